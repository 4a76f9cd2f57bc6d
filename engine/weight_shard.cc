// Slicing full fp32 weights into one rank's part.
#include "engine/weight_shard.h"

#include <algorithm>
#include <cstring>
#include <string>

#include "engine/memory_plan.h"
#include "engine/model_shape.h"

namespace hr::engine {
namespace {

std::string str(int v) { return std::to_string(v); }

// Rows [first, first + count) of the row-major matrix [rows, cols] in `m`, appended to `out`.
void append_rows(const std::vector<float>& m, int cols, int first, int count,
                 std::vector<float>* out) {
  const auto* from = m.data() + static_cast<size_t>(first) * cols;
  out->insert(out->end(), from, from + static_cast<size_t>(count) * cols);
}

// Columns [first, first + count) of the row-major matrix [rows, cols] in m[offset..], appended to
// `out` as [rows, count].
void append_columns(const std::vector<float>& m, size_t offset, int rows, int cols, int first,
                    int count, std::vector<float>* out) {
  for (int r = 0; r < rows; ++r) {
    const auto* row = m.data() + offset + static_cast<size_t>(r) * cols + first;
    out->insert(out->end(), row, row + count);
  }
}

// A SwiGLU MLP's gate/up matrix [2 F, D] at m[offset..]: gate rows [first, first + count), then
// the same up rows.
void append_gate_up(const std::vector<float>& m, size_t offset, int F, int D, int first, int count,
                    std::vector<float>* out) {
  const auto* base = m.data() + offset;
  for (int half = 0; half < 2; ++half) {
    const auto* from = base + (static_cast<size_t>(half) * F + first) * D;
    out->insert(out->end(), from, from + static_cast<size_t>(count) * D);
  }
}

}  // namespace

Status check_degrees(const ModelConfig& c, const ParallelDegrees& d) {
  PlanOptions o;
  o.tp = d.tp;
  o.pp = d.pp;
  o.ep = d.ep;
  o.stage_layers = d.stage_layers;
  return check_parallel_layout(shape_of(c), o);
}

namespace {

// What rank (stage, tp_rank) holds: the degrees already checked.
WeightShard plan_shard(const ModelConfig& c, const ParallelDegrees& d, int stage, int tp_rank) {
  WeightShard s;
  s.tp = d.tp;
  s.tp_rank = tp_rank;
  s.pp = d.pp;
  s.stage = stage;
  s.ep = d.ep;
  s.first_layer = stage_first_layer(c.num_layers, d.pp, d.stage_layers, stage);
  s.num_layers = stage_first_layer(c.num_layers, d.pp, d.stage_layers, stage + 1) - s.first_layer;
  s.num_q_heads = c.num_heads / d.tp;
  s.first_q_head = tp_rank * s.num_q_heads;
  if (c.num_kv_heads >= d.tp) {
    s.num_kv_heads = c.num_kv_heads / d.tp;
    s.first_kv_head = tp_rank * s.num_kv_heads;
  } else {  // replicated: the KV head this rank's q heads read
    s.num_kv_heads = 1;
    s.first_kv_head = s.first_q_head / (c.num_heads / c.num_kv_heads);
  }
  s.ffn = c.intermediate_size / d.tp;
  s.first_ffn = tp_rank * s.ffn;
  if (c.is_moe()) {
    s.num_experts = c.moe.num_experts / d.ep;
    s.first_expert = (tp_rank % d.ep) * s.num_experts;
    const int slices = d.tp / d.ep;
    s.expert_ffn = c.moe.expert_intermediate_size / slices;
    s.first_expert_ffn = (tp_rank / d.ep) * s.expert_ffn;
  }
  const int V = c.vocab_size, vocab_share = (V + d.tp - 1) / d.tp;
  s.first_vocab = std::min(V, tp_rank * vocab_share);
  s.vocab = std::min(V, s.first_vocab + vocab_share) - s.first_vocab;
  return s;
}

Status check_rank(const ParallelDegrees& d, int stage, int tp_rank) {
  if (stage < 0 || stage >= d.pp || tp_rank < 0 || tp_rank >= d.tp) {
    return invalid_argument("rank (stage " + str(stage) + ", tensor-parallel rank " + str(tp_rank) +
                            ") is outside the deployment");
  }
  return Status::ok();
}

// The model's layer `li` (whole, `L`) cut to the rank's heads, rows and experts.
LayerWeights slice_layer(const ModelConfig& c, const WeightShard& s, const LayerWeights& L,
                         int li) {
  const int D = c.hidden_size, hd = c.head_dim, Q = c.q_size(), KV = c.kv_size();
  LayerWeights R;
  R.input_norm = L.input_norm;
  R.post_norm = L.post_norm;
  R.q_norm = L.q_norm;
  R.k_norm = L.k_norm;
  // q rows of this rank's heads, then its KV heads' k rows and v rows.
  const int q0 = s.first_q_head * hd, qn = s.num_q_heads * hd;
  const int k0 = Q + s.first_kv_head * hd, v0 = Q + KV + s.first_kv_head * hd;
  const int kn = s.num_kv_heads * hd;
  append_rows(L.wqkv, D, q0, qn, &R.wqkv);
  append_rows(L.wqkv, D, k0, kn, &R.wqkv);
  append_rows(L.wqkv, D, v0, kn, &R.wqkv);
  if (!L.bqkv.empty()) {
    append_rows(L.bqkv, 1, q0, qn, &R.bqkv);
    append_rows(L.bqkv, 1, k0, kn, &R.bqkv);
    append_rows(L.bqkv, 1, v0, kn, &R.bqkv);
  }
  append_columns(L.wo, 0, D, Q, q0, qn, &R.wo);
  if (c.is_moe_layer(li)) {
    const int FE = c.moe.expert_intermediate_size;
    R.router = L.router;
    for (int e = s.first_expert; e < s.first_expert + s.num_experts; ++e) {
      append_gate_up(L.experts_gate_up, static_cast<size_t>(e) * 2 * FE * D, FE, D,
                     s.first_expert_ffn, s.expert_ffn, &R.experts_gate_up);
      append_columns(L.experts_down, static_cast<size_t>(e) * D * FE, D, FE, s.first_expert_ffn,
                     s.expert_ffn, &R.experts_down);
    }
  } else {
    const int F = c.intermediate_size;
    append_gate_up(L.w_gate_up, 0, F, D, s.first_ffn, s.ffn, &R.w_gate_up);
    append_columns(L.w_down, 0, D, F, s.first_ffn, s.ffn, &R.w_down);
  }
  return R;
}

// The final norm and the rank's LM head rows, from the whole model's head (the embedding when
// tied).
void slice_head(const ModelConfig& c, const WeightShard& s, const std::vector<float>& final_norm,
                const std::vector<float>& head, ModelWeights* out) {
  out->final_norm = final_norm;
  append_rows(head, c.hidden_size, s.first_vocab, s.vocab, &out->lm_head);
}

}  // namespace

ModelConfig rank_config(const ModelConfig& c, const WeightShard& s) {
  if (s.tp == 1) return c;
  ModelConfig r = c;
  r.num_heads = s.num_q_heads;
  r.num_kv_heads = s.num_kv_heads;
  r.intermediate_size = s.ffn;
  r.moe.expert_intermediate_size = s.expert_ffn;
  r.tie_word_embeddings = false;
  return r;
}

Result<ModelWeights> shard_weights(const ModelWeights& full, const ParallelDegrees& d, int stage,
                                   int tp_rank) {
  const ModelConfig& c = full.config;
  HR_RETURN_IF_ERROR(check_degrees(c, d));
  HR_RETURN_IF_ERROR(check_rank(d, stage, tp_rank));
  if (full.cpu_packed) return invalid_argument("shard_weights takes unpacked weights");
  ModelWeights out;
  out.config = c;
  out.part = plan_shard(c, d, stage, tp_rank);
  const WeightShard& s = out.part;
  if (s.first_stage()) out.embed = full.embed;
  if (s.last_stage()) {
    slice_head(c, s, full.final_norm, full.lm_head.empty() ? full.embed : full.lm_head, &out);
  }
  for (int i = 0; i < s.num_layers; ++i) {
    const int li = s.first_layer + i;
    out.layers.push_back(slice_layer(c, s, full.layers[static_cast<size_t>(li)], li));
  }
  return out;
}

Result<ModelWeights> load_shard(const SafetensorsModel& st, const ModelConfig& c,
                                const ParallelDegrees& d, int stage, int tp_rank) {
  HR_RETURN_IF_ERROR(check_degrees(c, d));
  HR_RETURN_IF_ERROR(check_rank(d, stage, tp_rank));
  ModelWeights out;
  out.config = c;
  out.part = plan_shard(c, d, stage, tp_rank);
  const WeightShard& s = out.part;
  const bool tied = c.tie_word_embeddings;
  if (s.first_stage() || (s.last_stage() && tied)) {
    HR_ASSIGN_OR_RETURN(ModelWeights ends, load_weights_part(st, c, {0, 0, true, s.last_stage()}));
    if (s.last_stage()) {
      slice_head(c, s, ends.final_norm, tied ? ends.embed : ends.lm_head, &out);
    }
    if (s.first_stage()) out.embed = std::move(ends.embed);
  } else if (s.last_stage()) {
    HR_ASSIGN_OR_RETURN(ModelWeights ends, load_weights_part(st, c, {0, 0, false, true}));
    slice_head(c, s, ends.final_norm, ends.lm_head, &out);
  }
  // A layer at a time: the whole layer is read (its mapped bytes), cut, and dropped.
  for (int i = 0; i < s.num_layers; ++i) {
    const int li = s.first_layer + i;
    HR_ASSIGN_OR_RETURN(ModelWeights one, load_weights_part(st, c, {li, 1, false, false}));
    out.layers.push_back(slice_layer(c, s, one.layers[0], li));
  }
  return out;
}

}  // namespace hr::engine
