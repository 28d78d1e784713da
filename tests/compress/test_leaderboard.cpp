// The leaderboard's scorers (issue 22) against naive loops written from their definitions:
//   * knorm keeps, per KV head, the b keys of smallest L2 norm;
//   * tova keeps the b positions the last query attends to most, averaged over every query head
//     of the layer (one set for all KV heads), its own token always kept;
//   * tova's decode-time stream evicts, each step, the held tokens the new query attends to least
//     (head-averaged), never the new token: a token-by-token list simulation;
//   * keydiff keeps, per KV head, the b keys of lowest cosine to the mean of the unit keys;
//   * lagkv ranks each partition's tokens by the softmaxed std of their keys and values min-max
//     normalised by the next partition, keeps sinks and tail, and the most recent on a short region;
//   * adakv shares the layer's budget across heads by score above a per-head safeguard;
//   * expected_attention scores keys by the expected attention of a Gaussian fitted to the
//     un-rotated queries and moved by the average rotation, times |v|.
#include <ATen/ATen.h>
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kvlab/attention/rope.h"
#include "kvlab/compress/compressor.h"
#include "kvlab/compress/preset.h"
#include "kvlab/core/check.h"

using namespace kvlab;

namespace {

LayerKV random_region(int64_t n, int64_t n_obs, int64_t h_kv, int64_t g, int64_t d, uint64_t seed) {
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto o = at::TensorOptions().dtype(at::kDouble);
  LayerKV kv;
  kv.keys = at::randn({h_kv, n, d}, gen, o);             // [Hkv, n, d]
  kv.values = at::randn({h_kv, n, d}, gen, o);           // [Hkv, n, d]
  kv.queries = at::randn({h_kv * g, n_obs, d}, gen, o);  // [Hq, n_obs, d]
  kv.query_pos = at::arange(n - n_obs, n, at::TensorOptions().dtype(at::kLong));  // [n_obs]
  return kv;
}

std::vector<int64_t> row(const at::Tensor& idx, int64_t h) {
  auto r = idx[h].contiguous();
  std::vector<int64_t> v(r.data_ptr<int64_t>(), r.data_ptr<int64_t>() + r.numel());
  std::sort(v.begin(), v.end());
  return v;
}

// The k largest of sc (ties to the lower index), sorted, by repeated scans.
std::vector<int64_t> naive_top(const std::vector<double>& sc, int64_t k) {
  std::vector<char> taken(sc.size(), 0);
  std::vector<int64_t> out;
  for (int64_t t = 0; t < k; ++t) {
    int64_t best = -1;
    for (size_t i = 0; i < sc.size(); ++i)
      if (!taken[i] && (best < 0 || sc[i] > sc[best])) best = static_cast<int64_t>(i);
    taken[best] = 1;
    out.push_back(best);
  }
  std::sort(out.begin(), out.end());
  return out;
}

// Mean over every query head of query (head, j)'s softmax over the keys `held` (indices into the
// layer's keys), in double by loops.
std::vector<double> naive_head_mean(const at::Tensor& keys, const at::Tensor& queries, int64_t j,
                                    const std::vector<int64_t>& held) {
  const int64_t h_kv = keys.size(0), h_q = queries.size(0), g = h_q / h_kv, d = keys.size(2);
  auto K = keys.accessor<double, 3>();
  auto Q = queries.accessor<double, 3>();
  std::vector<double> mean(held.size(), 0.0);
  for (int64_t hq = 0; hq < h_q; ++hq) {
    std::vector<double> s(held.size());
    double mx = -1e300, z = 0;
    for (size_t i = 0; i < held.size(); ++i) {
      double dot = 0;
      for (int64_t c = 0; c < d; ++c) dot += Q[hq][j][c] * K[hq / g][held[i]][c];
      s[i] = dot / std::sqrt(static_cast<double>(d));
      mx = std::max(mx, s[i]);
    }
    for (double& x : s) z += (x = std::exp(x - mx));
    for (size_t i = 0; i < held.size(); ++i) mean[i] += s[i] / z / static_cast<double>(h_q);
  }
  return mean;
}

CompressOptions entries(int64_t b) {
  CompressOptions o;
  o.budget = Budget::of_entries(b);
  return o;
}

}  // namespace

TEST_CASE("knorm keeps the keys of smallest L2 norm per KV head (naive loop)") {
  auto kv = random_region(53, 4, 3, 2, 8, 21);
  for (int64_t b : {1, 10, 26, 52}) {
    INFO("budget=" << b);
    auto out = make_compressor("knorm", nlohmann::json::object())->compress(kv, entries(b));
    auto K = kv.keys.accessor<double, 3>();
    for (int64_t h = 0; h < 3; ++h) {
      std::vector<double> sc(53);
      for (int64_t i = 0; i < 53; ++i) {
        double s = 0;
        for (int64_t c = 0; c < 8; ++c) s += K[h][i][c] * K[h][i][c];
        sc[i] = -std::sqrt(s);
      }
      CHECK(row(out.kept_idx, h) == naive_top(sc, b));
    }
    CHECK(out.bias.eq(0).all().item<bool>());
  }
}

TEST_CASE("tova keeps the last query's head-averaged top positions, its own token always (naive loop)") {
  auto kv = random_region(47, 5, 3, 3, 8, 22);
  std::vector<int64_t> all(47);
  std::iota(all.begin(), all.end(), 0);
  auto sc = naive_head_mean(kv.keys, kv.queries, 4, all);  // the last query, at position 46
  double mx = 0;
  for (int64_t i = 0; i < 46; ++i) mx = std::max(mx, sc[i]);
  sc[46] = mx;  // kvpress pads the last token's score with the maximum
  for (int64_t b : {1, 9, 30}) {
    INFO("budget=" << b);
    auto out = make_compressor("tova", nlohmann::json::object())->compress(kv, entries(b));
    const auto want = naive_top(sc, b);
    for (int64_t h = 0; h < 3; ++h) CHECK(row(out.kept_idx, h) == want);  // one set for every KV head
    // Its own token ties with the best one (kvpress's padding); from two entries on both stay.
    if (b >= 2) CHECK(std::find(want.begin(), want.end(), 46) != want.end());
  }
  CHECK(make_compressor("tova", nlohmann::json::object())->observation_queries() == 1);
}

TEST_CASE("tova's decode-time stream equals a token-by-token list simulation") {
  // A prompt of n0 tokens compressed to b, then T decoded tokens, each pushed with its query; the
  // stream holds b entries (an entry budget) and evicts what the new query attends to least.
  const int64_t n0 = 30, T = 12, b = 10, h_kv = 2, g = 2, d = 8;
  auto all = random_region(n0 + T, n0 + T, h_kv, g, d, 23);  // queries at every position
  LayerKV prompt = all;
  prompt.keys = all.keys.narrow(1, 0, n0);
  prompt.values = all.values.narrow(1, 0, n0);
  prompt.queries = all.queries.narrow(1, n0 - 1, 1);       // the last prompt query
  prompt.query_pos = at::full({1}, n0 - 1, at::TensorOptions().dtype(at::kLong));
  auto stream = make_compressor("tova", nlohmann::json::object())->start_stream(prompt, entries(b));
  REQUIRE(stream != nullptr);
  // The list simulation.
  std::vector<int64_t> prefix(n0);
  std::iota(prefix.begin(), prefix.end(), 0);
  auto sc = naive_head_mean(all.keys, all.queries, n0 - 1, prefix);
  double mx = 0;
  for (int64_t i = 0; i < n0 - 1; ++i) mx = std::max(mx, sc[i]);
  sc[n0 - 1] = mx;
  std::vector<int64_t> held = naive_top(sc, b);
  auto held_positions = [&] { return row(stream->held().pos, 0); };
  CHECK(held_positions() == held);
  for (int64_t t = n0; t < n0 + T; ++t) {
    stream->push(all.keys.narrow(1, t, 1), all.values.narrow(1, t, 1), t);
    stream->settle(all.queries.narrow(1, t, 1), at::Tensor());
    held.push_back(t);
    auto s = naive_head_mean(all.keys, all.queries, t, held);
    double m2 = 0;
    for (size_t i = 0; i + 1 < held.size(); ++i) m2 = std::max(m2, s[i]);
    s.back() = m2;
    std::vector<int64_t> keep_idx = naive_top(s, b), next;
    for (int64_t i : keep_idx) next.push_back(held[i]);
    held = next;
    INFO("step t=" << t);
    CHECK(held_positions() == held);
    CHECK(row(stream->held().pos, 1) == held);  // every KV head holds the same positions
  }
  CHECK(stream->n_seen() == n0 + T);
  // The registry's probe starts a stream on a region with no query (kvlab replay --list-methods
  // died on it): held whole until a query settles it.
  CHECK(streams_while_decoding("tova"));
  CHECK_FALSE(streams_while_decoding("knorm"));
}

TEST_CASE("keydiff keeps the keys of lowest cosine to the mean unit key, per KV head (naive loop)") {
  auto kv = random_region(41, 3, 2, 2, 6, 24);
  for (int64_t b : {1, 13, 40}) {
    INFO("budget=" << b);
    auto out = make_compressor("keydiff", nlohmann::json::object())->compress(kv, entries(b));
    auto K = kv.keys.accessor<double, 3>();
    for (int64_t h = 0; h < 2; ++h) {
      std::vector<double> anchor(6, 0.0), sc(41);
      for (int64_t i = 0; i < 41; ++i) {
        double nn = 0;
        for (int64_t c = 0; c < 6; ++c) nn += K[h][i][c] * K[h][i][c];
        for (int64_t c = 0; c < 6; ++c) anchor[c] += K[h][i][c] / std::sqrt(nn) / 41.0;
      }
      double na = 0;
      for (double a : anchor) na += a * a;
      for (int64_t i = 0; i < 41; ++i) {
        double dot = 0, nn = 0;
        for (int64_t c = 0; c < 6; ++c) dot += K[h][i][c] * anchor[c], nn += K[h][i][c] * K[h][i][c];
        sc[i] = -dot / std::sqrt(nn * na);
      }
      CHECK(row(out.kept_idx, h) == naive_top(sc, b));
    }
  }
}

// LagKV's score of every position of KV head h, by loops (lagkv.cpp's summary).
std::vector<double> naive_lagkv(const LayerKV& kv, int64_t h, int64_t n_sink, int64_t lag) {
  const int64_t n = kv.keys.size(1), d = kv.keys.size(2);
  std::vector<double> sc(n, 1.0);
  if (n < n_sink + 2 * lag) {
    for (int64_t j = n_sink; j < n; ++j) sc[j] = double(j - n_sink) / double(n - n_sink);
    return sc;
  }
  const int64_t parts = (n - n_sink) / lag;
  for (int64_t p = 0; p + 1 < parts; ++p) {
    const int64_t a = n_sink + p * lag, r = a + lag;  // partition [a, a+lag), reference [r, r+lag)
    std::vector<double> total(lag, 0.0);
    for (const at::Tensor* x : {&kv.keys, &kv.values}) {
      auto X = x->accessor<double, 3>();
      std::vector<double> sd(lag);
      for (int64_t i = 0; i < lag; ++i) {
        std::vector<double> z(d);
        for (int64_t c = 0; c < d; ++c) {
          double lo = X[h][r][c], hi = X[h][r][c];
          for (int64_t t = r; t < r + lag; ++t) lo = std::min(lo, X[h][t][c]), hi = std::max(hi, X[h][t][c]);
          z[c] = (X[h][a + i][c] - lo) / (hi - lo);
        }
        double mean = std::accumulate(z.begin(), z.end(), 0.0) / d, ss = 0;
        for (double v : z) ss += (v - mean) * (v - mean);
        sd[i] = std::sqrt(ss / (d - 1));
      }
      double denom = 0;
      for (double v : sd) denom += std::exp(v);
      for (int64_t i = 0; i < lag; ++i) total[i] += std::exp(sd[i]) / denom / 2;
    }
    for (int64_t i = 0; i < lag; ++i) {
      int64_t below = 0;
      for (int64_t t = 0; t < lag; ++t) below += total[t] < total[i];
      sc[a + i] = double(below) / double(lag);
    }
  }
  return sc;
}

TEST_CASE("lagkv keeps sinks, tail and each partition's most lag-relative tokens; the most recent when short (naive loop)") {
  // 4 sinks + 3 partitions of 8 + 5: partitions 0 and 1 are scored (against 1 and 2), the tail is
  // partition 2 and the last 5. 19 tokens < 4 + 2 * 8: nothing is scored against a reference.
  for (int64_t n : {33, 19}) {
    auto kv = random_region(n, 2, 2, 2, 6, 31 + n);
    for (int64_t b : {int64_t(3), int64_t(10), n - 6, n - 1}) {
      INFO("n=" << n << " budget=" << b);
      auto out = make_compressor("lagkv", {{"n_sink", 4}, {"lag_size", 8}})->compress(kv, entries(b));
      for (int64_t h = 0; h < 2; ++h) CHECK(row(out.kept_idx, h) == naive_top(naive_lagkv(kv, h, 4, 8), b));
    }
  }
  CHECK(make_compressor("lagkv", {{"n_sink", 4}, {"lag_size", 8}})
            ->compress(random_region(19, 2, 1, 1, 4, 5), entries(10))
            .kept_idx[0]
            .equal(at::cat({at::arange(4, at::kLong), at::arange(13, 19, at::kLong)})));
}

TEST_CASE("adakv shares the layer's H·b entries across heads by score, each head keeping its best α·b (naive loop)") {
  // Keys of head 1 scaled up: knorm scores it far below head 0, so head 0 takes most of the budget
  // and head 1 keeps only its safeguard.
  auto kv = random_region(30, 2, 2, 1, 4, 7);
  kv.keys[1].mul_(10.0);
  for (double alpha : {0.2, 0.5, 0.0}) {
    for (int64_t b : {int64_t(5), int64_t(12)}) {
      INFO("alpha=" << alpha << " budget=" << b);
      auto out = make_compressor("adakv", {{"scorer", "knorm"}, {"alpha_safeguard", alpha}})->compress(kv, entries(b));
      auto K = kv.keys.accessor<double, 3>();
      std::vector<std::vector<double>> sc(2, std::vector<double>(30));
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < 30; ++i) {
          double nn = 0;
          for (int64_t c = 0; c < 4; ++c) nn += K[h][i][c] * K[h][i][c];
          sc[h][i] = -std::sqrt(nn);
        }
      const int64_t n_safe = alpha > 0 ? std::max<int64_t>(1, static_cast<int64_t>(alpha * b)) : 0;
      std::vector<std::vector<int64_t>> want = {naive_top(sc[0], n_safe), naive_top(sc[1], n_safe)};
      std::vector<double> flat;  // the rest, flattened (head, position); safeguarded ones at -inf
      for (int64_t h = 0; h < 2; ++h)
        for (int64_t i = 0; i < 30; ++i)
          flat.push_back(std::count(want[h].begin(), want[h].end(), i) ? -INFINITY : sc[h][i]);
      for (int64_t f : naive_top(flat, 2 * (b - n_safe))) want[f / 30].push_back(f % 30);
      for (int64_t h = 0; h < 2; ++h) {
        std::sort(want[h].begin(), want[h].end());
        std::vector<int64_t> got;
        for (int64_t i : row(out.kept_idx, h))
          if (i >= 0) got.push_back(i);
        CHECK(got == want[h]);
      }
      CHECK(out.mean_entries() == doctest::Approx(double(b)));
      if (alpha == 0.2) CHECK(want[1].size() == static_cast<size_t>(n_safe));  // head 1 at its floor
    }
  }
}

// expected_attention's scores by loops: queries un-rotated pair by pair (RoPE with theta 10000,
// lanes i and i + d/2), mean and covariance, the average rotation of the next F positions, the
// Gaussian's expected logits, a softmax per query head over the keys past the sinks, the group's
// mean, times |v|; sinks +inf.
std::vector<std::vector<double>> naive_expected_attention(const LayerKV& kv, int64_t n_sink, int64_t future) {
  const int64_t h_kv = kv.keys.size(0), n = kv.keys.size(1), d = kv.keys.size(2), h_q = kv.queries.size(0);
  const int64_t g = h_q / h_kv, half = d / 2, n_obs = kv.queries.size(1);
  auto Q = kv.queries.accessor<double, 3>();
  auto K = kv.keys.accessor<double, 3>();
  auto V = kv.values.accessor<double, 3>();
  auto qp = kv.query_pos.accessor<int64_t, 1>();
  std::vector<double> freq(half);
  for (int64_t i = 0; i < half; ++i) freq[i] = 1.0 / std::pow(10000.0, double(2 * i) / double(d));
  // The average rotation: per lane pair, mean cos and mean sin over positions t0 .. t0 + future - 1.
  const int64_t t0 = qp[n_obs - 1] + 1;
  std::vector<double> cbar(half, 0.0), sbar(half, 0.0);
  for (int64_t t = t0; t < t0 + future; ++t)
    for (int64_t i = 0; i < half; ++i) {
      // float32 angles, as rope_cos_sin (and transformers) form them
      const float a = static_cast<float>(t) * static_cast<float>(freq[i]);
      cbar[i] += std::cos(double(a)) / future, sbar[i] += std::sin(double(a)) / future;
    }
  auto rotate = [&](const std::vector<double>& x) {  // R̄ x
    std::vector<double> y(d);
    for (int64_t i = 0; i < half; ++i) {
      y[i] = cbar[i] * x[i] - sbar[i] * x[i + half];
      y[i + half] = cbar[i] * x[i + half] + sbar[i] * x[i];
    }
    return y;
  };
  std::vector<std::vector<double>> out(h_kv, std::vector<double>(n, 0.0));
  for (int64_t hq = 0; hq < h_q; ++hq) {
    std::vector<std::vector<double>> pre;
    for (int64_t j = 0; j < n_obs; ++j) {
      if (qp[j] < n_sink) continue;
      std::vector<double> x(d);
      for (int64_t i = 0; i < half; ++i) {
        const float a = static_cast<float>(qp[j]) * static_cast<float>(freq[i]);
        const double c = std::cos(double(a)), s = std::sin(double(a));
        x[i] = Q[hq][j][i] * c + Q[hq][j][i + half] * s;
        x[i + half] = Q[hq][j][i + half] * c - Q[hq][j][i] * s;
      }
      pre.push_back(x);
    }
    const double m = double(pre.size());
    std::vector<double> mu(d, 0.0);
    for (const auto& x : pre)
      for (int64_t c = 0; c < d; ++c) mu[c] += x[c] / m;
    std::vector<std::vector<double>> cov(d, std::vector<double>(d, 0.0)), rc(d), rcr(d, std::vector<double>(d));
    for (const auto& x : pre)
      for (int64_t a = 0; a < d; ++a)
        for (int64_t b = 0; b < d; ++b) cov[a][b] += (x[a] - mu[a]) * (x[b] - mu[b]) / m;
    for (int64_t b = 0; b < d; ++b) {  // columns of R̄ Σ, then rows of (R̄ Σ) R̄ᵀ = R̄ (R̄ Σ)ᵀ transposed
      std::vector<double> col(d);
      for (int64_t a = 0; a < d; ++a) col[a] = cov[a][b];
      rc[b] = rotate(col);  // rc[b][a] = (R̄Σ)[a][b]
    }
    for (int64_t a = 0; a < d; ++a) {
      std::vector<double> row(d);
      for (int64_t b = 0; b < d; ++b) row[b] = rc[b][a];
      auto r = rotate(row);  // (R̄ (R̄Σ)[a,:]ᵀ)[b] = (R̄Σ R̄ᵀ)[a][b]
      for (int64_t b = 0; b < d; ++b) rcr[a][b] = r[b];
    }
    const auto mur = rotate(mu);
    const int64_t kh = hq / g;
    std::vector<double> logit(n, -INFINITY);
    double mx = -INFINITY, z = 0;
    for (int64_t j = n_sink; j < n; ++j) {
      double l = 0, quad = 0;
      for (int64_t a = 0; a < d; ++a) l += K[kh][j][a] * mur[a];
      for (int64_t a = 0; a < d; ++a)
        for (int64_t b = 0; b < d; ++b) quad += K[kh][j][a] * rcr[a][b] * K[kh][j][b];
      logit[j] = l / std::sqrt(double(d)) + quad / double(d) / 2.0;
      mx = std::max(mx, logit[j]);
    }
    for (int64_t j = n_sink; j < n; ++j) z += std::exp(logit[j] - mx);
    for (int64_t j = n_sink; j < n; ++j) out[kh][j] += std::exp(logit[j] - mx) / z / double(g);
  }
  for (int64_t h = 0; h < h_kv; ++h)
    for (int64_t j = 0; j < n; ++j) {
      if (j < n_sink) {
        out[h][j] = INFINITY;
        continue;
      }
      double vn = 0;
      for (int64_t c = 0; c < d; ++c) vn += V[h][j][c] * V[h][j][c];
      out[h][j] *= std::sqrt(vn);
    }
  return out;
}

TEST_CASE("expected_attention keeps the keys of highest expected attention under the queries' Gaussian times |v| (naive loop)") {
  // Every position's query, as generation gives it (observation_queries -1).
  auto kv = random_region(40, 40, 2, 2, 8, 41);
  kv.rope_inv_freq = rope_inv_freq(10000.0, 8, RopeScaling{});
  auto c = make_compressor("expected_attention", {{"n_future_positions", 16}, {"n_sink", 3}});
  const auto want = naive_expected_attention(kv, 3, 16);
  auto mine = c->keep_scores(kv);  // [Hkv, n]
  for (int64_t h = 0; h < 2; ++h)
    for (int64_t j = 0; j < 40; ++j) {
      INFO("head " << h << " position " << j);
      if (j < 3) CHECK(std::isinf(mine[h][j].item<double>()));
      else CHECK(mine[h][j].item<double>() == doctest::Approx(want[h][j]).epsilon(1e-6));  // angles: float32 vs float64
    }
  for (int64_t b : {int64_t(5), int64_t(20)}) {
    auto out = c->compress(kv, entries(b));
    for (int64_t h = 0; h < 2; ++h) CHECK(row(out.kept_idx, h) == naive_top(want[h], b));
  }
}

TEST_CASE("a wrapper composes with a scorer by name: adakv:knorm is adakv with scorer=knorm; its paper preset is the scorer's") {
  auto kv = random_region(30, 2, 2, 1, 4, 9);
  auto a = make_compressor("adakv:knorm", nlohmann::json::object())->compress(kv, entries(8));
  auto b = make_compressor("adakv", {{"scorer", "knorm"}})->compress(kv, entries(8));
  CHECK(a.kept_idx.equal(b.kept_idx));
  CHECK(compressor_info("adakv:knorm").name == "adakv");
  const MethodPreset p = method_preset("adakv:expected_attention", "paper");
  CHECK(p.params == nlohmann::json{{"scorer", "expected_attention"}, {"alpha_safeguard", 0.2},
                                   {"n_future_positions", 512}, {"n_sink", 4}, {"use_covariance", true},
                                   {"use_vnorm", true}, {"epsilon", 0.0}});
  CHECK(method_preset("adakv", "paper").params == method_preset("adakv:snapkv", "paper").params);
  CHECK(method_preset("adakv:knorm", "default").params == nlohmann::json{{"scorer", "knorm"}});
  CHECK_THROWS_WITH_AS(make_compressor("knorm:snapkv", {}), doctest::Contains("'knorm' is not a wrapper"), Error);
  CHECK_THROWS_WITH_AS(make_compressor("adakv:knrom", {}), doctest::Contains("Did you mean: knorm?"), Error);
  CHECK_THROWS_WITH_AS(make_compressor("adakv:knorm", {{"scorer", "lagkv"}}), doctest::Contains("contradicts the name"),
                       Error);
  CHECK_THROWS_WITH_AS(make_compressor("adakv:chelsea", {}), doctest::Contains("parameter 'scorer'"), Error);
}
