#!/usr/bin/env bash
# Replication and failover with real processes and real SIGKILL: the local launcher runs
# 3 shards with `replicas: 2`, 3 workers, lossless both ways and adam, kills one shard as
# worker 0 starts a step (its pushes in flight), and compares every result with the same
# job undisturbed (the launcher runs that first): each shard index, killed at steps drawn
# from a seed, restarted 2 s later (empty, as a restarted pod) or never. Then two shards
# that share chunks die at once: the job must fail naming both. Real gradients when
# GCOMP_GRADIENTS_DIR has them, else a synthetic file.
set -uo pipefail
CLUSTER="$1"
DIR="${GCOMP_GRADIENTS_DIR:-}"
SEED="${FAILOVER_SEED:-$RANDOM}"
fail() { echo "FAIL: $*"; exit 1; }

if [[ -n "$DIR" && -f "$DIR/digits_cnn_step1.npy" ]]; then
  GRAD="$DIR/digits_cnn_step1.npy"
  CHUNK=65536
  STEPS=40
else
  echo "note: GCOMP_GRADIENTS_DIR unset or without digits_cnn_step1.npy; using a synthetic file"
  GRAD="$TEST_TMPDIR/synthetic.npy"
  /usr/bin/python3 tests/write_npy.py "$GRAD" 262144 sine
  CHUNK=16384
  STEPS=60
fi
# Either way long enough that a shard restarted 2 s after the kill has rejoined (3 maps)
# before the job ends: at least 3 s of steps after the kill at step 2-9.
echo "seed $SEED (rerun with FAILOVER_SEED=$SEED)"
RANDOM=$SEED

run() {  # run KILL_SHARDS AT_STEP RESTART_MS
  "$CLUSTER" --shards 3 --workers 3 --replicas 2 --steps "$STEPS" --mode lossless \
    --optimizer adam --chunk_bytes "$CHUNK" --gradients "$GRAD" --kill_shard "$1" \
    --kill_at_step "$2" --restart_after_ms "$3" --progress never | tail -1
}

for k in 0 1 2; do
  for restart in 2000 -1; do
    at=$((2 + RANDOM % 8))
    out="$(run "$k" "$at" "$restart")"
    echo "kill shard $k at step $at, restart after $restart ms: $out"
    [[ "$out" == *'"ok":true'* ]] || fail "shard $k at step $at (restart $restart): not ok"
    [[ "$out" == *'"identical_to_undisturbed":true'* ]] || fail "shard $k: results differ"
    [[ "$out" =~ \"failovers\":([0-9]+) ]] || fail "no failovers key"
    # Without a restart: one failover. With one: also the rejoin's two maps (the restarted
    # shard asks to catch up, then takes its chunks back).
    want=$((restart < 0 ? 1 : 3))
    (( BASH_REMATCH[1] == want )) || fail "shard $k: ${BASH_REMATCH[1]} failovers, want $want"
  done
done

# Shards 1 and 2 at once: some chunk has both as its copies, so its next step must fail
# with a status naming both, and the job must not end "ok".
out="$(run 1,2 3 -1)"
echo "kill shards 1,2 at step 3: $out"
[[ "$out" == *'"ok":false'* ]] || fail "two copies down: the job claims success"
[[ "$out" == *'DATA_LOSS'* && "$out" == *'is lost'* ]] || fail "two copies down: no DataLoss"
[[ "$out" =~ \"error\":\"([^\"]*)\" ]] || fail "two copies down: no error"
err="${BASH_REMATCH[1]}"
[[ "$err" == *'shard 1 ('* && "$err" == *'shard 2 ('* ]] || fail "error does not name both shards: $err"
echo PASS
