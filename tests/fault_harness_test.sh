#!/usr/bin/env bash
# The fault harness's short version (tests/fault_harness.cc): one seeded run of each fault
# kind against real etcd and gcomp_server processes; every run must end bit-identical to an
# undisturbed run.
set -euo pipefail
harness="$1"
"$harness" --server "$TEST_SRCDIR/gcomp_ps/server/gcomp_server" --runs 6 --seed 1
