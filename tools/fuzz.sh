#!/usr/bin/env bash
# Builds the libFuzzer targets of //fuzz with clang-14 and runs each in turn (docs/FUZZING.md).
#
#   tools/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]       e.g. tools/fuzz.sh 20   (CI)
#   tools/fuzz.sh --runs N [--max-seconds S] [TARGET...]  e.g. tools/fuzz.sh --runs 10000000
#
# Each target fuzzes a scratch copy of fuzz/corpus/<target>/ plus fuzz/regressions/<target>/
# (the repository's corpus is never written), one process at a time, with -timeout=10 and
# -rss_limit_mb=2048. Prints one line per target: result, executions, seconds, exec/s and
# the size of the corpus at the end. Exits 1 if any target crashed, leaked, timed out or ran
# out of memory; its input and log stay in the work folder the output names.
# Environment: GCOMP_FUZZ_WORKDIR (default: a new folder under /tmp), GCOMP_FUZZ_FLAGS (more
# libFuzzer flags), ASAN_OPTIONS (default: a 16 MB quarantine, no allocation stacks).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"

ALL_TARGETS=(codec_block codec_frame wire_block wire_message cluster_config shard_service checkpoint_file)
seconds=20
runs=""
max_seconds=""
targets=()
while (($#)); do
  case "$1" in
    --runs) runs="${2:?--runs needs a count}"; shift 2 ;;
    --max-seconds) max_seconds="${2:?--max-seconds needs a count}"; shift 2 ;;
    -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
    *[!0-9]*)
      found=0
      for t in "${ALL_TARGETS[@]}"; do [[ "$1" == "$t" ]] && found=1; done
      if ((!found)); then
        echo "fuzz.sh: unknown argument or target '$1' (targets: ${ALL_TARGETS[*]})" >&2
        exit 2
      fi
      targets+=("$1"); shift ;;
    *) seconds="$1"; shift ;;
  esac
done
((${#targets[@]})) || targets=("${ALL_TARGETS[@]}")

limit_flags=()
if [[ -n "$runs" ]]; then
  limit_flags+=("-runs=$runs")
  [[ -n "$max_seconds" ]] && limit_flags+=("-max_total_time=$max_seconds")
else
  limit_flags+=("-max_total_time=$seconds")
fi

WORK="${GCOMP_FUZZ_WORKDIR:-$(mktemp -d /tmp/gcomp-fuzz.XXXXXX)}"
mkdir -p "$WORK"
echo "fuzz: building the fuzz targets with clang-14 (log: $WORK/build.log)"
if ! tools/clang_bazel.sh build --config=fuzz //fuzz:all_fuzzers >"$WORK/build.log" 2>&1; then
  grep -v "ld.gold: warning" "$WORK/build.log" | tail -40
  echo "fuzz: build failed" >&2
  exit 1
fi
BIN="$(tools/clang_bazel.sh info --config=fuzz bazel-bin 2>/dev/null)/fuzz"

# ASan's defaults hold 256 MB of freed blocks in quarantine and record a stack for every
# allocation: for the allocation-heavy targets (yaml-cpp builds a tree of shared nodes per
# input) that was half the time and most of the RSS. 16 MB still outlives any one input's
# allocations, so a use after free within an input is caught; a finding's input replays
# with the default options (full allocation stacks) for the report.
export ASAN_OPTIONS="${ASAN_OPTIONS:-quarantine_size_mb=16:malloc_context_size=0}"
failed=0
for t in "${targets[@]}"; do
  dir="$WORK/$t"
  rm -rf "$dir"
  mkdir -p "$dir/corpus"
  cp fuzz/corpus/"$t"/* "$dir/corpus/"
  if [[ -d "fuzz/regressions/$t" ]]; then cp fuzz/regressions/"$t"/* "$dir/corpus/"; fi
  # shard_service's inputs reach thousands of features each: the entropic scheduler's
  # per-feature bookkeeping then took half the time (about 400 against 1,100 exec/s).
  target_flags=()
  [[ "$t" == shard_service ]] && target_flags+=(-entropic=0)
  start=$(date +%s)
  set +e
  # shellcheck disable=SC2086  # GCOMP_FUZZ_FLAGS is a list of flags
  (cd "$dir" && "$BIN/${t}_fuzz" "${limit_flags[@]}" "${target_flags[@]}" -timeout=10 -rss_limit_mb=2048 \
      -print_final_stats=1 -artifact_prefix="$dir/" ${GCOMP_FUZZ_FLAGS:-} corpus) \
      >"$dir/fuzz.log" 2>&1
  rc=$?
  set -e
  elapsed=$(($(date +%s) - start))
  executed=$(sed -n 's/^stat::number_of_executed_units: *//p' "$dir/fuzz.log" | tail -1)
  speed=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$dir/fuzz.log" | tail -1)
  corpus=$(find "$dir/corpus" -type f | wc -l)
  artifacts=$(find "$dir" -maxdepth 1 -type f \( -name 'crash-*' -o -name 'leak-*' \
      -o -name 'timeout-*' -o -name 'oom-*' \) | sort)
  # A slow unit (over 10 s, yet under -timeout, which would have failed the run) is most
  # often a stall of a loaded machine: it is named for a replay, not counted as a failure.
  slow=$(find "$dir" -maxdepth 1 -type f -name 'slow-unit-*' | sort)
  if ((rc == 0)) && [[ -z "$artifacts" ]]; then
    result=ok
  else
    result=FAILED
    failed=1
  fi
  printf 'fuzz %-15s %-6s runs=%s seconds=%s exec/s=%s corpus=%s\n' "$t" "$result" \
      "${executed:-?}" "$elapsed" "${speed:-?}" "$corpus"
  if [[ -n "$slow" ]]; then
    echo "  slow unit (replay it: \"$BIN/${t}_fuzz\" FILE, to tell a slow input from a stall): $slow"
  fi
  if [[ "$result" == FAILED ]]; then
    echo "  exit status $rc; log $dir/fuzz.log; inputs: ${artifacts:-none}"
    grep -E "ERROR|SUMMARY|violated|runtime error" "$dir/fuzz.log" | head -5 | sed 's/^/  /' \
        || true
  fi
done
echo "fuzz: work folder $WORK"
exit "$failed"
