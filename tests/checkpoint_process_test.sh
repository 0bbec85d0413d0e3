#!/usr/bin/env bash
# A real gcomp_server with checkpoint.dir: after a worker trains 3 steps, kill -TERM makes
# it write the final checkpoint; gcomp_admin checkpoint lists it; a restarted server
# restores it; a damaged one stops the start naming the file (docs/CHECKPOINT.md).
set -uo pipefail
SERVER="$1"
WORKER="$2"
ADMIN="$3"
fail() { echo "FAIL: $*"; exit 1; }
DIR="$TEST_TMPDIR"

/usr/bin/python3 tests/write_npy.py "$DIR/g.npy" 4096 ramp
PORT=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$DIR/cluster.yaml" <<YAML
job: ckpt
workers: 1
shards: ["127.0.0.1:$PORT"]
chunk_bytes: 4096
uplink: {mode: lossless}
downlink: {mode: lossless}
optimizer: {name: momentum}
checkpoint: {dir: "$DIR/ckpt"}
YAML

"$SERVER" --config "$DIR/cluster.yaml" --shard 0 --metrics_address none \
  > /dev/null 2> "$DIR/server.log" &
server_pid=$!
"$WORKER" --config "$DIR/cluster.yaml" --worker 0 --gradients "$DIR/g.npy" --steps 3 \
  > "$DIR/worker.json" 2> "$DIR/worker.log" || { cat "$DIR/server.log" "$DIR/worker.log"; fail "worker failed"; }
kill -TERM "$server_pid"
wait "$server_pid"
rc=$?
cat "$DIR/server.log"
[[ $rc -eq 0 ]] || fail "server exited $rc after SIGTERM"
grep -q "checkpoint final-of-1 written: 4 chunks" "$DIR/server.log" || fail "no final checkpoint line"
[[ -f "$DIR/ckpt/ckpt/final-of-1/shard-0-of-1.manifest" ]] || fail "no manifest"
grep -q "^step 2$" "$DIR/ckpt/ckpt/final-of-1/shard-0-of-1.manifest" || fail "manifest step: $(cat "$DIR/ckpt/ckpt/final-of-1/shard-0-of-1.manifest")"

"$ADMIN" checkpoint --config "$DIR/cluster.yaml" > "$DIR/inspect.txt"
rc=$?
cat "$DIR/inspect.txt"
[[ $rc -eq 0 ]] || fail "gcomp_admin checkpoint exited $rc"
grep -q "final-of-1 .* 2 .* 1  complete" "$DIR/inspect.txt" || fail "no complete final set listed"
grep -q "g0 .* F32 .* 4096 momentum .* 4 2$" "$DIR/inspect.txt" || fail "tensor row missing"

"$SERVER" --config "$DIR/cluster.yaml" --shard 0 --metrics_address none \
  > /dev/null 2> "$DIR/server2.log" &
server_pid=$!
for _ in $(seq 100); do
  grep -q "listening on" "$DIR/server2.log" && break
  sleep 0.1
done
kill -TERM "$server_pid"
wait "$server_pid"
cat "$DIR/server2.log"
grep -q "restored 4 chunks of 1 tensors from .*final-of-1 (step 2" "$DIR/server2.log" || fail "no restore line"

# A damaged checkpoint stops the start with DATA_LOSS naming the file.
for f in "$DIR"/ckpt/ckpt/final-of-1/*.ckpt; do truncate -s 100 "$f"; done
"$SERVER" --config "$DIR/cluster.yaml" --shard 0 --metrics_address none > /dev/null 2> "$DIR/server3.log"
rc=$?
cat "$DIR/server3.log"
[[ $rc -ne 0 ]] || fail "server started on a damaged checkpoint"
grep -q "DATA_LOSS.*shard-0-of-1-.*ckpt" "$DIR/server3.log" || fail "error does not name the file"
"$ADMIN" checkpoint --dir "$DIR/ckpt/ckpt" > "$DIR/inspect2.txt"
rc=$?
cat "$DIR/inspect2.txt"
[[ $rc -eq 1 ]] || fail "gcomp_admin checkpoint on a damaged set exited $rc, want 1"
grep -q "no usable set: DATA_LOSS" "$DIR/inspect2.txt" || fail "damage not reported"
echo PASS
