kvlab_library(kvlab_core
  kvlab/provenance.cpp
  kvlab/config.cpp
  kvlab/report.cpp
  kvlab/capture.cpp
  kvlab/attention.cpp
  kvlab/metrics.cpp
  kvlab/synthetic.cpp
  kvlab/progress.cpp
  kvlab/text.cpp
  kvlab/aggregate.cpp
  kvlab/fit.cpp
)
add_dependencies(kvlab_core kvlab_git_sha)
target_link_libraries(kvlab_core PUBLIC ${TORCH_LIBRARIES} ${HDF5_LIBRARIES} ${HDF5_CXX_LIBRARIES}
  nlohmann_json::nlohmann_json fmt::fmt-header-only Threads::Threads)
# fmt header-only: LibTorch 2.x ships its own (newer) fmt headers, which would otherwise be
# compiled against Debian's libfmt.so of another version.
target_include_directories(kvlab_core SYSTEM PUBLIC ${HDF5_INCLUDE_DIRS})
target_compile_definitions(kvlab_core PUBLIC ${HDF5_DEFINITIONS}
  KVLAB_VERSION="${PROJECT_VERSION}" KVLAB_BUILD_TYPE="${CMAKE_BUILD_TYPE}")
