#!/usr/bin/env bash
# Real processes: the local cluster launcher on the real gradients (skips without them),
# and a worker SIGKILLed mid-step, whose peers must fail within the step deadline with
# its name in the status.
set -uo pipefail
CLUSTER="$1"
DIR="${GCOMP_GRADIENTS_DIR:-}"
fail() { echo "FAIL: $*"; exit 1; }

if [[ -n "$DIR" && -f "$DIR/digits_cnn_step1.npy" ]]; then
  GRAD="$DIR/digits_cnn_step1.npy"
else
  echo "note: GCOMP_GRADIENTS_DIR unset or without digits_cnn_step1.npy; using a synthetic file"
  GRAD="$TEST_TMPDIR/synthetic.npy"
  # 65536 small f32 values (a sine).
  /usr/bin/python3 tests/write_npy.py "$GRAD" 65536 sine
fi

out="$("$CLUSTER" --shards 2 --workers 3 --steps 2 --gradients "$GRAD" | tail -1)"
echo "$out"
[[ "$out" == *'"bound_ok":true'* && "$out" == *'"bound_checked":true'* && "$out" == *'"identical":true'* && "$out" == *'"ok":true'* ]] \
  || fail "near-lossless cluster run"

out="$("$CLUSTER" --shards 3 --workers 2 --steps 2 --mode lossless --gradients "$GRAD" \
        --set max_inflight_chunks=2 | tail -1)"
echo "$out"
[[ "$out" == *'"max_abs_error":0,'* && "$out" == *'"ok":true'* ]] || fail "lossless cluster run"

# --set reaches the processes: a shard limit below every worker name fails registration,
# naming the field; a field that does not exist is refused by the launcher itself.
out="$("$CLUSTER" --shards 1 --workers 2 --steps 1 --gradients "$GRAD" \
        --set limits.max_key_bytes=1 | tail -1)"
echo "$out"
[[ "$out" == *'"ok":false'* && "$out" == *'exceeds limits.max_key_bytes = 1'* ]] \
  || fail "--set did not reach the shard"
err="$("$CLUSTER" --shards 1 --workers 1 --steps 1 --gradients "$GRAD" \
        --set max_inflight_chunkz=2 2>&1 >/dev/null)"
rc=$?
echo "$err"
[[ $rc -eq 2 && "$err" == *"'max_inflight_chunkz': unknown field"* ]] || fail "bad --set not refused"

# A shard that refuses its flags or its checkpoint folder fails the run at once, in its own
# words, not after the workers' 20 s connect timeout.
touch "$TEST_TMPDIR/a-file"
for bad in "--decode_threads 0|decode_threads must be 1 to 256, got 0" \
           "--checkpoint_dir $TEST_TMPDIR/a-file/ckpt|$TEST_TMPDIR/a-file"; do
  start=$(date +%s)
  out="$("$CLUSTER" --shards 2 --workers 2 --steps 2 --gradients "$GRAD" ${bad%%|*} | tail -1)"
  elapsed=$(( $(date +%s) - start ))
  echo "$out"
  [[ "$out" == *'"ok":false'* && "$out" == *'"error":"shard '[01]' exited with status 1 (see shard'* \
     && "$out" == *"${bad#*|}"* ]] || fail "shard refusing ${bad%%|*} not reported"
  (( elapsed < 15 )) || fail "took ${elapsed}s to fail on ${bad%%|*}"
done

start=$(date +%s)
out="$("$CLUSTER" --shards 2 --workers 3 --steps 4 --gradients "$GRAD" --kill_worker 1 \
        --kill_at_step 1 --step_timeout_ms 2000 | tail -1)"
elapsed=$(( $(date +%s) - start ))
echo "$out"
[[ "$out" == *'"ok":false'* ]] || fail "killed worker not reported"
[[ "$out" == *'DEADLINE_EXCEEDED'* && "$out" == *'missing workers: worker-1'* ]] \
  || fail "status does not name the killed worker"
(( elapsed < 30 )) || fail "took ${elapsed}s to fail"
echo PASS
