# Writes OUT with the git SHA and dirty flag of SRC; touches OUT only when they change,
# so a new commit rebuilds exactly one translation unit.
execute_process(COMMAND git -C ${SRC} rev-parse HEAD OUTPUT_VARIABLE sha
                OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR sha STREQUAL "")
  set(sha "unknown")
endif()
# Dirty = a tracked file outside results/ differs from HEAD: results are outputs, and a long run
# writing into results/ must not mark the binary that writes them as built from unknown code.
execute_process(COMMAND git -C ${SRC} status --porcelain --untracked-files=no -- . ":(exclude)results"
                OUTPUT_VARIABLE status ERROR_QUIET RESULT_VARIABLE rc2)
if(rc2 EQUAL 0 AND NOT status STREQUAL "")
  set(dirty "true")
else()
  set(dirty "false")
endif()
set(content "#pragma once\n#define KVLAB_GIT_SHA \"${sha}\"\n#define KVLAB_GIT_DIRTY ${dirty}\n")
if(EXISTS ${OUT})
  file(READ ${OUT} old)
else()
  set(old "")
endif()
if(NOT old STREQUAL content)
  file(WRITE ${OUT} "${content}")
endif()
