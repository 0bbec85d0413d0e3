#!/usr/bin/env bash
# Installs every Debian package gcomp-ps needs to build, test and run its examples.
# Idempotent: when everything is present it prints nothing and touches nothing;
# `apt-get update` runs only when something is missing.
set -euo pipefail

PACKAGES=(
  bazel-bootstrap g++ git
  protobuf-compiler protobuf-compiler-grpc libprotobuf-dev libgrpc++-dev
  libabsl-dev libspdlog-dev libfmt-dev libgtest-dev libgmock-dev libbenchmark-dev
  libxxhash-dev libzstd-dev liblz4-dev libyaml-cpp-dev
  pybind11-dev python3-dev python3-numpy python3-pytest python3-yaml
  python3-torch python3-sklearn python3-matplotlib
  python3-venv python3-pip python3-setuptools python3-wheel pkg-config
  iproute2
  prometheus-cpp-dev prometheus openssl
  clang-14 libfuzzer-14-dev libclang-rt-14-dev cmake ninja-build dpkg-dev
  podman runc debootstrap aardvark-dns catatonit python3-grpcio
  etcd-server etcd-client golang-etcd-server-dev
)

missing=()
for pkg in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$pkg")
  fi
done

if ((${#missing[@]} == 0)); then
  exit 0
fi

echo "bootstrap: installing ${missing[*]}" >&2
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "bootstrap: done" >&2
