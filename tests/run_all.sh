#!/usr/bin/env bash
# Every test of the project: the Bazel suite (GPU tests excluded; they skip without a
# device anyway), the sanitizer pass over the pure C++ layers, the Python tests, the clang
# passes (lock analysis, ThreadSanitizer) and a short run of every fuzz target.
# Ends with one line "N passed, N failed, N skipped" counted from the test reports.
#
# Real gradients: set GCOMP_GRADIENTS_DIR, or keep the shared data at
# ../shared/data/gradients beside the checkout; tests that need them skip otherwise.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

"$ROOT/tools/bootstrap.sh" || { echo "bootstrap failed"; exit 1; }

if [[ -z "${GCOMP_GRADIENTS_DIR:-}" && -d "$ROOT/../shared/data/gradients" ]]; then
  GCOMP_GRADIENTS_DIR="$(cd "$ROOT/../shared/data/gradients" && pwd)"
fi
export GCOMP_GRADIENTS_DIR="${GCOMP_GRADIENTS_DIR:-}"
if [[ -z "$GCOMP_GRADIENTS_DIR" ]]; then
  echo "note: GCOMP_GRADIENTS_DIR unset and ../shared/data/gradients absent;" \
       "tests on real gradients will skip"
fi

REPORT_DIR="$(mktemp -d)"
trap 'rm -rf "$REPORT_DIR"' EXIT
status=0

# Runs one `bazel test` invocation and copies each target's test.xml aside, so that
# a later invocation (another config) cannot overwrite what this one reported.
#   run_bazel_tests LABEL "BAZEL OPTIONS" TARGET...
run_bazel_tests() {
  local label="$1" opts="$2"; shift 2
  local log="$REPORT_DIR/$label.log"
  # shellcheck disable=SC2086  # opts is a word list on purpose
  bazel test $opts --test_env=GCOMP_GRADIENTS_DIR --test_summary=short "$@" 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  # rc 4 = "no test targets" is not a failure of the suite itself.
  if [[ $rc -ne 0 && $rc -ne 4 ]]; then status=1; fi
  # 3 = some tests failed (counted from their reports below); anything else means the
  # build itself broke, which counts as one failure so the summary cannot read clean.
  if [[ $rc -ne 0 && $rc -ne 3 && $rc -ne 4 ]]; then
    mkdir -p "$REPORT_DIR/xml/$label"
    echo "bazel test ($label) exited $rc" >> "$REPORT_DIR/xml/$label/unbuilt.txt"
  fi
  local testlogs
  testlogs="$(bazel info $opts bazel-testlogs 2>/dev/null)"  # shellcheck disable=SC2086
  grep -E '^//[^ ]+ +(\(cached\) )?(PASSED|FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)' "$log" \
    | awk '{print $1}' | while read -r target; do
      local path="${target#//}"; path="${path/://}"
      local xml="$testlogs/$path/test.xml"
      local dest="$REPORT_DIR/xml/$label/$path.xml"
      mkdir -p "$(dirname "$dest")"
      if [[ -f "$xml" ]]; then cp "$xml" "$dest"; else echo "missing" > "$dest.missing"; fi
    done
  grep -E '^//[^ ]+ +(FAILED TO BUILD|NO STATUS)' "$log" | awk '{print $1}' \
    | while read -r target; do
      mkdir -p "$REPORT_DIR/xml/$label"
      echo "$target" >> "$REPORT_DIR/xml/$label/unbuilt.txt"
    done
}

run_bazel_tests main "" //...
# Codec and base are pure C++: run them again under ASan + UBSan.
run_bazel_tests asan "--config=asan" //codec/... //base/...

# Python tests (pytest from Debian, run by the system interpreter that has torch).
# `bazel test` builds only test targets, so build what they import and launch first: the
# extension and the shard binary. Tests that need them skip (with the reason) if this fails.
if ! bazel build //python:_gcomp.so //server:gcomp_server; then
  status=1
  mkdir -p "$REPORT_DIR/xml/python"
  echo "bazel build of the Python extension or gcomp_server failed" >> "$REPORT_DIR/xml/python/unbuilt.txt"
fi
if compgen -G "python/**/*_test.py" >/dev/null || compgen -G "python/tests/*.py" >/dev/null \
   || compgen -G "examples/*_test.py" >/dev/null || compgen -G "bench/*_test.py" >/dev/null; then
  PYTHONPATH="$ROOT/python:$ROOT/bazel-bin/python:${PYTHONPATH:-}" \
    /usr/bin/python3 -m pytest -q -p no:cacheprovider --junitxml="$REPORT_DIR/xml/pytest.xml" \
    python examples bench deploy/k8s deploy/image sdk 2>&1
  rc=$?
  if [[ $rc -ne 0 && $rc -ne 5 ]]; then status=1; fi
fi

# clang passes: the lock analysis (-Wthread-safety) over the tree and ThreadSanitizer over the
# server, worker and cross-process tests (docs/BUILDING.md).
"$ROOT/tests/run_tsan.sh" "$REPORT_DIR/xml/tsan" || status=1

# Every libFuzzer target for a short fixed time (the long campaign: docs/FUZZING.md). One
# report case per target; a build failure counts as one failure.
GCOMP_FUZZ_WORKDIR="$REPORT_DIR/fuzz" "$ROOT/tools/fuzz.sh" "${GCOMP_FUZZ_SECONDS:-20}" 2>&1 \
  | tee "$REPORT_DIR/fuzz.log"
[[ ${PIPESTATUS[0]} -eq 0 ]] || status=1
/usr/bin/python3 - "$REPORT_DIR/fuzz.log" "$REPORT_DIR/xml/fuzz" <<'PY'
import pathlib, sys
from xml.sax.saxutils import escape, quoteattr
log, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
out.mkdir(parents=True, exist_ok=True)
lines = [l.split() for l in log.read_text().splitlines() if l.startswith("fuzz ") and len(l.split()) > 3]
if not lines:
    (out / "unbuilt.txt").write_text("fuzz targets did not build or run (see the log above)\n")
    sys.exit(0)
cases = []
for words in lines:
    name, result, detail = words[1], words[2], " ".join(words[3:])
    body = "" if result == "ok" else "<failure message=%s/>" % quoteattr(detail)
    cases.append("<testcase classname=\"fuzz\" name=%s>%s</testcase>" % (quoteattr(name), body))
(out / "fuzz.xml").write_text("<testsuites><testsuite name=\"fuzz\">%s</testsuite></testsuites>\n"
                             % "".join(cases))
PY

/usr/bin/python3 "$ROOT/tests/count_results.py" "$REPORT_DIR/xml" || status=1
exit $status
