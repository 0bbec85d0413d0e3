#!/usr/bin/env bash
# What the service adds to moving bytes (docs/BENCHMARKS.md, "Service overhead"): one worker
# and one shard on loopback (//deploy/local:cluster, W = 1, S = 1), `none` and near-lossless,
# against plain gRPC moving the same chunks to a server process and back
# (//bench:grpc_echo_bench), all in the same run:
#   none:          service step / echo step of the raw chunks                (target <= 1.3)
#   near-lossless: service step / (echo step of the compressed chunks
#                  + the codec's encode and decode time on both ends)        (target <= 1.3)
# The codec's time comes from `gcomp bench` on the same file (1 thread): worker encode,
# shard decode, shard encode and worker decode of the whole gradient.
#
#   bench/service_overhead.sh [GRADIENT.npy] [STEPS]
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
GRADIENTS="${GCOMP_GRADIENTS_DIR:-$ROOT/../shared/data/gradients}"
FILE="${1:-$GRADIENTS/digits_cnn_step1.npy}"
STEPS="${2:-30}"
CHUNK=1048576
[[ -f "$FILE" ]] || { echo "service_overhead: no gradient file $FILE (set GCOMP_GRADIENTS_DIR)" >&2; exit 2; }
bazel build //deploy/local:cluster //bench:grpc_echo_bench //:gcomp >&2 || exit 1

raw=$(/usr/bin/python3 -c "import numpy, sys; print(numpy.load(sys.argv[1], mmap_mode='r').size * 4)" "$FILE")
full=$((raw / CHUNK)); rest=$((raw % CHUNK))
sizes() {  # sizes PER_CHUNK_FULL PER_CHUNK_REST: the chunk list of one step
  local list=() i
  for ((i = 0; i < full; ++i)); do list+=("$1"); done
  ((rest > 0)) && list+=("$2")
  local IFS=,; echo "${list[*]}"
}
cluster() {  # cluster MODE -> JSON line
  bazel-bin/deploy/local/cluster --shards 1 --workers 1 --steps "$STEPS" --mode "$1" \
    --chunk_bytes "$CHUNK" --gradients "$FILE" --progress never | tail -1
}
field() { /usr/bin/python3 -c "import json, sys; print(json.loads(sys.argv[1])[sys.argv[2]])" "$1" "$2"; }

none="$(cluster none)"; echo "$none" >&2
echo_raw="$(bazel-bin/bench/grpc_echo_bench --chunk_bytes="$(sizes $CHUNK $rest)" --steps "$STEPS")"
echo "$echo_raw" >&2
nl="$(cluster near-lossless)"; echo "$nl" >&2
# Compressed bytes per step and direction, spread over the chunks by their raw sizes.
wire_nl=$(field "$nl" wire_bytes); steps_done=$(field "$nl" steps)
per_dir=$(/usr/bin/python3 -c "print($wire_nl / 2 / $steps_done)")
scale=$(/usr/bin/python3 -c "print($per_dir / $raw)")
cfull=$(/usr/bin/python3 -c "print(max(1, round($CHUNK * $scale)))")
crest=$(/usr/bin/python3 -c "print(max(1, round($rest * $scale)))")
echo_comp="$(bazel-bin/bench/grpc_echo_bench --chunk_bytes="$(sizes "$cfull" "$crest")" --steps "$STEPS")"
echo "$echo_comp" >&2
bench_out="$(bazel-bin/gcomp bench --repeats 5 "$FILE")"
echo "$bench_out" >&2
read -r enc dec < <(echo "$bench_out" | awk -F'|' '/gcomp near-lossless/ {gsub(/ /,""); print $4, $5; exit}')

/usr/bin/python3 - "$raw" "$none" "$echo_raw" "$nl" "$echo_comp" "$enc" "$dec" <<'PY'
import json, sys
raw = int(sys.argv[1])
none, echo_raw, nl, echo_comp = (json.loads(a) for a in sys.argv[2:6])
enc, dec = float(sys.argv[6]), float(sys.argv[7])
codec_ms = 2 * (raw / (enc * 1e9) + raw / (dec * 1e9)) * 1e3
print(f"gradient {raw / 1e6:.2f} MB, {echo_raw['chunks']} chunks; codec 1 thread: "
      f"encode {enc:.2f} GB/s, decode {dec:.2f} GB/s (4 passes: {codec_ms:.1f} ms)")
print("| mode | service step ms (p50) | baseline ms | of which plain gRPC ms | of which codec ms | service / baseline | target |")
print("| --- | --- | --- | --- | --- | --- | --- |")
b = echo_raw["step_ms_p50"]
print(f"| none | {none['step_ms_p50']:.1f} | {b:.1f} | {b:.1f} | 0 | "
      f"{none['step_ms_p50'] / b:.2f}x | <= 1.3x |")
b = echo_comp["step_ms_p50"] + codec_ms
print(f"| near-lossless (ratio {nl['ratio']:.2f}) | {nl['step_ms_p50']:.1f} | {b:.1f} | "
      f"{echo_comp['step_ms_p50']:.1f} | {codec_ms:.1f} | {nl['step_ms_p50'] / b:.2f}x | <= 1.3x |")
PY
