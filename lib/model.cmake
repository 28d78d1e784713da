# Files of the model library: weights, tokenizers, forward pass. Keep the list explicit.
set(KVLAB_MODEL_SOURCES
  kvlab/safetensors.cpp
  kvlab/gguf.cpp
  kvlab/model_config.cpp
  kvlab/model.cpp
  kvlab/rope.cpp
  kvlab/weights_loader.cpp
  kvlab/model_tokenizer.cpp
  kvlab/tokenizer.cpp kvlab/tokenizer_load.cpp kvlab/bpe.cpp kvlab/pretokenize.cpp
  kvlab/sentencepiece_model.cpp kvlab/chat_template.cpp kvlab/datasets.cpp
)
if(KVLAB_MODEL_SOURCES)
  kvlab_library(kvlab_model ${KVLAB_MODEL_SOURCES})
  target_link_libraries(kvlab_model PUBLIC kvlab_core)
else()
  add_library(kvlab_model INTERFACE)
  target_link_libraries(kvlab_model INTERFACE kvlab_core)
endif()
# --model names (smollm2-135m, stories260k) resolve relative to the source tree by default.
set_source_files_properties(kvlab/weights_loader.cpp PROPERTIES COMPILE_DEFINITIONS KVLAB_REPO_DIR="${CMAKE_SOURCE_DIR}")
