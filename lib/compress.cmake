# The compressor library: one file per method plus the registry (an explicit table).
kvlab_library(kvlab_compress
  kvlab/replay.cpp
  kvlab/replay_plan.cpp
  kvlab/compress/compressor.cpp
  kvlab/compress/registry.cpp
  kvlab/compress/exact.cpp
  kvlab/compress/uniform.cpp
  kvlab/compress/streaming_llm.cpp
  kvlab/compress/local.cpp
  kvlab/compress/h2o.cpp
  kvlab/compress/snapkv.cpp
  kvlab/compress/pyramidkv.cpp
  kvlab/compress/cam.cpp
  kvlab/compress/buzz.cpp
  kvlab/compress/chelsea.cpp
  kvlab/compress/kcenter.cpp
  kvlab/compress/balancekv.cpp
  kvlab/compress/balancekv_mr.cpp
  kvlab/compress/subgen.cpp
  kvlab/compress/clustergen.cpp
)
target_link_libraries(kvlab_compress PUBLIC kvlab_core)
