# Generation through compressed caches: agreement with replay, ratio 1 against the exact cache,
# one prefill shared by branches.
kvlab_test(test_generate SOURCES generate/test_generate.cpp generate/test_stream.cpp generate/test_kvpress_golden.cpp generate/test_quantized_decode.cpp generate/test_rerotation.cpp LIBS kvlab_generate kvlab_replay LABELS unit)
