#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: installs what it needs, builds, runs.
#
# Today that is the local parameter-server cluster on the shared real gradients: 2 shard
# and 4 worker processes on loopback aggregate them for a few steps with the GComp codec
# (near-lossless), check every result against the uncompressed reference and the codec's
# bound, and print one JSON line. A later issue replaces this with real training.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
tools/bootstrap.sh

GRADIENTS="${GCOMP_GRADIENTS_DIR:-$ROOT/../shared/data/gradients}"
bazel build //deploy/local:cluster
if compgen -G "$GRADIENTS/*.npy" >/dev/null; then
  files=("$GRADIENTS"/*.npy)
else
  echo "demo: no real gradients at $GRADIENTS (set GCOMP_GRADIENTS_DIR);" \
       "using a synthetic gradient-like file instead" >&2
  files=("$(mktemp -d)/synthetic.npy")
  /usr/bin/python3 - "${files[0]}" <<'PY'
import sys, numpy as np
rng = np.random.default_rng(0)
g = (rng.standard_normal(1 << 20) * np.exp(rng.standard_normal(1 << 20) * 2) * 1e-3)
g[rng.random(1 << 20) < 0.3] = 0
np.save(sys.argv[1], g.astype(np.float32))
PY
fi
list="$(IFS=,; echo "${files[*]}")"
echo "demo: local cluster (2 shards, 4 workers, near-lossless) on ${#files[@]} gradient file(s)" >&2
bazel-bin/deploy/local/cluster --shards 2 --workers 4 --steps 3 --mode near-lossless \
  --gradients "$list"
