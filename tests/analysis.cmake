# Tests of the analyses (issue 12): t-SNE, trustworthiness, clusterability, figures.
kvlab_test(test_analysis
  SOURCES analysis/test_tsne.cpp analysis/test_clusterability.cpp analysis/test_figure.cpp
          analysis/test_commands.cpp analysis/test_sweep.cpp
          analysis/test_buzz_steady.cpp
  LIBS kvlab_analysis
  LABELS unit)
add_dependencies(test_analysis kvlab)
