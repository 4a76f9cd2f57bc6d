// CPU forward pass over a flattened batch with a paged KV cache.
#include "engine/cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "base/check.h"
#include "engine/cpu_gemm.h"
#include "engine/moe_routing.h"

namespace hr::engine {

void rms_norm(const float* x, const float* w, int n, float eps, float* out) {
  float ss = 0;
  for (int i = 0; i < n; ++i) ss += x[i] * x[i];
  float scale = 1.0f / std::sqrt(ss / static_cast<float>(n) + eps);
  for (int i = 0; i < n; ++i) out[i] = x[i] * scale * w[i];
}

void apply_rope(float* vec, int head_dim, int position, const float* inv_freq) {
  int half = head_dim / 2;
  for (int i = 0; i < half; ++i) {
    float angle = static_cast<float>(position) * inv_freq[i];
    float c = std::cos(angle);
    float s = std::sin(angle);
    float a = vec[i];
    float b = vec[i + half];
    vec[i] = a * c - b * s;
    vec[i + half] = b * c + a * s;
  }
}

namespace {

// Eight partial sums: independent chains the compiler keeps in vector registers (one running sum
// is a chain of dependent adds, several times slower).
float dot(const float* a, const float* b, int n) {
  float acc[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace

void attend(const float* q, const float* k_cache, const float* v_cache,
            const int32_t* block_table_row, int block_size, int kv_size, int kv_head, int head_dim,
            int pos, float scale, std::vector<float>& scores, float* out) {
  auto at = [&](const float* cache, int p) {
    size_t slot =
        static_cast<size_t>(block_table_row[p / block_size]) * block_size + p % block_size;
    return cache + slot * kv_size + static_cast<size_t>(kv_head) * head_dim;
  };
  scores.resize(static_cast<size_t>(pos) + 1);
  float mx = -INFINITY;
  for (int p = 0; p <= pos; ++p) {
    const float* k = at(k_cache, p);
    scores[p] = dot(q, k, head_dim) * scale;
    mx = std::max(mx, scores[p]);
  }
  float sum = 0;
  for (int p = 0; p <= pos; ++p) {
    scores[p] = std::exp(scores[p] - mx);
    sum += scores[p];
  }
  std::fill(out, out + head_dim, 0.0f);
  for (int p = 0; p <= pos; ++p) {
    const float* v = at(v_cache, p);
    float pw = scores[p] / sum;
    for (int i = 0; i < head_dim; ++i) out[i] += pw * v[i];
  }
}

void silu_mul(const float* gate_up, int ffn, float* out) {
  const float* u = gate_up + ffn;
  for (int i = 0; i < ffn; ++i) out[i] = gate_up[i] / (1.0f + std::exp(-gate_up[i])) * u[i];
}

namespace {

// Below this many weights (1 MiB) a product stays on the calling thread: handing out work costs
// more than splitting saves (this keeps the small bundled model's products single-threaded).
constexpr double kMinSplitWeights = 1 << 18;
// The same for the other loops of a step, in multiply-adds or element updates: splitting a small
// model's norms or a short attention wakes the pool's threads for less work than the wake-up
// costs, and keeps a core busy that request handling could use.
constexpr int kMinSplitWork = 1 << 16;
int min_rows(int work_per_row) { return std::max(16, kMinSplitWork / std::max(1, work_per_row)); }

// Replaces `count` row-major matrices [n, k], one after another in v, by their panel packings,
// one after another (each packed_size(n, k) floats).
void pack_matrix(std::vector<float>* v, int n, int k, int count = 1) {
  const size_t one = static_cast<size_t>(n) * k;
  HR_CHECK(v->size() == one * count) << v->size() << " != " << count << " x " << n << " x " << k;
  std::vector<float> packed;
  allocate_weight(&packed, packed_size(n, k) * count);
  for (int i = 0; i < count; ++i)
    pack_panels(v->data() + one * i, n, k, packed.data() + packed_size(n, k) * i);
  v->swap(packed);
}

}  // namespace

void pack_for_cpu(ModelWeights* w) {
  if (w->cpu_packed) return;
  const ModelConfig& c = w->config;
  const WeightShard s = w->shard();
  const int D = c.hidden_size, F = s.ffn, hd = c.head_dim;
  const int Q = s.num_q_heads * hd, KV = s.num_kv_heads * hd;
  const int E = s.num_experts, FE = s.expert_ffn;
  for (size_t li = 0; li < w->layers.size(); ++li) {
    LayerWeights& L = w->layers[li];
    pack_matrix(&L.wqkv, Q + 2 * KV, D);
    pack_matrix(&L.wo, D, Q);
    if (c.is_moe_layer(s.first_layer + static_cast<int>(li))) {
      pack_matrix(&L.experts_gate_up, 2 * FE, D, E);
      pack_matrix(&L.experts_down, D, FE, E);
    } else {
      pack_matrix(&L.w_gate_up, 2 * F, D);
      pack_matrix(&L.w_down, D, F);
    }
  }
  // The LM head (the embedding when tied on the whole model); a shard's own slice, if it has one.
  if (!w->lm_head.empty()) {
    pack_matrix(&w->lm_head, s.vocab, D);
  } else if (s.whole()) {
    pack_matrix(&w->embed, c.vocab_size, D);
  }
  w->cpu_packed = true;
}

// Every product, decode or prefill, runs the panel kernels (cpu_gemm.h), split over the pool in
// runs of three panels (the AVX-512 tile's width).
void CpuBackend::matmul(const float* x, const float* w, float* y, int m, int n, int k,
                        bool accumulate) {
  if (m == 0) return;  // a step that needs no logits
  PanelProduct p{x, w, y, m, n, k, accumulate};
  const int panels = num_panels(n);
  const int triples = (panels + 2) / 3;
  const int min_split = static_cast<int>(std::max(1.0, kMinSplitWeights / (3.0 * kPanelRows * k)));
  pool_.parallel_for(triples, min_split,
                     [&](int t0, int t1) { multiply_panels(p, 3 * t0, std::min(panels, 3 * t1)); });
}

Result<std::unique_ptr<CpuBackend>> CpuBackend::create(std::shared_ptr<const ModelWeights> weights,
                                                       CpuBackendOptions options) {
  if (!weights->cpu_packed) {
    auto packed = std::make_shared<ModelWeights>(*weights);
    pack_for_cpu(packed.get());
    weights = std::move(packed);
  }
  if (options.block_size < 1) return invalid_argument("block size must be positive", "block-size");
  if (options.num_threads < 0 || options.num_threads > 256) {
    return invalid_argument("thread count must be 0 (one per core) to 256", "threads");
  }
  const ModelConfig& c = weights->config;
  const WeightShard shard = weights->shard();
  if (shard.tp > 1 &&
      (options.tensor_parallel == nullptr || options.tensor_parallel->size() != shard.tp ||
       options.tensor_parallel->rank() != shard.tp_rank)) {
    return invalid_argument("a tensor-parallel rank's weights need its group's communicator",
                            "tensor-parallel");
  }
  size_t per_block = 2ull * static_cast<size_t>(shard.num_layers) * options.block_size *
                     static_cast<size_t>(shard.num_kv_heads) * c.head_dim * sizeof(float);
  int num_blocks = options.num_kv_blocks > 0 ? options.num_kv_blocks
                                             : static_cast<int>(options.kv_cache_bytes / per_block);
  if (num_blocks < 1) {
    return invalid_argument("KV cache budget of " + std::to_string(options.kv_cache_bytes) +
                                " bytes holds no block (one takes " + std::to_string(per_block) +
                                ")",
                            "kv-cache-bytes");
  }
  return std::unique_ptr<CpuBackend>(new CpuBackend(std::move(weights), options, num_blocks));
}

CpuBackend::CpuBackend(std::shared_ptr<const ModelWeights> weights, CpuBackendOptions options,
                       int num_blocks)
    : weights_(std::move(weights)),
      shard_(weights_->shard()),
      options_(options),
      num_blocks_(num_blocks),
      pool_(options.num_threads > 0
                ? options.num_threads
                : std::max(1, static_cast<int>(std::thread::hardware_concurrency())),
            options.thread_nice) {
  const ModelConfig& c = weights_->config;
  rope_inv_freq_ = c.rope_inv_freq();
  size_t layer_elems =
      static_cast<size_t>(num_blocks_) * options_.block_size * shard_.num_kv_heads * c.head_dim;
  k_cache_.assign(static_cast<size_t>(shard_.num_layers), std::vector<float>(layer_elems, 0.0f));
  v_cache_.assign(static_cast<size_t>(shard_.num_layers), std::vector<float>(layer_elems, 0.0f));
}

size_t CpuBackend::kv_cache_bytes() const {
  return 2ull * shard_.num_layers * num_blocks_ * options_.block_size * shard_.num_kv_heads *
         weights_->config.head_dim * sizeof(float);
}

Status CpuBackend::add_reduced(int T) {
  const size_t n = static_cast<size_t>(T) * weights_->config.hidden_size;
  HR_RETURN_IF_ERROR(options_.tensor_parallel->all_reduce(out_.data(), n));
  for (size_t i = 0; i < n; ++i) x_[i] += out_[i];
  return Status::ok();
}

Status CpuBackend::row_parallel(const float* x, const float* w, int T, int k) {
  const int D = weights_->config.hidden_size;
  if (shard_.tp == 1) {
    matmul(x, w, x_.data(), T, D, k, /*accumulate=*/true);
    return Status::ok();
  }
  out_.resize(static_cast<size_t>(T) * D);
  matmul(x, w, out_.data(), T, D, k, false);
  return add_reduced(T);
}

Status CpuBackend::forward_part(const StepInput& in, float* hidden, float* logits) {
  const ModelWeights& w = *weights_;
  const ModelConfig& c = w.config;
  const WeightShard& sh = shard_;
  const int T = in.num_tokens, D = c.hidden_size, F = sh.ffn, hd = c.head_dim;
  const int nh = sh.num_q_heads, nkv = sh.num_kv_heads, group = nh / nkv;
  const int Q = nh * hd, KV = nkv * hd;
  const int bs = options_.block_size;
  const int QKV = Q + 2 * KV;
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (in.fed_rows) return invalid_argument("forward() takes no fed rows");
  if ((!sh.first_stage() || !sh.last_stage()) && hidden == nullptr) {
    return invalid_argument("a pipeline stage's step needs its hidden rows");
  }
  HR_RETURN_IF_ERROR(check_step(in, {c.vocab_size, bs, num_blocks_}));
  x_.resize(static_cast<size_t>(T) * D);
  h_.resize(static_cast<size_t>(T) * D);
  qkv_.resize(static_cast<size_t>(T) * QKV);
  attn_.resize(static_cast<size_t>(T) * Q);
  gu_.resize(static_cast<size_t>(T) * 2 * F);
  act_.resize(static_cast<size_t>(T) * F);

  // Sequence of each token row.
  std::vector<int> seq_of(static_cast<size_t>(T));
  for (int s = 0; s < in.num_seqs; ++s) {
    for (int t = in.seq_start[s]; t < in.seq_start[s + 1]; ++t) seq_of[t] = s;
  }
  auto slot_of = [&](int s, int pos) -> size_t {
    int block = in.block_table[static_cast<size_t>(s) * in.max_blocks_per_seq + pos / bs];
    return (static_cast<size_t>(block) * bs + pos % bs) * KV;
  };

  // Part times, when asked for: `clock()` is the time since the last call.
  using Clock = std::chrono::steady_clock;
  Clock::time_point part_start = time_parts_ ? Clock::now() : Clock::time_point{};
  auto clock = [&] {
    const Clock::time_point now = Clock::now();
    const double s = std::chrono::duration<double>(now - part_start).count();
    part_start = now;
    return s;
  };
  if (!sh.first_stage()) {
    std::memcpy(x_.data(), hidden, sizeof(float) * x_.size());
  } else {
    const bool packed_embed = w.lm_head.empty() && sh.last_stage();  // tied: packed as the head
    for (int t = 0; t < T; ++t) {
      float* row = &x_[static_cast<size_t>(t) * D];
      if (packed_embed) {
        unpack_row(w.embed.data(), D, in.token_ids[t], row);
      } else {
        std::memcpy(row, &w.embed[static_cast<size_t>(in.token_ids[t]) * D], sizeof(float) * D);
      }
    }
  }
  if (time_parts_) {
    const double embedding = clock();
    if (sh.first_stage()) part_times_.first += embedding;
  }
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Attention's work: q.k and the weighted v sum over each token's context, for every head.
  double attention_work = 0;
  for (int t = 0; t < T; ++t) attention_work += 2.0 * (in.positions[t] + 1) * nh * hd;
  const int attention_min = attention_work < 4.0 * kMinSplitWork ? T * nh + 1 : 8;
  if (time_parts_) clock();  // the attention plan above is no layer's
  for (int li = 0; li < sh.num_layers; ++li) {
    const LayerWeights& L = w.layers[static_cast<size_t>(li)];
    float* kc = k_cache_[static_cast<size_t>(li)].data();
    float* vc = v_cache_[static_cast<size_t>(li)].data();
    pool_.parallel_for(T, min_rows(D), [&](int t0, int t1) {
      for (int t = t0; t < t1; ++t) {
        rms_norm(&x_[static_cast<size_t>(t) * D], L.input_norm.data(), D, eps,
                 &h_[static_cast<size_t>(t) * D]);
      }
    });
    matmul(h_.data(), L.wqkv.data(), qkv_.data(), T, QKV, D, false);
    pool_.parallel_for(T, min_rows(4 * QKV), [&](int t0, int t1) {
      for (int t = t0; t < t1; ++t) {
        float* row = &qkv_[static_cast<size_t>(t) * QKV];
        if (!L.bqkv.empty()) {
          for (int i = 0; i < QKV; ++i) row[i] += L.bqkv[i];
        }
        if (c.qk_norm) {  // in place: rms_norm reads its row whole before writing
          for (int h = 0; h < nh; ++h)
            rms_norm(row + h * hd, L.q_norm.data(), hd, eps, row + h * hd);
          for (int h = 0; h < nkv; ++h)
            rms_norm(row + Q + h * hd, L.k_norm.data(), hd, eps, row + Q + h * hd);
        }
        int pos = in.positions[t];
        for (int h = 0; h < nh; ++h) apply_rope(row + h * hd, hd, pos, rope_inv_freq_.data());
        for (int h = 0; h < nkv; ++h) apply_rope(row + Q + h * hd, hd, pos, rope_inv_freq_.data());
        size_t slot = slot_of(seq_of[t], pos);
        std::memcpy(kc + slot, row + Q, sizeof(float) * KV);
        std::memcpy(vc + slot, row + Q + KV, sizeof(float) * KV);
      }
    });
    // Paged attention: token t attends to positions [0, positions[t]] of its sequence.
    pool_.parallel_for(T * nh, attention_min, [&](int w0, int w1) {
      std::vector<float> scores;
      for (int w = w0; w < w1; ++w) {
        int t = w / nh;
        int h = w % nh;
        int s = seq_of[t];
        int pos = in.positions[t];
        int kvh = h / group;
        const float* q = &qkv_[static_cast<size_t>(t) * QKV + h * hd];
        float* out = &attn_[static_cast<size_t>(t) * Q + h * hd];
        attend(q, kc, vc, in.block_table + static_cast<size_t>(s) * in.max_blocks_per_seq, bs, KV,
               kvh, hd, pos, scale, scores, out);
      }
    });
    HR_RETURN_IF_ERROR(row_parallel(attn_.data(), L.wo.data(), T, Q));
    pool_.parallel_for(T, min_rows(D), [&](int t0, int t1) {
      for (int t = t0; t < t1; ++t) {
        rms_norm(&x_[static_cast<size_t>(t) * D], L.post_norm.data(), D, eps,
                 &h_[static_cast<size_t>(t) * D]);
      }
    });
    if (c.is_moe_layer(sh.first_layer + li)) {
      HR_RETURN_IF_ERROR(moe(L, sh.first_layer + li, T));
    } else {
      matmul(h_.data(), L.w_gate_up.data(), gu_.data(), T, 2 * F, D, false);
      pool_.parallel_for(T, std::max(2, 65536 / F), [&](int t0, int t1) {
        for (int t = t0; t < t1; ++t) {
          silu_mul(&gu_[static_cast<size_t>(t) * 2 * F], F, &act_[static_cast<size_t>(t) * F]);
        }
      });
      HR_RETURN_IF_ERROR(row_parallel(act_.data(), L.w_down.data(), T, F));
    }
    if (time_parts_) part_times_.layer[static_cast<size_t>(li)] += clock();
  }
  if (!sh.last_stage()) {
    std::memcpy(hidden, x_.data(), sizeof(float) * x_.size());
    return Status::ok();
  }
  Status st = lm_head(in, logits);
  if (time_parts_) part_times_.last += clock();
  return st;
}

void CpuBackend::time_parts(bool on) {
  time_parts_ = on;
  part_times_.layer.assign(static_cast<size_t>(shard_.num_layers), 0.0);
  part_times_.first = part_times_.last = 0;
}

Status CpuBackend::lm_head(const StepInput& in, float* logits) {
  const ModelWeights& w = *weights_;
  const int D = w.config.hidden_size, V = w.config.vocab_size, L = in.num_logits;
  const float eps = static_cast<float>(w.config.rms_norm_eps);
  final_.resize(static_cast<size_t>(L) * D);
  for (int i = 0; i < L; ++i) {
    int row = in.logits_rows[i];
    rms_norm(&x_[static_cast<size_t>(row) * D], w.final_norm.data(), D, eps,
             &final_[static_cast<size_t>(i) * D]);
  }
  if (shard_.tp == 1) {
    matmul(final_.data(), w.lm_head_data(), logits, L, V, D, false);
    return Status::ok();
  }
  // Each rank's vocabulary slice, padded to ceil(V / tp) columns so the gather is even, then the
  // slices side by side in every row.
  const int tp = shard_.tp, share = (V + tp - 1) / tp;
  local_logits_.resize(static_cast<size_t>(L) * share);
  gathered_logits_.resize(static_cast<size_t>(tp) * L * share);
  out_.resize(static_cast<size_t>(L) * shard_.vocab);
  matmul(final_.data(), w.lm_head.data(), out_.data(), L, shard_.vocab, D, false);
  for (int i = 0; i < L; ++i) {
    std::memcpy(&local_logits_[static_cast<size_t>(i) * share],
                &out_[static_cast<size_t>(i) * shard_.vocab], sizeof(float) * shard_.vocab);
  }
  HR_RETURN_IF_ERROR(options_.tensor_parallel->all_gather(
      local_logits_.data(), gathered_logits_.data(), local_logits_.size()));
  for (int r = 0; r < tp; ++r) {
    const int first = std::min(V, r * share), count = std::min(V, first + share) - first;
    for (int i = 0; i < L; ++i) {
      std::memcpy(logits + static_cast<size_t>(i) * V + first,
                  &gathered_logits_[(static_cast<size_t>(r) * L + i) * share],
                  sizeof(float) * count);
    }
  }
  return Status::ok();
}

Status CpuBackend::moe(const LayerWeights& L, int layer, int T) {
  const ModelConfig& c = weights_->config;
  const MoeConfig& m = c.moe;
  const int D = c.hidden_size, E = m.num_experts, K = m.top_k, F = shard_.expert_ffn;
  const int first = shard_.first_expert, held = shard_.num_experts;
  router_logits_.resize(static_cast<size_t>(T) * E);
  route_ids_.resize(static_cast<size_t>(T) * K);
  route_weights_.resize(static_cast<size_t>(T) * K);
  expert_out_.resize(static_cast<size_t>(T) * K * D);
  // The router in fp32 (every rank routes every token alike), then each token's choices.
  pool_.parallel_for(T, min_rows(E * D), [&](int t0, int t1) {
    for (int t = t0; t < t1; ++t) {
      for (int e = 0; e < E; ++e) {
        router_logits_[static_cast<size_t>(t) * E + e] =
            dot(&h_[static_cast<size_t>(t) * D], &L.router[static_cast<size_t>(e) * D], D);
      }
    }
  });
  route_tokens(router_logits_.data(), T, m, nullptr, route_ids_.data(), route_weights_.data());
  if (routing_observer_) routing_observer_(layer, T, route_ids_.data(), route_weights_.data());
  // Each held expert once, for all the tokens routed to it: gathered rows, gate/up, SwiGLU, down.
  routed_.resize(static_cast<size_t>(E));   // (token, choice) indices per expert
  for (auto& rows : routed_) rows.clear();  // (their capacity kept from step to step)
  for (int i = 0; i < T * K; ++i) routed_[static_cast<size_t>(route_ids_[i])].push_back(i);
  const size_t gu_panels = packed_size(2 * F, D), down_panels = packed_size(D, F);
  for (int e = first; e < first + held; ++e) {
    const std::vector<int32_t>& rows = routed_[static_cast<size_t>(e)];
    const int n = static_cast<int>(rows.size());
    if (n == 0) continue;
    expert_in_.resize(static_cast<size_t>(n) * D);
    expert_gu_.resize(static_cast<size_t>(n) * 2 * F);
    expert_act_.resize(static_cast<size_t>(n) * F);
    for (int r = 0; r < n; ++r) {
      std::memcpy(&expert_in_[static_cast<size_t>(r) * D],
                  &h_[static_cast<size_t>(rows[r] / K) * D], sizeof(float) * D);
    }
    matmul(expert_in_.data(), L.experts_gate_up.data() + gu_panels * (e - first), expert_gu_.data(),
           n, 2 * F, D, false);
    for (int r = 0; r < n; ++r) {
      silu_mul(&expert_gu_[static_cast<size_t>(r) * 2 * F], F,
               &expert_act_[static_cast<size_t>(r) * F]);
    }
    // Down into the gate/up buffer (free again), then each output row to its (token, choice).
    expert_gu_.resize(static_cast<size_t>(n) * D);
    matmul(expert_act_.data(), L.experts_down.data() + down_panels * (e - first), expert_gu_.data(),
           n, D, F, false);
    for (int r = 0; r < n; ++r) {
      std::memcpy(&expert_out_[static_cast<size_t>(rows[r]) * D],
                  &expert_gu_[static_cast<size_t>(r) * D], sizeof(float) * D);
    }
  }
  // Each token's weighted sum over its held experts in expert order (as transformers adds them
  // up), then the residual: the same arithmetic whatever else is in the step. With several ranks
  // the sums are partial and all-reduced first.
  const bool alone = shard_.tp == 1;
  if (!alone) out_.resize(static_cast<size_t>(T) * D);
  pool_.parallel_for(T, min_rows(K * D), [&](int t0, int t1) {
    std::vector<int> order(static_cast<size_t>(K));
    std::vector<float> sum(static_cast<size_t>(D));
    for (int t = t0; t < t1; ++t) {
      const int32_t* ids = &route_ids_[static_cast<size_t>(t) * K];
      for (int j = 0; j < K; ++j) order[static_cast<size_t>(j)] = j;
      std::sort(order.begin(), order.end(), [&](int a, int b) { return ids[a] < ids[b]; });
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (int j : order) {
        if (ids[j] < first || ids[j] >= first + held) continue;
        const float w = route_weights_[static_cast<size_t>(t) * K + j];
        const float* out = &expert_out_[(static_cast<size_t>(t) * K + j) * D];
        for (int i = 0; i < D; ++i) sum[static_cast<size_t>(i)] += out[i] * w;
      }
      float* x = alone ? &x_[static_cast<size_t>(t) * D] : &out_[static_cast<size_t>(t) * D];
      for (int i = 0; i < D; ++i) x[i] = (alone ? x[i] : 0.0f) + sum[static_cast<size_t>(i)];
    }
  });
  return alone ? Status::ok() : add_reduced(T);
}

}  // namespace hr::engine
