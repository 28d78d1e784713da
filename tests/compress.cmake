# Tests of the compressors. Keep the list explicit.
kvlab_test(test_compress SOURCES compress/test_baselines.cpp compress/test_buzz.cpp compress/test_chelsea.cpp compress/test_balancekv.cpp compress/test_subgen.cpp compress/test_contract.cpp compress/test_bench_growth.cpp compress/test_balancekv_golden.cpp compress/test_rerotate.cpp compress/test_below_n.cpp compress/test_leaderboard.cpp compress/test_held_set.cpp LIBS kvlab_replay LABELS unit)
# A method with a new kind of input added from its own file (issue 49), in its own binary so the
# every-method tests above see kvlab's list alone.
kvlab_test(test_new_method SOURCES compress/test_new_method.cpp LIBS kvlab_cache LABELS unit)
