// Helpers shared by every test binary.
#pragma once

#include <ATen/ATen.h>

#include <string>

namespace kvlab::test {

// ../shared beside the checkout, or $KVLAB_SHARED.
std::string shared_dir();
// tests/fixtures in the source tree.
std::string fixtures_dir();
// A fresh empty directory under the build tree, unique per call.
std::string temp_dir(const std::string& tag);
// The whole file as a string (empty if it cannot be read).
std::string read_file(const std::string& path);
// The kvlab binary ($KVLAB_BIN, set by CTest).
std::string kvlab_bin();
// Runs a shell command; returns exit code, stdout+stderr in `out`.
int run_command(const std::string& cmd, std::string* out);
// Largest |a-b| / max(|b|, floor) elementwise.
double max_rel_diff(const at::Tensor& a, const at::Tensor& b, double floor = 1e-12);

}  // namespace kvlab::test
