# End-to-end task benchmarks (tasks/): LongEval's scorer and the resumable runner.
kvlab_test(test_tasks SOURCES tasks/test_longeval.cpp LIBS kvlab_tasks LABELS unit)
