# Tests of the KV-cache quantizers (issue 52) against the goldens of data_scripts/make_quant_golden.py.
kvlab_test(test_quant SOURCES quant/test_fp8.cpp quant/test_affine.cpp quant/test_kivi.cpp quant/test_kv_quantizer.cpp quant/test_hqq.cpp LIBS kvlab_quant LABELS unit)
