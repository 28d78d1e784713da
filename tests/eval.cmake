# Tests of the end-to-end benchmarks' pieces: the metrics against golden scores from their Python
# originals (data_scripts/make_eval_metrics_golden.py).
kvlab_test(test_eval_metrics SOURCES eval/test_eval_metrics.cpp LIBS kvlab_eval_metrics LABELS unit)
