#!/usr/bin/env bash
# Builds the gcomp-ps runtime image with podman and prints its size.
#
#   deploy/image/build.sh [--tag localhost/gcomp:dev] [--base IMAGE]
#
# Binaries: `bazel build $BAZEL_FLAGS` (default -c opt) of gcomp_server, gcomp_worker,
# gcomp and gcomp_admin.
# Base: --base IMAGE (e.g. docker.io/library/debian:12-slim where a registry is reachable),
# else localhost/gcomp-base:bookworm, made once with `debootstrap --variant=minbase` from
# the Debian mirror this machine's apt uses, with the runtime packages included (no
# registry needed). Environment: PODMAN (default "podman"; e.g. "podman --runtime runc"),
# and podman's own CONTAINERS_CONF.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
TAG=localhost/gcomp:dev
BASE=""
while (($#)); do
  case "$1" in
    --tag) TAG="$2"; shift 2 ;;
    --base) BASE="$2"; shift 2 ;;
    *) echo "build.sh: unknown argument '$1' (--tag IMAGE, --base IMAGE)" >&2; exit 2 ;;
  esac
done
read -r -a PODMAN <<< "${PODMAN:-podman}"
PACKAGES=$(grep -v '^#' deploy/image/runtime-packages.txt | xargs)

BINARIES=(server/gcomp_server worker/gcomp_worker gcomp admin/gcomp_admin)
read -r -a BAZEL_FLAGS <<< "${BAZEL_FLAGS--c opt}"
bazel build "${BAZEL_FLAGS[@]}" //server:gcomp_server //worker:gcomp_worker //:gcomp //admin:gcomp_admin
OUT="$(bazel info "${BAZEL_FLAGS[@]}" bazel-bin)"
CONTEXT="$(mktemp -d)"
trap 'rm -rf "$CONTEXT"' EXIT
mkdir -p "$CONTEXT/bin"
mkdir -p "$CONTEXT/lib"
for b in "${BINARIES[@]}"; do
  install -m 0755 "$OUT/$b" "$CONTEXT/bin/"
  strip "$CONTEXT/bin/$(basename "$b")"
  # Libraries from outside Debian's archive (the CUDA runtime, which NVIDIA lets
  # applications ship; the worker loads it, and runs on the CPU without a GPU) go along.
  ldd "$OUT/$b" | awk '$3 ~ /^\// {print $3}' | while read -r lib; do
    case "$lib" in
      /lib/*|/usr/lib/*|/lib64/*) ;;
      *) install -m 0644 "$(readlink -f "$lib")" "$CONTEXT/lib/$(basename "$lib")" ;;
    esac
  done
done

if [[ -z "$BASE" ]]; then
  BASE=localhost/gcomp-base:bookworm
  if ! "${PODMAN[@]}" image exists "$BASE"; then
    MIRROR=$(awk '/^URIs:/ {print $2; exit}' /etc/apt/sources.list.d/debian.sources 2>/dev/null || true)
    [[ -n "$MIRROR" ]] || { echo "build.sh: no Debian mirror in /etc/apt/sources.list.d/debian.sources; pass --base" >&2; exit 2; }
    command -v debootstrap >/dev/null || { echo "build.sh: debootstrap is not installed (apt-get install debootstrap), or pass --base" >&2; exit 2; }
    ROOTFS="$CONTEXT/rootfs"
    echo "build.sh: making $BASE with debootstrap from $MIRROR" >&2
    debootstrap --variant=minbase --include="${PACKAGES// /,}" bookworm "$ROOTFS" "$MIRROR" >"$CONTEXT/debootstrap.log" 2>&1 \
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
  -f deploy/image/Containerfile -t "$TAG" "$CONTEXT" >/dev/null
SIZE=$("${PODMAN[@]}" image inspect "$TAG" --format '{{.Size}}')
echo "image $TAG: $((SIZE / 1000000)) MB (base $BASE)"
