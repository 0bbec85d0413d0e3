#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: installs what it needs, builds, runs.
#
# Real training through the parameter server: the digits CNN (scikit-learn's 8x8 digits,
# 30% held out) is trained by 2 worker processes through 2 local gcomp_server shards three
# times with the same seed (uncompressed, GComp lossless, GComp near-lossless); the
# comparison prints a Markdown table with the targets checked and writes a loss plot.
# DEMO_STEPS (default 200) shortens or lengthens the runs.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
tools/bootstrap.sh

bazel build //python:_gcomp.so //server:gcomp_server
OUT="${DEMO_OUT:-$ROOT/out/demo}"
echo "demo: digits CNN, 2 workers, 2 shards, modes none / lossless / near-lossless" >&2
PYTHONPATH="$ROOT/python:$ROOT/bazel-bin/python${PYTHONPATH:+:$PYTHONPATH}" \
  /usr/bin/python3 examples/compare.py --example digits --workers 2 --shards 2 \
  --steps "${DEMO_STEPS:-200}" --out-dir "$OUT"
