// The sampling kernel against the host sampler (engine/sampler.h): penalties and biases applied
// in place, log probabilities, greedy, top-k, top-p, seeds and the draw's frequencies. Built twice:
// against the CUDA runtime (label gpu; skips without a device) and against the CPU stand-in for
// it (simt/, label unit), which runs the kernel's own source on fibers and so checks its
// logic, barriers and warp operations on any machine (not its speed, nor the GPU's __expf).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <vector>

#include "engine/sampler.h"
#include "kernels/sampling.cuh"
#include "tests/engine/cuda_test_util.h"

namespace hr::engine {
namespace {

// Runs the sampler over `rows` copies of one logits row with the given parameters, row r with
// random 0x1234567 * (r + 1); launches of up to 256 rows, to bound memory at large vocabularies.
std::vector<int32_t> sample_rows(const std::vector<float>& logits, int rows,
                                 kernels::SampleParams sp) {
  const int V = static_cast<int>(logits.size());
  std::vector<int32_t> tokens;
  for (int first = 0; first < rows; first += 256) {
    const int n = std::min(256, rows - first);
    std::vector<float> all;
    std::vector<kernels::SampleParams> params;
    for (int r = first; r < first + n; ++r) {
      all.insert(all.end(), logits.begin(), logits.end());
      params.push_back(sp);
      params.back().random = 0x1234567ull * (r + 1);
    }
    DeviceBuffer<float> d_logits(all);
    DeviceBuffer<kernels::SampleParams> d_params(params);
    DeviceBuffer<int32_t> d_tokens(static_cast<size_t>(n));
    EXPECT_EQ(kernels::sample_tokens(d_logits.ptr, n, V, d_params.ptr, nullptr, d_tokens.ptr,
                                     nullptr, nullptr),
              cudaSuccess);
    const std::vector<int32_t> got = d_tokens.get();
    tokens.insert(tokens.end(), got.begin(), got.end());
  }
  return tokens;
}

// Penalties and logit biases change the logits in place exactly as the host's apply_penalties
// does, for listed tokens (generated, or prompt-only), the row's input token counted once more
// whether listed or not, and rows without penalties left alone; the greedy token is the
// penalized argmax.
TEST(CudaSamplingTest, PenaltiesMatchTheHostReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(17);
  const int V = 3001, R = 6, T = 9;
  std::vector<float> logits = random_vec(static_cast<size_t>(R) * V, rng, -4.0f, 4.0f);
  std::vector<int32_t> input_ids(T);
  for (int32_t& id : input_ids) id = static_cast<int32_t>(rng() % V);
  // Row r reads token row 1 + r (its input token); rows 1 and 4 list theirs, rows 2 and 5 do not.
  std::vector<PenaltyToken> seen;
  std::vector<SampleSpec> specs(R);
  std::vector<kernels::SampleParams> params(R);
  std::vector<size_t> begins, bias_begins;
  std::vector<LogitBias> biases;
  for (int r = 0; r < R; ++r) {
    SampleSpec& s = specs[static_cast<size_t>(r)];
    s.penalties.frequency = r == 0 ? 0.0f : 0.3f * static_cast<float>(r);
    s.penalties.presence = r == 0 ? 0.0f : 0.7f;
    s.penalties.repetition = r == 0 ? 1.0f : r % 2 ? 1.3f : 0.8f;
    s.penalize_input = r != 3;
    const size_t begin = seen.size();
    std::set<int32_t> ids;
    while (ids.size() < static_cast<size_t>(40 * r)) ids.insert(static_cast<int32_t>(rng() % V));
    if (r == 1 || r == 4) ids.insert(input_ids[static_cast<size_t>(1 + r)]);
    if (r == 2 || r == 5) ids.erase(input_ids[static_cast<size_t>(1 + r)]);
    for (int32_t id : ids) seen.push_back({id, static_cast<int32_t>(rng() % 4)});  // 0: prompt only
    kernels::SampleParams& p = params[static_cast<size_t>(r)];
    p.frequency_penalty = s.penalties.frequency;
    p.presence_penalty = s.penalties.presence;
    p.repetition_penalty = s.penalties.repetition;
    p.input_row = s.penalize_input ? 1 + r : -1;
    p.num_penalty_tokens = static_cast<int32_t>(seen.size() - begin);
    s.num_penalty_tokens = p.num_penalty_tokens;
    begins.push_back(begin);
    if (r >= 2) {  // rows 2 on also have logit biases, on listed tokens and others
      bias_begins.push_back(biases.size());
      biases.push_back({seen[begin].token, 3.5f});
      biases.push_back(
          {(seen[begin].token + 1 + static_cast<int32_t>(rng() % 100)) % V, -100.0f});  // distinct
      biases.push_back({static_cast<int32_t>(V + 5), 1.0f});  // past the vocabulary: ignored
      s.num_logit_bias = p.num_logit_bias = 3;
    } else {
      bias_begins.push_back(biases.size());
    }
  }
  std::vector<float> expect = logits;
  std::vector<int32_t> greedy(R);
  for (int r = 0; r < R; ++r) {
    SampleSpec s = specs[static_cast<size_t>(r)];
    s.penalty_tokens = seen.data() + begins[static_cast<size_t>(r)];
    s.logit_bias = biases.data() + bias_begins[static_cast<size_t>(r)];
    float* row = expect.data() + static_cast<size_t>(r) * V;
    apply_penalties(row, V, s, input_ids[static_cast<size_t>(1 + r)]);
    greedy[static_cast<size_t>(r)] = static_cast<int32_t>(std::max_element(row, row + V) - row);
  }
  std::vector<kernels::PenaltyToken> d_seen_host;
  for (const PenaltyToken& p : seen) d_seen_host.push_back({p.token, p.count});
  DeviceBuffer<kernels::PenaltyToken> d_seen(d_seen_host);
  for (int r = 0; r < R; ++r)
    params[static_cast<size_t>(r)].penalty_tokens = d_seen.ptr + begins[static_cast<size_t>(r)];
  std::vector<kernels::LogitBias> d_bias_host;
  for (const LogitBias& b : biases) d_bias_host.push_back({b.token, b.bias});
  DeviceBuffer<kernels::LogitBias> d_bias(d_bias_host);
  for (int r = 0; r < R; ++r)
    params[static_cast<size_t>(r)].logit_bias = d_bias.ptr + bias_begins[static_cast<size_t>(r)];
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<kernels::SampleParams> d_params(params);
  DeviceBuffer<int32_t> d_input(input_ids), d_tokens(static_cast<size_t>(R));
  ASSERT_EQ(kernels::sample_tokens(d_logits.ptr, R, V, d_params.ptr, d_input.ptr, d_tokens.ptr,
                                   nullptr, nullptr),
            cudaSuccess);
  const std::vector<float> got = d_logits.get();
  size_t changed = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i], expect[i]) << "row " << i / V << ", token " << i % V;
    changed += got[i] != logits[i];
  }
  EXPECT_GT(changed, static_cast<size_t>(40 * 14));  // rows 1-5 list 40 * 15 tokens
  EXPECT_EQ(d_tokens.get(), greedy);
}

// Log probabilities on the device equal the host's token_logprobs for the token the kernel chose:
// greedy and sampled rows, 0, 5 and 20 alternatives (and more asked than there are), rows with
// NaN, -inf and +inf logits, and rows that ask for none left unwritten. The alternatives are
// ranked in shared memory from their threshold (ties there within the candidates it holds, row
// 10; as many candidates as it holds, row 11), or a pass each where that cannot be: an infinite
// maximum (row 7), more ties at the threshold than it holds (rows 8 and 12), fewer finite logits
// than alternatives (row 9).
// A constraint's token bitmask: masked logits become -inf in place as the host's
// apply_token_mask makes them, greedy rows take the best allowed token, and sampled rows (hot
// temperature, every token near equally likely) never draw a masked one.
TEST(CudaSamplingTest, TokenMaskMatchesTheHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(23);
  const int V = 3001, R = 8, W = (V + 31) / 32;
  std::vector<float> logits = random_vec(static_cast<size_t>(R) * V, rng, -4.0f, 4.0f);
  std::vector<uint32_t> masks(static_cast<size_t>(R) * W);
  for (uint32_t& m : masks) m = static_cast<uint32_t>(rng()) & static_cast<uint32_t>(rng());
  masks[static_cast<size_t>(W) * 3] = 0;  // row 3: a mask with a hole at the start
  DeviceBuffer<uint32_t> d_masks(masks);
  std::vector<kernels::SampleParams> params(R);
  for (int r = 0; r < R; ++r) {
    params[static_cast<size_t>(r)].temperature = r % 2 ? 5.0f : 0.0f;
    params[static_cast<size_t>(r)].random = 77ull * (r + 1);
    params[static_cast<size_t>(r)].allowed = d_masks.ptr + static_cast<size_t>(r) * W;
  }
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<kernels::SampleParams> d_params(params);
  DeviceBuffer<int32_t> d_tokens(static_cast<size_t>(R));
  ASSERT_EQ(kernels::sample_tokens(d_logits.ptr, R, V, d_params.ptr, nullptr, d_tokens.ptr, nullptr,
                                   nullptr),
            cudaSuccess);
  const std::vector<float> got_logits = d_logits.get();
  const std::vector<int32_t> tokens = d_tokens.get();
  for (int r = 0; r < R; ++r) {
    std::vector<float> row(logits.begin() + static_cast<long>(r) * V,
                           logits.begin() + static_cast<long>(r + 1) * V);
    const uint32_t* mask = masks.data() + static_cast<size_t>(r) * W;
    apply_token_mask(row.data(), V, mask);
    for (int i = 0; i < V; ++i)
      ASSERT_EQ(got_logits[static_cast<size_t>(r) * V + i], row[static_cast<size_t>(i)]) << r;
    const int32_t t = tokens[static_cast<size_t>(r)];
    ASSERT_GE(t, 0);
    EXPECT_TRUE((mask[t >> 5] >> (t & 31)) & 1u) << "row " << r << " drew masked token " << t;
    if (r % 2 == 0) {
      SampleSpec greedy;
      EXPECT_EQ(t, sample_token(row.data(), V, greedy)) << r;
    }
  }
}

TEST(CudaSamplingTest, LogprobsMatchTheHostReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(19);
  const int V = 5003, R = 13;
  std::vector<float> logits = random_vec(static_cast<size_t>(R) * V, rng, -6.0f, 6.0f);
  auto at = [&](int r, int i) -> float& {
    return logits[static_cast<size_t>(r) * V + static_cast<size_t>(i)];
  };
  for (int i = 0; i < V; i += 7) at(5, i) = NAN;
  for (int i = 3; i < V; i += 11) at(6, i) = -INFINITY;
  at(7, 100) = at(7, 4000) = INFINITY;  // shared certainty
  for (int i = 0; i < V; ++i)
    at(8, i) = i % 500 == 0 ? 2.0f + 0.1f * static_cast<float>(i / 500) : 0.5f;
  for (int i = 0; i < V; ++i) at(9, i) = i == 17 || i == 2500 || i == 4999 ? 1.0f : -INFINITY;
  for (int i = 0; i < V; ++i) at(10, i) = std::min(at(10, i), 1.0f);
  for (int i = 0; i < 5; ++i) at(10, 1000 * i + 3) = 3.0f;
  for (int i = 0; i < 40; ++i) at(10, 120 * i + 11) = 2.0f;  // the 20th value, tied 40 times
  // Exactly as many tokens at or above the 20th value as shared memory holds (256), and one more.
  for (int r : {11, 12}) {
    for (int i = 0; i < V; ++i) at(r, i) = std::min(at(r, i), 1.0f);
    for (int i = 0; i < 5; ++i) at(r, 1000 * i + 3) = 3.0f;
    for (int i = 0; i < (r == 11 ? 251 : 252); ++i) at(r, 19 * i + 4) = 2.0f;
  }
  std::vector<kernels::SampleParams> params(R);
  const int asked[R] = {0, 5, 20, -1, 3, 20, 7, 40, 20, 20, 20, 20, 20};
  for (int r = 0; r < R; ++r) {
    kernels::SampleParams& p = params[static_cast<size_t>(r)];
    p.temperature = r % 2 ? 0.8f : 0.0f;
    p.top_k = r == 4 ? 50 : 0;
    p.random = 0x9e3779b97f4a7c15ull * (r + 1);
    p.logprobs = std::min(asked[r], kernels::kMaxTopLogprobs);
  }
  DeviceBuffer<float> d_logits(logits);
  DeviceBuffer<kernels::SampleParams> d_params(params);
  DeviceBuffer<int32_t> d_tokens(static_cast<size_t>(R));
  std::vector<kernels::TokenLogprobs> poison(R);
  for (auto& p : poison) p.num_top = -7;
  DeviceBuffer<kernels::TokenLogprobs> d_lp(poison);
  ASSERT_EQ(kernels::sample_tokens(d_logits.ptr, R, V, d_params.ptr, nullptr, d_tokens.ptr,
                                   d_lp.ptr, nullptr),
            cudaSuccess);
  const std::vector<int32_t> tokens = d_tokens.get();
  const std::vector<kernels::TokenLogprobs> got = d_lp.get();
  for (int r = 0; r < R; ++r) {
    const kernels::TokenLogprobs& g = got[static_cast<size_t>(r)];
    if (asked[r] < 0) {
      EXPECT_EQ(g.num_top, -7) << r;
      continue;
    }
    TokenLogprobs want;
    token_logprobs(logits.data() + static_cast<size_t>(r) * V, V, tokens[static_cast<size_t>(r)],
                   asked[r], &want);
    if (g.logprob != want.logprob) {  // -inf equals -inf
      EXPECT_NEAR(g.logprob, want.logprob, 1e-4) << r;
    }
    ASSERT_EQ(g.num_top, want.num_top) << r;
    EXPECT_EQ(g.num_top, std::min(asked[r], kernels::kMaxTopLogprobs)) << r;
    for (int i = 0; i < g.num_top; ++i) {
      EXPECT_EQ(g.top_ids[i], want.top_ids[i]) << r << " " << i;
      if (g.top_logprobs[i] != want.top_logprobs[i]) {
        EXPECT_NEAR(g.top_logprobs[i], want.top_logprobs[i], 1e-4) << r << " " << i;
      }
    }
    if (params[static_cast<size_t>(r)].temperature == 0.0f && g.num_top > 0) {
      EXPECT_EQ(g.top_ids[0], tokens[static_cast<size_t>(r)]) << r;  // greedy takes the most likely
    }
  }
}

TEST(CudaSamplingTest, GreedyTopKTopPAndSeeds) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(7);
  const int V = 50000;
  std::vector<float> logits = random_vec(V, rng, -5.0f, 5.0f);
  logits[31337] = 9.0f;  // a clear maximum
  std::vector<int> order(V);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  kernels::SampleParams greedy;
  for (int32_t t : sample_rows(logits, 3, greedy)) EXPECT_EQ(t, 31337);
  kernels::SampleParams k1{1.0f, 1.0f, 1};
  for (int32_t t : sample_rows(logits, 3, k1)) EXPECT_EQ(t, 31337);
  // top-k 5: only the five highest, and more than one of them over the draws.
  kernels::SampleParams k5{2.0f, 1.0f, 5};
  std::set<int32_t> top5(order.begin(), order.begin() + 5), seen;
  for (int32_t t : sample_rows(logits, 400 / kDrawDivisor, k5)) {
    EXPECT_TRUE(top5.count(t)) << t;
    seen.insert(t);
  }
  EXPECT_GT(seen.size(), 1u);
  // top-p: the smallest set of highest-probability tokens whose mass reaches p. Ten distinct high
  // logits over a low tail, so that the set's edge is far from p.
  std::vector<float> peaked = random_vec(V, rng, -12.0f, -10.0f);
  for (int i = 0; i < 10; ++i) peaked[100 + 7 * i] = 6.0f - 0.3f * static_cast<float>(i);
  std::vector<int> by_logit(V);
  std::iota(by_logit.begin(), by_logit.end(), 0);
  std::sort(by_logit.begin(), by_logit.end(), [&](int a, int b) { return peaked[a] > peaked[b]; });
  double total = 0;
  for (float l : peaked) total += std::exp(static_cast<double>(l) - 6.0);
  std::set<int32_t> nucleus;
  double acc = 0, before = 0;
  for (int id : by_logit) {
    nucleus.insert(id);
    before = acc;
    acc += std::exp(static_cast<double>(peaked[id]) - 6.0) / total;
    if (acc >= 0.5) break;
  }
  ASSERT_LT(before, 0.49);
  ASSERT_GT(acc, 0.51);
  kernels::SampleParams pp{1.0f, 0.5f, 0};
  std::set<int32_t> seen_p;
  for (int32_t t : sample_rows(peaked, 400 / kDrawDivisor, pp)) {
    EXPECT_TRUE(nucleus.count(t)) << t;
    seen_p.insert(t);
  }
  EXPECT_EQ(seen_p.size(), nucleus.size());
  // NaN is never picked; a row of nothing but NaN gets -1, greedy or sampled.
  std::vector<float> some_nan = logits;
  for (int i = 0; i < V; i += 3) some_nan[static_cast<size_t>(i)] = NAN;  // 31337 % 3 == 2: kept
  some_nan[31337 - 1] = NAN;
  for (int32_t t : sample_rows(some_nan, 2, greedy)) EXPECT_EQ(t, 31337);
  kernels::SampleParams t1{1.0f, 1.0f, 0};
  for (const kernels::SampleParams& sp : {k5, pp, t1}) {
    for (int32_t t : sample_rows(some_nan, 50, sp))
      EXPECT_FALSE(std::isnan(some_nan[static_cast<size_t>(t)])) << t;
  }
  // -inf is never picked and leaves top-k as it is; +inf is picked at any temperature.
  std::vector<float> some_inf = logits;
  for (int i = 1; i < V; i += 5)
    some_inf[static_cast<size_t>(i)] = -INFINITY;  // 31337 % 5 == 2: kept
  std::vector<int> inf_order(V);
  std::iota(inf_order.begin(), inf_order.end(), 0);
  std::sort(inf_order.begin(), inf_order.end(),
            [&](int a, int b) { return some_inf[a] > some_inf[b]; });
  const std::set<int32_t> inf_top5(inf_order.begin(), inf_order.begin() + 5);
  for (int32_t t : sample_rows(some_inf, 100 / kDrawDivisor, k5))
    EXPECT_TRUE(inf_top5.count(t)) << t;
  for (int32_t t : sample_rows(some_inf, 100 / kDrawDivisor, t1))
    EXPECT_NE(some_inf[static_cast<size_t>(t)], -INFINITY) << t;
  some_inf[123] = INFINITY;
  for (const kernels::SampleParams& sp : {greedy, k5, pp, t1}) {
    for (int32_t t : sample_rows(some_inf, 4, sp)) EXPECT_EQ(t, 123);
  }
  const std::vector<float> all_nan(V, NAN);
  for (const kernels::SampleParams& sp : {greedy, k5, pp}) {
    for (int32_t t : sample_rows(all_nan, 2, sp)) EXPECT_EQ(t, -1);
  }
  // Every token banned (NaN aside): the lowest -inf id, as greedy and as on the CPU; a NaN
  // temperature samples greedily.
  std::vector<float> banned(V, -INFINITY);
  banned[0] = NAN;
  for (const kernels::SampleParams& sp : {greedy, k5, pp, t1}) {
    for (int32_t t : sample_rows(banned, 2, sp)) EXPECT_EQ(t, 1);
  }
  kernels::SampleParams nan_t{NAN, 1.0f, 0};
  for (int32_t t : sample_rows(logits, 2, nan_t)) EXPECT_EQ(t, 31337);
  // A temperature too small to invert (1 / T overflows) is greedy too; top_p 0 keeps the maximum.
  kernels::SampleParams tiny_t{1e-40f, 1.0f, 0}, p0{1.0f, 0.0f, 0};
  for (const kernels::SampleParams& sp : {tiny_t, p0}) {
    for (int32_t t : sample_rows(logits, 4, sp)) EXPECT_EQ(t, 31337);
  }
  // top-k and top-p together: top-p's mass is taken within the top k. The three highest peaked
  // logits weigh 1, 0.74 and 0.55: the first alone falls short of half, the first two reach it.
  kernels::SampleParams k3p{1.0f, 0.5f, 3};
  std::set<int32_t> seen_kp;
  for (int32_t t : sample_rows(peaked, 400 / kDrawDivisor, k3p)) seen_kp.insert(t);
  EXPECT_EQ(seen_kp, (std::set<int32_t>{100, 107}));
  // top-k keeps every token tied with the k-th.
  std::vector<float> tied(V, -3.0f);
  tied[10] = 4.0f;
  for (int id : {20000, 7, 49999, 31000}) tied[static_cast<size_t>(id)] = 3.0f;
  kernels::SampleParams k2{4.0f, 1.0f, 2};
  std::set<int32_t> seen_tied;
  for (int32_t t : sample_rows(tied, 400 / kDrawDivisor, k2)) seen_tied.insert(t);
  EXPECT_EQ(seen_tied, (std::set<int32_t>{7, 10, 20000, 31000, 49999}));
  // Same random, same token; the frequencies follow softmax(logits / T).
  std::vector<float> small = {0.0f, 1.0f, 2.0f, -1.0f, 0.5f, 1.5f, -0.5f, 0.25f};
  const int draws = 4000 / kDrawDivisor;
  auto a = sample_rows(small, draws, t1), b = sample_rows(small, draws, t1);
  EXPECT_EQ(a, b);
  double z = 0;
  for (float l : small) z += std::exp(l);
  std::map<int, int> counts;
  for (int32_t t : a) counts[t]++;
  for (int i = 0; i < 8; ++i) {
    double p = std::exp(small[i]) / z, expect = draws * p, sigma = std::sqrt(draws * p * (1 - p));
    EXPECT_NEAR(counts[i], expect, 5 * sigma) << "token " << i;
  }
}

// The draw finds its token through chunk sums and then a walk of one chunk 32 tokens at a time:
// with chunks of 49 and 126 tokens (50,000 and 128,256 logits), tokens placed early and late in
// their chunks and in chunks far apart are drawn as often as their weights say, and never a token
// of no weight.
TEST(CudaSamplingTest, DrawsFollowTheWeightsAcrossChunks) {
  SKIP_WITHOUT_GPU();
  for (int V : {50000, 128256}) {
    const int chunk = (V + 1023) / 1024;
    std::vector<float> row(static_cast<size_t>(V), -INFINITY);
    const std::vector<int> ids = {0,    31, 32, chunk - 1, chunk, 5 * chunk + 40, 600 * chunk + 33,
                                  V - 1};
    for (size_t j = 0; j < ids.size(); ++j)
      row[static_cast<size_t>(ids[j])] = 0.25f * static_cast<float>(j % 5);
    row[static_cast<size_t>(7 * chunk + 2)] = NAN;
    const int draws = 4000 / kDrawDivisor;
    kernels::SampleParams t1{1.0f, 1.0f, 0};
    std::map<int, int> counts;
    for (int32_t t : sample_rows(row, draws, t1)) counts[t]++;
    double z = 0;
    for (int id : ids) z += std::exp(static_cast<double>(row[static_cast<size_t>(id)]));
    int total = 0;
    for (int id : ids) {
      const double p = std::exp(static_cast<double>(row[static_cast<size_t>(id)])) / z;
      EXPECT_NEAR(counts[id], draws * p, 5 * std::sqrt(draws * p * (1 - p)))
          << "V " << V << " token " << id;
      total += counts[id];
    }
    EXPECT_EQ(total, draws) << "V " << V;  // nothing else drawn
  }
}

}  // namespace
}  // namespace hr::engine
