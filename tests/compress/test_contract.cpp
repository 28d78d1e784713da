// The contract every registered compressor keeps, checked through the replay protocol on a
// synthetic capture: ratio 1 is exact, memory lands on the budget, seeds are reproducible,
// unknown parameters are rejected by name. Method files have deeper tests of their own.
#include <doctest/doctest.h>

#include <ATen/ATen.h>

#include <cmath>
#include <set>

#include "kvlab/attention/metrics.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/core/check.h"
#include "kvlab/io/synthetic.h"
#include "kvlab/replay/plan.h"
#include "kvlab/replay/replay.h"
#include "kvlab/replay/tables.h"
#include "test_util.h"

using namespace kvlab;

namespace {

// One (sample, layer) unit built straight from synthetic tensors (no file needed).
ReplayUnit synthetic_unit(const std::string& kind, int64_t n, int64_t n_q, uint64_t seed) {
  SyntheticSpec s;
  s.kind = kind;
  s.n_q_heads = 6;
  s.n_kv_heads = 2;
  s.head_dim = 32;
  s.n_tokens = n;
  s.n_q = n_q;
  s.seed = seed;
  auto t = synthetic_layer(s, 0, 0);
  ReplayUnit u;
  u.layer = 0;
  u.n_layers = 1;
  u.q = t.q, u.k = t.k, u.v = t.v;
  u.kv_heads = {0, 1};
  u.ref = exact_reference(u.q, u.k, u.v);
  u.probs = exact_attention_probs(u.q, u.k, true);
  return u;
}

// Methods that reach a budget by halving land on n >> T, not on an arbitrary budget.
bool halving(const std::string& m) { return compressor_info(m).halving; }

double region_entries(const CompressedKV& c) { return c.mean_memory_entries(); }

}  // namespace

TEST_CASE("contract: every method reproduces exact attention at ratio 1") {
  auto u = synthetic_unit("clustered", 301, 17, 1);
  ReplayProtocol p;
  p.keep_first = 3;
  for (const auto& name : compressor_names()) {
    INFO("method=" << name);
    auto c = make_compressor(name, nlohmann::json::object());
    Budget b = halving(name) ? Budget::of_halvings(0) : Budget::of_ratio(1.0);
    auto out = replay_attend(u, *c, b, 42, p);
    auto m = compare_to_exact(out.z, u.ref);
    CHECK(m.rel_err < 1e-5);
  }
}

TEST_CASE("contract: memory lands on the budget (within one entry per head)") {
  auto u = synthetic_unit("random", 1024 + 37, 37, 2);
  ReplayProtocol p;
  const int64_t region = 1024;
  for (const auto& name : compressor_names()) {
    if (name == "exact") continue;
    auto c = make_compressor(name, nlohmann::json::object());
    for (int64_t budget : {64, 256, 512}) {
      INFO("method=" << name << " budget=" << budget);
      Budget b = Budget::of_entries(budget);
      int64_t expected = budget;
      if (halving(name)) {
        b = Budget::of_halvings(std::lround(std::log2(double(region) / double(budget))));
        expected = region >> b.halvings;
      }
      auto out = replay_attend(u, *c, b, 7, p);
      CHECK(out.region_end - out.region_begin == region);
      double entries = region_entries(out.region);
      if (name == "balancekv-mr") {
        // Known exception (balancekv_mr.cpp): the streaming merge-and-reduce keeps partly filled
        // levels per value-norm bucket, so its memory overshoots n >> T at small budgets. Replay
        // reports the achieved kept_fraction, so comparisons stay at honest memory.
        CHECK(entries >= 1);
      } else {
        CHECK(std::abs(entries - double(expected)) <= 1.0);
      }
    }
  }
}

TEST_CASE("contract: same seed gives identical output") {
  auto u = synthetic_unit("heavy", 400, 16, 3);
  ReplayProtocol p;
  for (const auto& name : compressor_names()) {
    INFO("method=" << name);
    auto c = make_compressor(name, nlohmann::json::object());
    Budget b = halving(name) ? Budget::of_halvings(2) : Budget::of_ratio(0.25);
    auto a = replay_attend(u, *c, b, 11, p), a2 = replay_attend(u, *c, b, 11, p);
    CHECK(a.z.equal(a2.z));
  }
}

TEST_CASE("registry: every entry makes a compressor whose name() is the entry's name") {
  CHECK(compressor_infos().size() == 17);
  for (const auto& info : compressor_infos()) {
    INFO("method=" << info.name);
    CHECK(make_compressor(info.name, nlohmann::json::object())->name() == info.name);
    CHECK(!info.description.empty());
    CHECK(!info.cost.note.empty());
  }
}

TEST_CASE("contract: unknown parameters are rejected by name; unknown methods suggest the closest") {
  for (const auto& name : compressor_names()) {
    INFO("method=" << name);
    CHECK_THROWS_WITH_AS(make_compressor(name, {{"no_such_knob", 1}}), doctest::Contains("no_such_knob"), Error);
  }
  CHECK_THROWS_WITH_AS(make_compressor("chelsa", {}), doctest::Contains("Did you mean: chelsea?"), Error);
  CHECK_THROWS_WITH_AS(budget_settings({1.5}, {}, {}), doctest::Contains("--ratio must be in (0, 1], got 1.5"), Error);
  CHECK_THROWS_WITH_AS(budget_settings({}, {}, {31}), doctest::Contains("--T (halvings) must be in [0, 30], got 31"), Error);
  CHECK_THROWS_WITH_AS(budget_settings({}, {0}, {}), doctest::Contains("--budget must be >= 1 entries, got 0"), Error);
  CHECK_THROWS_WITH_AS(budget_settings({0.1}, {10}, {}), doctest::Contains("exactly one of --ratio, --budget, --T"),
                       Error);
}

TEST_CASE("replay rows: kept_fraction, mass_recall and per-head metrics agree with direct computation") {
  auto u = synthetic_unit("heavy", 257, 13, 5);
  ReplayProtocol p;
  p.keep_first = 4;
  p.keep_last = 20;
  MethodSpec m;
  m.name = "streaming_llm";
  m.compressor = make_compressor("streaming_llm", {});
  Budget b = Budget::of_entries(50);
  auto rows = replay_rows(u, "s0", m, b, 42, p);
  REQUIRE(rows.size() == 2);
  // Region [4, 237): 233 tokens -> 50 kept; exact: 4 + 20 -> kept_fraction = 74/257.
  CHECK(rows[0]["region_tokens"] == 233);
  CHECK(rows[0]["kept_fraction"].get<double>() == doctest::Approx(74.0 / 257.0));
  // streaming_llm keeps region sinks [4, 8) and the most recent 46 region tokens [191, 237).
  auto kept = at::zeros({1, 257}, at::kBool);
  kept.narrow(1, 0, 8).fill_(true);
  kept.narrow(1, 191, 257 - 191).fill_(true);
  for (int h = 0; h < 2; ++h) {
    double direct = mass_recall(u.probs.narrow(0, 3 * h, 3), kept);
    CHECK(rows[h]["mass_recall"].get<double>() == doctest::Approx(direct).epsilon(1e-6));
    CHECK(rows[h]["head"] == h);
  }
  auto out = replay_attend(u, *m.compressor, b, 42, p);
  // Direct: exact attention restricted to the kept tokens.
  auto idx = at::nonzero(kept[0]).view(-1);
  auto qd = u.q.to(at::kDouble);
  auto kk = u.k.index_select(1, idx).to(at::kDouble), vv = u.v.index_select(1, idx).to(at::kDouble);
  KVSet set{kk, vv, {}, idx};
  AttentionOptions ao;
  ao.query_pos = at::arange(257 - 13, 257);
  auto z_direct = attention(qd, set, nullptr, ao);
  CHECK(test::max_rel_diff(out.z, z_direct, 1e-2) < 1e-4);
}

TEST_CASE("aggregates: mean and std over per-seed means") {
  nlohmann::json rows = nlohmann::json::array();
  // seed 1: rel_err 1 and 3 (mean 2); seed 2: 4 (mean 4) -> mean 3, std sqrt(2).
  rows.push_back({{"method", "a"}, {"setting", "r"}, {"params", {}}, {"layer", 0}, {"seed", 1}, {"rel_err", 1.0}});
  rows.push_back({{"method", "a"}, {"setting", "r"}, {"params", {}}, {"layer", 1}, {"seed", 1}, {"rel_err", 3.0}});
  rows.push_back({{"method", "a"}, {"setting", "r"}, {"params", {}}, {"layer", 0}, {"seed", 2}, {"rel_err", 4.0}});
  auto agg = replay_aggregates(rows);
  REQUIRE(agg["overall"].size() == 1);
  CHECK(agg["overall"][0]["rel_err"].get<double>() == doctest::Approx(3.0));
  CHECK(agg["overall"][0]["rel_err_std"].get<double>() == doctest::Approx(std::sqrt(2.0)));
  CHECK(agg["per_layer"].size() == 2);
}

TEST_CASE("structured captures order the methods as the papers predict") {
  ReplayProtocol p;
  auto mean_err = [&](const std::string& kind, const std::string& method, double ratio) {
    double sum = 0;
    for (uint64_t s : {1, 2, 3}) {
      auto u = synthetic_unit(kind, 1024, 32, s);
      auto c = make_compressor(method, {});
      Budget b = Budget::of_ratio(ratio);
      sum += compare_to_exact(replay_attend(u, *c, b, s, p).z, u.ref).rel_err;
    }
    return sum / 3;
  };
  // A few heavy tokens: score-based selection beats uniform sampling.
  double uni_h = mean_err("heavy", "uniform", 0.1);
  for (auto m : {"h2o", "snapkv"}) {
    INFO(std::string(m) << " vs uniform on heavy");
    CHECK(mean_err("heavy", m, 0.1) < uni_h);
  }
  // Clustered keys: merging tokens of a cluster (Chelsea) beats uniform sampling. (ClusterGen's
  // ordering needs values that follow the clusters; test_subgen.cpp asserts it on such data.)
  CHECK(mean_err("clustered", "chelsea", 0.1) < mean_err("clustered", "uniform", 0.1));
}
