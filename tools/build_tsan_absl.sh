#!/usr/bin/env bash
# Builds Abseil's synchronization layer from Debian's own source (the exact version of the
# installed libabsl-dev) with clang-14 -fsanitize=thread, as shared libraries with Debian's
# SONAMEs, so that ThreadSanitizer sees absl::Mutex, CondVar and Notification (ours and
# gRPC's, which locks with the same libabsl_synchronization.so.20220623). `--config=tsan` in
# .bazelrc links and rpaths the result; see docs/BUILDING.md ("Why Abseil is rebuilt").
#
#   tools/build_tsan_absl.sh          build once; later runs only check the stamp (quiet)
#   GCOMP_TSAN_JOBS=1 tools/build_tsan_absl.sh   fewer parallel compiles (default: nproc)
#
# Needs root (or sudo) the first time: it adds a deb-src entry for Debian's archive in
# /etc/apt/sources.list.d/gcomp-deb-src.sources and writes under /opt/gcomp-ps.
set -euo pipefail

PREFIX=/opt/gcomp-ps/absl-tsan    # .bazelrc (build:tsan) names this path
# Only the libraries that implement locking are replaced: the mutex and condition variable,
# the spin lock and thread identity under them, the allocator of those per-thread records
# (its lazily made arena must be seen made) and the deadlock detector. The rest of Abseil
# (Status, Cord, strings) stays Debian's build: gRPC hands those objects between its
# threads through its own uninstrumented code, so instrumenting them would only produce
# reports TSan cannot order. Every other Abseil library that takes a SpinLock is here too
# (those whose Debian build imports SpinLock::SlowLock: time, random_internal_pool_urbg,
# cordz_handle, cordz_info, symbolize): the lock's TSan annotations open in the inline
# SpinLockHolder of the caller and close in the instrumented SlowLock, so an uninstrumented
# caller meeting a contended lock (two threads in absl::Now(), or in gRPC's BackOff seeding
# absl's random pool) failed TSan's own CHECK "ignore_sync > 0" and aborted the test.
LIBS=(synchronization graphcycles_internal base spinlock_wait malloc_internal time
      random_internal_pool_urbg cordz_handle cordz_info symbolize)
JOBS="${GCOMP_TSAN_JOBS:-$(nproc)}"
SUDO=""
if [[ $(id -u) -ne 0 ]]; then SUDO="sudo"; fi

for tool in clang-14 clang++-14 cmake ninja dpkg-source; do
  if ! command -v "$tool" >/dev/null; then
    echo "build_tsan_absl: $tool is missing; run tools/bootstrap.sh" >&2
    exit 1
  fi
done

version="$(dpkg-query -W -f='${Version}' libabsl-dev 2>/dev/null || true)"
source_pkg="$(dpkg-query -W -f='${source:Package}' libabsl-dev 2>/dev/null || true)"
if [[ -z "$version" || -z "$source_pkg" ]]; then
  echo "build_tsan_absl: libabsl-dev is not installed; run tools/bootstrap.sh" >&2
  exit 1
fi
# The suppressions for Abseil's internals (TSAN_OPTIONS in .bazelrc names this copy).
supp_src="$(cd "$(dirname "$0")" && pwd)/tsan_suppressions.txt"
if ! cmp -s "$supp_src" "$PREFIX/tsan_suppressions.txt"; then
  $SUDO mkdir -p "$PREFIX"
  $SUDO cp "$supp_src" "$PREFIX/tsan_suppressions.txt"
fi

stamp="$PREFIX/lib/.gcomp-absl-tsan-version"
want="$version ${LIBS[*]}"
if [[ -f "$stamp" && "$(cat "$stamp")" == "$want" ]]; then
  exit 0
fi

echo "build_tsan_absl: building $source_pkg $version with -fsanitize=thread into $PREFIX" >&2

# Debian's source archive: same URIs and suites as the binary entries, as deb-src.
srcs_file=/etc/apt/sources.list.d/gcomp-deb-src.sources
if ! apt-cache showsrc "$source_pkg" 2>/dev/null | grep -qx "Version: $version"; then
  if [[ ! -f "$srcs_file" ]]; then
    if [[ -f /etc/apt/sources.list.d/debian.sources ]]; then
      sed 's/^Types: deb$/Types: deb-src/' /etc/apt/sources.list.d/debian.sources |
        $SUDO tee "$srcs_file" >/dev/null
    else
      codename="$(. /etc/os-release && echo "$VERSION_CODENAME")"
      printf '%s\n' "Types: deb-src" "URIs: http://deb.debian.org/debian" \
        "Suites: $codename $codename-updates" "Components: main" "" \
        "Types: deb-src" "URIs: http://deb.debian.org/debian-security" \
        "Suites: $codename-security" "Components: main" | $SUDO tee "$srcs_file" >/dev/null
    fi
  fi
  $SUDO apt-get update -qq
fi

work="$(mktemp -d /tmp/gcomp-absl-tsan.XXXXXX)"
trap 'rm -rf "$work"' EXIT
cd "$work"
# apt-get source runs dpkg-source, which applies Debian's patches (SONAME, options.h).
apt-get source -qq "$source_pkg=$version" >/dev/null 2>"$work/apt.log" || {
  cat "$work/apt.log" >&2
  echo "build_tsan_absl: could not fetch the source of $source_pkg $version" >&2
  exit 1
}
src="$(find "$work" -mindepth 1 -maxdepth 1 -type d -name "$source_pkg-*" | head -1)"
# The libraries must match the installed headers' ABI (inline namespace, std:: aliases).
if ! cmp -s "$src/absl/base/options.h" /usr/include/absl/base/options.h; then
  echo "build_tsan_absl: $src/absl/base/options.h differs from /usr/include/absl/base/options.h" >&2
  exit 1
fi

# The flags of debian/rules (C++17, shared libraries), plus ThreadSanitizer. Shared
# libraries leave the __tsan_* symbols to the runtime that clang links into each program.
cmake -S "$src" -B "$work/build" -G Ninja -Wno-dev \
  -DCMAKE_C_COMPILER=clang-14 -DCMAKE_CXX_COMPILER=clang++-14 \
  -DCMAKE_CXX_STANDARD=17 -DBUILD_SHARED_LIBS=ON -DBUILD_TESTING=OFF \
  -DCMAKE_BUILD_TYPE=None \
  -DCMAKE_C_FLAGS="-fsanitize=thread -O1 -g -fno-omit-frame-pointer" \
  -DCMAKE_CXX_FLAGS="-fsanitize=thread -O1 -g -fno-omit-frame-pointer" \
  >"$work/cmake.log" 2>&1 || {
  tail -30 "$work/cmake.log" >&2
  exit 1
}
ninja -C "$work/build" -j "$JOBS" "${LIBS[@]}" >"$work/ninja.log" 2>&1 || {
  tail -30 "$work/ninja.log" >&2
  exit 1
}

$SUDO mkdir -p "$PREFIX"
$SUDO rm -rf "$PREFIX/lib.new"
$SUDO mkdir -p "$PREFIX/lib.new"
for lib in "${LIBS[@]}"; do
  built=("$work"/build/absl/*/"libabsl_$lib.so"*)
  if [[ ! -f "${built[0]}" ]]; then
    echo "build_tsan_absl: libabsl_$lib.so was not built" >&2
    exit 1
  fi
  # The file, its SONAME link and the link-time name, all with Debian's names.
  $SUDO cp -a "${built[@]}" "$PREFIX/lib.new/"
done
echo "$want" | $SUDO tee "$PREFIX/lib.new/.gcomp-absl-tsan-version" >/dev/null
$SUDO rm -rf "$PREFIX/lib"
$SUDO mv "$PREFIX/lib.new" "$PREFIX/lib"
echo "build_tsan_absl: $(ls "$PREFIX"/lib/libabsl_*.so.*.*.* | wc -l) libraries in $PREFIX/lib" >&2
