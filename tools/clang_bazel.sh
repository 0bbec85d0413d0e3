#!/usr/bin/env bash
# Runs Bazel with clang-14 as the C++ compiler, in an output base of its own so that the
# g++ build cache of the main workspace stays warm:
#   tools/clang_bazel.sh build --config=tsan //server/...
# The configs that need clang (tsan, fuzz, thread-safety) are defined in .bazelrc.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
OUTPUT_BASE="${GCOMP_CLANG_OUTPUT_BASE:-$HOME/.cache/bazel-gcomp-clang/$(echo -n "$ROOT" | md5sum | cut -c1-12)}"
cmd="$1"; shift
exec bazel --output_base="$OUTPUT_BASE" "$cmd" --config=clang "$@"
