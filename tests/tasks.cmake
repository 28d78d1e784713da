# End-to-end task benchmarks (tasks/): LongEval's and NIAH's scorers, the resumable runner, kvlab niah.
kvlab_test(test_tasks SOURCES tasks/test_longeval.cpp tasks/test_niah.cpp LIBS kvlab_tasks LABELS unit)
add_dependencies(test_tasks kvlab)
