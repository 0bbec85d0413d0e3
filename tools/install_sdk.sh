#!/usr/bin/env bash
# Builds the C++ SDK and installs it under PREFIX for programs built without Bazel:
#   PREFIX/include/gcomp/client.h          the one public header
#   PREFIX/lib/libgcomp_client.so.0        the library (soname), and libgcomp_client.so
#   PREFIX/lib/pkgconfig/gcomp-client.pc   for pkg-config
# then: g++ -std=c++17 app.cc $(PKG_CONFIG_PATH=PREFIX/lib/pkgconfig pkg-config --cflags --libs gcomp-client)
#
#   tools/install_sdk.sh PREFIX
set -euo pipefail
if [[ $# -ne 1 ]]; then
  echo "usage: tools/install_sdk.sh PREFIX" >&2
  exit 2
fi
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
mkdir -p "$1"
PREFIX="$(cd "$1" && pwd)"
cd "$ROOT"
bazel build //sdk:libgcomp_client.so >&2
BIN="$(bazel info bazel-bin 2>/dev/null)"
install -D -m 0644 sdk/include/gcomp/client.h "$PREFIX/include/gcomp/client.h"
install -D -m 0755 "$BIN/sdk/libgcomp_client.so" "$PREFIX/lib/libgcomp_client.so.0"
ln -sf libgcomp_client.so.0 "$PREFIX/lib/libgcomp_client.so"
mkdir -p "$PREFIX/lib/pkgconfig"
# The library links gRPC, protobuf, Abseil, yaml-cpp, spdlog and prometheus-cpp as Debian's
# shared libraries (and the CUDA 13 runtime, for device buffers); a program needs none of
# their headers, so they are private requirements. The rpath finds the library without
# LD_LIBRARY_PATH.
cat >"$PREFIX/lib/pkgconfig/gcomp-client.pc" <<PC
prefix=$PREFIX
libdir=\${prefix}/lib
includedir=\${prefix}/include

Name: gcomp-client
Description: gcomp-ps worker client: push-pull of gradient tensors to the shards
Version: 0.1.0
Requires.private: grpc++ protobuf yaml-cpp
Libs: -L\${libdir} -Wl,-rpath,\${libdir} -lgcomp_client
Cflags: -I\${includedir}
PC
echo "install_sdk: $PREFIX (include/gcomp/client.h, lib/libgcomp_client.so.0, lib/pkgconfig/gcomp-client.pc)" >&2
