#!/usr/bin/env bash
# How one shard's cost grows with the number of workers (docs/BENCHMARKS.md, "Shard
# scaling"): the local cluster with S = 1 shard and W = 1, 2, 4, 8, 16 worker processes,
# near-lossless both ways, each run's step time and the shard's CPU seconds (user + system,
# from the launcher's shard_cpu_s), per step and per GB of wire the shard moved.
#
#   bench/shard_scaling.sh [GRADIENT.npy] [STEPS] [MODE]
#
# Every process shares this machine's cores, so step times at large W measure contention
# as much as the shard; the shard's CPU seconds per byte do not depend on that. Prints a
# Markdown table (each run's JSON line on stderr) and the cores a shard needs per 10 Gbit/s.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
GRADIENTS="${GCOMP_GRADIENTS_DIR:-$ROOT/../shared/data/gradients}"
FILE="${1:-$GRADIENTS/digits_cnn_step1.npy}"
STEPS="${2:-40}"
MODE="${3:-near-lossless}"
[[ -f "$FILE" ]] || { echo "shard_scaling: no gradient file $FILE (set GCOMP_GRADIENTS_DIR)" >&2; exit 2; }
bazel build //deploy/local:cluster >&2 || exit 1
CLUSTER=bazel-bin/deploy/local/cluster

echo "mode $MODE, $STEPS steps, $(basename "$FILE"), 1 shard, $(nproc) cores"
echo "| workers | step ms (p50) | shard CPU s | shard CPU ms / step | shard CPU ms / step / worker | wire MB / step (both ways) | shard cores per 10 Gbit/s | ok |"
echo "| --- | --- | --- | --- | --- | --- | --- | --- |"
for w in 1 2 4 8 16; do
  out="$("$CLUSTER" --shards 1 --workers "$w" --steps "$STEPS" --mode "$MODE" \
         --gradients "$FILE" --label "W=$w" --progress never | tail -1)"
  echo "$out" >&2
  /usr/bin/python3 - "$w" "$out" <<'PY'
import json, sys
w, line = int(sys.argv[1]), sys.argv[2]
r = json.loads(line)
cpu = r["shard_cpu_s"][0]
steps = max(r["steps"], 1)
wire = r["wire_bytes"]  # every worker's bytes sent + received: all of it crosses the shard
# 10 Gbit/s each way: the shard's wire in one direction is about half of `wire`.
per_dir_bytes = wire / 2
cores = cpu / (per_dir_bytes / 1.25e9) if per_dir_bytes else float("nan")
print(f"| {w} | {r['step_ms_p50']:.1f} | {cpu:.2f} | {1e3 * cpu / steps:.1f} | "
      f"{1e3 * cpu / steps / w:.1f} | {wire / steps / 1e6:.2f} | {cores:.2f} | "
      f"{str(r['ok']).lower()} |")
PY
done
