// Re-rotation while decoding (cache/rerotation.h, `ppl --rerotate`), checked against the official
// codes' own formulation (StreamingLLM's and BUZZ's: keys kept before RoPE, each rotated by its
// slot 0 .. m−1 in the cache, the new token's query by its slot), written out here from raw
// (pre-RoPE) vectors: after every step each held key equals its raw key rotated once to its slot
// (up to a shift that logits do not see), so the logits of the next query equal the official ones;
// without eviction nothing moves; a method that cannot is refused before any work.
#include <doctest/doctest.h>

#include <ATen/ATen.h>
#include <c10/core/InferenceMode.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <optional>

#include "kvlab/attention/rope.h"
#include "kvlab/cache/rerotation.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/core/check.h"
#include "kvlab/generate/branches.h"
#include "kvlab/generate/ppl.h"
#include "kvlab/model/model.h"
#include "kv_entries.h"
#include "test_util.h"

using namespace kvlab;
namespace fs = std::filesystem;

namespace {

// x [H, n, d] rotated to position p (one position for every row).
at::Tensor at_position(const at::Tensor& x, int64_t p, const at::Tensor& inv_freq) {
  return rotate_by(x, at::full({x.size(0), x.size(1)}, p, at::kLong), inv_freq);
}

// Each entry's rank among a head's held positions (its slot in the official codes' cache). pos [m].
std::vector<int64_t> slots(const at::Tensor& pos) {
  const auto p = pos.contiguous();
  std::vector<int64_t> v(p.data_ptr<int64_t>(), p.data_ptr<int64_t>() + p.numel()), order(v);
  std::sort(order.begin(), order.end());
  std::vector<int64_t> out;
  for (int64_t x : v) out.push_back(std::lower_bound(order.begin(), order.end(), x) - order.begin());
  return out;
}

// Every decode step's keys as the model cached them (true positions n, n+1, ...): [layer][step] -> [Hkv, 1, d].
struct KeyTap : QkvTap {
  std::vector<std::vector<at::Tensor>> k;
  explicit KeyTap(int n_layers) : k(size_t(n_layers)) {}
  void on_qkv(int layer, const at::Tensor&, const at::Tensor& kk, const at::Tensor&) override {
    k[size_t(layer)].push_back(kk.clone());
  }
};

// stories260K, or nothing (the test then says it skipped).
std::optional<Model> stories260k() {
  const std::string dir = test::shared_dir() + "/models/stories260K";
  if (!fs::exists(dir + "/model.safetensors")) {
    MESSAGE("skipped: " << dir << " not found (set KVLAB_SHARED)");
    return std::nullopt;
  }
  return load_model(dir);
}

}  // namespace

TEST_CASE("rerotation: held keys sit at their cache slots, as the official codes rotate them") {
  c10::InferenceMode guard;
  const int64_t h_kv = 2, h_q = 4, d = 16, steps = 60;
  const at::Tensor inv_freq = rope_inv_freq(10000.0, d, RopeScaling{});
  for (const std::string name : {"streaming_llm", "local", "h2o", "buzz"}) {
    for (const int64_t cap : {int64_t(12), int64_t(20)}) {
      INFO("method=" << name << " cache=" << cap);
      at::manual_seed(7);
      LayerKV empty;
      empty.keys = empty.values = at::zeros({h_kv, 0, d});
      CompressOptions co;
      co.budget = Budget::of_entries(cap);
      auto stream = make_compressor(name, nlohmann::json::object())->start_stream(empty, co);
      REQUIRE(stream);
      Rerotation rr(inv_freq, name);
      std::map<int64_t, at::Tensor> raw_k;  // position -> [Hkv, 1, d] before RoPE
      bool evicted = false;
      for (int64_t t = 0; t < steps; ++t) {
        const at::Tensor kraw = at::randn({h_kv, 1, d}), qraw = at::randn({h_q, 1, d});
        raw_k[t] = kraw;
        const int64_t m_before = stream->held().keys.size(1);  // held before this token: its slot
        // The model's keys and query are rotated at the true position t.
        stream->push(at_position(kraw, t, inv_freq), at::randn({h_kv, 1, d}), t);
        const KVSet& held = stream->held();
        const int64_t m = held.keys.size(1);
        // The official logits: held keys at slots 0 .. m−1 in position order, the query at its slot.
        auto pos = held.pos.contiguous();  // [Hkv, m]
        const at::Tensor q_true = at_position(qraw, t, inv_freq), q_slot = at_position(qraw, m_before, inv_freq);
        for (int64_t h = 0; h < h_kv; ++h) {
          const auto slot_of = slots(pos[h]);
          const int64_t* p = pos[h].data_ptr<int64_t>();
          for (int64_t j = 0; j < m; ++j) {
            const int64_t slot = slot_of[size_t(j)];
            const at::Tensor official = at_position(raw_k[p[j]].select(0, h).unsqueeze(0), slot, inv_freq);
            const at::Tensor ours = held.keys.select(0, h).narrow(0, j, 1).unsqueeze(0);  // [1, 1, d]
            // Query head 2h (its KV group's first): logits against the key, ours vs the official.
            const double l_ours = (q_true.select(0, 2 * h) * ours.view({1, d})).sum().item<double>();
            const double l_off = (q_slot.select(0, 2 * h) * official.view({1, d})).sum().item<double>();
            CHECK(l_ours == doctest::Approx(l_off).epsilon(1e-4).scale(std::abs(l_off) + 1.0));
          }
          CHECK(m_before == m - 1);
        }
        stream->settle(q_true, at::Tensor());
        evicted = evicted || stream->held().keys.size(1) < m;
        rr.apply(*stream);
        // After apply: held keys are their raw keys at t − (m' − 1 − rank), contiguous up to t.
        const KVSet& after = stream->held();
        const int64_t m2 = after.keys.size(1);
        auto pos2 = after.pos.contiguous();
        const auto where = rr.positions(*stream);
        for (int64_t h = 0; h < h_kv; ++h) {
          const auto slot_of = slots(pos2[h]);
          const int64_t* p = pos2[h].data_ptr<int64_t>();
          for (int64_t j = 0; j < m2; ++j) {
            const int64_t target = t - (m2 - 1 - slot_of[size_t(j)]);
            CHECK(where[size_t(h)][size_t(j)] == target);
            const at::Tensor want = at_position(raw_k[p[j]].select(0, h).unsqueeze(0), target, inv_freq);
            const at::Tensor got = after.keys.select(0, h).narrow(0, j, 1).unsqueeze(0);
            CHECK(at::allclose(got, want, 1e-4, 1e-4));
          }
        }
      }
      CHECK(evicted);  // the cap bit, so keys really moved
      CHECK(stream->held().keys.size(1) <= cap);
    }
  }
}

TEST_CASE("rerotation: without eviction ppl is unchanged; with it ppl moves; a method that cannot is refused") {
  c10::InferenceMode guard;
  auto loaded = stories260k();
  if (!loaded) return;
  const Model& model = *loaded;
  std::vector<int64_t> tokens;
  for (int64_t i = 0; i < 80; ++i) tokens.push_back(1 + (i * 37 + i * i) % 500);
  for (const std::string name : {"streaming_llm", "h2o", "buzz"}) {
    INFO("method=" << name);
    const MethodSpec m = test::method_spec(name);
    std::vector<PplBranch> br = {{m, 200, 0, false}, {m, 200, 0, true}, {m, 24, 0, false}, {m, 24, 0, true}};
    PplResult r = run_ppl(model, tokens, br);
    CHECK(r.rows[1].nll == r.rows[0].nll);  // 200 > 80 tokens: nothing evicted, nothing moved
    CHECK(r.rows[1].rerotate);
    CHECK(r.rows[3].nll != r.rows[2].nll);  // evicted: the moved keys change the logits
  }
  const MethodSpec tova = test::method_spec("tova");
  bool refused = false;
  try {
    check_ppl_branches(model, {{tova, 24, 0, true}});
  } catch (const Error& e) {
    refused = std::string(e.what()).find("--rerotate: tova") != std::string::npos;
  }
  CHECK(refused);
}

TEST_CASE("rerotation in generation: after k steps each held key is its key as cached, rotated once to its slot") {
  c10::InferenceMode guard;
  auto loaded = stories260k();
  if (!loaded) return;
  const Model& model = *loaded;
  const int n_layers = int(model.config.n_layers);
  std::vector<int64_t> prompt;
  for (int64_t i = 0; i < 40; ++i) prompt.push_back(1 + (i * 53 + 7 * i * i) % 500);
  const int64_t n = int64_t(prompt.size()), steps = 24;
  Prefill pre = run_prefill(model, prompt, 8);
  for (const std::string name : {"streaming_llm", "h2o", "buzz"}) {
    INFO("method=" << name);
    const MethodSpec m = test::method_spec(name);
    KeyTap tap(n_layers);
    std::vector<KVSet> held;
    BranchOptions bo;
    bo.max_new_tokens = steps + 1;
    bo.stop_at_eos = false;
    bo.tap = &tap;
    bo.on_done = [&](const CompressedAttention& a) {
      for (int l = 0; l < n_layers; ++l) held.push_back(a.layer(l).stream->held());
    };
    BranchSpec spec{m, Budget::of_entries(16), 3, 0, 0, /*stream=*/true, /*count_whole=*/true, /*rerotate=*/true};
    BranchResult r = run_branch(model, pre, spec, bo);
    REQUIRE(held.size() == size_t(n_layers));
    const int64_t last = n + steps - 1;  // the newest token's position
    for (int l = 0; l < n_layers; ++l) {
      INFO("layer " << l);
      const at::Tensor inv_freq = model.layer_inv_freq(l);
      auto pos = held[size_t(l)].pos.contiguous();
      for (int64_t h = 0; h < pos.size(0); ++h) {
        const auto slot_of = slots(pos[h]);
        const int64_t* p = pos[h].data_ptr<int64_t>();
        const int64_t m2 = pos.size(1);
        CHECK(m2 < n + steps);  // evicted: keys really moved
        for (int64_t j = 0; j < m2; ++j) {
          const int64_t target = last - (m2 - 1 - slot_of[size_t(j)]), q = p[j];
          const at::Tensor cached = q < n ? pre.k[size_t(l)].select(0, h).narrow(0, q, 1)
                                          : tap.k[size_t(l)][size_t(q - n)].select(0, h);  // [1, d]
          const at::Tensor want = rotate_by(cached.unsqueeze(0), at::full({1, 1}, target - q, at::kLong), inv_freq);
          CHECK(at::allclose(held[size_t(l)].keys.select(0, h).narrow(0, j, 1).unsqueeze(0), want, 1e-4, 1e-4));
        }
      }
    }
  }
  const MethodSpec sl = test::method_spec("streaming_llm");
  BranchOptions bo;
  bo.max_new_tokens = 2;
  auto message = [&](const BranchSpec& s) {
    try {
      run_branch(model, pre, s, bo);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK(message({sl, Budget::of_entries(16), 3, 4, 0, true, true, true}).find("keep_first 0") != std::string::npos);
  const MethodSpec tova = test::method_spec("tova");
  CHECK(message({tova, Budget::of_entries(16), 3, 0, 0, true, true, true}).find("tova keeps copies") !=
        std::string::npos);
}

TEST_CASE("rerotation after compression (KeyRerotationPress): kept keys contiguous up to the prompt's end, decoded ones as cached") {
  c10::InferenceMode guard;
  auto loaded = stories260k();
  if (!loaded) return;
  const Model& model = *loaded;
  const int n_layers = int(model.config.n_layers);
  std::vector<int64_t> prompt;
  for (int64_t i = 0; i < 48; ++i) prompt.push_back(1 + (i * 41 + 3 * i * i) % 500);
  const int64_t n = int64_t(prompt.size()), steps = 6;
  Prefill pre = run_prefill(model, prompt, 16);
  for (const std::string name : {"snapkv", "knorm", "streaming_llm"}) {
    INFO("method=" << name);
    const MethodSpec m = test::method_spec(name);
    KeyTap tap(n_layers);
    std::vector<KVSet> held;
    std::vector<at::Tensor> origin;
    BranchOptions bo;
    bo.max_new_tokens = steps + 1;
    bo.stop_at_eos = false;
    bo.tap = &tap;
    bo.on_done = [&](const CompressedAttention& a) {
      for (int l = 0; l < n_layers; ++l) held.push_back(a.layer(l).num), origin.push_back(a.layer(l).origin.clone());
    };
    // --prefill-only: every method compresses once, streaming_llm too.
    BranchSpec spec{m, Budget::of_ratio(0.5), 3, 2, 0, /*stream=*/false, /*count_whole=*/true, /*rerotate=*/true};
    run_branch(model, pre, spec, bo);
    REQUIRE(held.size() == size_t(n_layers));
    for (int l = 0; l < n_layers; ++l) {
      INFO("layer " << l);
      const at::Tensor inv_freq = model.layer_inv_freq(l);
      for (int64_t h = 0; h < held[size_t(l)].keys.size(0); ++h) {
        const at::Tensor org = origin[size_t(l)][h].contiguous();
        const int64_t* o = org.data_ptr<int64_t>();
        const int64_t m_all = org.numel();
        std::vector<int64_t> kept_pos;  // the prompt positions held, in order
        for (int64_t j = 0; j < m_all; ++j)
          if (o[j] < n) kept_pos.push_back(o[j]);
        REQUIRE(int64_t(kept_pos.size()) < n);  // compressed: keys really moved
        const auto slot_of = slots(at::tensor(kept_pos, at::kLong));
        int64_t r = 0;
        for (int64_t j = 0; j < m_all; ++j) {
          const at::Tensor got = held[size_t(l)].keys.select(0, h).narrow(0, j, 1).unsqueeze(0);  // [1, 1, d]
          if (o[j] < n) {
            const int64_t target = (n - 1) - (int64_t(kept_pos.size()) - 1 - slot_of[size_t(r++)]);
            const at::Tensor cached = pre.k[size_t(l)].select(0, h).narrow(0, o[j], 1).unsqueeze(0);
            CHECK(at::allclose(got, rotate_by(cached, at::full({1, 1}, target - o[j], at::kLong), inv_freq), 1e-5, 1e-5));
          } else {
            CHECK(at::equal(got, tap.k[size_t(l)][size_t(o[j] - n)].select(0, h).unsqueeze(0)));  // decoded: as cached
          }
        }
      }
    }
  }
}
