# End-to-end tests of the kvlab binary (built first: ctest runs after the whole build).
kvlab_test(test_cli SOURCES cli/test_cli.cpp LIBS kvlab_core LABELS unit)
add_dependencies(test_cli kvlab)
