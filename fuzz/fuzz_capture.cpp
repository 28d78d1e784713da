// libFuzzer target for the capture reader: arbitrary bytes opened as an HDF5 file image in memory
// (no disk), then what 'kvlab inspect' and 'kvlab replay' do with a capture: the summary, the last
// sample's tokens, one layer read in full with the non-finite check, and one KV head of another
// layer. Any exception other than kvlab::Error, any crash or sanitizer report is a bug; crashes
// inside HDF5 that no check before the call can prevent are kept in fuzz/known_hdf5_crashes/.
#include "kvlab/core/check.h"
#include "kvlab/io/capture.h"

#include <cstddef>
#include <cstdint>

namespace {
// A capture's q/k/v may be unwritten chunks (read as zeros), so a tiny input can describe layers of
// gigabytes that read correctly; reading them would only measure the allocator. Read layers up to
// this size (a real capture's layer is far larger; the checks before the read are the same).
constexpr int64_t kMaxReadBytes = int64_t(16) << 20;
}  // namespace

// HDF5 allocates what corrupted metadata asks for (seen: 3.9e18 bytes in H5C_protect, and 4 to 8 GB
// that it never touches, as the read that follows fails) and treats a NULL from malloc as an error.
// ASan and libFuzzer would report these as crashes or out-of-memory: give NULL from 4,000 MB up
// instead, as a machine that cannot back the request does. (Below libFuzzer's own malloc limit,
// -rss_limit_mb 4096, which flags an allocation of exactly 4 GiB: seen in the 10^6-input run,
// oom_4gib_h5c_protect.h5.)
extern "C" const char* __asan_default_options() { return "allocator_may_return_null=1:max_allocation_size_mb=4000"; }

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const kvlab::CaptureReader r = kvlab::CaptureReader::from_image(data, size, "fuzz.h5");
    (void)kvlab::capture_summary(r).dump();
    const kvlab::CaptureMeta& m = r.meta();
    const int64_t s = r.n_samples() - 1;
    const kvlab::SampleInfo& info = r.sample(s);
    const int64_t layer_bytes = int64_t(m.head_dim) * (m.n_q_heads * info.n_q + 2 * m.n_kv_heads * info.n_tokens) *
                                int64_t(c10::elementSize(kvlab::parse_storage_dtype(m.dtype, "dtype")));
    if (info.n_tokens * 4 <= kMaxReadBytes) (void)r.tokens(s);
    if (layer_bytes <= kMaxReadBytes) {
      const int layer = m.layers.back();
      const kvlab::LayerQKV qkv = r.read_layer(s, layer);  // q [Hq, n_q, d], k, v [Hkv, n, d]
      (void)kvlab::find_nonfinite(qkv, info.q_start);
      (void)r.read_kv_head(0, m.layers.front(), m.n_kv_heads - 1);
      kvlab::check_finite(r, s, layer, qkv);  // throws on NaN/Inf
    }
  } catch (const kvlab::Error&) {
    // Expected for malformed input.
  }
  return 0;
}
