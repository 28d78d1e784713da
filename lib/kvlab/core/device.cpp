#include "kvlab/core/device.h"

#include <ATen/Context.h>

#include "kvlab/core/check.h"

namespace kvlab {

at::Device parse_device(const std::string& name, const std::string& flag) {
  at::Device dev = at::kCPU;
  try {
    dev = at::Device(name);
  } catch (const std::exception&) {
    KVLAB_FAIL("{} '{}' is not a device (expected cpu, cuda or cuda:N)", flag, name);
  }
  KVLAB_CHECK(dev.is_cpu() || dev.is_cuda(), "{} '{}': only cpu and cuda are supported", flag,
              name);
  KVLAB_CHECK(!dev.is_cuda() || at::hasCUDA(), "{} {}: this LibTorch build has no CUDA (or no GPU "
              "is visible); use --device cpu", flag, name);
  return dev;
}

}  // namespace kvlab
