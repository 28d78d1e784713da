# Tests of the compressors. Keep the list explicit.
kvlab_test(test_compress SOURCES compress/test_baselines.cpp compress/test_buzz.cpp compress/test_chelsea.cpp compress/test_balancekv.cpp compress/test_subgen.cpp compress/test_contract.cpp compress/test_bench_growth.cpp compress/test_balancekv_golden.cpp compress/test_rerotate.cpp compress/test_below_n.cpp LIBS kvlab_replay LABELS unit)
