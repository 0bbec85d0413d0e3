#!/usr/bin/env bash
# Live re-sharding with real processes on loopback: the local launcher moves a training job
# 2 -> 3 -> 2 shards while 3 workers run (lossless both ways), through `gcomp_admin reshard`
# and through a rewritten config file, and every result must be bit-identical to the same
# job on 2 fixed shards (the launcher runs that first). Real gradients when
# GCOMP_GRADIENTS_DIR has them, else a synthetic file.
set -uo pipefail
CLUSTER="$1"
DIR="${GCOMP_GRADIENTS_DIR:-}"
fail() { echo "FAIL: $*"; exit 1; }

if [[ -n "$DIR" && -f "$DIR/digits_cnn_step1.npy" ]]; then
  GRAD="$DIR/digits_cnn_step1.npy"
  CHUNK=65536
  STEPS=12
else
  echo "note: GCOMP_GRADIENTS_DIR unset or without digits_cnn_step1.npy; using a synthetic file"
  GRAD="$TEST_TMPDIR/synthetic.npy"
  /usr/bin/python3 tests/write_npy.py "$GRAD" 65536 sine
  CHUNK=8192
  # Synthetic steps are fast: the second re-shard, asked for once the first is done, must
  # still find the job running.
  STEPS=40
fi
# With real gradients the first re-shard's Prepare comes before the workers finish step 3,
# so the switch is --at_step exactly. Synthetic steps (about 18 ms) can finish step 3 while
# the added shard and gcomp_admin start; step 4 then counts as started and the switch is
# the next boundary (docs/SERVICE.md, "The step boundary").
EXACT_FIRST=$([[ "$STEPS" == 12 ]] && echo 1 || echo 0)

check() {  # check NAME JSON SWITCH_STEPS...
  local name="$1" out="$2"
  shift 2
  echo "$out"
  [[ "$out" == *'"ok":true'* ]] || fail "$name: not ok"
  [[ "$out" == *'"identical_to_fixed":true'* ]] || fail "$name: differs from the fixed-shard run"
  [[ "$out" == *'"from_shards":2,"to_shards":3'* && "$out" == *'"from_shards":3,"to_shards":2'* ]] \
    || fail "$name: the two re-shards are not both in the JSON line"
  [[ "$out" =~ \"chunks_moved\":([0-9]+),\"bytes_moved\":([0-9]+) ]] || fail "$name: no totals"
  (( BASH_REMATCH[1] > 0 && BASH_REMATCH[2] > 0 )) || fail "$name: nothing moved"
  # --at_step fixes the first switch (see EXACT_FIRST); the launcher asks for the second once the first is
  # done, which on fast steps can be after step 8 has started: then it is the next boundary.
  if (($# == 2)); then
    [[ "$out" =~ \"switch_step\":([0-9]+),.*\"switch_step\":([0-9]+), ]] || fail "$name: no switch steps"
    local first="${BASH_REMATCH[1]}"
    if ((EXACT_FIRST)); then
      ((first == $1)) || fail "$name: first switch at $first, not at step $1"
    else
      ((first >= $1 && first < BASH_REMATCH[2])) || fail "$name: first switch at $first, want [$1, second)"
    fi
    (( BASH_REMATCH[2] >= $2 && BASH_REMATCH[2] < STEPS )) \
      || fail "$name: second switch at ${BASH_REMATCH[2]}, want [$2, $STEPS)"
  fi
}

for opt in momentum adam; do
  out="$("$CLUSTER" --shards 2 --workers 3 --steps "$STEPS" --mode lossless --optimizer "$opt" \
          --chunk_bytes "$CHUNK" --gradients "$GRAD" --reshard_at 4:3,8:2 --progress never | tail -1)"
  check "admin trigger, $opt" "$out" 4 8
done

# The file trigger switches at the first step boundary after shard 0 sees the new file, so
# the job runs long enough for both.
out="$("$CLUSTER" --shards 2 --workers 3 --steps 40 --mode lossless --optimizer momentum \
        --chunk_bytes "$CHUNK" --gradients "$GRAD" --reshard_at 4:3,20:2 --reshard_trigger file \
        --progress never | tail -1)"
check "file trigger" "$out"
[[ "$out" =~ \"switch_step\":([0-9]+).*\"switch_step\":([0-9]+) ]] || fail "file trigger: switch steps"
(( BASH_REMATCH[1] >= 3 && BASH_REMATCH[1] < BASH_REMATCH[2] && BASH_REMATCH[2] < 40 )) \
  || fail "file trigger: switches at ${BASH_REMATCH[1]} and ${BASH_REMATCH[2]} not within the run"
echo PASS
