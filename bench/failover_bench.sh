#!/usr/bin/env bash
# Replication and failover benchmark (docs/BENCHMARKS.md, "Replication and failover"):
#   1. step time with `replicas: 2` against 1, W = 4 workers, S = 3 shards, near-lossless,
#      on loopback and on an emulated 1 Gbit/s link;
#   2. the pause workers see when a shard is SIGKILLed (failover) and when it comes back
#      5 s later (well after the failover) and takes its chunks back (rejoin), on loopback.
#
#   bench/failover_bench.sh [GRADIENT.npy[,MORE.npy]] [STEPS]
#
# The emulated link: each shard runs in a network namespace of its own (gcomp_fo0..2),
# reached over a veth pair whose ends are rate-limited to 1 Gbit/s with tc tbf, so
# worker-to-shard traffic crosses one shaped link and shard-to-shard traffic (replication)
# two, as between machines with 1 Gbit/s NICs. Needs root; skipped with a message
# otherwise. Prints Markdown tables (and each run's JSON line on stderr).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
GRADIENTS="${GCOMP_GRADIENTS_DIR:-$ROOT/../shared/data/gradients}"
FILES="${1:-$GRADIENTS/text_gpt_step1.npy,$GRADIENTS/digits_cnn_step1.npy}"
STEPS="${2:-8}"
bazel build //deploy/local:cluster >&2 || exit 1
CLUSTER=bazel-bin/deploy/local/cluster

run() {  # link replicas extra-args...
  local link="$1" replicas="$2"; shift 2
  local out
  out="$("$CLUSTER" --shards 3 --workers 4 --steps "$STEPS" --mode near-lossless \
         --replicas "$replicas" --gradients "$FILES" --label "$link" --progress never "$@" |
         tail -1)"
  echo "$out" >&2
  /usr/bin/python3 - "$link" "$replicas" "$out" <<'PY'
import json, sys
link, replicas, line = sys.argv[1:]
r = json.loads(line)
print(f"| {link} | {replicas} | {r['step_ms_p50']:.1f} | {r['raw_gb_per_s']:.3f} | "
      f"{r['ratio']:.2f} | {str(r['ok']).lower()} |")
PY
}

echo "| link | replicas | step ms (p50) | raw GB/s aggregated | wire ratio | ok |"
echo "| --- | --- | --- | --- | --- | --- |"
run loopback 1
run loopback 2

# 2. Pauses: worker 0's step times around the kill and the rejoin.
echo
echo "| event | kill at step | worker 0 step ms at the event | median step ms | pause ms | identical to undisturbed |"
echo "| --- | --- | --- | --- | --- | --- |"
for restart in -1 5000; do
  err="$(mktemp)"
  out="$("$CLUSTER" --shards 3 --workers 4 --steps 60 --mode near-lossless --replicas 2 \
         --gradients "$FILES" --kill_shard 1 --kill_at_step 6 --restart_after_ms "$restart" \
         --keep_logs --progress never 2>"$err" | tail -1)"
  echo "$out" >&2
  logs="$(sed -n 's/^cluster: logs in //p' "$err")"
  rm -f "$err"
  /usr/bin/python3 - "$restart" "$out" "$logs" <<'PY'
import json, statistics, sys
restart, line, logs = sys.argv[1:]
r = json.loads(line)
w = json.load(open(f"{logs}/worker0.json"))
ms = w["step_ms"]
median = statistics.median(ms)
same = str(r.get("identical_to_undisturbed")).lower()
# The kill lands in step 6; the rejoin, 5 s later, in the slowest step after the ones the
# failover itself slowed (steps 6 and 7).
print(f"| failover | 6 | {ms[6]:.1f} | {median:.1f} | {ms[6] - median:.1f} | {same} |")
if int(restart) >= 0:
    after = max(range(8, len(ms)), key=lambda i: ms[i])
    print(f"| rejoin (restart after {restart} ms) | 6 | {ms[after]:.1f} (step {after}) | "
          f"{median:.1f} | {ms[after] - median:.1f} | {same} |")
PY
  rm -rf "$logs"
done

cleanup() {
  for k in 0 1 2; do
    ip netns del "gcomp_fo$k" 2>/dev/null
    ip link del "gfo$k" 2>/dev/null
  done
  [[ -n "${FORWARD:-}" ]] && sysctl -q -w net.ipv4.ip_forward="$FORWARD"
}
if [[ $EUID -ne 0 ]] || ! ip netns add gcomp_fo0 2>/dev/null; then
  echo "failover_bench: cannot create network namespaces here (needs root); skipping the 1 Gbit/s link" >&2
  exit 0
fi
trap cleanup EXIT
FORWARD="$(sysctl -n net.ipv4.ip_forward)"
sysctl -q -w net.ipv4.ip_forward=1
hosts=()
for k in 0 1 2; do
  ns="gcomp_fo$k"
  [[ $k -gt 0 ]] && ip netns add "$ns"
  ip link add "gfo$k" type veth peer name "gfo${k}n"
  ip link set "gfo${k}n" netns "$ns"
  ip addr add "10.78.$k.2/24" dev "gfo$k"
  ip link set "gfo$k" up
  ip netns exec "$ns" ip addr add "10.78.$k.1/24" dev "gfo${k}n"
  ip netns exec "$ns" ip link set "gfo${k}n" up
  ip netns exec "$ns" ip link set lo up
  ip netns exec "$ns" ip route add default via "10.78.$k.2"
  tc qdisc add dev "gfo$k" root tbf rate 1gbit burst 256kb latency 50ms
  ip netns exec "$ns" tc qdisc add dev "gfo${k}n" root tbf rate 1gbit burst 256kb latency 50ms
  hosts+=("10.78.$k.1")
done
echo
echo "| link | replicas | step ms (p50) | raw GB/s aggregated | wire ratio | ok |"
echo "| --- | --- | --- | --- | --- | --- |"
for replicas in 1 2; do
  run "1 Gbit/s veth per shard" "$replicas" --host "$(IFS=,; echo "${hosts[*]}")" \
      --base_port 17400 --server_prefix "ip netns exec gcomp_fo{index}"
done
