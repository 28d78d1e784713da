#!/usr/bin/env bash
# ctest wrapper: skip (77) without clang/libFuzzer, else run every fuzzer briefly.
set -euo pipefail
repo="$1"
if ! command -v clang++ >/dev/null ||
   ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, long){return 0;}' |
     clang++ -x c++ - -fsanitize=fuzzer -o /tmp/kvlab_fuzz_probe.$$ 2>/dev/null; then
  echo "clang++ with libFuzzer not found: fuzz_short skipped (apt-get install clang libclang-rt-14-dev)"
  exit 77
fi
rm -f /tmp/kvlab_fuzz_probe.$$
exec "$repo/fuzz/run_short.sh"
