// The --device flag, parsed in one place for every command.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace kvlab {

// "cpu", "cuda", "cuda:1" -> the device; an error naming `flag` for anything else, or for cuda
// when this LibTorch has no CUDA (or sees no GPU).
at::Device parse_device(const std::string& name, const std::string& flag = "--device");

}  // namespace kvlab
