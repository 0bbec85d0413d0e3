#!/usr/bin/env bash
# The clang passes over concurrency (docs/BUILDING.md, "ThreadSanitizer and lock analysis"):
#   1. every source of the tree compiled with --config=tsan, which includes
#      -Wthread-safety -Wthread-safety-beta -Werror (the lock analysis);
#   2. the server, worker and cross-process tests under ThreadSanitizer, linked against
#      Abseil's locking libraries rebuilt with -fsanitize=thread (tools/build_tsan_absl.sh).
#
#   tests/run_tsan.sh [XML_OUT_DIR]
#
# With XML_OUT_DIR, each TSan test target's report is copied to
# XML_OUT_DIR/<package>/<target>.xml, and what produced no report (a target that failed to
# build, the lock-analysis build) is listed in XML_OUT_DIR/unbuilt.txt, one line each, as
# tests/count_results.py reads them. Exits non-zero on any failure.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
XML_OUT="${1:-}"
status=0
start=$SECONDS

# The tests TSan runs: everything with threads in it that talks gRPC, in or across processes.
TSAN_TARGETS=(
  //tests:tsan_setup_test
  //base:reused_per_thread_test
  //server/...
  //worker/...
  //cluster/...
  //tests:service_test
  //tests:reshard_test
  //tests:failover_test
  //tests:retry_test
  //tests:admin_test
  //tests:large_test
  //tests:cluster_test
  //tests:server_sigterm_test
)

unbuilt() {
  echo "run_tsan: FAILED: $1" >&2
  status=1
  if [[ -n "$XML_OUT" ]]; then
    mkdir -p "$XML_OUT"
    echo "$1" >>"$XML_OUT/unbuilt.txt"
  fi
}

"$ROOT/tools/bootstrap.sh" || { echo "run_tsan: bootstrap failed" >&2; exit 1; }
echo "run_tsan: + tools/build_tsan_absl.sh"
if ! "$ROOT/tools/build_tsan_absl.sh"; then
  unbuilt "tools/build_tsan_absl.sh (Abseil with -fsanitize=thread) failed"
  exit 1
fi

# 1. Lock analysis over the whole tree: every source compiled (not linked: the analysis is a
# compiler pass) in the tsan config, so that step 2 reuses the objects. Patterns name each
# top-level package folder rather than //..., which would also walk the bazel-* links into
# the g++ output base.
patterns=(//:all)
for dir in */; do
  dir="${dir%/}"
  [[ -L "$dir" ]] && continue
  [[ -n "$(find "$dir" \( -name BUILD -o -name BUILD.bazel \) -print -quit)" ]] || continue
  patterns+=("//$dir/...")
done
compile_only=(--config=tsan --keep_going --output_groups=compilation_outputs)
echo "run_tsan: + tools/clang_bazel.sh build ${compile_only[*]} ${patterns[*]}"
if ! tools/clang_bazel.sh build "${compile_only[@]}" "${patterns[@]}"; then
  unbuilt "clang -Wthread-safety build of the tree (tools/clang_bazel.sh build --config=tsan)"
fi
echo "run_tsan: lock analysis done at $((SECONDS - start)) s"

# 2. ThreadSanitizer.
log="$(mktemp)"
trap 'rm -f "$log"' EXIT
test_opts=(--config=tsan --keep_going --test_summary=short)
echo "run_tsan: + tools/clang_bazel.sh test ${test_opts[*]} ${TSAN_TARGETS[*]}"
tools/clang_bazel.sh test "${test_opts[@]}" "${TSAN_TARGETS[@]}" 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
# 3: some tests failed (their reports say which); 4: no test targets; else the build broke.
if [[ $rc -ne 0 ]]; then status=1; fi
if [[ $rc -ne 0 && $rc -ne 3 ]]; then unbuilt "bazel test --config=tsan exited $rc"; fi
testlogs="$(tools/clang_bazel.sh info --config=tsan bazel-testlogs 2>/dev/null)"
echo "run_tsan: test logs in $testlogs"
if [[ -n "$XML_OUT" ]]; then
  grep -E '^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)' "$log" |
    awk '{print $1}' | while read -r target; do
      path="${target#//}"; path="${path/://}"
      mkdir -p "$XML_OUT/$(dirname "$path")"
      if [[ -f "$testlogs/$path/test.xml" ]]; then
        cp "$testlogs/$path/test.xml" "$XML_OUT/$path.xml"
      else
        echo "missing" >"$XML_OUT/$path.xml.missing"
      fi
    done
  grep -E '^//[^ ]+ +(FAILED TO BUILD|NO STATUS)' "$log" | awk '{print $1}' |
    while read -r target; do unbuilt "$target (tsan)"; done
fi
echo "run_tsan: done in $((SECONDS - start)) s; $([[ $status -eq 0 ]] && echo clean || echo FAILED)"
exit $status
