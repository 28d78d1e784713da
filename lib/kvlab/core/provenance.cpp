#include "kvlab/core/provenance.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/Context.h>
#include <ATen/Version.h>
#include <torch/version.h>
#include <unistd.h>

#include <chrono>
#include <ctime>

#include "kvlab/core/blas.h"

#include <cstdlib>
#include "kvlab/core/sha256.h"
#include "kvlab_git_sha.h"  // generated at build time: KVLAB_GIT_SHA, KVLAB_GIT_DIRTY

namespace kvlab {

std::string kvlab_version() { return KVLAB_VERSION; }
std::string git_sha() { return KVLAB_GIT_SHA; }
bool git_dirty() { return KVLAB_GIT_DIRTY; }
std::string build_type() { return KVLAB_BUILD_TYPE; }

std::string torch_version() {
  return std::to_string(TORCH_VERSION_MAJOR) + "." + std::to_string(TORCH_VERSION_MINOR) + "." +
         std::to_string(TORCH_VERSION_PATCH);
}

bool cuda_available() { return at::hasCUDA(); }

std::string cuda_version() {
  // The CUDA runtime version LibTorch was built with, when it has CUDA.
  // at::show_config() lists "CUDA Runtime X.Y" in builds with CUDA (1.13 and 2.x alike).
  const std::string cfg = at::show_config();
  const std::string tag = "CUDA Runtime ";
  auto p = cfg.find(tag);
  if (p == std::string::npos) return "none";
  auto e = cfg.find_first_of("\n ", p + tag.size());
  return cfg.substr(p + tag.size(), e - p - tag.size());
}

std::string hostname() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof(buf) - 1) != 0) return "unknown";
  return buf;
}

namespace {
std::string format_utc(const char* fmt) {
  std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[64];
  std::strftime(buf, sizeof(buf), fmt, &tm);
  return buf;
}
}  // namespace

std::string utc_now_iso() { return format_utc("%Y-%m-%dT%H:%M:%SZ"); }
std::string utc_stamp() { return format_utc("%Y%m%d-%H%M%S"); }

std::string describe_device(const std::string& device) {
  if (device.rfind("cuda", 0) == 0) return device + " (CUDA)";
  return "cpu (" + std::to_string(at::get_num_threads()) + " threads)";
}

nlohmann::json blas_json() {
  const BlasInfo b = blas_info();
  return {{"name", b.name}, {"threading", b.threading}, {"threads", b.threads}, {"core", b.core}};
}

nlohmann::json context_block(const std::string& device, uint64_t seed, const nlohmann::json& config) {
  return {{"schema_version", 1},
          {"kvlab_version", kvlab_version()},
          {"git_sha", git_sha()},
          {"git_dirty", git_dirty()},
          {"date", utc_now_iso()},
          {"host", hostname()},
          {"device", describe_device(device)},
          {"torch_version", torch_version()},
          {"cuda_available", cuda_available()},
          {"cuda_version", cuda_version()},
          {"build_type", build_type()},
          {"threads", at::get_num_threads()},
          {"blas", blas_json()},
          {"omp_wait_policy", std::getenv("OMP_WAIT_POLICY") ? std::getenv("OMP_WAIT_POLICY") : "default"},
          {"seed", seed},
          {"config", config},
          {"config_sha256", sha256_hex(config.dump())}};
}

}  // namespace kvlab
