// Where a result came from: version, git SHA (compiled into provenance.cpp only), host, device,
// LibTorch/CUDA versions, build type, UTC time.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace kvlab {

std::string kvlab_version();
std::string git_sha();        // full SHA at build time, "unknown" outside a checkout
bool git_dirty();             // tracked files modified at build time
std::string torch_version();  // e.g. "1.13.0"
bool cuda_available();
std::string cuda_version();   // "none" when LibTorch has no CUDA
std::string build_type();
std::string hostname();
std::string utc_now_iso();    // 2026-11-22T12:00:00Z
std::string utc_stamp();      // 20261122-120000 (for folder names)
std::string describe_device(const std::string& device);  // "cpu (x86_64, 2 threads)" / GPU name

// The BLAS under LibTorch's CPU matmuls: {"name", "threading", "threads"} (core/blas.h).
nlohmann::json blas_json();

// The google/benchmark-style context block of every result.json.
nlohmann::json context_block(const std::string& device, uint64_t seed, const nlohmann::json& config);

}  // namespace kvlab
