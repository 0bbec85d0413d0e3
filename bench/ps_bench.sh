#!/usr/bin/env bash
# Parameter-server benchmark: aggregated raw-gradient GB/s and step time, --mode none vs
# near-lossless, 4 workers and 2 shards unless told otherwise, on loopback and on an
# emulated link (1 Gbit/s unless RATE says otherwise, in tc's units: 1gbit, 10gbit, 500mbit).
#
#   bench/ps_bench.sh [GRADIENT.npy[,MORE.npy]] [STEPS] [RATE] [FIELD=VALUE[,...]] [WxS]
#
# The fourth argument sets more config fields for both modes (the launcher's --set), e.g.
# max_inflight_chunks=2 ("" for none). The fifth is the worker and shard count, 4x2 by
# default; 1x1 gives each process a core of a two-core machine.
#
# The emulated link: the shards run inside a network namespace created here
# (gcomp_ps_bench), reached over a veth pair 10.77.0.2 <-> 10.77.0.1 whose both ends are
# rate-limited to RATE with tc tbf. Needs root; skipped with a message otherwise.
# Prints a Markdown table (and each run's JSON line on stderr, labelled with the link, as
# bench/step_model.py --measured reads them).
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
GRADIENTS="${GCOMP_GRADIENTS_DIR:-$ROOT/../shared/data/gradients}"
FILES="${1:-$GRADIENTS/text_gpt_step1.npy,$GRADIENTS/digits_cnn_step1.npy}"
STEPS="${2:-5}"
RATE="${3:-1gbit}"
SET="${4:-}"
SIZE="${5:-4x2}"
[[ "$SIZE" =~ ^([1-9][0-9]*)x([1-9][0-9]*)$ ]] || { echo "ps_bench: '$SIZE' is not WORKERSxSHARDS, like 4x2" >&2; exit 2; }
WORKERS="${BASH_REMATCH[1]}"
SHARDS="${BASH_REMATCH[2]}"
[[ "$RATE" =~ ^[0-9]+(\.[0-9]+)?[kmg]bit$ ]] || { echo "ps_bench: RATE '$RATE' is not like 1gbit, 10gbit, 500mbit" >&2; exit 2; }
bazel build //deploy/local:cluster >&2 || exit 1
CLUSTER=bazel-bin/deploy/local/cluster
NS=gcomp_ps_bench

run() {  # link mode extra-args...
  local link="$1" mode="$2"; shift 2
  local out
  out="$("$CLUSTER" --shards "$SHARDS" --workers "$WORKERS" --steps "$STEPS" --mode "$mode" \
         --gradients "$FILES" --label "$link" ${SET:+--set "$SET"} "$@" | tail -1)"
  echo "$out" >&2
  /usr/bin/python3 - "$link" "$mode" "$out" <<'PY'
import json, sys
link, mode, line = sys.argv[1:]
r = json.loads(line)
print(f"| {link} | {mode} | {r['step_ms_p50']:.1f} | {r['raw_gb_per_s']:.3f} | "
      f"{r['ratio']:.2f} | {r['max_abs_error']:.3g} | {str(r['bound_ok']).lower()} |")
PY
}

echo "$WORKERS workers, $SHARDS shards, $STEPS steps, $(nproc) cores"
echo "| link | mode | step ms (p50) | raw GB/s aggregated | wire ratio | max abs error | bound ok |"
echo "| --- | --- | --- | --- | --- | --- | --- |"
run loopback none
run loopback near-lossless

cleanup() { ip netns del "$NS" 2>/dev/null; ip link del gps0 2>/dev/null; }
if [[ $EUID -ne 0 ]] || ! ip netns add "$NS" 2>/dev/null; then
  echo "ps_bench: cannot create network namespaces here (needs root); skipping the $RATE link" >&2
  exit 0
fi
trap cleanup EXIT
ip link add gps0 type veth peer name gps1
ip link set gps1 netns "$NS"
ip addr add 10.77.0.2/24 dev gps0
ip link set gps0 up
ip netns exec "$NS" ip addr add 10.77.0.1/24 dev gps1
ip netns exec "$NS" ip link set gps1 up
ip netns exec "$NS" ip link set lo up
# tbf needs a bucket of at least about a millisecond of bytes at the rate (below that it
# falls short of the rate): 256 KB up to 2 Gbit/s (as before), 1.25 MB at 10 Gbit/s.
BURST=$(awk -v r="$RATE" 'BEGIN { n = r + 0; u = substr(r, length(n "") + 1, 1);
  bps = n * (u == "k" ? 1e3 : u == "m" ? 1e6 : 1e9); b = bps / 8 / 1000;
  printf "%d", (b > 262144 ? b : 262144) }')
tc qdisc add dev gps0 root tbf rate "$RATE" burst "$BURST" latency 50ms
ip netns exec "$NS" tc qdisc add dev gps1 root tbf rate "$RATE" burst "$BURST" latency 50ms
for mode in none near-lossless; do
  run "$RATE veth" "$mode" --host 10.77.0.1 --base_port 17300 \
      --server_prefix "ip netns exec $NS"
done
