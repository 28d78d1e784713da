// exact — the full cache, no compression. The reference every method is measured against, and
// the ratio-1 limit every method must reproduce.

#include "kvlab/compress/preset.h"
#include "kvlab/compress/compressor.h"

namespace kvlab {
namespace {

class Exact final : public Compressor {
 public:
  explicit Exact(Params p) : params_(p.effective()) { p.finish(); }
  std::string name() const override { return "exact"; }
  nlohmann::json params() const override { return params_; }
  CompressedKV compress(const LayerKV& kv, const CompressOptions&) const override {
    return keep_all(kv);
  }

 private:
  nlohmann::json params_;
};

}  // namespace

std::unique_ptr<Compressor> make_exact(const nlohmann::json& params) {
  return std::make_unique<Exact>(Params(params, "exact"));
}

// Preset "paper": the full cache has no parameters.
MethodPreset paper_preset_exact() { return {nlohmann::json::object(), 0, 0, "the full cache (no parameters)", "", ""}; }

// The registry's entry for this method (compressor.h CompressorInfo).
CompressorInfo method_exact() {
  CompressorInfo m;
  m.name = "exact";
  m.description =
      "full cache, no compression (the reference)";
  m.make = make_exact;
  m.paper = paper_preset_exact;
  m.cost = {std::numeric_limits<double>::quiet_NaN(), "no work (keep_all)",
            "not stated: the identity"};
  return m;
}
}  // namespace kvlab
