#!/usr/bin/env bash
# gcomp_server --shard_from_hostname: the shard index from a StatefulSet pod's name, with a
# config whose shards come from the {count, address} template. Runs the server in a UTS
# namespace of its own (unshare -u) to set the host name; skips where that is not allowed.
set -uo pipefail
SERVER="$1"
fail() { echo "FAIL: $*"; exit 1; }
if ! unshare -u true 2>/dev/null; then
  echo "note: unshare -u not permitted here; skipping"
  exit 0
fi
PORT=$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
cat > "$TEST_TMPDIR/c.yaml" <<YAML
shards: {count: 3, address: "127.0.0.{index}:$PORT"}
YAML
# Pod gcomp-shard-1 is shard 1: it listens on its own entry of the template, 127.0.0.1.
unshare -u sh -c "hostname gcomp-shard-1; exec timeout 3 '$SERVER' --config '$TEST_TMPDIR/c.yaml' \
  --shard_from_hostname --metrics_address none --config_poll_ms 0" > "$TEST_TMPDIR/out" 2>&1
grep -q "shard 1 of 3 listening on 127.0.0.1:$PORT" "$TEST_TMPDIR/out" || fail "$(cat "$TEST_TMPDIR/out")"

unshare -u sh -c "hostname gcomp-shard; '$SERVER' --config '$TEST_TMPDIR/c.yaml' --shard_from_hostname" \
  > "$TEST_TMPDIR/out" 2>&1
rc=$?
[ "$rc" = 2 ] || fail "a host name without an ordinal: exit $rc, want 2"
grep -q "does not end in -<number>" "$TEST_TMPDIR/out" || fail "$(cat "$TEST_TMPDIR/out")"

unshare -u sh -c "hostname gcomp-shard-7; '$SERVER' --config '$TEST_TMPDIR/c.yaml' --shard_from_hostname" \
  > "$TEST_TMPDIR/out" 2>&1
rc=$?
[ "$rc" = 2 ] || fail "ordinal past the shard count: exit $rc, want 2"
grep -q "out of range" "$TEST_TMPDIR/out" || fail "$(cat "$TEST_TMPDIR/out")"
echo PASS
