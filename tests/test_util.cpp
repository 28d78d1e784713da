#include "test_util.h"

#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace kvlab::test {

std::string shared_dir() {
  if (const char* s = std::getenv("KVLAB_SHARED"); s && *s) return s;
  return std::string(KVLAB_SOURCE_DIR) + "/../shared";
}

std::string fixtures_dir() { return std::string(KVLAB_SOURCE_DIR) + "/tests/fixtures"; }

std::string temp_dir(const std::string& tag) {
  static std::atomic<int> counter{0};
  namespace fs = std::filesystem;
  fs::path p = fs::path(KVLAB_BINARY_DIR) / "test_tmp" /
               (tag + "_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
  fs::remove_all(p);
  fs::create_directories(p);
  return p.string();
}

std::string kvlab_bin() {
  if (const char* s = std::getenv("KVLAB_BIN"); s && *s) return s;
  return std::string(KVLAB_BINARY_DIR) + "/apps/kvlab";
}

int run_command(const std::string& cmd, std::string* out) {
  std::string full = cmd + " 2>&1";
  FILE* pipe = ::popen(full.c_str(), "r");
  if (!pipe) return -1;
  std::array<char, 4096> buf;
  std::string s;
  while (size_t n = std::fread(buf.data(), 1, buf.size(), pipe)) s.append(buf.data(), n);
  int status = ::pclose(pipe);
  if (out) *out = s;
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

double max_rel_diff(const at::Tensor& a, const at::Tensor& b, double floor) {
  auto ad = a.to(at::kDouble), bd = b.to(at::kDouble);
  auto denom = bd.abs().clamp_min(floor);
  return ((ad - bd).abs() / denom).max().item<double>();
}

std::string read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace kvlab::test
