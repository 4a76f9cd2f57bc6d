// Each CUDA kernel against its CPU reference (the CPU backend's own functions where they exist):
// random inputs without ties, odd sizes, block-boundary lengths, GQA ratios 1, 4 and 8, outputs
// poisoned before each launch. Skips without a device. Sampling: cuda_sampling_test.cc. Also built
// against the CPU stand-in for the CUDA runtime (simt/, HEADROOM_SIMT).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include "engine/attention_plan.h"
#include "engine/cpu_backend.h"
#include "engine/cuda_gemm.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "kernels/embedding.cuh"
#include "kernels/gemv.cuh"
#include "kernels/launch.cuh"
#include "kernels/paged_attention.cuh"
#include "kernels/rms_norm.cuh"
#include "kernels/rope_kv.cuh"
#include "kernels/silu_mul.cuh"
#include "tests/engine/cuda_test_util.h"

namespace hr::engine {
namespace {

#define BF(p) reinterpret_cast<__nv_bfloat16*>(p)

// ‖a − b‖ / ‖b‖.
double rel_error(const std::vector<float>& a, const std::vector<float>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]);
    den += static_cast<double>(b[i]) * b[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

TEST(CudaKernelsTest, EmbeddingGatherCopiesRows) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(1);
  const int V = 37, D = 136, T = 11;
  std::vector<float> table = random_vec(static_cast<size_t>(V) * D, rng);
  DeviceBuffer<uint16_t> d_table(to_bf16(table));
  std::vector<int32_t> ids(T);
  for (int& id : ids) id = static_cast<int>(rng() % V);
  DeviceBuffer<int32_t> d_ids(ids);
  DeviceBuffer<float> d_out(static_cast<size_t>(T) * D);
  ASSERT_EQ(kernels::embedding_gather(BF(d_table.ptr), d_ids.ptr, nullptr, nullptr, T, V, D,
                                      d_out.ptr, nullptr, nullptr),
            cudaSuccess);
  auto out = d_out.get();
  for (int t = 0; t < T; ++t) {
    for (int i = 0; i < D; ++i) ASSERT_EQ(out[t * D + i], table[ids[t] * D + i]) << t << "," << i;
  }
  // Rows fed from the previous step's sampled tokens take those instead of ids.
  // A fed -1 (the sampler's "no token") or an id past the table reads row 0, not outside it.
  const std::vector<int32_t> fed_tokens = {5, 36, 0, -1, V};
  std::vector<int32_t> fed_rows(T, -1);
  fed_rows[0] = 2;
  fed_rows[4] = 0;
  fed_rows[5] = 3;
  fed_rows[7] = 4;
  fed_rows[T - 1] = 1;
  DeviceBuffer<int32_t> d_fed_rows(fed_rows), d_fed_tokens(fed_tokens);
  DeviceBuffer<int32_t> d_ids_out(std::vector<int32_t>(T, 12345));
  ASSERT_EQ(cudaMemset(d_out.ptr, 0xFF, d_out.n * sizeof(float)), cudaSuccess);  // poisoned again
  ASSERT_EQ(kernels::embedding_gather(BF(d_table.ptr), d_ids.ptr, d_fed_rows.ptr, d_fed_tokens.ptr,
                                      T, V, D, d_out.ptr, d_ids_out.ptr, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  out = d_out.get();
  const std::vector<int32_t> ids_out = d_ids_out.get();
  for (int t = 0; t < T; ++t) {
    int id = fed_rows[t] >= 0 ? fed_tokens[fed_rows[t]] : ids[t];
    EXPECT_EQ(ids_out[t], id) << t;  // as given or fed, -1 and V included
    if (id < 0 || id >= V) id = 0;
    for (int i = 0; i < D; ++i) ASSERT_EQ(out[t * D + i], table[id * D + i]) << t << "," << i;
  }
  EXPECT_EQ(kernels::embedding_gather(BF(d_table.ptr), d_ids.ptr, nullptr, nullptr, T, V, 100,
                                      d_out.ptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::embedding_gather(BF(d_table.ptr), d_ids.ptr, nullptr, nullptr, T, 0, D,
                                      d_out.ptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  EXPECT_EQ(kernels::embedding_gather(BF(d_table.ptr), d_ids.ptr, d_fed_rows.ptr, nullptr, T, V, D,
                                      d_out.ptr, nullptr, nullptr),
            cudaErrorInvalidValue);
  // A later pipeline stage: without the table, only the ids (and out left alone).
  DeviceBuffer<int32_t> d_ids_only(std::vector<int32_t>(T, 12345));
  ASSERT_EQ(cudaMemset(d_out.ptr, 0x7F, d_out.n * sizeof(float)), cudaSuccess);
  const std::vector<float> before = d_out.get();
  ASSERT_EQ(kernels::embedding_gather(nullptr, d_ids.ptr, d_fed_rows.ptr, d_fed_tokens.ptr, T, V, D,
                                      nullptr, d_ids_only.ptr, nullptr),
            cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(d_ids_only.get(), ids_out);
  EXPECT_EQ(d_out.get(), before);
  EXPECT_EQ(kernels::embedding_gather(nullptr, d_ids.ptr, nullptr, nullptr, T, V, D, nullptr,
                                      nullptr, nullptr),
            cudaErrorInvalidValue);  // nothing to write
  EXPECT_EQ(kernels::embedding_gather(nullptr, d_ids.ptr, nullptr, nullptr, T, V, D, d_out.ptr,
                                      d_ids_only.ptr, nullptr),
            cudaErrorInvalidValue);  // rows without a table
}

TEST(CudaKernelsTest, AddRmsNormMatchesReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(2);
  for (int D : {128, 1000, 4096}) {
    const int R = 9;
    std::vector<float> x = random_vec(static_cast<size_t>(R) * D, rng);
    std::vector<float> delta = random_vec(x.size(), rng);
    std::vector<float> w = random_vec(D, rng, 0.5f, 1.5f);
    std::vector<int32_t> rows = {7, 2, 4};
    DeviceBuffer<float> d_x(x), d_delta(delta), d_w(w);
    DeviceBuffer<int32_t> d_rows(rows);
    DeviceBuffer<uint16_t> d_out(rows.size() * D);
    kernels::AddRmsNormParams p;
    p.x = d_x.ptr;
    p.delta = d_delta.ptr;
    p.weight = d_w.ptr;
    p.rows = d_rows.ptr;
    p.out = BF(d_out.ptr);
    p.num_rows = static_cast<int>(rows.size());
    p.dim = D;
    p.eps = 1e-5f;
    ASSERT_EQ(kernels::add_rms_norm(p, nullptr), cudaSuccess);
    auto out = bf16_to_float(d_out.get());
    auto x_after = d_x.get();
    for (size_t i = 0; i < rows.size(); ++i) {
      const int r = rows[i];
      std::vector<float> xr(x.begin() + r * D, x.begin() + (r + 1) * D), ref(D);
      for (int c = 0; c < D; ++c) xr[c] += delta[r * D + c];
      rms_norm(xr.data(), w.data(), D, 1e-5f, ref.data());
      std::vector<float> got(out.begin() + i * D, out.begin() + (i + 1) * D);
      EXPECT_LT(rel_error(got, ref), 5e-3) << "D=" << D << " row " << r;
      for (int c = 0; c < D; ++c) ASSERT_EQ(x_after[r * D + c], xr[c]);
    }
    // Rows not listed are left alone.
    for (int c = 0; c < D; ++c) ASSERT_EQ(x_after[0 * D + c], x[c]);
    // The add alone (a pipeline stage's end): every row, two delta rows each, no norm.
    std::vector<float> two = random_vec(2 * x.size(), rng);
    DeviceBuffer<float> d_y(x), d_two(two);
    kernels::AddRmsNormParams a;
    a.x = d_y.ptr;
    a.delta = d_two.ptr;
    a.delta_rows = 2;
    a.num_rows = R;
    a.dim = D;
    ASSERT_EQ(kernels::add_rms_norm(a, nullptr), cudaSuccess);
    const auto y = d_y.get();
    for (int r = 0; r < R; ++r) {
      for (int c = 0; c < D; ++c) {
        const size_t i = static_cast<size_t>(r) * D + c;
        ASSERT_EQ(y[i], x[i] + (two[(2 * r) * static_cast<size_t>(D) + c] +
                                two[(2 * r + 1) * static_cast<size_t>(D) + c]))
            << r << "," << c;
      }
    }
    a.delta = nullptr;  // nothing to add
    EXPECT_EQ(kernels::add_rms_norm(a, nullptr), cudaErrorInvalidValue);
    a.delta = d_two.ptr;
    a.weight = d_w.ptr;  // a weight and no output
    EXPECT_EQ(kernels::add_rms_norm(a, nullptr), cudaErrorInvalidValue);
  }
}

TEST(CudaKernelsTest, RopeWritesRotatedQueriesAndCacheSlots) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(3);
  auto cfg = parse_model_config(R"({"model_type":"llama","vocab_size":10,"hidden_size":512,
      "intermediate_size":64,"num_hidden_layers":1,"num_attention_heads":8,"num_key_value_heads":2,
      "max_position_embeddings":131072,"rope_theta":500000.0,
      "rope_scaling":{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,
      "original_max_position_embeddings":8192}})");
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  const int nh = 8, nkv = 2, hd = 64, T = 5, Q = nh * hd, KV = nkv * hd, W = Q + 2 * KV, slots = 40;
  std::vector<float> inv_freq = cfg->rope_inv_freq();
  std::vector<float> qkv = random_vec(static_cast<size_t>(T) * W, rng),
                     bias = random_vec(W, rng, -0.1f, 0.1f);
  std::vector<int32_t> pos = {0, 15, 16, 5000, 70000}, slot = {3, 17, 16, 39, 0};
  DeviceBuffer<float> d_qkv(qkv), d_bias(bias), d_inv(inv_freq);
  DeviceBuffer<int32_t> d_pos(pos), d_slot(slot);
  DeviceBuffer<uint16_t> d_q(static_cast<size_t>(T) * Q), d_k(static_cast<size_t>(slots) * KV),
      d_v(static_cast<size_t>(slots) * KV);
  kernels::RopeKvParams p;
  p.qkv = d_qkv.ptr;
  p.bias = d_bias.ptr;
  p.positions = d_pos.ptr;
  p.slot_mapping = d_slot.ptr;
  p.inv_freq = d_inv.ptr;
  p.q_out = BF(d_q.ptr);
  p.k_cache = BF(d_k.ptr);
  p.v_cache = BF(d_v.ptr);
  p.num_tokens = T;
  p.num_heads = nh;
  p.num_kv_heads = nkv;
  p.head_dim = hd;
  ASSERT_EQ(kernels::rope_write_kv(p, nullptr), cudaSuccess);
  auto q = bf16_to_float(d_q.get()), k = bf16_to_float(d_k.get()), v = bf16_to_float(d_v.get());
  auto kraw = d_k.get();
  std::set<int> written(slot.begin(), slot.end());
  for (int t = 0; t < T; ++t) {
    std::vector<float> row(qkv.begin() + t * W, qkv.begin() + (t + 1) * W);
    for (int i = 0; i < W; ++i) row[i] += bias[i];
    for (int h = 0; h < nh + nkv; ++h) apply_rope(row.data() + h * hd, hd, pos[t], inv_freq.data());
    std::vector<float> gq(q.begin() + t * Q, q.begin() + (t + 1) * Q),
        rq(row.begin(), row.begin() + Q);
    EXPECT_LT(rel_error(gq, rq), 5e-3) << "token " << t;
    std::vector<float> gk(k.begin() + slot[t] * KV, k.begin() + (slot[t] + 1) * KV),
        rk(row.begin() + Q, row.begin() + Q + KV);
    EXPECT_LT(rel_error(gk, rk), 5e-3) << "token " << t;
    std::vector<float> gv(v.begin() + slot[t] * KV, v.begin() + (slot[t] + 1) * KV),
        rv(row.begin() + Q + KV, row.end());
    EXPECT_LT(rel_error(gv, rv), 5e-3) << "token " << t;
  }
  for (int s = 0; s < slots; ++s) {
    if (written.count(s)) continue;
    for (int i = 0; i < KV; ++i)
      ASSERT_EQ(kraw[s * KV + i], 0xFFFF) << "slot " << s << " was written";
  }
}

TEST(CudaKernelsTest, SiluMulMatchesReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(4);
  for (int F : {1000, 1024, 13}) {
    const int T = 3;
    std::vector<float> gu = random_vec(static_cast<size_t>(T) * 2 * F, rng, -4.0f, 4.0f);
    DeviceBuffer<uint16_t> d_gu(to_bf16(gu)), d_out(static_cast<size_t>(T) * F);
    ASSERT_EQ(kernels::silu_mul(BF(d_gu.ptr), T, F, BF(d_out.ptr), nullptr), cudaSuccess);
    auto out = bf16_to_float(d_out.get());
    std::vector<float> ref(static_cast<size_t>(T) * F);
    for (int t = 0; t < T; ++t)
      silu_mul(&gu[static_cast<size_t>(t) * 2 * F], F, &ref[static_cast<size_t>(t) * F]);
    EXPECT_LT(rel_error(out, ref), 5e-3) << "F=" << F;
  }
}

struct AttentionCase {
  int num_heads, num_kv_heads, head_dim;
};

// Sequences with various cached lengths and new-token counts in one step, through the planner
// (with a small or large multiprocessor count, to force or avoid decode splits), against the CPU
// backend's attend(). With fused_combine the splits merge inside the attention kernels: run twice
// (the counters must be back at zero for the second launch), no combine kernel.
void check_attention(const AttentionCase& ac, int num_sms, DecodeAttention decode,
                     bool fixed_splits, bool fused_combine, std::mt19937& rng) {
  const int nh = ac.num_heads, nkv = ac.num_kv_heads, hd = ac.head_dim, bs = 16, KV = nkv * hd;
  // (context length after the step, new tokens in the step)
  std::vector<std::pair<int, int>> seqs = {{1, 1},   {15, 1},  {16, 1},   {17, 1},  {64, 1},
                                           {100, 1}, {128, 1}, {513, 1},  {33, 33}, {70, 37},
                                           {16, 16}, {130, 3}, {200, 200}};
  const int max_blocks = 40;
  std::vector<int32_t> table(seqs.size() * max_blocks);
  std::vector<int32_t> free_blocks(seqs.size() * max_blocks);
  std::iota(free_blocks.begin(), free_blocks.end(), 0);
  std::shuffle(free_blocks.begin(), free_blocks.end(), rng);
  for (size_t i = 0; i < table.size(); ++i) table[i] = free_blocks[i];
  const int num_blocks = static_cast<int>(free_blocks.size());
  std::vector<float> kc = random_vec(static_cast<size_t>(num_blocks) * bs * KV, rng),
                     vc = random_vec(kc.size(), rng);
  std::vector<int32_t> ids, positions, seq_start = {0};
  for (auto [ctx, n] : seqs) {
    for (int p = ctx - n; p < ctx; ++p) positions.push_back(p);
    seq_start.push_back(static_cast<int32_t>(positions.size()));
  }
  const int T = static_cast<int>(positions.size());
  std::vector<float> q = random_vec(static_cast<size_t>(T) * nh * hd, rng);
  DeviceBuffer<uint16_t> d_q(to_bf16(q)), d_k(to_bf16(kc)), d_v(to_bf16(vc)),
      d_out(static_cast<size_t>(T) * nh * hd);
  DeviceBuffer<int32_t> d_table(table), d_pos(positions);
  StepInput in;
  in.num_tokens = T;
  in.num_seqs = static_cast<int>(seqs.size());
  in.positions = positions.data();
  in.seq_start = seq_start.data();
  in.block_table = table.data();
  in.max_blocks_per_seq = max_blocks;
  AttentionPlan plan;
  const int max_partials = 1024;
  ASSERT_TRUE(
      plan_attention(in, {nh, nkv, num_sms, max_partials, fixed_splits, decode}, &plan).is_ok());
  if (decode == DecodeAttention::kPrefillTiles) {
    EXPECT_TRUE(plan.decode.empty());
  }
  if (decode == DecodeAttention::kTensorCore) {
    EXPECT_FALSE(plan.decode.empty())
        << "groups of up to 16 heads fit the tensor-core decode kernel";
    EXPECT_EQ(plan.decode_kernel, kernels::AttentionKernel::kDecodeTc);
  }
  if (num_sms > 100 && nh / nkv <= kernels::kAttentionDecodeRows) {
    EXPECT_GT(plan.combine.size(), 0u) << "a small batch on a large GPU splits its decodes";
  }
  DeviceBuffer<kernels::AttentionWorkItem> d_dec(plan.decode), d_pre(plan.prefill);
  DeviceBuffer<kernels::AttentionCombineItem> d_comb(plan.combine);
  DeviceBuffer<float> d_po(static_cast<size_t>(max_partials) * nh * hd),
      d_pml(static_cast<size_t>(max_partials) * nh * 2);
  kernels::PagedAttentionParams p;
  p.q = BF(d_q.ptr);
  p.k_cache = BF(d_k.ptr);
  p.v_cache = BF(d_v.ptr);
  p.block_table = d_table.ptr;
  p.positions = d_pos.ptr;
  p.out = BF(d_out.ptr);
  p.partial_out = d_po.ptr;
  p.partial_ml = d_pml.ptr;
  p.max_blocks_per_seq = max_blocks;
  p.block_size = bs;
  p.num_heads = nh;
  p.num_kv_heads = nkv;
  p.head_dim = hd;
  p.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  DeviceBuffer<int32_t> d_counters(
      std::vector<int32_t>(std::max<size_t>(1, plan.combine.size()) * nkv, 0));
  if (fused_combine) {
    p.combine_items = d_comb.ptr;
    p.combine_counters = d_counters.ptr;
  }
  for (int run = 0; run < (fused_combine ? 2 : 1); ++run) {
    ASSERT_EQ(cudaMemset(d_out.ptr, 0xFF, d_out.n * sizeof(uint16_t)),
              cudaSuccess);  // poisoned again
    ASSERT_EQ(kernels::paged_attention(p, d_dec.ptr, static_cast<int>(plan.decode.size()),
                                       plan.decode_kernel, nullptr),
              cudaSuccess);
    ASSERT_EQ(kernels::paged_attention(p, d_pre.ptr, static_cast<int>(plan.prefill.size()),
                                       kernels::AttentionKernel::kPrefill, nullptr),
              cudaSuccess);
    if (!fused_combine) {
      ASSERT_EQ(kernels::paged_attention_combine(p, d_comb.ptr,
                                                 static_cast<int>(plan.combine.size()), nullptr),
                cudaSuccess);
    }
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  for (int32_t c : d_counters.get()) ASSERT_EQ(c, 0) << "merge counters left set";
  auto out = bf16_to_float(d_out.get());
  std::vector<float> scores, ref(hd);
  for (size_t s = 0; s < seqs.size(); ++s) {
    for (int t = seq_start[s]; t < seq_start[s + 1]; ++t) {
      for (int h = 0; h < nh; ++h) {
        attend(&q[(static_cast<size_t>(t) * nh + h) * hd], kc.data(), vc.data(),
               &table[s * max_blocks], bs, KV, h / (nh / nkv), hd, positions[t], p.scale, scores,
               ref.data());
        std::vector<float> got(out.begin() + (static_cast<size_t>(t) * nh + h) * hd,
                               out.begin() + (static_cast<size_t>(t) * nh + h + 1) * hd);
        ASSERT_LT(rel_error(got, ref), 2e-2)
            << "heads " << nh << "/" << nkv << " hd " << hd << " sms " << num_sms << " decode "
            << static_cast<int>(decode) << " fixed_splits " << fixed_splits << " fused_combine "
            << fused_combine << " seq " << s << " pos " << positions[t] << " head " << h;
      }
    }
  }
}

// One test per shape of heads, so that they run side by side.
class PagedAttentionTest : public ::testing::TestWithParam<AttentionCase> {};

TEST_P(PagedAttentionTest, MatchesReference) {
  SKIP_WITHOUT_GPU();
  const AttentionCase ac = GetParam();
  std::mt19937 rng(5 + ac.num_heads * 1000 + ac.num_kv_heads * 10 + ac.head_dim);
  for (int sms : {1, 132}) {
    for (DecodeAttention decode : {DecodeAttention::kCudaCore, DecodeAttention::kPrefillTiles,
                                   DecodeAttention::kTensorCore}) {
      for (bool fixed_splits : {false, true}) {
        for (bool fused_combine : {false, true})
          check_attention(ac, sms, decode, fixed_splits, fused_combine, rng);
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(CudaKernelsTest, PagedAttentionTest,
                         ::testing::Values(AttentionCase{4, 4, 32}, AttentionCase{8, 8, 64},
                                           AttentionCase{32, 8, 128}, AttentionCase{16, 2, 128},
                                           AttentionCase{16, 1, 64}),
                         [](const ::testing::TestParamInfo<AttentionCase>& info) {
                           const AttentionCase& c = info.param;
                           return "heads" + std::to_string(c.num_heads) + "_kv" +
                                  std::to_string(c.num_kv_heads) + "_dim" +
                                  std::to_string(c.head_dim);
                         });

// Each kernel refuses a group of heads larger than its tile, and the merge counters without the
// combine items.
TEST(CudaKernelsTest, PagedAttentionRefusesWhatItsKernelCannotHold) {
  SKIP_WITHOUT_GPU();
  DeviceBuffer<uint16_t> d_bf(64 * 128);
  DeviceBuffer<int32_t> d_i32(64);
  DeviceBuffer<kernels::AttentionWorkItem> d_items(1);
  kernels::PagedAttentionParams p;
  p.q = p.k_cache = p.v_cache = p.out = BF(d_bf.ptr);
  p.block_table = p.positions = d_i32.ptr;
  p.max_blocks_per_seq = 1;
  p.block_size = 16;
  p.head_dim = 128;
  p.num_kv_heads = 1;
  using kernels::AttentionKernel;
  for (auto [heads, kernel] :
       {std::pair{16, AttentionKernel::kDecode}, std::pair{32, AttentionKernel::kDecodeTc},
        std::pair{256, AttentionKernel::kPrefill}}) {
    p.num_heads = heads;
    EXPECT_EQ(kernels::paged_attention(p, d_items.ptr, 1, kernel, nullptr), cudaErrorInvalidValue)
        << heads;
  }
  p.num_heads = 8;
  p.combine_counters = d_i32.ptr;
  EXPECT_EQ(kernels::paged_attention(p, d_items.ptr, 1, AttentionKernel::kDecodeTc, nullptr),
            cudaErrorInvalidValue);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// An item without keys that writes out (the planner makes none) writes zeros on every kernel,
// over its own tokens and heads only.
TEST(CudaKernelsTest, PagedAttentionItemsWithoutKeysWriteZeros) {
  SKIP_WITHOUT_GPU();
  const int nh = 8, nkv = 2, hd = 64, T = 3;
  DeviceBuffer<uint16_t> d_kv(16 * nkv * hd), d_q(static_cast<size_t>(T) * nh * hd),
      d_out(static_cast<size_t>(T) * nh * hd);
  DeviceBuffer<int32_t> d_table(std::vector<int32_t>{0}), d_pos(std::vector<int32_t>{0, 1, 2});
  kernels::PagedAttentionParams p;
  p.q = BF(d_q.ptr);
  p.k_cache = p.v_cache = BF(d_kv.ptr);
  p.out = BF(d_out.ptr);
  p.block_table = d_table.ptr;
  p.positions = d_pos.ptr;
  p.max_blocks_per_seq = 1;
  p.block_size = 16;
  p.num_heads = nh;
  p.num_kv_heads = nkv;
  p.head_dim = hd;
  p.scale = 0.125f;
  using kernels::AttentionKernel;
  for (AttentionKernel kernel :
       {AttentionKernel::kDecode, AttentionKernel::kDecodeTc, AttentionKernel::kPrefill}) {
    // Token 1 alone (decodes), or tokens 1 and 2 (prefill); token 0 stays poisoned.
    const int q_len = kernel == AttentionKernel::kPrefill ? 2 : 1;
    DeviceBuffer<kernels::AttentionWorkItem> d_item(
        std::vector<kernels::AttentionWorkItem>{{0, 1, q_len, 0, 0, -1, 0}});
    ASSERT_EQ(cudaMemset(d_out.ptr, 0xFF, d_out.n * sizeof(uint16_t)), cudaSuccess);
    ASSERT_EQ(kernels::paged_attention(p, d_item.ptr, 1, kernel, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> out = d_out.get();
    for (size_t e = 0; e < out.size(); ++e) {
      const size_t t = e / (nh * hd);
      const bool written = t >= 1 && t < static_cast<size_t>(1 + q_len);
      ASSERT_EQ(out[e], written ? 0 : 0xFFFF)
          << "kernel " << static_cast<int>(kernel) << " element " << e;
    }
  }
}

TEST(CudaKernelsTest, GemmMatchesReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(6);
  auto gemm = CublasLtGemm::create(8 << 20);
  ASSERT_TRUE(gemm.is_ok()) << gemm.status().to_string();
  for (auto [m, n, k] :
       {std::tuple{3, 257, 136}, std::tuple{64, 1000, 4096}, std::tuple{1, 4096, 512}}) {
    std::vector<float> x = random_vec(static_cast<size_t>(m) * k, rng),
                       w = random_vec(static_cast<size_t>(n) * k, rng);
    DeviceBuffer<uint16_t> d_x(to_bf16(x)), d_w(to_bf16(w)), d_y16(static_cast<size_t>(m) * n);
    DeviceBuffer<float> d_y(static_cast<size_t>(m) * n);
    ASSERT_TRUE(
        (*gemm)->run(BF(d_x.ptr), BF(d_w.ptr), d_y.ptr, GemmOut::kF32, m, n, k, nullptr).is_ok());
    ASSERT_TRUE((*gemm)
                    ->run(BF(d_x.ptr), BF(d_w.ptr), d_y16.ptr, GemmOut::kBF16, m, n, k, nullptr)
                    .is_ok());
    std::vector<float> ref(static_cast<size_t>(m) * n);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < n; ++j) {
        double acc = 0;
        for (int c = 0; c < k; ++c) acc += static_cast<double>(x[i * k + c]) * w[j * k + c];
        ref[i * n + j] = static_cast<float>(acc);
      }
    }
    EXPECT_LT(rel_error(d_y.get(), ref), 1e-4) << m << "x" << n << "x" << k;
    EXPECT_LT(rel_error(bf16_to_float(d_y16.get()), ref), 5e-3) << m << "x" << n << "x" << k;
  }
}

// y [m, n] = x [m, k] · w [n, k]^T, bf16 in, fp32 out.
kernels::GemvParams plain_gemv(uint16_t* w, uint16_t* x, float* y, int m, int n, int k) {
  kernels::GemvParams gp;
  gp.w = BF(w);
  gp.m = m;
  gp.n = n;
  gp.k = k;
  gp.x = BF(x);
  gp.y = y;
  return gp;
}

TEST(CudaKernelsTest, GemvMatchesReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(8);
  for (auto [n, k] : {std::pair{257, 136}, std::pair{1000, 4096}, std::pair{33, 1064}}) {
    for (int m = 1; m <= kernels::kGemvMaxRows; ++m) {
      std::vector<float> x = random_vec(static_cast<size_t>(m) * k, rng),
                         w = random_vec(static_cast<size_t>(n) * k, rng);
      DeviceBuffer<uint16_t> d_x(to_bf16(x)), d_w(to_bf16(w)),
          d_y16(static_cast<size_t>(m + 1) * n);
      DeviceBuffer<float> d_y(static_cast<size_t>(m + 1) *
                              n);  // one spare row: must stay untouched
      kernels::GemvParams gp = plain_gemv(d_w.ptr, d_x.ptr, d_y.ptr, m, n, k);
      ASSERT_EQ(kernels::gemv(gp, nullptr), cudaSuccess);
      gp.y = d_y16.ptr;
      gp.y_bf16 = true;
      ASSERT_EQ(kernels::gemv(gp, nullptr), cudaSuccess);
      std::vector<float> ref(static_cast<size_t>(m) * n);
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double acc = 0;
          for (int c = 0; c < k; ++c) acc += static_cast<double>(x[i * k + c]) * w[j * k + c];
          ref[i * n + j] = static_cast<float>(acc);
        }
      }
      auto y = d_y.get();
      auto y16 = d_y16.get();
      for (int j = 0; j < n; ++j) {
        uint32_t bits;
        std::memcpy(&bits, &y[static_cast<size_t>(m) * n + j], 4);
        ASSERT_EQ(bits, 0xFFFFFFFFu) << "spare row written, m=" << m;
        ASSERT_EQ(y16[static_cast<size_t>(m) * n + j], 0xFFFF) << "spare row written, m=" << m;
      }
      y.resize(ref.size());
      y16.resize(ref.size());
      EXPECT_LT(rel_error(y, ref), 1e-5) << m << "x" << n << "x" << k;
      EXPECT_LT(rel_error(bf16_to_float(y16), ref), 5e-3) << m << "x" << n << "x" << k;
    }
  }
}

// The CPU's SwiGLU of one RMS-normalised row: out[j] = silu(gate_j) up_j, with gate and up the
// rows j and n + j of w [2n, k] times rms_norm(x, nw) (eps 1e-5), in double.
void normed_swiglu_ref(const float* x, const std::vector<float>& nw, const std::vector<float>& w,
                       int k, int n, float* out) {
  std::vector<float> h(static_cast<size_t>(k)), gu(static_cast<size_t>(2) * n);
  rms_norm(x, nw.data(), k, 1e-5f, h.data());
  for (int j = 0; j < 2 * n; ++j) {
    double acc = 0;
    for (int c = 0; c < k; ++c)
      acc += static_cast<double>(h[c]) * w[static_cast<size_t>(j) * k + c];
    gu[static_cast<size_t>(j)] = static_cast<float>(acc);
  }
  silu_mul(gu.data(), n, out);
}

// The fused modes: input RMS-normalised from the residual stream's sums of squares, SwiGLU's
// activation as output, and the residual update that accumulates the new rows' sums of squares.
// Widths below and above one full batch of loads per warp (256 16-byte pieces), with a remainder.
TEST(CudaKernelsTest, FusedGemvModesMatchReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  const int n = 1000;
  for (int k : {1024, 2056, 4104}) {
    for (int m = 1; m <= kernels::kGemvMaxFusedRows; ++m) {
      std::vector<float> w = random_vec(static_cast<size_t>(n) * k, rng);
      DeviceBuffer<uint16_t> d_w(to_bf16(w));
      // Normalised input.
      std::vector<float> resid = random_vec(static_cast<size_t>(m) * k, rng, -2.0f, 2.0f);
      std::vector<float> nw = random_vec(k, rng, 0.5f, 1.5f), sumsq(m, 0.0f);
      for (int i = 0; i < m; ++i) {
        for (int c = 0; c < k; ++c) sumsq[i] += resid[i * k + c] * resid[i * k + c];
      }
      DeviceBuffer<float> d_resid(resid), d_nw(nw), d_sumsq(sumsq), d_y(static_cast<size_t>(m) * n);
      kernels::GemvParams gp;
      gp.w = BF(d_w.ptr);
      gp.m = m;
      gp.n = n;
      gp.k = k;
      gp.input = kernels::GemvInput::kRmsNorm;
      gp.resid = d_resid.ptr;
      gp.resid_sumsq = d_sumsq.ptr;
      gp.norm_weight = d_nw.ptr;
      gp.eps = 1e-5f;
      gp.y = d_y.ptr;
      ASSERT_EQ(kernels::gemv(gp, nullptr), cudaSuccess);
      std::vector<float> ref(static_cast<size_t>(m) * n), h(k);
      for (int i = 0; i < m; ++i) {
        rms_norm(&resid[i * k], nw.data(), k, 1e-5f, h.data());
        for (int j = 0; j < n; ++j) {
          double acc = 0;
          for (int c = 0; c < k; ++c) acc += static_cast<double>(h[c]) * w[j * k + c];
          ref[i * n + j] = static_cast<float>(acc);
        }
      }
      EXPECT_LT(rel_error(d_y.get(), ref), 1e-4) << "rms-norm input, m=" << m << " k=" << k;
      // SwiGLU output: gate rows then up rows in w2 (2n rows), y = silu(gate) * up.
      std::vector<float> w2 = random_vec(static_cast<size_t>(2) * n * k, rng);
      DeviceBuffer<uint16_t> d_w2(to_bf16(w2)), d_act(static_cast<size_t>(m) * n);
      kernels::GemvParams sp = gp;
      sp.w = BF(d_w2.ptr);
      sp.y = d_act.ptr;
      sp.y_bf16 = true;
      sp.swiglu = true;
      ASSERT_EQ(kernels::gemv(sp, nullptr), cudaSuccess);
      std::vector<float> aref(static_cast<size_t>(m) * n);
      for (int i = 0; i < m; ++i)
        normed_swiglu_ref(&resid[i * k], nw, w2, k, n, &aref[static_cast<size_t>(i) * n]);
      EXPECT_LT(rel_error(bf16_to_float(d_act.get()), aref), 5e-3)
          << "swiglu output, m=" << m << " k=" << k;
      // Residual update as output, accumulating the new rows' sums of squares.
      std::vector<float> xin = random_vec(static_cast<size_t>(m) * k, rng, -3.0f, 3.0f);
      std::vector<float> rin = random_vec(static_cast<size_t>(m) * n, rng);
      DeviceBuffer<uint16_t> d_xin(to_bf16(xin));
      DeviceBuffer<float> d_rin(rin), d_rout(static_cast<size_t>(m) * n),
          d_sums(std::vector<float>(m, 0.0f));
      kernels::GemvParams rp;
      rp.w = BF(d_w.ptr);
      rp.m = m;
      rp.n = n;
      rp.k = k;
      rp.x = BF(d_xin.ptr);
      rp.resid_in = d_rin.ptr;
      rp.resid_out = d_rout.ptr;
      rp.out_sumsq = d_sums.ptr;
      ASSERT_EQ(kernels::gemv(rp, nullptr), cudaSuccess);
      std::vector<float> rref(static_cast<size_t>(m) * n);
      std::vector<double> sref(m, 0.0);
      for (int i = 0; i < m; ++i) {
        for (int j = 0; j < n; ++j) {
          double acc = 0;
          for (int c = 0; c < k; ++c) acc += static_cast<double>(xin[i * k + c]) * w[j * k + c];
          rref[i * n + j] = rin[i * n + j] + static_cast<float>(acc);
          sref[i] += static_cast<double>(rref[i * n + j]) * rref[i * n + j];
        }
      }
      EXPECT_LT(rel_error(d_rout.get(), rref), 1e-4) << "residual output, m=" << m << " k=" << k;
      auto sums = d_sums.get();
      for (int i = 0; i < m; ++i)
        EXPECT_NEAR(sums[i], sref[i], 1e-4 * sref[i]) << "row " << i << " k=" << k;
      // Three rows are refused in the fused modes.
      rp.m = 3;
      EXPECT_EQ(kernels::gemv(rp, nullptr), cudaErrorInvalidValue);
    }
  }
}

// Weights pulled into L2 for the next kernel change no result, bit for bit: plain and residual
// outputs, one wave of blocks and many (where only the last wave prefetches), ranges smaller and
// larger than the warps' count of 16-byte pieces. Ranges not in 16-byte pieces are refused.
TEST(CudaKernelsTest, GemvPrefetchChangesNothing) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(12);
  DeviceBuffer<uint16_t> next(static_cast<size_t>(3) << 20);  // 6 MiB: the "next weights"
  for (auto [n, k] : {std::pair{1000, 1024}, std::pair{100000, 64}}) {
    const int m = 1;
    std::vector<float> x = random_vec(static_cast<size_t>(k), rng),
                       w = random_vec(static_cast<size_t>(n) * k, rng);
    std::vector<float> rin = random_vec(static_cast<size_t>(n), rng);
    DeviceBuffer<uint16_t> d_x(to_bf16(x)), d_w(to_bf16(w));
    DeviceBuffer<float> d_y(n), d_y2(n), d_rin(rin), d_rout(n), d_rout2(n),
        d_s(std::vector<float>(1, 0.0f));
    kernels::GemvParams gp = plain_gemv(d_w.ptr, d_x.ptr, d_y.ptr, m, n, k);
    ASSERT_EQ(kernels::gemv(gp, nullptr), cudaSuccess);
    kernels::GemvParams rp = gp;
    rp.y = nullptr;
    rp.resid_in = d_rin.ptr;
    rp.resid_out = d_rout.ptr;
    rp.out_sumsq = d_s.ptr;
    ASSERT_EQ(kernels::gemv(rp, nullptr), cudaSuccess);
    for (size_t bytes : {size_t{16}, size_t{40000}, size_t{6} << 20}) {
      kernels::GemvParams pp = gp;
      pp.y = d_y2.ptr;
      pp.prefetch[0] = {next.ptr, bytes};
      pp.prefetch[1] = {next.ptr + 8, 4096};
      ASSERT_EQ(kernels::gemv(pp, nullptr), cudaSuccess);
      DeviceBuffer<float> d_s2(std::vector<float>(1, 0.0f));
      kernels::GemvParams pr = rp;
      pr.resid_out = d_rout2.ptr;
      pr.out_sumsq = d_s2.ptr;
      pr.prefetch[0] = {next.ptr, bytes};
      ASSERT_EQ(kernels::gemv(pr, nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      EXPECT_EQ(d_y2.get(), d_y.get()) << n << "x" << k << ", " << bytes << " bytes";
      EXPECT_EQ(d_rout2.get(), d_rout.get()) << n << "x" << k << ", " << bytes << " bytes";
    }
  }
  DeviceBuffer<uint16_t> d_w(static_cast<size_t>(64) * 64), d_x(64);
  DeviceBuffer<float> d_y(64);
  kernels::GemvParams bad = plain_gemv(d_w.ptr, d_x.ptr, d_y.ptr, 1, 64, 64);
  bad.prefetch[0] = {next.ptr, 40};  // not whole 16-byte pieces
  EXPECT_EQ(kernels::gemv(bad, nullptr), cudaErrorInvalidValue);
  bad.prefetch[0] = {next.ptr + 1, 32};  // 2 bytes in: not 16-byte aligned
  EXPECT_EQ(kernels::gemv(bad, nullptr), cudaErrorInvalidValue);
  bad.prefetch[0] = {nullptr, 32};
  EXPECT_EQ(kernels::gemv(bad, nullptr), cudaErrorInvalidValue);
}

// The q/k/v GEMV with RoPE and the KV write folded in, against the CPU's products, rms_norm and
// apply_rope: both inputs (bf16 rows and the normalised residual), with and without bias, GQA
// groups of 1, 4 and 8.
void check_fused_gemv_rope(int nh, int nkv, int k, std::mt19937& rng) {
  const int hd = 64, Q = nh * hd, KV = nkv * hd, n = Q + 2 * KV, slots = 16;
  std::vector<float> inv_freq(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv_freq[i] = std::pow(10000.0f, -2.0f * i / hd);
  std::vector<float> w = random_vec(static_cast<size_t>(n) * k, rng);
  std::vector<float> bias = random_vec(n, rng, -0.1f, 0.1f);
  DeviceBuffer<uint16_t> d_w(to_bf16(w));
  DeviceBuffer<float> d_bias(bias), d_inv(inv_freq);
  const std::vector<int32_t> pos = {7, 3000}, slot = {5, 12};
  DeviceBuffer<int32_t> d_pos(pos), d_slot(slot);
  for (int m = 1; m <= kernels::kGemvMaxFusedRows; ++m) {
    for (bool normed : {false, true}) {
      for (bool with_bias : {false, true}) {
        std::vector<float> x = random_vec(static_cast<size_t>(m) * k, rng, -2.0f, 2.0f);
        std::vector<float> nw = random_vec(k, rng, 0.5f, 1.5f), sumsq(m, 0.0f);
        for (int i = 0; i < m; ++i) {
          for (int c = 0; c < k; ++c) sumsq[i] += x[i * k + c] * x[i * k + c];
        }
        std::vector<float> xb = x;
        DeviceBuffer<uint16_t> d_xb(to_bf16(xb));  // xb now holds the bf16-rounded values
        DeviceBuffer<float> d_x(x), d_nw(nw), d_sumsq(sumsq);
        DeviceBuffer<uint16_t> d_q(static_cast<size_t>(m) * Q),
            d_k(static_cast<size_t>(slots) * KV), d_v(static_cast<size_t>(slots) * KV);
        kernels::GemvParams gp;
        gp.w = BF(d_w.ptr);
        gp.m = m;
        gp.n = n;
        gp.k = k;
        if (normed) {
          gp.input = kernels::GemvInput::kRmsNorm;
          gp.resid = d_x.ptr;
          gp.resid_sumsq = d_sumsq.ptr;
          gp.norm_weight = d_nw.ptr;
          gp.eps = 1e-5f;
        } else {
          gp.x = BF(d_xb.ptr);
        }
        gp.rope = {BF(d_q.ptr), BF(d_k.ptr), BF(d_v.ptr), with_bias ? d_bias.ptr : nullptr,
                   d_pos.ptr,   d_slot.ptr,  d_inv.ptr,   nh,
                   nkv,         hd};
        ASSERT_EQ(kernels::gemv(gp, nullptr), cudaSuccess);
        auto q = bf16_to_float(d_q.get()), kc = bf16_to_float(d_k.get()),
             vc = bf16_to_float(d_v.get());
        auto kraw = d_k.get(), vraw = d_v.get();
        std::vector<float> h(k), row(n);
        for (int i = 0; i < m; ++i) {
          if (normed) {
            rms_norm(&x[i * k], nw.data(), k, 1e-5f, h.data());
          } else {
            std::copy(xb.begin() + i * k, xb.begin() + (i + 1) * k, h.begin());
          }
          for (int j = 0; j < n; ++j) {
            double acc = 0;
            for (int c = 0; c < k; ++c)
              acc += static_cast<double>(h[c]) * w[static_cast<size_t>(j) * k + c];
            row[j] = static_cast<float>(acc) + (with_bias ? bias[j] : 0.0f);
          }
          for (int hh = 0; hh < nh + nkv; ++hh)
            apply_rope(row.data() + hh * hd, hd, pos[i], inv_freq.data());
          const std::string what = "heads " + std::to_string(nh) + "/" + std::to_string(nkv) +
                                   " k=" + std::to_string(k) + " m=" + std::to_string(m) +
                                   " normed=" + std::to_string(normed) +
                                   " bias=" + std::to_string(with_bias) + " row " +
                                   std::to_string(i);
          EXPECT_LT(rel_error(std::vector<float>(q.begin() + i * Q, q.begin() + (i + 1) * Q),
                              std::vector<float>(row.begin(), row.begin() + Q)),
                    5e-3)
              << "q " << what;
          EXPECT_LT(rel_error(std::vector<float>(kc.begin() + slot[i] * KV,
                                                 kc.begin() + (slot[i] + 1) * KV),
                              std::vector<float>(row.begin() + Q, row.begin() + Q + KV)),
                    5e-3)
              << "k " << what;
          EXPECT_LT(rel_error(std::vector<float>(vc.begin() + slot[i] * KV,
                                                 vc.begin() + (slot[i] + 1) * KV),
                              std::vector<float>(row.begin() + Q + KV, row.end())),
                    5e-3)
              << "v " << what;
        }
        for (int s = 0; s < slots; ++s) {
          if (s == slot[0] || (m > 1 && s == slot[1])) continue;
          for (int e = 0; e < KV; ++e) {
            ASSERT_EQ(kraw[s * KV + e], 0xFFFF) << "slot " << s << " was written";
            ASSERT_EQ(vraw[s * KV + e], 0xFFFF) << "slot " << s << " was written";
          }
        }
      }
    }
  }
  // A matrix of the wrong height for the heads is refused.
  kernels::GemvParams bad;
  bad.w = BF(d_w.ptr);
  bad.m = 1;
  bad.n = n - 2;
  bad.k = k;
  DeviceBuffer<uint16_t> d_x1(static_cast<size_t>(k)), d_q1(static_cast<size_t>(Q)),
      d_kv1(static_cast<size_t>(slots) * KV);
  bad.x = BF(d_x1.ptr);
  bad.rope = {BF(d_q1.ptr),  BF(d_kv1.ptr),
              BF(d_kv1.ptr), nullptr,
              d_pos.ptr,     d_slot.ptr,
              d_inv.ptr,     nh,
              nkv,           hd};
  EXPECT_EQ(kernels::gemv(bad, nullptr), cudaErrorInvalidValue);
}

TEST(CudaKernelsTest, FusedGemvRopeMatchesReference) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(13);
  for (int k : {264, 2056}) {
    for (auto [nh, nkv] : {std::pair{4, 4}, std::pair{8, 2}, std::pair{16, 2}})
      check_fused_gemv_rope(nh, nkv, k, rng);
  }
}

// A stream of its own for kernels chained with no sync between them (it waits for the legacy
// stream's set-up copies and fills), and programmatic launch back on (as by default) however the
// test ends.
struct ChainStream {
  ChainStream() {
    if (cudaStreamCreate(&stream) != cudaSuccess) stream = nullptr;
  }
  ~ChainStream() {
    kernels::set_programmatic_launch(true);
    if (stream) cudaStreamDestroy(stream);
  }
  ChainStream(const ChainStream&) = delete;
  ChainStream& operator=(const ChainStream&) = delete;
  cudaStream_t stream = nullptr;
};

// rope_write_kv's parameters with Qwen3's q/k norms, for `m` tokens' q/k/v rows.
kernels::RopeKvParams normed_rope(const float* rows, const int32_t* pos, const int32_t* slot,
                                  const float* inv_freq, const float* q_norm, const float* k_norm,
                                  uint16_t* q, uint16_t* k, uint16_t* v, int m, int nh, int nkv,
                                  int hd) {
  kernels::RopeKvParams rp;
  rp.qkv = rows;
  rp.positions = pos;
  rp.slot_mapping = slot;
  rp.inv_freq = inv_freq;
  rp.q_norm = q_norm;
  rp.k_norm = k_norm;
  rp.q_out = BF(q);
  rp.k_cache = BF(k);
  rp.v_cache = BF(v);
  rp.num_tokens = m;
  rp.num_heads = nh;
  rp.num_kv_heads = nkv;
  rp.head_dim = hd;
  return rp;
}

// How many of `got`'s bf16 values are more than 2^-`bits` (relative) from `want`'s.
int bf16_far(const std::vector<uint16_t>& got, const std::vector<uint16_t>& want, int bits) {
  EXPECT_EQ(got.size(), want.size());
  int far = 0;
  for (size_t j = 0; j < got.size() && j < want.size(); ++j) {
    const float a = bf16_to_f32(got[j]), b = bf16_to_f32(want[j]);
    if (std::fabs(a - b) > std::ldexp(std::max(std::fabs(a), std::fabs(b)), -bits)) ++far;
  }
  return far;
}

// Qwen3's q/k norms in the fused q/k/v GEMV (each head normalised by the last block to finish its
// rows) give the same bits as the plain GEMV followed by rope_write_kv: one and two tokens, the
// input as bf16 rows and normalised from the residual stream, with and without a bias, twice in a
// row over the same head counters (left at zero).
void check_fused_gemv_qk_norm(int nh, int nkv, int hd, int k, std::mt19937& rng) {
  const int Q = nh * hd, KV = nkv * hd, n = Q + 2 * KV, slots = 8;
  std::vector<float> inv_freq(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv_freq[i] = std::pow(1000000.0f, -2.0f * i / hd);
  std::vector<float> w = random_vec(static_cast<size_t>(n) * k, rng);
  DeviceBuffer<uint16_t> d_w(to_bf16(w));
  DeviceBuffer<float> d_bias(random_vec(n, rng, -0.1f, 0.1f)), d_inv(inv_freq);
  DeviceBuffer<float> d_qn(random_vec(hd, rng, 0.5f, 1.5f)), d_kn(random_vec(hd, rng, 0.5f, 1.5f));
  DeviceBuffer<int32_t> d_pos(std::vector<int32_t>{9, 2077}), d_slot(std::vector<int32_t>{6, 1});
  DeviceBuffer<int32_t> d_counters(std::vector<int32_t>(static_cast<size_t>(nh + nkv), 0));
  for (int m = 1; m <= kernels::kGemvMaxFusedRows; ++m) {
    for (bool normed : {false, true}) {
      for (bool with_bias : {false, true}) {
        std::vector<float> x = random_vec(static_cast<size_t>(m) * k, rng, -2.0f, 2.0f), sumsq(m);
        for (int i = 0; i < m; ++i) {
          for (int c = 0; c < k; ++c) sumsq[i] += x[i * k + c] * x[i * k + c];
        }
        DeviceBuffer<uint16_t> d_xb(to_bf16(x));
        DeviceBuffer<float> d_x(x), d_nw(random_vec(k, rng, 0.5f, 1.5f)), d_sumsq(sumsq);
        kernels::GemvParams gp = plain_gemv(d_w.ptr, normed ? nullptr : d_xb.ptr, nullptr, m, n, k);
        if (normed) {
          gp.input = kernels::GemvInput::kRmsNorm;
          gp.resid = d_x.ptr;
          gp.resid_sumsq = d_sumsq.ptr;
          gp.norm_weight = d_nw.ptr;
        }
        // The reference: the q/k/v rows, then the RoPE kernel with the norms.
        DeviceBuffer<float> d_rows(static_cast<size_t>(m) * n);
        DeviceBuffer<uint16_t> d_q0(static_cast<size_t>(m) * Q), d_k0(slots * KV), d_v0(slots * KV);
        kernels::GemvParams plain = gp;
        plain.y = d_rows.ptr;
        ASSERT_EQ(kernels::gemv(plain, nullptr), cudaSuccess);
        kernels::RopeKvParams rp =
            normed_rope(d_rows.ptr, d_pos.ptr, d_slot.ptr, d_inv.ptr, d_qn.ptr, d_kn.ptr, d_q0.ptr,
                        d_k0.ptr, d_v0.ptr, m, nh, nkv, hd);
        rp.bias = with_bias ? d_bias.ptr : nullptr;
        ASSERT_EQ(kernels::rope_write_kv(rp, nullptr), cudaSuccess);
        const std::string what = "heads " + std::to_string(nh) + "/" + std::to_string(nkv) +
                                 " hd=" + std::to_string(hd) + " k=" + std::to_string(k) +
                                 " m=" + std::to_string(m) + " normed=" + std::to_string(normed) +
                                 " bias=" + std::to_string(with_bias);
        for (int run = 0; run < 2; ++run) {
          DeviceBuffer<float> d_scratch(static_cast<size_t>(m) * n);
          DeviceBuffer<uint16_t> d_q(static_cast<size_t>(m) * Q), d_k(slots * KV), d_v(slots * KV);
          kernels::GemvParams fused = gp;
          fused.rope = {BF(d_q.ptr), BF(d_k.ptr), BF(d_v.ptr), with_bias ? d_bias.ptr : nullptr,
                        d_pos.ptr,   d_slot.ptr,  d_inv.ptr,   nh,
                        nkv,         hd};
          fused.rope.q_norm = d_qn.ptr;
          fused.rope.k_norm = d_kn.ptr;
          fused.rope.eps = 1e-6f;
          fused.rope.scratch = d_scratch.ptr;
          fused.rope.head_counters = d_counters.ptr;
          ASSERT_EQ(kernels::gemv(fused, nullptr), cudaSuccess);
          // (Within a bf16 step of each other: the same sums and the same head code, though a
          // compiler may contract the two kernels' arithmetic differently.)
          EXPECT_EQ(bf16_far(d_q.get(), d_q0.get(), 7), 0) << "queries, " << what << " run " << run;
          EXPECT_EQ(bf16_far(d_k.get(), d_k0.get(), 7), 0) << "keys, " << what << " run " << run;
          EXPECT_EQ(bf16_far(d_v.get(), d_v0.get(), 7), 0) << "values, " << what << " run " << run;
          EXPECT_EQ(d_counters.get(), std::vector<int32_t>(static_cast<size_t>(nh + nkv), 0));
        }
      }
    }
  }
}

TEST(CudaKernelsTest, FusedGemvWithQkNormsEqualsTheRopeKernel) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(16);
  check_fused_gemv_qk_norm(4, 2, 128, 264, rng);
  check_fused_gemv_qk_norm(8, 4, 64, 136, rng);
  // Refused: a head whose half is not a multiple of a block's warps, and norms without counters.
  DeviceBuffer<uint16_t> d_w(static_cast<size_t>(8) * 24 * 64), d_x(64), d_out(8 * 24 * 8);
  DeviceBuffer<float> d_f(8 * 24 * 2);
  DeviceBuffer<int32_t> d_i(8);
  kernels::GemvParams bad = plain_gemv(d_w.ptr, d_x.ptr, nullptr, 1, 8 * 24, 64);
  bad.rope = {
      BF(d_out.ptr), BF(d_out.ptr), BF(d_out.ptr), nullptr, d_i.ptr, d_i.ptr, d_f.ptr, 4, 2, 24};
  bad.rope.q_norm = bad.rope.k_norm = d_f.ptr;
  bad.rope.scratch = d_f.ptr;
  bad.rope.head_counters = d_i.ptr;
  EXPECT_EQ(kernels::gemv(bad, nullptr), cudaErrorInvalidValue);  // hd 24: 12 pairs a head
  bad.n = 8 * 32;
  bad.rope.head_dim = 32;
  bad.rope.head_counters = nullptr;
  EXPECT_EQ(kernels::gemv(bad, nullptr), cudaErrorInvalidValue);
}

// A Qwen3-30B-A3B-shaped attention input as fused steps run it, on one stream with no sync between,
// programmatic launch on and off: the o product's residual update (summing the new rows'
// squares), then the q/k/v GEMV normalising those rows with those sums, with the q/k norms (32
// query and 4 key heads of 128: 40 heads' last blocks racing the others) and RoPE. It must equal
// the same product run kernel by kernel with the RoPE kernel after it, within a bf16 step.
TEST(CudaKernelsTest, ChainedQkNormGemvWaitsForTheResidualUpdate) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(17);
  const int nh = 32, nkv = 4, hd = 128, D = 2048, Q = nh * hd, KV = nkv * hd, N = Q + 2 * KV;
  std::vector<float> wo = random_vec(static_cast<size_t>(D) * Q, rng);
  std::vector<float> wqkv = random_vec(static_cast<size_t>(N) * D, rng);
  DeviceBuffer<uint16_t> d_wo(to_bf16(wo)), d_wqkv(to_bf16(wqkv));
  std::vector<float> inv_freq(hd / 2);
  for (int i = 0; i < hd / 2; ++i) inv_freq[i] = std::pow(1000000.0f, -2.0f * i / hd);
  DeviceBuffer<float> d_inv(inv_freq), d_nw(random_vec(D, rng, 0.5f, 1.5f));
  DeviceBuffer<float> d_qn(random_vec(hd, rng, 0.5f, 1.5f)), d_kn(random_vec(hd, rng, 0.5f, 1.5f));
  DeviceBuffer<int32_t> d_pos(std::vector<int32_t>{40, 41}), d_slot(std::vector<int32_t>{3, 7});
  DeviceBuffer<int32_t> d_counters(std::vector<int32_t>(nh + nkv, 0));
  ChainStream chain;
  ASSERT_NE(chain.stream, nullptr);
  cudaStream_t stream = chain.stream;
  const int slots = 8;
  for (int m = 1; m <= kernels::kGemvMaxFusedRows; ++m) {
    std::vector<float> attn = random_vec(static_cast<size_t>(m) * Q, rng);
    DeviceBuffer<uint16_t> d_attn(to_bf16(attn));
    DeviceBuffer<float> d_r0(random_vec(static_cast<size_t>(m) * D, rng, -2.0f, 2.0f));
    // Kernel by kernel: the residual, its rows' sums, the plain normalised product, RoPE.
    DeviceBuffer<float> d_r1(static_cast<size_t>(m) * D), d_rows(static_cast<size_t>(m) * N);
    DeviceBuffer<float> d_sums(std::vector<float>(m, 0.0f));
    DeviceBuffer<uint16_t> d_q0(static_cast<size_t>(m) * Q), d_k0(slots * KV), d_v0(slots * KV);
    kernels::GemvParams o = plain_gemv(d_wo.ptr, d_attn.ptr, nullptr, m, D, Q);
    o.resid_in = d_r0.ptr;
    o.resid_out = d_r1.ptr;
    o.out_sumsq = d_sums.ptr;
    kernels::GemvParams qkv = plain_gemv(d_wqkv.ptr, nullptr, nullptr, m, N, D);
    qkv.input = kernels::GemvInput::kRmsNorm;
    qkv.resid = d_r1.ptr;
    qkv.resid_sumsq = d_sums.ptr;
    qkv.norm_weight = d_nw.ptr;
    kernels::set_programmatic_launch(false);
    ASSERT_EQ(kernels::gemv(o, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    kernels::GemvParams plain = qkv;
    plain.y = d_rows.ptr;
    ASSERT_EQ(kernels::gemv(plain, nullptr), cudaSuccess);
    const kernels::RopeKvParams rp =
        normed_rope(d_rows.ptr, d_pos.ptr, d_slot.ptr, d_inv.ptr, d_qn.ptr, d_kn.ptr, d_q0.ptr,
                    d_k0.ptr, d_v0.ptr, m, nh, nkv, hd);
    ASSERT_EQ(kernels::rope_write_kv(rp, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const auto want_q = d_q0.get(), want_k = d_k0.get(), want_v = d_v0.get();
    for (bool programmatic : {true, false}) {
      kernels::set_programmatic_launch(programmatic);
      DeviceBuffer<float> d_r1b(static_cast<size_t>(m) * D), d_scratch(static_cast<size_t>(m) * N);
      DeviceBuffer<float> d_sumsb(std::vector<float>(m, 0.0f));
      DeviceBuffer<uint16_t> d_q(static_cast<size_t>(m) * Q), d_k(slots * KV), d_v(slots * KV);
      kernels::GemvParams o2 = o;
      o2.resid_out = d_r1b.ptr;
      o2.out_sumsq = d_sumsb.ptr;
      kernels::GemvParams fused = qkv;
      fused.resid = d_r1b.ptr;
      fused.resid_sumsq = d_sumsb.ptr;
      fused.rope = {BF(d_q.ptr), BF(d_k.ptr), BF(d_v.ptr), nullptr, d_pos.ptr,
                    d_slot.ptr,  d_inv.ptr,   nh,          nkv,     hd};
      fused.rope.q_norm = d_qn.ptr;
      fused.rope.k_norm = d_kn.ptr;
      fused.rope.scratch = d_scratch.ptr;
      fused.rope.head_counters = d_counters.ptr;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the buffers above are filled
      ASSERT_EQ(kernels::gemv(o2, stream), cudaSuccess);
      ASSERT_EQ(kernels::gemv(fused, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const std::string what =
          "m=" + std::to_string(m) + " programmatic=" + std::to_string(programmatic);
      // (Two bf16 steps: the sums of squares are atomics, whose order may change their last bits.)
      EXPECT_EQ(bf16_far(d_q.get(), want_q, 6), 0) << "queries, " << what;
      EXPECT_EQ(bf16_far(d_k.get(), want_k, 6), 0) << "keys, " << what;
      EXPECT_EQ(bf16_far(d_v.get(), want_v, 6), 0) << "values, " << what;
      EXPECT_EQ(d_counters.get(), std::vector<int32_t>(nh + nkv, 0)) << what;
    }
  }
}

// A decode layer's MLP as the backend runs it, three GEMVs in a row on one stream with no sync
// between them, programmatic launch on and off: o_proj's residual update (which sums the new rows'
// squares), the normalised gate/up GEMV with SwiGLU output reading those sums, and down_proj's
// residual update reading the activation. Each kernel must wait for the one before; the widths
// run the main loop of loads.
TEST(CudaKernelsTest, ChainedFusedGemvsWaitForEachOther) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(14);
  const int Q = 2056, D = 2064, F = 4104;
  std::vector<float> wo = random_vec(static_cast<size_t>(D) * Q, rng);
  std::vector<float> wgu = random_vec(static_cast<size_t>(2) * F * D, rng);
  std::vector<float> wd = random_vec(static_cast<size_t>(D) * F, rng),
                     nw = random_vec(D, rng, 0.5f, 1.5f);
  DeviceBuffer<uint16_t> d_wo(to_bf16(wo)), d_wgu(to_bf16(wgu)), d_wd(to_bf16(wd));
  DeviceBuffer<float> d_nw(nw);
  ChainStream chain;
  ASSERT_NE(chain.stream, nullptr);
  cudaStream_t stream = chain.stream;
  for (int m = 1; m <= kernels::kGemvMaxFusedRows; ++m) {
    std::vector<float> attn = random_vec(static_cast<size_t>(m) * Q, rng, -2.0f, 2.0f);
    std::vector<float> r0 = random_vec(static_cast<size_t>(m) * D, rng, -2.0f, 2.0f);
    DeviceBuffer<uint16_t> d_attn(to_bf16(attn));
    DeviceBuffer<float> d_r0(r0);
    // The CPU's layer: r1 = r0 + attn wo^T; act = bf16(silu(gate) up) of rms_norm(r1); r2 = r1 +
    // act wd^T.
    std::vector<float> r1(static_cast<size_t>(m) * D), r2(static_cast<size_t>(m) * D);
    std::vector<float> act(static_cast<size_t>(m) * F);
    std::vector<double> s2(m, 0.0);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < D; ++j) {
        double acc = 0;
        for (int c = 0; c < Q; ++c)
          acc += static_cast<double>(attn[i * Q + c]) * wo[static_cast<size_t>(j) * Q + c];
        r1[i * D + j] = r0[i * D + j] + static_cast<float>(acc);
      }
      normed_swiglu_ref(&r1[i * D], nw, wgu, D, F, &act[static_cast<size_t>(i) * F]);
    }
    to_bf16(act);
    for (int i = 0; i < m; ++i) {
      for (int j = 0; j < D; ++j) {
        double acc = 0;
        for (int c = 0; c < F; ++c) {
          acc += static_cast<double>(act[static_cast<size_t>(i) * F + c]) *
                 wd[static_cast<size_t>(j) * F + c];
        }
        r2[i * D + j] = r1[i * D + j] + static_cast<float>(acc);
        s2[i] += static_cast<double>(r2[i * D + j]) * r2[i * D + j];
      }
    }
    for (bool programmatic : {true, false}) {
      kernels::set_programmatic_launch(programmatic);
      DeviceBuffer<float> d_r1(static_cast<size_t>(m) * D), d_r2(static_cast<size_t>(m) * D);
      DeviceBuffer<float> d_sums(std::vector<float>(static_cast<size_t>(2) * m, 0.0f));
      DeviceBuffer<uint16_t> d_act(static_cast<size_t>(m) * F);
      kernels::GemvParams o = plain_gemv(d_wo.ptr, d_attn.ptr, nullptr, m, D, Q);
      o.resid_in = d_r0.ptr;
      o.resid_out = d_r1.ptr;
      o.out_sumsq = d_sums.ptr;
      o.prefetch[0] = {d_wgu.ptr, size_t{1} << 20};
      kernels::GemvParams g = plain_gemv(d_wgu.ptr, nullptr, nullptr, m, F, D);
      g.input = kernels::GemvInput::kRmsNorm;
      g.resid = d_r1.ptr;
      g.resid_sumsq = d_sums.ptr;
      g.norm_weight = d_nw.ptr;
      g.y = d_act.ptr;
      g.y_bf16 = true;
      g.swiglu = true;
      g.prefetch[0] = {d_wd.ptr, size_t{1} << 20};
      kernels::GemvParams dn = plain_gemv(d_wd.ptr, d_act.ptr, nullptr, m, D, F);
      dn.resid_in = d_r1.ptr;
      dn.resid_out = d_r2.ptr;
      dn.out_sumsq = d_sums.ptr + m;
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);  // the buffers above are filled
      ASSERT_EQ(kernels::gemv(o, stream), cudaSuccess);
      ASSERT_EQ(kernels::gemv(g, stream), cudaSuccess);
      ASSERT_EQ(kernels::gemv(dn, stream), cudaSuccess);
      ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      const std::string what =
          "m=" + std::to_string(m) + " programmatic=" + std::to_string(programmatic);
      EXPECT_LT(rel_error(d_r1.get(), r1), 1e-4) << what;
      EXPECT_LT(rel_error(bf16_to_float(d_act.get()), act), 5e-3) << what;
      EXPECT_LT(rel_error(d_r2.get(), r2), 1e-3) << what;
      auto sums = d_sums.get();
      for (int i = 0; i < m; ++i)
        EXPECT_NEAR(sums[m + i], s2[i], 1e-3 * s2[i]) << what << " row " << i;
    }
  }
}

}  // namespace
}  // namespace hr::engine
