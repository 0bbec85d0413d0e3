#!/bin/bash
# gcomp_admin's command line: exit statuses (0 ok, 1 a shard down, 2 usage/config), the
# usage text for an unknown subcommand, and --json that parses. The shard side (rows of
# live shards, tokens) is status_test's.
set -u
ADMIN="$1"
TMP="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }

# Port 1 on loopback: nothing listens there, so the shard is down.
printf 'job: t\nshards: ["127.0.0.1:1"]\n' > "$TMP/c.yaml"

"$ADMIN" status --config "$TMP/c.yaml" > "$TMP/out" 2> "$TMP/err"
rc=$?
[ "$rc" = 1 ] || fail "down shard: exit $rc, want 1"
grep -q "DOWN" "$TMP/out" || fail "no DOWN row: $(cat "$TMP/out")"
grep -q "UNAVAILABLE" "$TMP/out" || fail "no status code: $(cat "$TMP/out")"

"$ADMIN" status --config "$TMP/c.yaml" --json > "$TMP/json"
rc=$?
[ "$rc" = 1 ] || fail "--json down shard: exit $rc, want 1"
/usr/bin/python3 - "$TMP/json" <<'PY' || fail "--json: $(cat "$TMP/json")"
import json, sys
doc = json.load(open(sys.argv[1]))
assert doc["all_up"] is False, doc
(row,) = doc["shards"]
assert row["up"] is False and row["error_code"] == "UNAVAILABLE" and row["address"] == "127.0.0.1:1", row
PY

"$ADMIN" frobnicate --config "$TMP/c.yaml" > "$TMP/out" 2> "$TMP/err"
rc=$?
[ "$rc" = 2 ] || fail "unknown subcommand: exit $rc, want 2"
grep -q "unknown subcommand 'frobnicate'" "$TMP/err" || fail "no message: $(cat "$TMP/err")"
grep -q "^  status " "$TMP/err" || fail "usage lists no subcommands: $(cat "$TMP/err")"

"$ADMIN" > /dev/null 2>&1; rc=$?
[ "$rc" = 2 ] || fail "no subcommand: exit $rc, want 2"
"$ADMIN" status > /dev/null 2> "$TMP/err"; rc=$?
[ "$rc" = 2 ] || fail "no --config: exit $rc, want 2"
grep -q -- "--config is required" "$TMP/err" || fail "$(cat "$TMP/err")"
"$ADMIN" status --config "$TMP/missing.yaml" > /dev/null 2> "$TMP/err"; rc=$?
[ "$rc" = 2 ] || fail "missing config: exit $rc, want 2"
"$ADMIN" status --config "$TMP/c.yaml" --set workers=0 > /dev/null 2> "$TMP/err"; rc=$?
[ "$rc" = 2 ] || fail "bad override: exit $rc, want 2"
grep -q "workers" "$TMP/err" || fail "$(cat "$TMP/err")"
"$ADMIN" status --config "$TMP/c.yaml" --log_format=xml > /dev/null 2> "$TMP/err"; rc=$?
[ "$rc" = 2 ] || fail "bad --log_format: exit $rc, want 2"
"$ADMIN" reshard > /dev/null 2> "$TMP/err"; rc=$?
[ "$rc" = 2 ] || fail "reshard without --config: exit $rc, want 2"
grep -q -- "--config is required" "$TMP/err" || fail "$(cat "$TMP/err")"
"$ADMIN" reshard --config "$TMP/c.yaml" --at_step=-1 > /dev/null 2> "$TMP/err"; rc=$?
[ "$rc" = 2 ] || fail "reshard --at_step=-1: exit $rc, want 2"
# No shard of the new map is up: refused (exit 1), naming why.
"$ADMIN" reshard --config "$TMP/c.yaml" --set shard_map_epoch=2 --deadline_ms 500 > /dev/null 2> "$TMP/err"; rc=$?
[ "$rc" = 1 ] || fail "reshard with no shard up: exit $rc, want 1"
grep -q "older shard-map epoch" "$TMP/err" || fail "$(cat "$TMP/err")"
echo PASS
