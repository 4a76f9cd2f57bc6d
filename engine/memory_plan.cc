// Bytes per rank from the shapes, as the CUDA backend would allocate them.
#include "engine/memory_plan.h"

#include <algorithm>

#include "engine/micro_batches.h"

namespace hr::engine {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A [rows × cols] matrix as held in `f`.
int64_t matrix(int64_t rows, int64_t cols, WeightFormat f) {
  switch (f) {
    case WeightFormat::kBf16:
      return rows * cols * 2;
    case WeightFormat::kFp8:
      return rows * cols + ceil_div(rows, 128) * ceil_div(cols, 128) * 4;
    case WeightFormat::kInt4:
      return ceil_div(rows * cols, 2) + rows * ceil_div(cols, 32) * 2;
  }
  return 0;
}

// KV heads on each rank: a share of them, or one replicated when there are fewer than ranks.
int64_t local_kv_heads(const ModelShape& s, int tp) {
  return s.num_kv_heads >= tp ? s.num_kv_heads / tp : 1;
}

}  // namespace

int stage_first_layer(int num_layers, int pp, const std::vector<int>& stage_layers, int stage) {
  if (stage_layers.empty()) {
    return static_cast<int>(static_cast<int64_t>(num_layers) * stage / pp);
  }
  int first = 0;
  for (int i = 0; i < stage; ++i) first += stage_layers[static_cast<size_t>(i)];
  return first;
}

Status check_parallel_layout(const ModelShape& s, const PlanOptions& o) {
  if (o.tp < 1 || o.tp > 1024) {
    return invalid_argument("tensor-parallel ranks must be 1 to 1024", "tensor-parallel");
  }
  if (o.pp < 1 || o.pp > s.num_layers) {
    return invalid_argument(
        "pipeline stages must be 1 to the model's " + std::to_string(s.num_layers) + " layers",
        "pipeline-parallel");
  }
  if (s.num_heads % o.tp != 0) {
    return invalid_argument("the model's " + std::to_string(s.num_heads) +
                                " attention heads do not split over " + std::to_string(o.tp) +
                                " ranks",
                            "tensor-parallel");
  }
  if (!s.mla && (s.num_kv_heads >= o.tp ? s.num_kv_heads % o.tp : o.tp % s.num_kv_heads) != 0) {
    return invalid_argument("the model's " + std::to_string(s.num_kv_heads) +
                                " KV heads neither split over nor replicate evenly on " +
                                std::to_string(o.tp) + " ranks",
                            "tensor-parallel");
  }
  if (s.intermediate_size % o.tp != 0) {
    return invalid_argument("the MLP's " + std::to_string(s.intermediate_size) +
                                " intermediate rows do not split over " + std::to_string(o.tp) +
                                " ranks",
                            "tensor-parallel");
  }
  if (!o.stage_layers.empty()) {
    int sum = 0;
    for (int n : o.stage_layers) {
      if (n < 1) return invalid_argument("every pipeline stage needs a layer", "stage-layers");
      sum += n;
    }
    if (static_cast<int>(o.stage_layers.size()) != o.pp || sum != s.num_layers) {
      return invalid_argument("the stages' layer counts must be " + std::to_string(o.pp) +
                                  " numbers adding up to the model's " +
                                  std::to_string(s.num_layers) + " layers",
                              "stage-layers");
    }
  }
  if (o.ep != 1 && o.ep != o.tp) {
    return invalid_argument("expert parallelism is 1 (experts sliced) or the tensor-parallel size",
                            "expert-parallel");
  }
  if (s.num_experts > 0) {
    if (s.num_experts % o.ep != 0) {
      return invalid_argument("the model's " + std::to_string(s.num_experts) +
                                  " experts do not split over " + std::to_string(o.ep) + " ranks",
                              "expert-parallel");
    }
    const int slices = o.tp / o.ep;
    if (s.expert_intermediate_size % slices != 0 ||
        (s.shared_experts * s.expert_intermediate_size) % o.tp != 0) {
      return invalid_argument(
          "the experts' intermediate rows do not split over " + std::to_string(slices) + " ranks",
          "expert-parallel");
    }
  }
  return Status::ok();
}

namespace {

Status check(const ModelShape& s, const PlanOptions& o) {
  HR_RETURN_IF_ERROR(check_parallel_layout(s, o));
  if (o.block_size < 1 || o.max_num_tokens < 1 || o.max_num_seqs < 1 || o.num_sms < 1) {
    return invalid_argument("block size, step sizes and SMs must be positive", "block-size");
  }
  if (!(o.kv_cache_fraction > 0 && o.kv_cache_fraction <= 0.98)) {
    return invalid_argument("the KV cache fraction must be in (0, 0.98]", "kv-cache-fraction");
  }
  return Status::ok();
}

// One layer's weights on one tensor-parallel rank.
int64_t layer_bytes(const ModelShape& s, const PlanOptions& o, int64_t layer) {
  const int64_t D = s.hidden_size;
  const int tp = o.tp;
  int64_t b = 2 * D * 4;  // input and post-attention norms (fp32)
  const int64_t H = s.num_heads / tp;
  if (s.mla) {
    const int64_t qk = s.qk_nope_head_dim + s.qk_rope_head_dim;
    if (s.q_lora_rank > 0) {
      b += matrix(s.q_lora_rank, D, o.weights) + s.q_lora_rank * 4 +
           matrix(H * qk, s.q_lora_rank, o.weights);
    } else {
      b += matrix(H * qk, D, o.weights);
    }
    b += matrix(s.kv_lora_rank + s.qk_rope_head_dim, D, o.weights) + s.kv_lora_rank * 4;
    b += matrix(H * (s.qk_nope_head_dim + s.v_head_dim), s.kv_lora_rank, o.weights);
    b += matrix(D, H * s.v_head_dim, o.weights);
  } else {
    const int64_t rows = (H + 2 * local_kv_heads(s, tp)) * s.head_dim;
    b += matrix(rows, D, o.weights) + matrix(D, H * s.head_dim, o.weights);
    if (s.qkv_bias) b += rows * 4;
    if (s.qk_norm) b += 2 * s.head_dim * 4;
  }
  if (s.is_moe_layer(layer)) {
    b += s.num_experts * D * 4 + (s.router_bias ? s.num_experts * 4 : 0);  // router (fp32)
    const int64_t experts = s.num_experts / o.ep;
    const int64_t f = s.expert_intermediate_size / (tp / o.ep);
    b += experts * (matrix(2 * f, D, o.experts) + matrix(D, f, o.experts));
    if (s.shared_experts > 0) {
      const int64_t fs = s.shared_experts * s.expert_intermediate_size / tp;
      b += matrix(2 * fs, D, o.weights) + matrix(D, fs, o.weights);
    }
  } else {
    const int64_t f = s.intermediate_size / tp;
    b += matrix(2 * f, D, o.weights) + matrix(D, f, o.weights);
  }
  return b;
}

}  // namespace

int64_t step_buffer_bytes(const ModelShape& s, const PlanOptions& o, int64_t num_layers,
                          bool last_stage) {
  const int64_t T = o.max_num_tokens, S = o.max_num_seqs;
  const int64_t D = s.hidden_size, V = s.vocab_size;
  const int64_t F = s.intermediate_size / o.tp;
  const int64_t hd = s.mla ? s.qk_nope_head_dim + s.qk_rope_head_dim : s.head_dim;
  const int64_t heads = s.num_heads / o.tp;
  const int64_t kv_heads = s.mla ? heads : local_kv_heads(s, o.tp);
  const int64_t Q = heads * hd, KV = kv_heads * hd, QKV = Q + 2 * KV;
  constexpr int64_t kFusedRows = 2;  // kernels::kGemvMaxFusedRows
  int64_t b = (hd / 2) * 4;          // RoPE frequencies
  b += T * D * 4 * 2 + T * D * 2;    // residual, delta, normed
  b += T * QKV * 4 + T * Q * 2 * 2;  // qkv, q, attention output
  b += T * 2 * F * 2 + T * F * 2;    // gate_up, activation
  b += S * 4 + T * 4;                // sampled tokens, input ids
  if (last_stage) {
    b += S * D * 2 + S * V * 4 + S * kTokenLogprobsBytes;  // final rows, logits, log probabilities
    // A tensor-parallel rank's LM head slice's logits, and every rank's gathered.
    if (o.tp > 1) b += (1 + o.tp) * S * ceil_div(V, o.tp) * 4;
    // With stages, a step cut into micro-batches (one per stage, the default; more take more):
    // each part's sampled tokens, two steps' worth, and the step's placed together.
    if (o.pp > 1) b += (2 * o.pp + 1) * S * 4;
  }
  b += kFusedRows * D * 4;
  if (s.num_experts > 0) {
    // Every rank routes over all the experts and lays the pairs out by expert over all of them
    // (a rank of expert parallelism skips the tiles of others' experts, in the same layout).
    constexpr int64_t kTile = 64;  // kernels::kMoeTile
    const int64_t E = s.num_experts, pairs = T * s.top_k;
    const int64_t capacity = ceil_div(pairs + E * (kTile - 1), kTile) * kTile;
    const int64_t f = s.expert_intermediate_size / (o.tp / o.ep);
    b += T * E * 4 + pairs * 4 * 3;  // router logits, top k, each pair's sorted row
    b += E * 4 + (E + 1) * 4 + capacity * 4 + capacity / kTile * 4 + E * 4 + 4;
    b += capacity * f * 2 + pairs * D * 4;  // experts' activations, outputs
  }
  b += 2 * num_layers * kFusedRows * 4;  // norm sums
  b += (heads + kv_heads) * 4;           // the fused q/k/v GEMV's head counters
  const int64_t partials = std::max<int64_t>(8 * o.num_sms, 64);
  b += partials * heads * hd * 4 + partials * heads * 2 * 4 + (partials / 2) * kv_heads * 4;
  return b;
}

Result<MemoryPlan> plan_memory(const ModelShape& s, const PlanOptions& o) {
  HR_RETURN_IF_ERROR(check(s, o));
  MemoryPlan plan;
  plan.tp = o.tp;
  plan.pp = o.pp;
  plan.ep = o.ep;
  plan.parameters = s.parameters();
  plan.fits = true;
  const int64_t D = s.hidden_size, V = s.vocab_size;
  plan.kv_tokens = -1;
  const int groups = step_groups_for(o.step_groups, o.pp);
  for (int stage = 0; stage < o.pp; ++stage) {
    const int64_t first =
        stage_first_layer(static_cast<int>(s.num_layers), o.pp, o.stage_layers, stage);
    const int64_t last =
        stage_first_layer(static_cast<int>(s.num_layers), o.pp, o.stage_layers, stage + 1);
    for (int t = 0; t < o.tp; ++t) {
      RankPlan r;
      r.stage = stage;
      r.tp_rank = t;
      r.first_layer = first;
      r.num_layers = last - first;
      if (stage == 0) r.weight_bytes += V * D * 2;  // the embedding, whole (bf16)
      if (stage == o.pp - 1) {
        r.weight_bytes += D * 4;  // the final norm
        // The LM head's share of the vocabulary; a tied one is the embedding only on one rank
        // that holds the whole model (a rank's slice, or a last stage's head, is apart).
        if (!(s.tie_word_embeddings && o.pp == 1 && o.tp == 1))
          r.weight_bytes += ceil_div(V, o.tp) * D * 2;
      }
      for (int64_t l = first; l < last; ++l) r.weight_bytes += layer_bytes(s, o, l);
      r.activation_bytes = step_buffer_bytes(s, o, r.num_layers, stage == o.pp - 1);
      r.workspace_bytes = o.workspace_bytes;
      r.graph_bytes = o.graph_bytes * std::max(2, groups) / 2;
      r.context_bytes = o.context_bytes;
      r.free_bytes = o.gpu_memory_bytes - r.context_bytes - r.weight_bytes - r.activation_bytes -
                     r.workspace_bytes;
      const int64_t per_token = s.mla ? r.num_layers * (s.kv_lora_rank + s.qk_rope_head_dim) * 2
                                      : 2 * r.num_layers * local_kv_heads(s, o.tp) * s.head_dim * 2;
      r.kv_block_bytes = per_token * o.block_size;
      // As the backend: a fraction of what is free; the captured graphs come out of the rest.
      r.kv_bytes = std::max<int64_t>(
          0, std::min(static_cast<int64_t>(static_cast<double>(r.free_bytes) * o.kv_cache_fraction),
                      r.free_bytes - r.graph_bytes));
      r.kv_blocks = std::max<int64_t>(0, r.kv_bytes / r.kv_block_bytes - 1);
      r.kv_tokens = r.kv_blocks * o.block_size;
      if (r.kv_blocks < 1) plan.fits = false;
      plan.kv_tokens = plan.kv_tokens < 0 ? r.kv_tokens : std::min(plan.kv_tokens, r.kv_tokens);
      plan.total_weight_bytes += r.weight_bytes;
      plan.ranks.push_back(r);
    }
  }
  if (!plan.fits) plan.kv_tokens = 0;
  return plan;
}

}  // namespace hr::engine
