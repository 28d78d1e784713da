# Tests of the core library: capture format, exact attention, metrics, config, reports.
kvlab_test(test_core
  SOURCES core/test_attention.cpp core/test_metrics.cpp core/test_capture.cpp core/test_config.cpp
          core/test_report.cpp core/test_memory.cpp core/test_blas.cpp
  LIBS kvlab_io kvlab_attention
  LABELS unit)
