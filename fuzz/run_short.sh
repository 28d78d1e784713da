#!/usr/bin/env bash
# Short fuzzing run (the test-suite one): builds the libFuzzer targets with clang in build-fuzz/
# and runs each for FUZZ_SECONDS (default 20) from the committed seed corpus tests/fixtures/fuzz_corpus/<name>/.
# Usage: fuzz/run_short.sh [fuzzer names...]      (default: every fuzz_* target below)
#        FUZZ_RUNS=1000000 fuzz/run_short.sh      (a fixed number of inputs per target instead)
#        FUZZ_SEED=1 fuzz/run_short.sh            (a fixed random seed: the same inputs, in the same order, everywhere)
# Exit status is non-zero if a fuzzer finds a crash, a sanitizer report or a non-kvlab exception;
# the reproducer is written to build-fuzz/artifacts/<name>/. See fuzz/README.md for the long run.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${KVLAB_FUZZ_BUILD:-$repo/build-fuzz}"
seconds="${FUZZ_SECONDS:-20}"
runs="${FUZZ_RUNS:-}"  # set: run each target for this many inputs instead of FUZZ_SECONDS (the sanitizer label)
seed="${FUZZ_SEED:-}"  # set: libFuzzer's -seed, so the inputs tried are the same sequence on every machine
fuzzers=("$@")
if [[ ${#fuzzers[@]} -eq 0 ]]; then
  mapfile -t fuzzers < <(sed -n 's/^kvlab_fuzzer(\(fuzz_[a-z0-9_]*\) .*/\1/p' "$repo/fuzz/CMakeLists.txt")
fi

if [[ ! -f "$build/build.ninja" ]]; then
  cmake -S "$repo/fuzz" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_COMPILER="${CXX_FUZZ:-clang++}" >/dev/null
fi

# libtorch allocates a few objects at start-up that it never frees; leaks are not what we hunt.
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=0}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1}"
status=0
for f in "${fuzzers[@]}"; do
  # Build each target on its own, so that one that does not build does not stop the others.
  if ! cmake --build "$build" --target "$f" -j "${FUZZ_JOBS:-2}" >"$build/$f.build.log" 2>&1; then
    echo "[fuzz] $f does not build; see $build/$f.build.log" >&2
    tail -n 20 "$build/$f.build.log" >&2
    status=1
    continue
  fi
  work="$build/corpus/$f"            # grows; the committed seeds stay untouched
  art="$build/artifacts/$f/"
  mkdir -p "$work" "$art"
  seeds="$repo/tests/fixtures/fuzz_corpus/$f"
  dict=()
  [[ -f "$repo/fuzz/$f.dict" ]] && dict=(-dict="$repo/fuzz/$f.dict")
  budget=(-max_total_time="$seconds")
  [[ -n "$runs" ]] && budget=(-runs="$runs")
  [[ -n "$seed" ]] && budget+=(-seed="$seed")
  echo "[fuzz] $f for ${runs:-${seconds}s}${runs:+ inputs}" >&2
  if ! "$build/$f" "$work" "$seeds" "${dict[@]}" "${budget[@]}" -max_len=65536 \
       -rss_limit_mb=4096 -artifact_prefix="$art" -print_final_stats=1 2>"$build/$f.log"; then
    echo "[fuzz] $f FAILED; see $build/$f.log and $art" >&2
    tail -n 40 "$build/$f.log" >&2
    status=1
  else
    grep -E "stat::number_of_executed_units|cov:" "$build/$f.log" | tail -n 2 >&2 || true
  fi
done
exit $status
