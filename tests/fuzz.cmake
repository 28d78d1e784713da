# The short fuzzing run (fuzz/run_short.sh: clang + libFuzzer, ~15 s per target) as a test.
# Skipped (exit 77) when clang with libFuzzer is not installed; the long run is in fuzz/README.md.
# A fixed seed: every machine tries the same inputs in the same order (a slower one a prefix of
# them), so what fails in CI fails the same way here; new inputs are the long runs' job, which draw
# a fresh seed each time (CI found oom_tiny_chunks.h5's class with a fresh seed, input not kept).
add_test(NAME fuzz_short
  COMMAND ${CMAKE_COMMAND} -E env FUZZ_SECONDS=15 FUZZ_SEED=1 KVLAB_FUZZ_BUILD=${CMAKE_BINARY_DIR}/fuzz-build
          bash ${CMAKE_SOURCE_DIR}/tests/fuzz_short.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(fuzz_short PROPERTIES LABELS "fuzz" SKIP_RETURN_CODE 77 TIMEOUT 1500)

# Every fuzzer (ASan + UBSan, as all of them are built) for 10^6 inputs each: issue 14's sanitizer
# run, about 25 minutes on 2 cores (fuzz_capture is the slow one). Label "slow": not in the default
# test run; `ctest -L sanitizers` runs it. The figures of the last run are in fuzz/README.md.
add_test(NAME fuzz_sanitizers_1e6
  COMMAND ${CMAKE_COMMAND} -E env FUZZ_RUNS=1000000 KVLAB_FUZZ_BUILD=${CMAKE_BINARY_DIR}/fuzz-build
          bash ${CMAKE_SOURCE_DIR}/tests/fuzz_short.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(fuzz_sanitizers_1e6 PROPERTIES LABELS "fuzz;slow;sanitizers" SKIP_RETURN_CODE 77 TIMEOUT 7200)
