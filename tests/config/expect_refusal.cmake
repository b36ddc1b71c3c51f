# Runs dscpp_report --config INPUT --world-size WORLD and passes when it exits 2 (a config
# error, not a crash: a signal gives no exit code here) with a message matching EXPECT.
execute_process(COMMAND ${REPORT} --config ${INPUT} --world-size ${WORLD}
  RESULT_VARIABLE rc OUTPUT_QUIET ERROR_VARIABLE err)
if(NOT rc STREQUAL "2")
  message(FATAL_ERROR "expected exit code 2, got '${rc}'; stderr:\n${err}")
endif()
if(NOT err MATCHES "dscpp: config error: .*${EXPECT}")
  message(FATAL_ERROR "stderr does not match '${EXPECT}':\n${err}")
endif()
