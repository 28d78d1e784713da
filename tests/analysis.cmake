# Tests of the analyses (issue 12): t-SNE and trustworthiness.
kvlab_test(test_analysis
  SOURCES analysis/test_tsne.cpp
  LIBS kvlab_analysis
  LABELS unit)
