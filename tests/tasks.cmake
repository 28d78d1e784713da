# End-to-end task benchmarks (tasks/): LongEval, NIAH, LongBench and XSUM scorers, the resumable runner, and
# kvlab niah / longbench / summarize end to end.
kvlab_test(test_tasks SOURCES tasks/test_longeval.cpp tasks/test_niah.cpp tasks/test_longbench.cpp tasks/test_protocol.cpp tasks/test_ruler.cpp LIBS kvlab_tasks LABELS unit)
add_dependencies(test_tasks kvlab)
