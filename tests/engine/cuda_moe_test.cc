// The mixture-of-experts kernels (kernels/moe.cuh) and the kernel changes for Qwen3 against their
// CPU references: routing against engine/moe_routing.h (softmax with and without renormalising,
// exact ties going to the lower expert, sigmoid group-limited choice with a bias); the sort of
// pairs by expert (an expert with no tokens, every token on one expert, tiles past the end); the
// experts' products in both forms against a double-precision host product; the residual add that
// sums a token's k outputs; RoPE with Qwen3's q/k norms. Skips without a device; also built
// against the CPU stand-in for the CUDA runtime (simt/, HEADROOM_SIMT).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <set>

#include "engine/cpu_backend.h"
#include "engine/moe_routing.h"
#include "engine/safetensors.h"
#include "kernels/moe.cuh"
#include "kernels/rms_norm.cuh"
#include "kernels/rope_kv.cuh"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/moe_configs.h"

namespace hr::engine {
namespace {

#define BF(p) reinterpret_cast<__nv_bfloat16*>(p)

// Whether the device runs Hopper's wgmma (the CPU stand-in, which says it is one, runs it as the
// PTX manual has it).
bool hopper() {
  int dev = 0, major = 0;
  return cudaGetDevice(&dev) == cudaSuccess &&
         cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
         major == 9;
}

kernels::MoeRouting device_routing(const MoeConfig& m) {
  kernels::MoeRouting r;
  r.num_experts = m.num_experts;
  r.top_k = m.top_k;
  r.sigmoid = m.scoring == RouterScoring::kSigmoid;
  r.renormalize = m.renormalize;
  r.num_groups = m.num_groups;
  r.topk_groups = m.topk_groups;
  r.scaling = m.routed_scaling_factor;
  return r;
}

// A sorted layout's device buffers.
struct LayoutBuffers {
  LayoutBuffers(int pairs, int E)
      : capacity(kernels::moe_capacity(pairs, E)),
        counts(E),
        offsets(E + 1),
        sorted(capacity),
        tiles(capacity / kernels::kMoeTile),
        active(E),
        pair_rows(pairs) {}
  kernels::MoeLayout layout() const {
    return {counts.ptr, offsets.ptr, sorted.ptr, tiles.ptr, active.ptr, pair_rows.ptr};
  }
  int capacity;
  DeviceBuffer<int32_t> counts, offsets, sorted, tiles, active, pair_rows;
};

// The layout for `ids` (pairs' experts), checked against a count on the host.
void expect_layout(const std::vector<int32_t>& ids, int E, const LayoutBuffers& b) {
  const int capacity = b.capacity;
  const auto c = b.counts.get(), o = b.offsets.get(), s = b.sorted.get(), tl = b.tiles.get(),
             a = b.active.get(), pr = b.pair_rows.get();
  // Each pair's row holds that pair.
  for (size_t i = 0; i < ids.size(); ++i)
    EXPECT_EQ(s[static_cast<size_t>(pr[i])], static_cast<int>(i)) << i;
  std::vector<int> want(E);
  for (int e : ids) ++want[e];
  int next_active = 0;
  for (int e = 0; e < E; ++e) {
    ASSERT_EQ(c[e], want[e]) << e;
    EXPECT_EQ(o[e] % kernels::kMoeTile, 0) << e;
    EXPECT_EQ(o[e + 1] - o[e],
              (want[e] + kernels::kMoeTile - 1) / kernels::kMoeTile * kernels::kMoeTile)
        << e;
    std::multiset<int> rows;
    for (int r = o[e]; r < o[e + 1]; ++r) {
      if (r - o[e] < want[e]) {
        ASSERT_GE(s[r], 0) << r;
        EXPECT_EQ(ids[s[r]], e) << r;
        rows.insert(s[r]);
      } else {
        EXPECT_EQ(s[r], -1) << r;
      }
      if ((r - o[e]) % kernels::kMoeTile == 0) {
        EXPECT_EQ(tl[r / kernels::kMoeTile], e) << r;
      }
    }
    EXPECT_EQ(rows.size(), static_cast<size_t>(want[e]));
    if (want[e] > 0) {
      EXPECT_EQ(a[next_active++], e);
    }
  }
  for (int i = next_active; i < E; ++i) EXPECT_EQ(a[i], -1);
  for (int r = o[E]; r < capacity; ++r) EXPECT_EQ(s[r], -1) << r;
  for (int t = o[E] / kernels::kMoeTile; t < capacity / kernels::kMoeTile; ++t)
    EXPECT_EQ(tl[t], -1) << t;
}

// Routes T random rows on the device and on the host (logits in double from the same bf16 rows);
// the choices must agree wherever the host's k-th and (k+1)-th choice scores are apart by more
// than 1e-4, and the weights within 1e-4 there. `tie` makes experts 3 and 5 identical rows.
// With `sort`, the routing also sorts the pairs (one launch up to kMoeFusedRouteTokens tokens),
// twice over the same counter (it must be left at zero), and the layout is checked against the
// choices it made.
void check_route(const MoeConfig& m, int T, int D, bool tie, bool with_bias, std::mt19937& rng,
                 bool sort = false, bool tiled = true) {
  const int E = m.num_experts, K = m.top_k;
  std::vector<float> x = random_vec(static_cast<size_t>(T) * D, rng);
  std::vector<float> router = random_vec(static_cast<size_t>(E) * D, rng, -0.3f, 0.3f);
  if (tie) std::copy_n(&router[3 * D], D, &router[5 * D]);
  std::vector<float> bias = random_vec(static_cast<size_t>(E), rng, -0.05f, 0.05f);
  DeviceBuffer<uint16_t> d_x(to_bf16(x));
  DeviceBuffer<float> d_router(router), d_bias(bias);
  DeviceBuffer<int32_t> d_ids(static_cast<size_t>(T) * K);
  DeviceBuffer<float> d_w(static_cast<size_t>(T) * K), d_logits(static_cast<size_t>(T) * E);
  kernels::MoeRouteParams p;
  p.logits = d_logits.ptr;
  p.x = BF(d_x.ptr);
  p.router = d_router.ptr;
  p.bias = with_bias ? d_bias.ptr : nullptr;
  p.num_tokens = T;
  p.dim = D;
  p.routing = device_routing(m);
  p.topk_ids = d_ids.ptr;
  p.topk_weights = d_w.ptr;
  p.tiled = tiled;
  LayoutBuffers b(T * K, E);
  DeviceBuffer<int32_t> counter(std::vector<int32_t>{0});
  if (sort) {
    p.layout = b.layout();
    p.capacity = b.capacity;
    p.counter = counter.ptr;
  }
  ASSERT_EQ(kernels::moe_route(p, nullptr), cudaSuccess);
  if (sort) {
    ASSERT_EQ(counter.get()[0], 0);
    ASSERT_EQ(cudaMemset(b.sorted.ptr, 0x7f, b.capacity * 4), cudaSuccess);
    ASSERT_EQ(kernels::moe_route(p, nullptr), cudaSuccess);
    ASSERT_EQ(counter.get()[0], 0);
  }
  const auto ids = d_ids.get();
  if (sort) expect_layout(ids, E, b);
  const auto w = d_w.get();
  std::vector<float> logits(static_cast<size_t>(T) * E);
  for (int t = 0; t < T; ++t) {
    for (int e = 0; e < E; ++e) {
      double s = 0;
      for (int i = 0; i < D; ++i) s += static_cast<double>(x[t * D + i]) * router[e * D + i];
      logits[t * E + e] = static_cast<float>(s);
    }
  }
  std::vector<int32_t> want_ids(static_cast<size_t>(T) * K);
  std::vector<float> want_w(want_ids.size());
  route_tokens(logits.data(), T, m, with_bias ? bias.data() : nullptr, want_ids.data(),
               want_w.data());
  // The host's choice scores, to find near-ties.
  MoeConfig all = m;
  all.top_k = E;
  all.renormalize = false;
  all.routed_scaling_factor = 1.0f;
  all.num_groups = all.topk_groups = 1;
  std::vector<int32_t> order(static_cast<size_t>(T) * E);
  std::vector<float> scores(order.size());
  route_tokens(logits.data(), T, all, with_bias ? bias.data() : nullptr, order.data(),
               scores.data());
  int compared = 0;
  for (int t = 0; t < T; ++t) {
    bool near_tie = false;
    for (int j = 0; j < K && j + 1 < E; ++j) {  // within the top k and at its edge
      const float a = scores[t * E + j], b = scores[t * E + j + 1];
      const float ba = with_bias ? bias[order[t * E + j]] : 0,
                  bb = with_bias ? bias[order[t * E + j + 1]] : 0;
      const bool exact_tie =
          tie && std::set<int>{order[t * E + j], order[t * E + j + 1]} == std::set<int>{3, 5};
      if (!exact_tie && std::abs((a + ba) - (b + bb)) < 1e-4f) near_tie = true;
    }
    if (near_tie) continue;
    ++compared;
    for (int j = 0; j < K; ++j) {
      ASSERT_EQ(ids[t * K + j], want_ids[t * K + j]) << "token " << t << " choice " << j;
      EXPECT_NEAR(w[t * K + j], want_w[t * K + j], 1e-4) << "token " << t << " choice " << j;
    }
  }
  EXPECT_GT(compared, T / 2);
}

// More than kMoeFusedRouteTokens tokens: the tiled product (64 tokens by 128 experts a block;
// here tiles cut by the tokens, the experts and the columns) and the row kernel alike.
TEST(CudaMoeTest, RouteMatchesTheHost) {
  SKIP_WITHOUT_GPU();
  for (bool tiled : {true, false}) {
    std::mt19937 rng(7);
    check_route(softmax_moe(128, 8, true), 37, 64, false, false, rng, false, tiled);
    check_route(softmax_moe(8, 2, false), 19, 136, false, false, rng, false, tiled);
    check_route(sigmoid_grouped_moe(64, 6, 8, 3, 2.5f), 21, 96, false, true, rng, false, tiled);
    check_route(softmax_moe(160, 4, true), 130, 100, false, false, rng, false, tiled);
  }
}

// The residual-stream form, as the backend routes: each row normalised in fp32 (times the norm
// weight) before the router's product, and written out in bf16 for the experts; more than one
// tile of tokens (and of experts), tiled and by rows.
TEST(CudaMoeTest, RouteFromTheResidualStreamMatchesTheHost) {
  SKIP_WITHOUT_GPU();
  for (auto [tiled, experts] :
       {std::pair{true, 128}, std::pair{true, 160}, std::pair{false, 128}}) {
    std::mt19937 rng(11);
    const MoeConfig m = softmax_moe(experts, 8, true);  // (160: two tiles of experts)
    const int T = 70, D = 136, E = m.num_experts, K = m.top_k;
    std::vector<float> resid = random_vec(static_cast<size_t>(T) * D, rng, -2.0f, 2.0f);
    std::vector<float> norm = random_vec(static_cast<size_t>(D), rng, 0.5f, 1.5f);
    std::vector<float> router = random_vec(static_cast<size_t>(E) * D, rng, -0.3f, 0.3f);
    DeviceBuffer<float> d_resid(resid), d_norm(norm), d_router(router);
    DeviceBuffer<int32_t> d_ids(static_cast<size_t>(T) * K);
    DeviceBuffer<float> d_w(static_cast<size_t>(T) * K), d_logits(static_cast<size_t>(T) * E);
    DeviceBuffer<uint16_t> d_normed(static_cast<size_t>(T) * D);
    kernels::MoeRouteParams p;
    p.resid = d_resid.ptr;
    p.norm_weight = d_norm.ptr;
    p.eps = 1e-6f;
    p.normed_out = BF(d_normed.ptr);
    p.router = d_router.ptr;
    p.num_tokens = T;
    p.dim = D;
    p.routing = device_routing(m);
    p.logits = d_logits.ptr;
    p.topk_ids = d_ids.ptr;
    p.topk_weights = d_w.ptr;
    p.tiled = tiled;
    ASSERT_EQ(kernels::moe_route(p, nullptr), cudaSuccess);
    const auto logits = d_logits.get();
    const auto normed = d_normed.get();
    for (int t = 0; t < T; ++t) {
      double ss = 0;
      for (int i = 0; i < D; ++i) ss += static_cast<double>(resid[t * D + i]) * resid[t * D + i];
      const double inv = 1.0 / std::sqrt(ss / D + 1e-6);
      for (int i = 0; i < D; ++i) {
        const double want = resid[t * D + i] * inv * norm[i];
        EXPECT_NEAR(bf16_to_f32(normed[t * D + i]), want, 1e-2 * std::max(1.0, std::abs(want)))
            << (tiled ? "tiled " : "rows ") << t << "," << i;
      }
      for (int e = 0; e < E; ++e) {
        double s = 0;
        for (int i = 0; i < D; ++i) s += resid[t * D + i] * inv * norm[i] * router[e * D + i];
        EXPECT_NEAR(logits[t * E + e], s, 1e-4 * std::max(1.0, std::abs(s)))
            << (tiled ? "tiled " : "rows ") << t << "," << e;
      }
    }
  }
}

// Routing with the sort: decode's few tokens in one launch (the last block takes the top k and
// the sort), and a larger step in three.
TEST(CudaMoeTest, RouteAndSortMatchTheHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  const MoeConfig qwen = softmax_moe(128, 8, true);
  check_route(qwen, 1, 256, false, false, rng, true);
  check_route(qwen, kernels::kMoeFusedRouteTokens, 64, false, false, rng, true);
  check_route(qwen, 23, 64, false, false, rng, true);
  // Few experts: several warps share each expert's columns.
  check_route(softmax_moe(8, 2, false), 3, 520, false, false, rng, true);
  check_route(sigmoid_grouped_moe(64, 6, 8, 3, 1.0f), 5, 96, false, true, rng, true);
  // More experts than the block has threads.
  check_route(softmax_moe(512, 4, false), kernels::kMoeFusedRouteTokens, 512, false, false, rng,
              true);
}

// Experts 3 and 5 with the same router row score exactly alike: the lower one is chosen first.
TEST(CudaMoeTest, RouteTiesGoToTheLowerExpert) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(8);
  // Every expert chosen: the tie is always inside the choice, in order.
  check_route(softmax_moe(8, 8, true), 9, 32, true, false, rng);
}

// moe_align's layout for `ids`.
void check_align(const std::vector<int32_t>& ids, int E) {
  const int pairs = static_cast<int>(ids.size());
  LayoutBuffers b(pairs, E);
  DeviceBuffer<int32_t> d_ids(ids);
  ASSERT_EQ(kernels::moe_align(d_ids.ptr, pairs, E, b.capacity, b.layout(), nullptr), cudaSuccess);
  expect_layout(ids, E, b);
}

TEST(CudaMoeTest, AlignSortsPairsByExpert) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  std::vector<int32_t> ids(300);
  for (auto& e : ids) e = static_cast<int>(rng() % 13);  // experts 13..15 get nothing
  check_align(ids, 16);
  check_align(std::vector<int32_t>(150, 6), 8);  // every pair on one expert: three tiles
  check_align({4}, 128);                         // one decode pair
}

// The experts of a step whose pairs' experts are `ids` ([T, K]), in both kernel forms, against a
// double-precision host product (activations rounded to bf16 as the device keeps them).
void check_experts(int T, int K, int E, int D, int F, const std::vector<int32_t>& ids,
                   std::mt19937& rng) {
  std::vector<float> x = random_vec(static_cast<size_t>(T) * D, rng);
  std::vector<float> gu = random_vec(static_cast<size_t>(E) * 2 * F * D, rng, -0.2f, 0.2f);
  std::vector<float> down = random_vec(static_cast<size_t>(E) * D * F, rng, -0.2f, 0.2f);
  std::vector<float> w = random_vec(static_cast<size_t>(T) * K, rng, 0.1f, 1.0f);
  DeviceBuffer<uint16_t> d_x(to_bf16(x)), d_gu(to_bf16(gu)), d_down(to_bf16(down));
  DeviceBuffer<float> d_w(w);
  const int pairs = T * K;
  LayoutBuffers b(pairs, E);
  const int capacity = b.capacity;
  const kernels::MoeLayout l = b.layout();
  DeviceBuffer<int32_t> d_ids(ids);
  ASSERT_EQ(kernels::moe_align(d_ids.ptr, pairs, E, capacity, l, nullptr), cudaSuccess);
  // The host's answer.
  std::vector<float> want(static_cast<size_t>(pairs) * D);
  std::vector<float> act(F);
  for (int pr = 0; pr < pairs; ++pr) {
    const int e = ids[pr], t = pr / K;
    for (int f = 0; f < F; ++f) {
      double g = 0, u = 0;
      for (int i = 0; i < D; ++i) {
        g += static_cast<double>(x[t * D + i]) * gu[(static_cast<size_t>(e) * 2 * F + f) * D + i];
        u += static_cast<double>(x[t * D + i]) *
             gu[(static_cast<size_t>(e) * 2 * F + F + f) * D + i];
      }
      act[f] = bf16_to_f32(f32_to_bf16(static_cast<float>(g / (1 + std::exp(-g)) * u)));
    }
    for (int d = 0; d < D; ++d) {
      double s = 0;
      for (int f = 0; f < F; ++f)
        s += static_cast<double>(act[f]) * down[(static_cast<size_t>(e) * D + d) * F + f];
      want[static_cast<size_t>(pr) * D + d] = static_cast<float>(s * w[pr]);
    }
  }
  // The step's parameters, but for the outputs (and the weights, where a share is held).
  auto params = [&](uint16_t* act) {
    kernels::MoeExpertsParams p;
    p.x = BF(d_x.ptr);
    p.w_gate_up = BF(d_gu.ptr);
    p.w_down = BF(d_down.ptr);
    p.topk_weights = d_w.ptr;
    p.topk_ids = d_ids.ptr;
    p.layout = l;
    p.num_tokens = T;
    p.top_k = K;
    p.num_experts = E;
    p.dim = D;
    p.ffn = F;
    p.capacity = capacity;
    p.act = BF(act);
    return p;
  };
  // The upper half of the experts, as a rank of expert parallelism holds them.
  const int first = E / 2, held = E - E / 2;
  std::vector<float> gu_held(gu.begin() + static_cast<size_t>(first) * 2 * F * D, gu.end());
  std::vector<float> down_held(down.begin() + static_cast<size_t>(first) * D * F, down.end());
  DeviceBuffer<uint16_t> d_gu_held(to_bf16(gu_held)), d_down_held(to_bf16(down_held));
  // The GEMV with and without the down weights' prefetch (a limit of 0: never), and the GEMM;
  // then the GEMV and the GEMM over the held experts alone; then the GEMM of wide warps and the
  // GEMM on warpgroups (wgmma: Hopper only), each over all the experts and over the held ones.
  std::vector<float> gemv_rows;  // the GEMV's k rows per token
  for (int form = 0; form < 9; ++form) {
    const bool part = form == 3 || form == 4 || form == 6 || form == 8;
    const auto kernel = form < 2 || form == 3 ? kernels::MoeKernel::kGemv
                        : form < 5            ? kernels::MoeKernel::kGroupedGemm
                        : form < 7            ? kernels::MoeKernel::kGroupedGemmWide
                                              : kernels::MoeKernel::kGroupedGemmWarpgroup;

    DeviceBuffer<uint16_t> d_act(static_cast<size_t>(capacity) * F);
    DeviceBuffer<float> d_out(static_cast<size_t>(pairs) * D);
    if (part) cudaMemset(d_out.ptr, 0, static_cast<size_t>(pairs) * D * 4);
    kernels::MoeExpertsParams p = params(d_act.ptr);
    if (part) {
      p.w_gate_up = BF(d_gu_held.ptr);
      p.w_down = BF(d_down_held.ptr);
      p.first_expert = first;
      p.num_local_experts = held;
    }
    p.out = d_out.ptr;
    if (form == 1) p.prefetch_limit = 0;
    if (kernel == kernels::MoeKernel::kGroupedGemmWarpgroup && !hopper()) {
      EXPECT_EQ(kernels::moe_experts(p, kernel, nullptr), cudaErrorNotSupported);
      continue;
    }
    ASSERT_EQ(kernels::moe_experts(p, kernel, nullptr), cudaSuccess);
    const auto out = d_out.get();
    if (form == 0) gemv_rows = out;
    double num = 0, den = 0;
    for (size_t i = 0; i < out.size(); ++i) {
      ASSERT_TRUE(std::isfinite(out[i])) << i;
      const int e = ids[i / static_cast<size_t>(D)];
      if (part && (e < first || e >= first + held)) {
        // Another rank's expert: its pairs' rows untouched.
        ASSERT_EQ(out[i], 0.0f) << "pair " << i / D << " of expert " << e << ", form " << form;
        continue;
      }
      num += (out[i] - want[i]) * static_cast<double>(out[i] - want[i]);
      den += static_cast<double>(want[i]) * want[i];
    }
    if (den == 0) continue;  // no pair on the held experts
    static const char* const kForms[] = {"GEMV",
                                         "GEMV without prefetch",
                                         "grouped GEMM",
                                         "GEMV, held experts",
                                         "grouped GEMM, held experts",
                                         "grouped GEMM of wide warps",
                                         "grouped GEMM of wide warps, held experts",
                                         "grouped GEMM on warpgroups",
                                         "grouped GEMM on warpgroups, held experts"};
    EXPECT_LT(std::sqrt(num / den), 1e-2) << kForms[form] << " T=" << T;
  }
  if (T > kernels::kMoeCombineTokens) return;
  // Down writing the residual update: each token's k outputs added in choice order, and the new
  // rows' sums of squares; streamed (the weights evict-first) and not.
  std::vector<float> resid = random_vec(static_cast<size_t>(T) * D, rng);
  for (int form = 0; form < 2; ++form) {
    DeviceBuffer<uint16_t> d_act(static_cast<size_t>(capacity) * F);
    DeviceBuffer<float> d_in(resid), d_out(static_cast<size_t>(T) * D);
    DeviceBuffer<float> d_sumsq(std::vector<float>(static_cast<size_t>(T), 0.0f));
    kernels::MoeExpertsParams p = params(d_act.ptr);
    p.resid_in = d_in.ptr;
    p.resid_out = d_out.ptr;
    p.out_sumsq = d_sumsq.ptr;
    if (form == 1) p.prefetch_limit = 0;
    ASSERT_EQ(kernels::moe_experts(p, kernels::MoeKernel::kGemv, nullptr), cudaSuccess);
    const auto got = d_out.get();
    const auto sumsq = d_sumsq.get();
    double num = 0, den = 0;
    int unequal = 0;
    for (int t = 0; t < T; ++t) {
      double want_sq = 0;
      for (int d = 0; d < D; ++d) {
        double sum = 0;
        for (int k = 0; k < K; ++k) sum += want[static_cast<size_t>(t * K + k) * D + d];
        const float g = got[static_cast<size_t>(t) * D + d];
        ASSERT_TRUE(std::isfinite(g));
        // The same bits as the GEMV's rows added as the norm kernel adds them (in choice order).
        float rows = gemv_rows[static_cast<size_t>(t * K) * D + d];
        for (int k = 1; k < K; ++k) rows += gemv_rows[static_cast<size_t>(t * K + k) * D + d];
        if (g != resid[t * D + d] + rows) ++unequal;
        num += (g - resid[t * D + d] - sum) * (g - resid[t * D + d] - sum);
        den += sum * sum;
        want_sq += static_cast<double>(g) * g;
      }
      EXPECT_NEAR(sumsq[t], want_sq, 1e-4 * want_sq) << "T=" << T << " token " << t;
    }
    EXPECT_LT(std::sqrt(num / den), 1e-2) << "combined down, form " << form << " T=" << T;
    EXPECT_EQ(unequal, 0) << "combined down against the rows' sum, form " << form << " T=" << T;
  }
  // Refused: more tokens than the form takes, the grouped GEMM, a share of the experts.
  kernels::MoeExpertsParams bad = params(d_x.ptr);
  bad.capacity = kernels::moe_capacity((kernels::kMoeCombineTokens + 1) * K, E);
  DeviceBuffer<float> d_r(static_cast<size_t>(kernels::kMoeCombineTokens + 1) * D);
  bad.resid_in = d_r.ptr;
  bad.resid_out = d_r.ptr + D;
  bad.out_sumsq = d_r.ptr;
  bad.num_tokens = kernels::kMoeCombineTokens + 1;
  EXPECT_EQ(kernels::moe_experts(bad, kernels::MoeKernel::kGemv, nullptr), cudaErrorInvalidValue);
  bad.num_tokens = 1;
  EXPECT_EQ(kernels::moe_experts(bad, kernels::MoeKernel::kGroupedGemm, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::moe_experts(bad, kernels::MoeKernel::kGroupedGemmWide, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::moe_experts(bad, kernels::MoeKernel::kGroupedGemmWarpgroup, nullptr),
            cudaErrorInvalidValue);
  bad.num_local_experts = E / 2;
  EXPECT_EQ(kernels::moe_experts(bad, kernels::MoeKernel::kGemv, nullptr), cudaErrorInvalidValue);
}

TEST(CudaMoeTest, ExpertsMatchTheHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(10);
  // Decode: one token, its k experts.
  check_experts(1, 4, 16, 64, 48, {3, 9, 0, 15}, rng);
  // Qwen3's top 8 (two runs of the combined down's experts in flight), and a top 6 (a run cut
  // short) over two tokens sharing experts.
  check_experts(1, 8, 16, 64, 48, {3, 9, 0, 15, 1, 2, 7, 11}, rng);
  check_experts(2, 6, 12, 40, 72, {4, 0, 11, 5, 2, 9, 9, 4, 1, 0, 7, 3}, rng);
  // The largest top k the kernels take (16: four runs of the combined down's experts).
  {
    std::vector<int32_t> ids(32);
    for (int i = 0; i < 32; ++i) ids[static_cast<size_t>(i)] = (i * 7 + i / 16) % 20;
    check_experts(2, 16, 20, 32, 40, ids, rng);
  }
  // A small batch: some experts without tokens, the weights' columns not a multiple of the tile.
  {
    const int T = 13, K = 2, E = 8;
    std::vector<int32_t> ids;
    for (int t = 0; t < T; ++t) {
      const int a = static_cast<int>(rng() % 5);
      ids.push_back(a);
      ids.push_back(a + 1 + static_cast<int>(rng() % 2));  // experts 7 has none
    }
    check_experts(T, K, E, 72, 40, ids, rng);
  }
  // Mixtral's fixture's shape at a prefill of 52 tokens.
  {
    std::vector<int32_t> ids;
    for (int t = 0; t < 52; ++t) {
      const int a = static_cast<int>(rng() % 8);
      ids.push_back(a);
      ids.push_back((a + 1 + static_cast<int>(rng() % 7)) % 8);
    }
    check_experts(52, 2, 8, 128, 96, ids, rng);
  }
  // More output columns than a block of either GEMM takes (gate/up's 128, the wide down's 256),
  // the last block's mostly past the end, and a k not a multiple of the GEMMs' slice.
  {
    std::vector<int32_t> ids;
    for (int t = 0; t < 40; ++t) {
      ids.push_back(t % 3);
      ids.push_back(3);
    }
    check_experts(40, 2, 4, 264, 136, ids, rng);
  }
  // Longer expert rows: down's GEMV takes two rows a warp, then one (a last block whose warps
  // run past the rows).
  check_experts(3, 2, 4, 72, 1040, {0, 3, 1, 3, 2, 0}, rng);
  check_experts(2, 2, 4, 40, 2056, {1, 2, 2, 3}, rng);
  // Every token on one expert, across tiles (and GEMV groups of 8).
  check_experts(kOnSimt ? 70 : 150, 1, 4, 64, 64, std::vector<int32_t>(kOnSimt ? 70 : 150, 2), rng);
}

// The grouped GEMM's shared memory (past 48 KiB) is raised on each device it runs on: one GPU a
// rank puts several devices in one process. (On the CPU stand-in, two simulated devices.)
TEST(CudaMoeTest, ExpertsRunOnEveryDevice) {
  SKIP_WITHOUT_GPU();
#ifdef HEADROOM_SIMT
  hr::simt::set_device_count(2);
  struct Restore {
    ~Restore() { hr::simt::set_device_count(1); }
  } restore;
#endif
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  if (count < 2) GTEST_SKIP() << "two GPUs are needed";
  std::mt19937 rng(12);
  std::vector<int32_t> ids;
  for (int t = 0; t < 20; ++t) {
    ids.push_back(t % 4);
    ids.push_back(4 + t % 3);
  }
  for (int device : {0, 1, 0}) {
    SCOPED_TRACE("device " + std::to_string(device));
    ASSERT_EQ(cudaSetDevice(device), cudaSuccess);
    check_experts(20, 2, 8, 64, 48, ids, rng);
  }
}

// A MoE layer's k weighted outputs per token summed into the residual stream by the next norm.
TEST(CudaMoeTest, AddRmsNormSumsEachTokensOutputs) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(11);
  const int T = 5, D = 96, K = 3;
  std::vector<float> x = random_vec(static_cast<size_t>(T) * D, rng);
  std::vector<float> delta = random_vec(static_cast<size_t>(T) * K * D, rng);
  std::vector<float> weight = random_vec(D, rng, 0.5f, 1.5f);
  DeviceBuffer<float> d_x(x), d_delta(delta), d_weight(weight);
  DeviceBuffer<uint16_t> d_out(static_cast<size_t>(T) * D);
  kernels::AddRmsNormParams p;
  p.x = d_x.ptr;
  p.delta = d_delta.ptr;
  p.delta_rows = K;
  p.weight = d_weight.ptr;
  p.out = BF(d_out.ptr);
  p.num_rows = T;
  p.dim = D;
  ASSERT_EQ(kernels::add_rms_norm(p, nullptr), cudaSuccess);
  const auto got_x = d_x.get();
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < D; ++i) {
      float s = x[t * D + i];
      for (int j = 0; j < K; ++j) s += delta[(t * K + j) * D + i];
      EXPECT_NEAR(got_x[t * D + i], s, 1e-5) << t << "," << i;
    }
  }
}

// Qwen3: each query and key head RMS-normalised with its own weights before the rotation.
TEST(CudaMoeTest, RopeWithQkNormMatchesTheHost) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  const int T = 3, nh = 4, nkv = 2, hd = 64, Q = nh * hd, KV = nkv * hd, W = Q + 2 * KV;
  std::vector<float> qkv = random_vec(static_cast<size_t>(T) * W, rng, -2.0f, 2.0f);
  std::vector<float> qn = random_vec(hd, rng, 0.5f, 1.5f), kn = random_vec(hd, rng, 0.5f, 1.5f);
  ModelConfig c;
  c.head_dim = hd;
  c.rope_theta = 1e6;
  const std::vector<float> inv = c.rope_inv_freq();
  std::vector<int32_t> pos{0, 7, 300}, slots{5, 0, 2};
  DeviceBuffer<float> d_qkv(qkv), d_qn(qn), d_kn(kn), d_inv(inv);
  DeviceBuffer<int32_t> d_pos(pos), d_slots(slots);
  DeviceBuffer<uint16_t> d_q(static_cast<size_t>(T) * Q), d_k(6 * KV), d_v(6 * KV);
  kernels::RopeKvParams p;
  p.qkv = d_qkv.ptr;
  p.positions = d_pos.ptr;
  p.slot_mapping = d_slots.ptr;
  p.inv_freq = d_inv.ptr;
  p.q_norm = d_qn.ptr;
  p.k_norm = d_kn.ptr;
  p.eps = 1e-6f;
  p.q_out = BF(d_q.ptr);
  p.k_cache = BF(d_k.ptr);
  p.v_cache = BF(d_v.ptr);
  p.num_tokens = T;
  p.num_heads = nh;
  p.num_kv_heads = nkv;
  p.head_dim = hd;
  ASSERT_EQ(kernels::rope_write_kv(p, nullptr), cudaSuccess);
  const auto q = d_q.get(), k = d_k.get(), v = d_v.get();
  for (int t = 0; t < T; ++t) {
    std::vector<float> row(qkv.begin() + t * W, qkv.begin() + (t + 1) * W);
    for (int h = 0; h < nh + nkv; ++h) {
      float* head = &row[h * hd];
      rms_norm(head, h < nh ? qn.data() : kn.data(), hd, 1e-6f, head);
      apply_rope(head, hd, pos[t], inv.data());
      for (int i = 0; i < hd; ++i) {
        const float got = h < nh ? bf16_to_f32(q[t * Q + h * hd + i])
                                 : bf16_to_f32(k[slots[t] * KV + (h - nh) * hd + i]);
        EXPECT_NEAR(got, head[i], 2e-2 * std::max(1.0f, std::abs(head[i])))
            << t << " head " << h << " " << i;
      }
    }
    for (int i = 0; i < KV; ++i)
      EXPECT_NEAR(bf16_to_f32(v[slots[t] * KV + i]), row[Q + KV + i], 2e-2) << t << " v " << i;
  }
}

}  // namespace
}  // namespace hr::engine
