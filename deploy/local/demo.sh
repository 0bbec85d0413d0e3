#!/usr/bin/env bash
# The main job, from a fresh Debian 12 machine: installs what it needs, builds, runs.
#
# Today that is the GComp codec on real gradients: `gcomp bench` compresses each file
# in lossless and near-lossless mode next to zstd and lz4 and prints ratio and speed.
# The local parameter-server cluster replaces this once it exists.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
tools/bootstrap.sh

GRADIENTS="${GCOMP_GRADIENTS_DIR:-$ROOT/../shared/data/gradients}"
bazel build //:gcomp
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
echo "demo: GComp codec vs zstd/lz4 on ${#files[@]} gradient file(s)"
bazel-bin/gcomp bench "${files[@]}"
