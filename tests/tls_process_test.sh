#!/usr/bin/env bash
# Real gcomp_server and gcomp_worker processes with mutual TLS and the job token, then in
# plaintext: the first line the server logs names the security mode, a worker with the
# right certificate and token runs its steps, one without the token is refused with
# UNAUTHENTICATED, and a token rotation accepts the old and the new token until it ends.
set -uo pipefail
SERVER="$1"
WORKER="$2"
CERTS_SCRIPT="$3"
fail() { echo "FAIL: $*"; exit 1; }
DIR="$TEST_TMPDIR"
"$CERTS_SCRIPT" "$DIR/certs" || fail "make_test_certs.sh failed"
C="$DIR/certs"

/usr/bin/python3 tests/write_npy.py "$DIR/g.npy" 4096 ramp
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# run_case NAME SERVER_SET WORKER_SET: starts a shard, runs one worker, stops the shard.
run_case() {
  local name=$1 server_set=$2 worker_set=$3 port
  port=$(free_port)
  cat > "$DIR/$name.yaml" <<YAML
job: tls
workers: 1
shards: ["127.0.0.1:$port"]
connect_timeout_ms: 3000
YAML
  "$SERVER" --config "$DIR/$name.yaml" --shard 0 --set "$server_set" --metrics_address none \
    > /dev/null 2> "$DIR/$name.server.log" &
  local server_pid=$!
  "$WORKER" --config "$DIR/$name.yaml" --worker 0 --gradients "$DIR/g.npy" --steps 2 \
    --set "$worker_set" > "$DIR/$name.worker.json" 2> "$DIR/$name.worker.log"
  worker_rc=$?
  kill -TERM "$server_pid"
  wait "$server_pid"
}

TLS="security.ca_file=$C/ca.pem,security.token_file=$C/token"
run_case tls "$TLS,security.cert_file=$C/server.pem,security.key_file=$C/server.key" \
  "$TLS,security.cert_file=$C/client.pem,security.key_file=$C/client.key"
cat "$DIR/tls.server.log" "$DIR/tls.worker.json"
[[ $worker_rc -eq 0 ]] || { cat "$DIR/tls.worker.log"; fail "the TLS worker failed"; }
head -n 1 "$DIR/tls.server.log" | grep -q "security: mutual TLS" ||
  fail "the TLS server's first log line does not name mutual TLS"

run_case notoken "$TLS,security.cert_file=$C/server.pem,security.key_file=$C/server.key" \
  "security.ca_file=$C/ca.pem,security.cert_file=$C/client.pem,security.key_file=$C/client.key"
cat "$DIR/notoken.server.log" "$DIR/notoken.worker.json"
[[ $worker_rc -ne 0 ]] || fail "a worker without the token was served"
grep -q "UNAUTHENTICATED" "$DIR/notoken.worker.json" "$DIR/notoken.worker.log" ||
  fail "the worker without the token did not get UNAUTHENTICATED"
grep -q "refused Aggregation.RegisterWorker from ipv4:127.0.0.1:" "$DIR/notoken.server.log" ||
  fail "the refusal is not logged with the peer address"
if grep -q -f "$C/token" "$DIR"/*.log "$DIR"/*.json; then fail "the token appears in a log"; fi

# A token rotation, mid-way: the shard accepts the new token (first line) and the old one,
# so a worker still sending the old token trains; one with neither is refused.
{ echo "rotated-$RANDOM$RANDOM"; cat "$C/token"; } > "$DIR/both-tokens"
SERVER_TLS="security.ca_file=$C/ca.pem,security.cert_file=$C/server.pem,security.key_file=$C/server.key"
WORKER_TLS="security.ca_file=$C/ca.pem,security.cert_file=$C/client.pem,security.key_file=$C/client.key"
run_case rotating "$SERVER_TLS,security.token_file=$DIR/both-tokens" "$WORKER_TLS,security.token_file=$C/token"
[[ $worker_rc -eq 0 ]] || { cat "$DIR/rotating.server.log" "$DIR/rotating.worker.log"; fail "the old token was refused during the rotation"; }
head -n 1 "$DIR/both-tokens" > "$DIR/new-token"
run_case rotated "$SERVER_TLS,security.token_file=$DIR/new-token" "$WORKER_TLS,security.token_file=$C/token"
[[ $worker_rc -ne 0 ]] || fail "the old token was accepted after the rotation"
grep -q "PERMISSION_DENIED" "$DIR/rotated.worker.json" "$DIR/rotated.worker.log" ||
  fail "the old token after the rotation did not get PERMISSION_DENIED"

run_case plain "workers=1" "workers=1"
cat "$DIR/plain.server.log"
[[ $worker_rc -eq 0 ]] || { cat "$DIR/plain.worker.log"; fail "the plaintext worker failed"; }
head -n 1 "$DIR/plain.server.log" | grep -q "security: INSECURE" ||
  fail "the plaintext server's first log line does not say INSECURE"
echo PASS
