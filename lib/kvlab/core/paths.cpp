#include "kvlab/core/paths.h"

#include <cstdlib>
#include <filesystem>

namespace kvlab {

std::string shared_default(const std::string& rel) {
  const char* env = std::getenv("KVLAB_SHARED");
  return (env && *env ? std::string(env) : std::string("../shared")) + "/" + rel;
}

std::string shipped_file(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  if (path.empty() || p.is_absolute() || fs::exists(p)) return path;
  const fs::path in_tree = fs::path(KVLAB_REPO_DIR) / p;
  return fs::exists(in_tree) ? in_tree.string() : path;
}

}  // namespace kvlab
