#!/usr/bin/env bash
# The fault harness's short version (tests/fault_harness.cc): one seeded run of each of its
# 7 fault kinds against real etcd and gcomp_server processes; every run must end
# bit-identical to an undisturbed run (a partition is skipped, saying why, where network
# namespaces cannot be made).
set -euo pipefail
harness="$1"
"$harness" --server "$TEST_SRCDIR/gcomp_ps/server/gcomp_server" --runs 7 --seed 1
