#!/usr/bin/env bash
# Steady state: 1,000 near-lossless steps of the local cluster (W = 4, S = 2) must keep every
# process's resident memory and open file count flat after warm-up: under 5% growth from
# step 500 to the end (the launcher's --soak_from_step check). docs/BENCHMARKS.md records
# the same check over 10,000 steps on a real gradient.
set -uo pipefail
CLUSTER="$1"
fail() { echo "FAIL: $*"; exit 1; }
GRAD="$TEST_TMPDIR/soak.npy"
# A v1.0 .npy of 131072 '<f4' values (512 KiB: 8 chunks of 64 KiB spread over both shards).
/usr/bin/python3 tests/write_npy.py "$GRAD" 131072 sparse-sine
out="$("$CLUSTER" --shards 2 --workers 4 --steps 1000 --chunk_bytes 65536 --gradients "$GRAD" \
        --soak_from_step 500 --soak_max_growth_pct 5 | tail -1)"
echo "$out"
[[ "$out" == *'"steps":1000,'* ]] || fail "not all 1000 steps ran"
[[ "$out" == *'"soak_from_step":500,'* ]] || fail "no soak figures in the JSON line"
[[ "$out" == *'"soak_ok":true'* && "$out" == *'"ok":true'* ]] || fail "memory or open files grew"
echo PASS
