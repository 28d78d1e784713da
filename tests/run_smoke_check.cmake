# cmake -DKVLAB=... -DRUN_FILE=... -DWORK=... -P run_smoke_check.cmake (registered in run.cmake)
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

function(kvlab_run expect_ok out_var)
  execute_process(COMMAND "${KVLAB}" --threads 1 run ${ARGN} WORKING_DIRECTORY "${WORK}"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(expect_ok AND NOT rc EQUAL 0)
    message(FATAL_ERROR "kvlab run ${ARGN}: exit ${rc}\n${out}\n${err}")
  elseif(NOT expect_ok AND rc EQUAL 0)
    message(FATAL_ERROR "kvlab run ${ARGN}: expected failure, got exit 0\n${out}\n${err}")
  endif()
  set(${out_var} "${out}\n${err}" PARENT_SCOPE)
endfunction()

# 1. The smoke experiment runs and its replay result is complete.
kvlab_run(TRUE log "${RUN_FILE}" --results-dir "${WORK}/results")
file(GLOB_RECURSE results "${WORK}/results/*/result.json")
list(LENGTH results n)
if(NOT n EQUAL 1)
  message(FATAL_ERROR "expected one result.json under ${WORK}/results, found ${n}: ${results}\n${log}")
endif()
file(READ "${results}" json)
string(JSON complete GET "${json}" complete)
if(NOT complete)
  message(FATAL_ERROR "${results}: \"complete\" is ${complete}")
endif()
string(JSON n_rows LENGTH "${json}" rows)
if(n_rows LESS 1)
  message(FATAL_ERROR "${results}: no rows")
endif()
if(NOT EXISTS "${WORK}/captures/smoke_synthetic.h5.config.json")
  message(FATAL_ERROR "no sidecar config next to the synth capture")
endif()

# 2. A second run reuses the capture (same config) and --dry-run prints without running.
kvlab_run(TRUE log "${RUN_FILE}" --results-dir "${WORK}/results" --dry-run)
if(NOT log MATCHES "skipped: output exists with the same config" OR NOT log MATCHES "replay --config")
  message(FATAL_ERROR "dry run: expected the synth step skipped and the replay command printed:\n${log}")
endif()

# 3. Bad run files fail with a message naming the key / the step.
file(WRITE "${WORK}/bad_key.json" [=[{"name": "x", "stpes": []}]=])
kvlab_run(FALSE log "${WORK}/bad_key.json")
if(NOT log MATCHES "unknown key 'stpes'")
  message(FATAL_ERROR "unknown top-level key: message does not name it:\n${log}")
endif()
file(WRITE "${WORK}/bad_cmd.json"
     [=[{"steps": [{"command": "synth", "config": {"out": "a.h5"}}, {"command": "replya", "config": {}}]}]=])
kvlab_run(FALSE log "${WORK}/bad_cmd.json")
if(NOT log MATCHES "steps\\[1\\]")
  message(FATAL_ERROR "unknown command: message does not name the step index:\n${log}")
endif()
file(WRITE "${WORK}/bad_step_key.json"
     [=[{"steps": [{"command": "synth", "config": {"out": "a.h5", "tokns": 5}}]}]=])
kvlab_run(FALSE log "${WORK}/bad_step_key.json")
if(NOT log MATCHES "tokns")
  message(FATAL_ERROR "unknown step config key: message does not name it:\n${log}")
endif()

# 4. A capture step never replaces a file kvlab did not make (issue 50: a synth step aimed at a user's
#    file replaced it, exit 0): refused, the file untouched; with "overwrite": true in its config it may.
file(WRITE "${WORK}/users_file.jsonl" "a user's data, not a capture\n")
file(WRITE "${WORK}/clobber.json"
     [=[{"steps": [{"command": "synth", "config": {"out": "users_file.jsonl", "kind": "random", "tokens": 64,
        "queries": 8, "layers": 1, "q_heads": 2, "kv_heads": 1, "head_dim": 8, "seed": 0}}]}]=])
kvlab_run(FALSE log "${WORK}/clobber.json")
file(READ "${WORK}/users_file.jsonl" after)
if(NOT after STREQUAL "a user's data, not a capture\n")
  message(FATAL_ERROR "a synth step replaced a file it did not make:\n${log}")
endif()
if(NOT log MATCHES "overwrite")
  message(FATAL_ERROR "the refusal does not say how to replace the file (overwrite):\n${log}")
endif()
file(WRITE "${WORK}/clobber_ok.json"
     [=[{"steps": [{"command": "synth", "config": {"out": "users_file.jsonl", "overwrite": true, "kind": "random",
        "tokens": 64, "queries": 8, "layers": 1, "q_heads": 2, "kv_heads": 1, "head_dim": 8, "seed": 0}}]}]=])
kvlab_run(TRUE log "${WORK}/clobber_ok.json")
file(READ "${WORK}/users_file.jsonl" after)
if(after STREQUAL "a user's data, not a capture\n")
  message(FATAL_ERROR "\"overwrite\": true in the step's config did not replace the file:\n${log}")
endif()
