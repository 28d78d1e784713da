# `kvlab run` end to end: the smoke experiment file (synth + replay over every method) into a
# temporary directory; checks exit 0, result.json "complete": true, the capture cache on a second
# run, and that bad run files fail naming the key / step. See run_smoke_check.cmake.
add_test(NAME cli_run_smoke
  COMMAND ${CMAKE_COMMAND} -DKVLAB=$<TARGET_FILE:kvlab>
          -DRUN_FILE=${CMAKE_SOURCE_DIR}/configs/smoke/replay_synthetic.json
          -DWORK=${CMAKE_BINARY_DIR}/test_tmp/cli_run_smoke
          -P ${CMAKE_CURRENT_SOURCE_DIR}/run_smoke_check.cmake)
set_tests_properties(cli_run_smoke PROPERTIES LABELS "unit;cli" TIMEOUT 300)
