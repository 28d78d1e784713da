#include "kvlab/io/capture_hdf5.h"

#include <H5PLpublic.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <vector>

#include "kvlab/core/check.h"
#include "kvlab/io/capture.h"

namespace kvlab {
namespace capture_detail {
namespace {

// What the last failing HDF5 calls said, innermost first. HDF5 calls this auto-report function
// when an API call fails, before returning to the caller; by the time a C++ exception reaches the
// reader's boundary, the handles closed during unwinding have already cleared HDF5's own stack.
thread_local std::string g_last_error;

herr_t collect_message(unsigned n, const H5E_error2_t* err, void* data) {
  auto* parts = static_cast<std::vector<std::string>*>(data);
  if (n < 2 && err && err->desc && *err->desc) parts->emplace_back(err->desc);
  return 0;
}

herr_t record_error(hid_t stack, void* /*client_data*/) {
  if (!g_last_error.empty()) return 0;  // keep the first failure; later ones follow from it
  std::vector<std::string> parts;
  H5Ewalk2(stack, H5E_WALK_UPWARD, collect_message, &parts);
  parts.erase(std::unique(parts.begin(), parts.end()), parts.end());
  std::string line = fmt::format("{}", fmt::join(parts, "; "));
  std::replace(line.begin(), line.end(), '\n', ' ');
  g_last_error = line;
  return 0;
}

}  // namespace

void init_hdf5() {
  static const bool done = [] {
    H5::Exception::dontPrint();  // the first HDF5 call: HDF5 registers its atexit clean-up here
    H5Eset_auto2(H5E_DEFAULT, record_error, nullptr);
    H5PLset_loading_state(0);
    // Runs before HDF5's clean-up (atexit is last in, first out). HDF5 prints "infinite loop
    // closing library" at exit when a failed open left objects it cannot close, unless no
    // auto-report function is set.
    std::atexit([] { H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr); });
    return true;
  }();
  (void)done;
}

std::string take_hdf5_error() {
  std::string s;
  s.swap(g_last_error);
  return s;
}

// float16 is IEEE half (h5py reads it as numpy float16); bfloat16 is stored as a 16-bit HDF5 float
// with bfloat16's layout (sign 15, exponent 7..14, mantissa 0..6, bias 127), which h5py reads
// through HDF5's float conversion (see docs/capture-format.md).
H5::DataType float_file_type(at::ScalarType t) {
  H5::FloatType f(H5::PredType::IEEE_F32LE);
  switch (t) {
    case at::kFloat: return f;
    case at::kHalf:
      f.setFields(15, 10, 5, 0, 10);
      f.setSize(2);
      f.setEbias(15);
      return f;
    case at::kBFloat16:
      f.setFields(15, 7, 8, 0, 7);
      f.setSize(2);
      f.setEbias(127);
      return f;
    default: KVLAB_FAIL("unsupported capture dtype {}", c10::toString(t));
  }
}

H5::StrType fixed_string_type(size_t n) {
  H5::StrType t(H5::PredType::C_S1, std::max<size_t>(n, 1));
  t.setStrpad(H5T_STR_NULLPAD);
  t.setCset(H5T_CSET_UTF8);
  return t;
}

bool is_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t len = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
    if (len == 0 || i + len > s.size()) return false;
    uint32_t cp = len == 1 ? c : c & (0x7f >> len);
    for (size_t j = 1; j < len; ++j) {
      const auto cc = static_cast<unsigned char>(s[i + j]);
      if ((cc >> 6) != 0x2) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += len;
  }
  return true;
}

std::string sample_name(int64_t i) { return fmt::format("sample_{:04d}", i); }
std::string layer_name(int layer) { return fmt::format("layer_{:02d}", layer); }

}  // namespace capture_detail

at::ScalarType parse_storage_dtype(const std::string& name, const std::string& flag) {
  if (name == "float32" || name == "fp32") return at::kFloat;
  if (name == "float16" || name == "fp16") return at::kHalf;
  if (name == "bfloat16" || name == "bf16") return at::kBFloat16;
  KVLAB_FAIL("{}: expected float32, float16 or bfloat16, got '{}'", flag, name);
}

std::string storage_dtype_name(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return "float32";
    case at::kHalf: return "float16";
    case at::kBFloat16: return "bfloat16";
    default: return c10::toString(t);
  }
}

}  // namespace kvlab
