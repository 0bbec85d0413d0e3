#!/usr/bin/env bash
# A real Prometheus server (Debian's `prometheus`) scrapes the shards of a local cluster
# run; its HTTP query API must report the same bytes, chunk-steps and ratio as the
# launcher's JSON line.
set -uo pipefail
CLUSTER="$1"
fail() { echo "FAIL: $*"; exit 1; }
PROMETHEUS="${PROMETHEUS:-$(command -v prometheus || true)}"
[[ -x "$PROMETHEUS" ]] || fail "the prometheus server is not installed (tools/bootstrap.sh installs it)"
DIR="$TEST_TMPDIR"

# 131072 f32 values = 512 KiB: 8 chunks of 64 KiB over 2 shards.
/usr/bin/python3 tests/write_npy.py "$DIR/g.npy" 131072 sine
# Two consecutive free ports for the shards' metrics (--metrics_base_port M0), one for Prometheus.
read -r M0 P < <(/usr/bin/python3 - <<'PY'
import socket
def free(port):
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()
while True:
    s = socket.socket(); s.bind(("127.0.0.1", 0)); base = s.getsockname()[1]; s.close()
    if base < 65000 and free(base + 1):
        break
s = socket.socket(); s.bind(("127.0.0.1", 0)); prom = s.getsockname()[1]; s.close()
print(base, prom)
PY
)
M1=$((M0 + 1))
cat > "$DIR/prometheus.yml" <<YAML
global:
  scrape_interval: 500ms
  scrape_timeout: 400ms
scrape_configs:
  - job_name: gcomp-shards
    static_configs:
      - targets: ["127.0.0.1:$M0", "127.0.0.1:$M1"]
YAML
"$PROMETHEUS" --config.file="$DIR/prometheus.yml" --storage.tsdb.path="$DIR/tsdb" \
  --web.listen-address="127.0.0.1:$P" > "$DIR/prometheus.log" 2>&1 &
PROM_PID=$!
trap 'kill $PROM_PID 2>/dev/null; wait $PROM_PID 2>/dev/null' EXIT
ready=0
for _ in $(seq 1 120); do
  if /usr/bin/python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$P/-/ready', timeout=1)" \
      2>/dev/null; then
    ready=1
    break
  fi
  sleep 0.5
done
((ready)) || { tail -20 "$DIR/prometheus.log"; fail "Prometheus not ready after 60 s"; }

# Linger 6 s after the last step so that Prometheus scrapes the final counters (every
# 500 ms; a loaded machine may delay a few scrapes).
out="$("$CLUSTER" --shards 2 --workers 2 --steps 12 --chunk_bytes 65536 --gradients "$DIR/g.npy" \
        --metrics_base_port "$M0" --linger_ms 6000 | tail -1)"
echo "$out"
[[ "$out" == *'"ok":true'* ]] || fail "cluster run failed"
[[ "$out" == *"\"metrics_ports\":[$M0,$M1]"* ]] || fail "metrics ports not as asked"

/usr/bin/python3 - "$P" "$out" <<'PY' || fail "Prometheus disagrees with the launcher"
import json, sys, time, urllib.parse, urllib.request
port, line = sys.argv[1], json.loads(sys.argv[2])

def query(q):
    url = "http://127.0.0.1:%s/api/v1/query?%s" % (port, urllib.parse.urlencode({"query": q}))
    # Samples of the last scrapes may still be on their way into the head block.
    for _ in range(40):
        body = json.load(urllib.request.urlopen(url, timeout=10))
        assert body["status"] == "success", body
        result = body["data"]["result"]
        if result:
            return float(result[0]["value"][1])
        time.sleep(0.5)
    targets = json.load(urllib.request.urlopen(
        "http://127.0.0.1:%s/api/v1/targets" % port, timeout=10))
    raise AssertionError("no data for %s; targets: %s" % (q, json.dumps(targets)[:2000]))

# The shards have stopped: take each series' last scraped value.
last = lambda m: "sum(max_over_time(%s[5m]))" % m
wire = query(last("gcomp_shard_wire_bytes_total"))
raw = query(last("gcomp_shard_raw_bytes_total"))
steps = query(last("gcomp_shard_steps_completed_total"))
shards = query("count(max_over_time(gcomp_shard_map_epoch[5m]))")
ratio_in = query('sum(max_over_time(gcomp_shard_raw_bytes_total{direction="in"}[5m])) / '
                 'sum(max_over_time(gcomp_shard_wire_bytes_total{direction="in"}[5m]))')
print("prometheus: wire %d raw %d chunk-steps %d shards %d ratio %.4f" % (wire, raw, steps, shards, raw / wire))
ok = True
def check(name, got, want):
    global ok
    if got != want:
        print("MISMATCH %s: prometheus %r, launcher %r" % (name, got, want))
        ok = False
check("wire bytes", wire, line["wire_bytes"])
check("raw bytes", raw, line["raw_bytes"])
check("chunk-steps", steps, line["steps"] * 8)  # 8 chunks per step
check("shards", shards, 2)
check("ratio", round(raw / wire, 4), line["ratio"])
if not ratio_in > 1:
    print("uplink ratio %r not above 1" % ratio_in)
    ok = False
sys.exit(0 if ok else 1)
PY
echo PASS
