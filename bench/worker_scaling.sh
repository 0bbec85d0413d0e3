#!/usr/bin/env bash
# Worker scaling of one shard (docs/BENCHMARKS.md, "Worker scaling"): a load generator
# process (bench/worker_scaling_load.cc) opens W real client connections with distinct
# worker ids and pushes one tensor of ELEMENTS floats (lossless) for STEPS steps; the
# shard's threads, RSS and descriptors are read from /proc while W - 1 pushes wait for the
# step's last one. Each server binary given runs every row, so rows compare in one run.
#
#   bench/worker_scaling.sh [SERVER_BINARY ...]   (default: this tree's gcomp_server)
#   WORKERS="16 64 256 1024" SIZES="1000 262144" STEPS=20 bench/worker_scaling.sh
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
bazel build //bench:worker_scaling_load //server:gcomp_server >&2 || exit 1
LOAD=bazel-bin/bench/worker_scaling_load
SERVERS=("$@")
[[ ${#SERVERS[@]} -gt 0 ]] || SERVERS=(bazel-bin/server/gcomp_server)
WORKERS="${WORKERS:-16 64 256 1024}"
SIZES="${SIZES:-1000 262144}"
STEPS="${STEPS:-20}"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)"

echo "$(nproc) cores; $STEPS steps (the first, paused 500 ms before its last push so the shard is sampled with W - 1 pushes waiting, is not timed)"
echo "| server | W | tensor | step ms p50 | step ms p99 | call ms p50 | call ms p99 | threads idle | threads peak | RSS idle MB | RSS peak MB | RSS KB / worker | fds / worker | errors |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
for server in "${SERVERS[@]}"; do
  for size in $SIZES; do
    for w in $WORKERS; do
      port="$(/usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')"
      cat > "$TMP/cluster.yaml" <<YAML
job: bench
workers: $w
shards: ["127.0.0.1:$port"]
chunk_bytes: 1048576
step_timeout_ms: 100000
rpc_timeout_ms: 120000
limits: {memory_budget_bytes: 8589934592}
YAML
      "$server" --config "$TMP/cluster.yaml" --shard 0 --log_level warn \
        --metrics_address 127.0.0.1:0 2>"$TMP/server.log" &
      pid=$!
      # Idle means listening: wait for the port, then let start-up settle.
      /usr/bin/python3 - "$port" <<'PY'
import socket, sys, time
for _ in range(200):
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 0.1).close(); break
    except OSError:
        time.sleep(0.05)
PY
      sleep 1
      out="$("$LOAD" "127.0.0.1:$port" "$pid" "$w" "$size" "$STEPS")"
      echo "$out" >&2
      kill "$pid"; wait "$pid" 2>/dev/null
      /usr/bin/python3 - "$server" "$size" "$out" <<'PY'
import json, sys
server, size, line = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if not line:
    print(f"| {server} | ? | {size} | load generator failed |"); sys.exit()
r = json.loads(line)
w = r["workers"]
tensor = f"{size * 4 / 2**20:.0f} MiB" if size * 4 >= 2**20 else f"{size * 4 / 1000:.0f} KB"
per_worker_kb = (r["rss_connected_kb"] - r["rss_idle_kb"]) / w
fds = (r["fds_connected"] - r["fds_idle"]) / w
print(f"| {server} | {w} | {tensor} | {r['step_ms_p50']:.1f} | {r['step_ms_p99']:.1f} | "
      f"{r['call_ms_p50']:.1f} | {r['call_ms_p99']:.1f} | {r['threads_idle']} | "
      f"{r['threads_peak']} | {r['rss_idle_kb'] / 1024:.0f} | {r['rss_peak_kb'] / 1024:.0f} | "
      f"{per_worker_kb:.0f} | {fds:.2f} | {r['errors']} {r['first_error']} |")
PY
    done
  done
done
