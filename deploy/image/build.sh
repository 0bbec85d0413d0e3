#!/usr/bin/env bash
# Builds the gcomp-ps runtime image with podman and prints its size; with --train, the
# training image (Containerfile.train: the same binaries plus Python, torch, scikit-learn,
# the gcomp package and the examples) instead; with --etcd, the etcd image of
# deploy/k8s/base (Containerfile.etcd: Debian's etcd and etcdctl, no gcomp binaries).
#
#   deploy/image/build.sh [--train | --etcd] [--tag localhost/gcomp:dev] [--base IMAGE]
#                         [--source URL]
#
# Binaries: `bazel build $BAZEL_FLAGS` (default -c opt) of gcomp_server, gcomp_worker,
# gcomp and gcomp_admin.
# --train also builds the Python extension (//python:_gcomp.so).
# Base: --base IMAGE (e.g. docker.io/library/debian:12-slim where a registry is reachable),
# else localhost/gcomp-base:bookworm (gcomp-train-base with --train, gcomp-etcd-base with
# --etcd), made once with `debootstrap --variant=minbase` from
# the Debian mirror this machine's apt uses, with the runtime packages included (no
# registry needed). A registry base should be pinned by digest
# (debian:12-slim@sha256:...): a tag alone warns, since it can name other bytes tomorrow.
# Labels: org.opencontainers.image.version (//:VERSION), .revision (the git revision, as
# --version prints it) and .source (--source, default the git remote "origin").
# Environment: PODMAN (default "podman"; e.g. "podman --runtime runc"), and podman's own
# CONTAINERS_CONF.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
TAG=""
BASE=""
SOURCE=""
TRAIN=0
ETCD=0
while (($#)); do
  case "$1" in
    --tag) TAG="$2"; shift 2 ;;
    --base) BASE="$2"; shift 2 ;;
    --source) SOURCE="$2"; shift 2 ;;
    --train) TRAIN=1; shift ;;
    --etcd) ETCD=1; shift ;;
    *) echo "build.sh: unknown argument '$1' (--train, --etcd, --tag IMAGE, --base IMAGE, --source URL)" >&2; exit 2 ;;
  esac
done
if ((TRAIN && ETCD)); then
  echo "build.sh: --train and --etcd build different images; give one" >&2
  exit 2
fi
read -r -a PODMAN <<< "${PODMAN:-podman}"
PACKAGES=$(grep -v '^#' deploy/image/runtime-packages.txt | xargs)
TRAIN_PACKAGES=""
ETCD_PACKAGES=""
CONTAINERFILE=deploy/image/Containerfile
DEFAULT_BASE=localhost/gcomp-base:bookworm
if ((TRAIN)); then
  TAG="${TAG:-localhost/gcomp-train:dev}"
  TRAIN_PACKAGES=$(grep -v '^#' deploy/image/train-packages.txt | xargs)
  CONTAINERFILE=deploy/image/Containerfile.train
  DEFAULT_BASE=localhost/gcomp-train-base:bookworm
fi
if ((ETCD)); then
  TAG="${TAG:-localhost/gcomp-etcd:dev}"
  # The etcd image carries none of the runtime libraries.
  PACKAGES=""
  ETCD_PACKAGES=$(grep -v '^#' deploy/image/etcd-packages.txt | xargs)
  CONTAINERFILE=deploy/image/Containerfile.etcd
  DEFAULT_BASE=localhost/gcomp-etcd-base:bookworm
fi
TAG="${TAG:-localhost/gcomp:dev}"

BINARIES=(server/gcomp_server worker/gcomp_worker gcomp admin/gcomp_admin)
read -r -a BAZEL_FLAGS <<< "${BAZEL_FLAGS--c opt}"
TARGETS=(//server:gcomp_server //worker:gcomp_worker //:gcomp //admin:gcomp_admin)
if ((TRAIN)); then TARGETS+=(//python:_gcomp.so); fi
CONTEXT="$(mktemp -d)"
trap 'rm -rf "$CONTEXT"' EXIT
if ((ETCD)); then
  BINARIES=()  # nothing of gcomp-ps goes in: no build
else
  bazel build "${BAZEL_FLAGS[@]}" "${TARGETS[@]}"
  OUT="$(bazel info "${BAZEL_FLAGS[@]}" bazel-bin)"
fi
mkdir -p "$CONTEXT/bin" "$CONTEXT/lib"

# Libraries from outside Debian's archive (the CUDA runtime, which NVIDIA lets
# applications ship; the worker loads it, and runs on the CPU without a GPU) go along.
#   copy_foreign_libs BINARY
copy_foreign_libs() {
  ldd "$1" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
    case "$lib" in
      /lib/*|/usr/lib/*|/lib64/*) ;;
      *) install -m 0644 "$(readlink -f "$lib")" "$CONTEXT/lib/$(basename "$lib")" ;;
    esac
  done
}
for b in "${BINARIES[@]+"${BINARIES[@]}"}"; do
  install -m 0755 "$OUT/$b" "$CONTEXT/bin/"
  strip "$CONTEXT/bin/$(basename "$b")"
  copy_foreign_libs "$OUT/$b"
done
if ((TRAIN)); then
  # The package as `pip install ./python` lays it out: gcomp/ and the _gcomp extension.
  mkdir -p "$CONTEXT/site" "$CONTEXT/examples"
  cp -r python/gcomp "$CONTEXT/site/"
  find "$CONTEXT/site" -name __pycache__ -prune -exec rm -rf {} +
  install -m 0644 "$OUT/python/_gcomp.so" "$CONTEXT/site/"
  strip --strip-unneeded "$CONTEXT/site/_gcomp.so"
  copy_foreign_libs "$OUT/python/_gcomp.so"
  cp examples/*.py "$CONTEXT/examples/"
  rm -f "$CONTEXT"/examples/*_test.py
fi

VERSION=$(tr -d '[:space:]' < VERSION)
REVISION=$(tools/workspace_status.sh | sed -n 's/^STABLE_GCOMP_REVISION //p')
SOURCE="${SOURCE:-$(git remote get-url origin 2>/dev/null || echo unknown)}"
if [[ -n "$BASE" && "$BASE" == */* && "$BASE" != localhost/* && "$BASE" != *@sha256:* ]]; then
  echo "build.sh: warning: --base $BASE is not pinned by digest (add @sha256:...)" >&2
fi
if [[ -z "$BASE" ]]; then
  BASE=$DEFAULT_BASE
  if ! "${PODMAN[@]}" image exists "$BASE"; then
    MIRROR=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [[ -n "$MIRROR" ]] || { echo "build.sh: no Debian mirror in /etc/apt/sources.list.d/debian.sources; pass --base" >&2; exit 2; }
    command -v debootstrap >/dev/null || { echo "build.sh: debootstrap is not installed (apt-get install debootstrap), or pass --base" >&2; exit 2; }
    ROOTFS="$CONTEXT/rootfs"
    echo "build.sh: making $BASE with debootstrap from $MIRROR" >&2
    INCLUDE="$PACKAGES $TRAIN_PACKAGES $ETCD_PACKAGES"
    INCLUDE="$(echo $INCLUDE)"  # one space between names
    debootstrap --variant=minbase --include="${INCLUDE// /,}" bookworm "$ROOTFS" "$MIRROR" >"$CONTEXT/debootstrap.log" 2>&1 \
      || { tail -20 "$CONTEXT/debootstrap.log" >&2; exit 1; }
    # What a runtime image never reads.
    rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
      "$ROOTFS"/usr/share/doc "$ROOTFS"/usr/share/man "$ROOTFS"/usr/share/info "$ROOTFS"/usr/share/locale
    tar -C "$ROOTFS" -c . | "${PODMAN[@]}" import --quiet \
      --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' - "$BASE" >/dev/null
    rm -rf "$ROOTFS"
  fi
fi

"${PODMAN[@]}" build --quiet --build-arg "BASE=$BASE" --build-arg "RUNTIME_PACKAGES=$PACKAGES" \
  --build-arg "TRAIN_PACKAGES=$TRAIN_PACKAGES" --build-arg "ETCD_PACKAGES=$ETCD_PACKAGES" \
  --build-arg "VERSION=$VERSION" --build-arg "REVISION=$REVISION" --build-arg "SOURCE=$SOURCE" -f "$CONTAINERFILE" -t "$TAG" "$CONTEXT" >/dev/null
SIZE=$("${PODMAN[@]}" image inspect "$TAG" --format '{{.Size}}')
echo "image $TAG: $((SIZE / 1000000)) MB (base $BASE)"
