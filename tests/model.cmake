# Tests of the model library (weights, tokenizers, forward pass). Keep the list explicit.
kvlab_test(test_model
  SOURCES
    model/test_weights.cpp
    model/test_forward.cpp
    model/test_dump.cpp
    model/test_tokenizer.cpp
    model/test_few_rows.cpp
    model/test_stored_matrix.cpp
  LIBS kvlab_model kvlab_eval
  LABELS unit)
# SmolLM2 vs transformers golden (needs models/smollm2-135m/*.gguf; skips with a message otherwise).
add_test(NAME test_model_smollm2 COMMAND test_model --test-case=*SmolLM2* --no-skip
         WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(test_model_smollm2 PROPERTIES LABELS "model")
# Gemma-3-270M vs transformers golden (needs models/gemma3-270m/*.gguf; skips with a message otherwise).
add_test(NAME test_model_gemma3 COMMAND test_model --test-case=*Gemma-3-270M* --no-skip
         WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(test_model_gemma3 PROPERTIES LABELS "model")
# Qwen2.5-Coder-0.5B-Instruct vs transformers golden, three prompts (issue 48; needs
# models/qwen2.5-coder-0.5b/*.gguf from data_scripts/get_qwen25_coder.sh 0.5b; skips with a message
# otherwise). Label "slow": not in the default run (ctest -LE slow).
add_test(NAME test_model_qwen25 COMMAND test_model --test-case=*Qwen2.5-Coder-0.5B* --no-skip
         WORKING_DIRECTORY ${CMAKE_BINARY_DIR})
set_tests_properties(test_model_qwen25 PROPERTIES LABELS "model;slow" TIMEOUT 1500)
