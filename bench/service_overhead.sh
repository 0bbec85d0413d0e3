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
# With ROUNDS > 1 the four runs repeat in that order ROUNDS times, so that a slow stretch of
# a shared machine falls on both sides of a ratio; each round prints its ratios and the
# table shows the medians over the rounds.
#
#   bench/service_overhead.sh [GRADIENT.npy] [STEPS] [ROUNDS]
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
GRADIENTS="${GCOMP_GRADIENTS_DIR:-$ROOT/../shared/data/gradients}"
FILE="${1:-$GRADIENTS/digits_cnn_step1.npy}"
STEPS="${2:-30}"
ROUNDS="${3:-1}"
[[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]] || { echo "service_overhead: ROUNDS must be a positive integer, not '$ROUNDS'" >&2; exit 2; }
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

bench_out="$(bazel-bin/gcomp bench --repeats 5 "$FILE")"
echo "$bench_out" >&2
read -r enc dec < <(echo "$bench_out" | awk -F'|' '/gcomp near-lossless/ {gsub(/ /,""); print $4, $5; exit}')

runs=()  # per round: none, echo of the raw chunks, near-lossless, echo of the compressed chunks
for ((round = 1; round <= ROUNDS; ++round)); do
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
  runs+=("$none" "$echo_raw" "$nl" "$echo_comp")
done

/usr/bin/python3 - "$raw" "$enc" "$dec" "${runs[@]}" <<'PY'
import json, statistics, sys
raw, enc, dec = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
runs = [json.loads(a) for a in sys.argv[4:]]
rounds = [runs[i:i + 4] for i in range(0, len(runs), 4)]
codec_ms = 2 * (raw / (enc * 1e9) + raw / (dec * 1e9)) * 1e3
print(f"gradient {raw / 1e6:.2f} MB, {rounds[0][1]['chunks']} chunks; codec 1 thread: "
      f"encode {enc:.2f} GB/s, decode {dec:.2f} GB/s (4 passes: {codec_ms:.1f} ms)")
rows = []  # per round: none step, raw echo, near-lossless step, compressed echo (ms)
for none, echo_raw, nl, echo_comp in rounds:
    rows.append((none["step_ms_p50"], echo_raw["step_ms_p50"], nl["step_ms_p50"],
                 echo_comp["step_ms_p50"]))
if len(rows) > 1:
    for i, (n, e, l, c) in enumerate(rows, 1):
        print(f"round {i}: none {n:.1f} / {e:.1f} ms = {n / e:.2f}x; near-lossless {l:.1f} / "
              f"({c:.1f} + {codec_ms:.1f}) ms = {l / (c + codec_ms):.2f}x")
    print(f"medians over {len(rows)} rounds:")
med = lambda k: statistics.median(r[k] for r in rows)
none_ratio = statistics.median(r[0] / r[1] for r in rows)
nl_ratio = statistics.median(r[2] / (r[3] + codec_ms) for r in rows)
print("| mode | service step ms (p50) | baseline ms | of which plain gRPC ms | of which codec ms | service / baseline | target |")
print("| --- | --- | --- | --- | --- | --- | --- |")
print(f"| none | {med(0):.1f} | {med(1):.1f} | {med(1):.1f} | 0 | {none_ratio:.2f}x | <= 1.3x |")
print(f"| near-lossless (ratio {rounds[0][2]['ratio']:.2f}) | {med(2):.1f} | "
      f"{med(3) + codec_ms:.1f} | {med(3):.1f} | {codec_ms:.1f} | {nl_ratio:.2f}x | <= 1.3x |")
PY
