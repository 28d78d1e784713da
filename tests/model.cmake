# Tests of the model library (weights, tokenizers, forward pass). Keep the list explicit.
kvlab_test(test_model
  SOURCES
    model/test_weights.cpp
    model/test_tokenizer.cpp
  LIBS kvlab_model
  LABELS unit)
