// Factory functions of every method, one per file in this folder; registry.cpp lists them.
#pragma once

#include <memory>

#include <nlohmann/json.hpp>

#include "kvlab/compress/compressor.h"

namespace kvlab {

std::unique_ptr<Compressor> make_exact(const nlohmann::json& params);
std::unique_ptr<Compressor> make_uniform(const nlohmann::json& params);
std::unique_ptr<Compressor> make_uniform_halving(const nlohmann::json& params);
std::unique_ptr<Compressor> make_streaming_llm(const nlohmann::json& params);
std::unique_ptr<Compressor> make_local(const nlohmann::json& params);
std::unique_ptr<Compressor> make_h2o(const nlohmann::json& params);
std::unique_ptr<Compressor> make_snapkv(const nlohmann::json& params);
std::unique_ptr<Compressor> make_pyramidkv(const nlohmann::json& params);
std::unique_ptr<Compressor> make_cam(const nlohmann::json& params);
std::unique_ptr<Compressor> make_buzz(const nlohmann::json& params);
std::unique_ptr<Compressor> make_buzz_interval(const nlohmann::json& params);
std::unique_ptr<Compressor> make_buzz_logn(const nlohmann::json& params);
std::unique_ptr<Compressor> make_chelsea(const nlohmann::json& params);
std::unique_ptr<Compressor> make_balancekv(const nlohmann::json& params);
std::unique_ptr<Compressor> make_balancekv_mr(const nlohmann::json& params);
std::unique_ptr<Compressor> make_subgen(const nlohmann::json& params);
std::unique_ptr<Compressor> make_clustergen(const nlohmann::json& params);

}  // namespace kvlab
