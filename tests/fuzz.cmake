# The short fuzzing run (fuzz/run_short.sh: clang + libFuzzer, ~15 s per target) as a test.
# Skipped (exit 77) when clang with libFuzzer is not installed; the long run is in fuzz/README.md.
add_test(NAME fuzz_short
  COMMAND ${CMAKE_COMMAND} -E env FUZZ_SECONDS=15 KVLAB_FUZZ_BUILD=${CMAKE_BINARY_DIR}/fuzz-build
          bash ${CMAKE_SOURCE_DIR}/tests/fuzz_short.sh ${CMAKE_SOURCE_DIR})
set_tests_properties(fuzz_short PROPERTIES LABELS "fuzz" SKIP_RETURN_CODE 77 TIMEOUT 1500)
