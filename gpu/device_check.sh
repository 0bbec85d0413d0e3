#!/usr/bin/env bash
# Device check for the CUDA codec, for a machine with a GPU: builds gpu/ and the benchmark,
# runs the gpu-tagged tests (byte identity with the CPU codec on the grid and the real
# gradients, cross decode, damaged blocks), then the benchmark. Designed to finish in under
# 8 minutes on one H200. Outputs go under $OUT (default: ./device_check_out).
#
#   gpu/device_check.sh [extra bazel options...]
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
OUT="${OUT:-$ROOT/device_check_out}"
mkdir -p "$OUT"
for d in "${GCOMP_GRADIENTS_DIR:-}" "$ROOT/shared/data/gradients" "$ROOT/../shared/data/gradients"; do
  if [[ -n "$d" && -d "$d" ]]; then GCOMP_GRADIENTS_DIR="$(cd "$d" && pwd)"; break; fi
done
export GCOMP_GRADIENTS_DIR="${GCOMP_GRADIENTS_DIR:-}"
JOBS="$(nproc)"
read -ra BAZEL <<<"${BAZEL:-bazel}"  # e.g. BAZEL="bazel --output_base=/tmp/ob"
start=$SECONDS
status=0
step() { echo "== $1 ($((SECONDS - start)) s)" | tee -a "$OUT/summary.txt"; }

step "device"
{ nvidia-smi || echo "nvidia-smi failed"; } >"$OUT/nvidia-smi.txt" 2>&1
head -15 "$OUT/nvidia-smi.txt"
echo "gradients: ${GCOMP_GRADIENTS_DIR:-none}" | tee -a "$OUT/summary.txt"

step "build"
if ! timeout 330 "${BAZEL[@]}" build --jobs="$JOBS" "$@" //gpu/... //bench:gpu_codec_bench \
    //tests:device_push_pull_test \
    >"$OUT/build.log" 2>&1; then
  echo "build FAILED (see build.log)" | tee -a "$OUT/summary.txt"
  tail -30 "$OUT/build.log"
  exit 1
fi

step "gpu tests"
timeout 150 "${BAZEL[@]}" test --jobs="$JOBS" "$@" --test_tag_filters=gpu --test_output=all \
    --test_env=GCOMP_GRADIENTS_DIR="$GCOMP_GRADIENTS_DIR" //gpu/... \
    //tests:device_push_pull_test >"$OUT/test.log" 2>&1
rc=$?
[[ $rc -ne 0 ]] && status=1
echo "gpu tests: exit $rc" | tee -a "$OUT/summary.txt"
if grep -q "SKIPPED \] GpuCodec.GridIsByteIdenticalToCpu" "$OUT/test.log"; then
  echo "gpu tests SKIPPED: no usable device (see test.log); nothing was checked on a GPU" |
    tee -a "$OUT/summary.txt"
  status=1
fi
grep -E "^(//|\[  |Executed)|Skipped|Failure" "$OUT/test.log" | head -40
for log in bazel-testlogs/gpu/*/test.log bazel-testlogs/tests/device_push_pull_test/test.log; do
  [[ -f "$log" ]] && cp "$log" "$OUT/$(basename "$(dirname "$log")").test.log"
done

# The issue's case (64 MiB of f32) with 1 MiB blocks (the codec's default) and 256 KiB blocks
# (4x the CUDA blocks in flight), and 256 MiB with 1 MiB blocks.
for run in "64 1024" "64 256" "256 1024"; do
  read -r mib kib <<<"$run"
  step "benchmark, ${mib} MiB, ${kib} KiB blocks"
  timeout 100 bazel-bin/bench/gpu_codec_bench --mib="$mib" --iters=10 --chunk_kib="$kib" \
      >"$OUT/bench_${mib}m_${kib}k.txt" 2>&1
  rc=$?
  [[ $rc -ne 0 ]] && status=1
  echo "benchmark ${mib} MiB ${kib} KiB: exit $rc" | tee -a "$OUT/summary.txt"
  cat "$OUT/bench_${mib}m_${kib}k.txt"
done

step "done, status $status"
exit "$status"
