# End-to-end tests of the kvlab binary (built first: ctest runs after the whole build).
kvlab_test(test_cli SOURCES cli/test_cli.cpp cli/test_command.cpp LIBS kvlab_cli kvlab_io LABELS unit)
add_dependencies(test_cli kvlab)
