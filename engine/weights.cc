// Weight loading and fusing.
#include "engine/weights.h"

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <thread>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "engine/safetensors.h"

namespace hr::engine {

// Sizes the vector once (no regrowth), and asks for transparent huge pages over the whole 2 MiB
// pages inside it before the first touch (the batch-1 GEMV measured 8-10% faster on huge pages).
// Advice only: without THP the memory is the same as before.
void allocate_weight(std::vector<float>* v, size_t n) {
  v->reserve(n);
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHugePage = 2u << 20;
  uintptr_t begin = (reinterpret_cast<uintptr_t>(v->data()) + kHugePage - 1) & ~(kHugePage - 1);
  uintptr_t end = reinterpret_cast<uintptr_t>(v->data() + n) & ~(kHugePage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);
#endif
  v->resize(n);
}

namespace {

using Shape = std::vector<int64_t>;

Status read_into(const SafetensorsModel& st, const std::string& name, const Shape& shape,
                 std::vector<float>* out, size_t offset = 0) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  if (out->size() < offset + static_cast<size_t>(n)) out->resize(offset + static_cast<size_t>(n));
  return st.read_f32(name, shape, out->data() + offset);
}

}  // namespace

size_t ModelWeights::num_parameters() const {
  size_t n = embed.size() + final_norm.size() + lm_head.size();
  for (const auto& l : layers) {
    n += l.input_norm.size() + l.post_norm.size() + l.wqkv.size() + l.bqkv.size() + l.wo.size() +
         l.w_gate_up.size() + l.w_down.size() + l.q_norm.size() + l.k_norm.size() +
         l.router.size() + l.experts_gate_up.size() + l.experts_down.size();
  }
  return n;
}

std::vector<float>& ModelWeights::slot(WeightSlot s, int layer) {
  LayerWeights* l = layer >= 0 ? &layers[static_cast<size_t>(layer)] : nullptr;
  switch (s) {
    case WeightSlot::kEmbed:
      return embed;
    case WeightSlot::kLmHead:
      return lm_head;
    case WeightSlot::kFinalNorm:
      return final_norm;
    case WeightSlot::kInputNorm:
      return l->input_norm;
    case WeightSlot::kPostNorm:
      return l->post_norm;
    case WeightSlot::kQkv:
      return l->wqkv;
    case WeightSlot::kQkvBias:
      return l->bqkv;
    case WeightSlot::kO:
      return l->wo;
    case WeightSlot::kGateUp:
      return l->w_gate_up;
    case WeightSlot::kDown:
      return l->w_down;
    case WeightSlot::kQNorm:
      return l->q_norm;
    case WeightSlot::kKNorm:
      return l->k_norm;
    case WeightSlot::kRouter:
      return l->router;
    case WeightSlot::kExpertGateUp:
      return l->experts_gate_up;
    case WeightSlot::kExpertDown:
      return l->experts_down;
  }
  HR_CHECK(false) << "unknown weight slot";
  return embed;
}

const std::vector<float>& ModelWeights::slot(WeightSlot s, int layer) const {
  return const_cast<ModelWeights*>(this)->slot(s, layer);
}

WeightShard whole_model(const ModelConfig& c) {
  WeightShard s;
  s.num_layers = c.num_layers;
  s.num_q_heads = c.num_heads;
  s.num_kv_heads = c.num_kv_heads;
  s.ffn = c.intermediate_size;
  s.num_experts = c.moe.num_experts;
  s.expert_ffn = c.moe.expert_intermediate_size;
  s.vocab = c.vocab_size;
  return s;
}

size_t ModelWeights::num_bytes() const { return num_parameters() * sizeof(float); }

namespace {

// A MoE layer's router and experts. Checkpoints name them after the model (Qwen3-MoE:
// mlp.gate, mlp.experts.N.{gate,up,down}_proj; Mixtral: block_sparse_moe.gate,
// block_sparse_moe.experts.N.{w1,w3,w2}), or hold transformers 5's fused form (mlp.gate,
// mlp.experts.gate_up_proj [E, 2 F, D] with each expert's gate rows first, mlp.experts.down_proj
// [E, D, F]).
void expert_pieces(const ModelConfig& c, int layer, const std::string& p, bool fused,
                   std::vector<WeightPiece>* out) {
  using S = WeightSlot;
  const int64_t D = c.hidden_size, F = c.moe.expert_intermediate_size, E = c.moe.num_experts;
  const bool mixtral = c.model_type == "mixtral" && !fused;
  const std::string block = p + (mixtral ? "block_sparse_moe." : "mlp.");
  out->push_back({block + "gate.weight", {E, D}, S::kRouter, layer});
  if (fused) {
    out->push_back({block + "experts.gate_up_proj", {E, 2 * F, D}, S::kExpertGateUp, layer});
    out->push_back({block + "experts.down_proj", {E, D, F}, S::kExpertDown, layer});
    return;
  }
  for (int64_t e = 0; e < E; ++e) {
    const std::string x = block + "experts." + std::to_string(e) + ".";
    const auto at = [](int64_t n) { return static_cast<size_t>(n); };
    out->push_back({x + (mixtral ? "w1" : "gate_proj") + ".weight",
                    {F, D},
                    S::kExpertGateUp,
                    layer,
                    at(e * 2 * F * D)});
    out->push_back({x + (mixtral ? "w3" : "up_proj") + ".weight",
                    {F, D},
                    S::kExpertGateUp,
                    layer,
                    at((e * 2 + 1) * F * D)});
    out->push_back({x + (mixtral ? "w2" : "down_proj") + ".weight",
                    {D, F},
                    S::kExpertDown,
                    layer,
                    at(e * D * F)});
  }
}

}  // namespace

std::vector<WeightPiece> weight_pieces(const ModelConfig& c,
                                       const std::function<bool(const std::string&)>& has) {
  const int64_t D = c.hidden_size, F = c.intermediate_size, V = c.vocab_size;
  const int64_t Q = c.q_size(), KV = c.kv_size();
  using S = WeightSlot;
  std::vector<WeightPiece> out = {
      {"model.embed_tokens.weight", {V, D}, S::kEmbed},
      {"model.norm.weight", {D}, S::kFinalNorm},
  };
  if (!c.tie_word_embeddings) out.push_back({"lm_head.weight", {V, D}, S::kLmHead});
  for (int i = 0; i < c.num_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    auto at = [](int64_t n) { return static_cast<size_t>(n); };
    out.push_back({p + "input_layernorm.weight", {D}, S::kInputNorm, i});
    out.push_back({p + "post_attention_layernorm.weight", {D}, S::kPostNorm, i});
    out.push_back({p + "self_attn.q_proj.weight", {Q, D}, S::kQkv, i, 0});
    out.push_back({p + "self_attn.k_proj.weight", {KV, D}, S::kQkv, i, at(Q * D)});
    out.push_back({p + "self_attn.v_proj.weight", {KV, D}, S::kQkv, i, at((Q + KV) * D)});
    if (c.qkv_bias) {
      out.push_back({p + "self_attn.q_proj.bias", {Q}, S::kQkvBias, i, 0});
      out.push_back({p + "self_attn.k_proj.bias", {KV}, S::kQkvBias, i, at(Q)});
      out.push_back({p + "self_attn.v_proj.bias", {KV}, S::kQkvBias, i, at(Q + KV)});
    }
    if (c.qk_norm) {
      out.push_back({p + "self_attn.q_norm.weight", {c.head_dim}, S::kQNorm, i});
      out.push_back({p + "self_attn.k_norm.weight", {c.head_dim}, S::kKNorm, i});
    }
    out.push_back({p + "self_attn.o_proj.weight", {D, Q}, S::kO, i});
    if (c.is_moe_layer(i)) {
      expert_pieces(c, i, p, has && has(p + "mlp.experts.gate_up_proj"), &out);
      continue;
    }
    out.push_back({p + "mlp.gate_proj.weight", {F, D}, S::kGateUp, i, 0});
    out.push_back({p + "mlp.up_proj.weight", {F, D}, S::kGateUp, i, at(F * D)});
    out.push_back({p + "mlp.down_proj.weight", {D, F}, S::kDown, i});
  }
  return out;
}

Result<ModelWeights> load_weights_part(const SafetensorsModel& st, const ModelConfig& config,
                                       const WeightPart& part, const LoadOptions& options) {
  if (part.first_layer < 0 || part.num_layers < 0 ||
      part.first_layer + part.num_layers > config.num_layers) {
    return invalid_argument("layers " + std::to_string(part.first_layer) + " + " +
                            std::to_string(part.num_layers) + " are not the model's");
  }
  ModelWeights w;
  w.config = config;
  w.layers.resize(static_cast<size_t>(part.num_layers));
  std::vector<WeightPiece> pieces;
  for (WeightPiece& piece :
       weight_pieces(config, [&](const std::string& name) { return st.find(name) != nullptr; })) {
    const bool head = piece.slot == WeightSlot::kFinalNorm || piece.slot == WeightSlot::kLmHead;
    if (piece.layer >= 0) {
      if (piece.layer < part.first_layer || piece.layer >= part.first_layer + part.num_layers)
        continue;
      piece.layer -= part.first_layer;
    } else if (piece.slot == WeightSlot::kEmbed ? !part.embed : head && !part.head) {
      continue;
    }
    pieces.push_back(std::move(piece));
  }
  std::map<std::vector<float>*, size_t> slot_sizes;
  for (const WeightPiece& piece : pieces) {
    size_t n = 1;
    for (int64_t d : piece.shape) n *= static_cast<size_t>(d);
    size_t& size = slot_sizes[&w.slot(piece.slot, piece.layer)];
    size = std::max(size, piece.offset + n);
  }
  for (auto& [slot, size] : slot_sizes) allocate_weight(slot, size);
  // The pieces are converted in order, by `threads` threads taking the next one in turn. Whoever
  // takes piece i asks the kernel for the pieces [ask[i], ask[i + 1]): those up to
  // read_ahead_bytes past the start of piece i, each asked for once.
  const size_t n = pieces.size();
  std::vector<const TensorView*> views(n);  // null: missing (read_into names it)
  std::vector<size_t> ask(n + 1, n);
  for (size_t i = 0; i < n; ++i) views[i] = st.find(pieces[i].name);
  auto bytes = [&](size_t i) { return views[i] ? views[i]->num_bytes : 0; };
  if (options.read_ahead_bytes > 0) {
    size_t end = 0, window = 0;  // window: bytes of pieces [i, end)
    ask[0] = 0;
    for (size_t i = 0; i < n; ++i) {
      while (end < n && (end <= i || window + bytes(end) <= options.read_ahead_bytes)) {
        window += bytes(end++);
      }
      ask[i + 1] = end;
      window -= bytes(i);
    }
  }
  // The error reported is the first piece's that fails, as if they were read one by one: every
  // piece before a failing one was taken (in order) before it, so it is tried too.
  std::atomic<size_t> next{0};
  std::mutex error_mu;
  Status error;
  size_t error_at = n;
  auto convert = [&] {
    for (size_t i = next++; i < n; i = next++) {
      for (size_t a = ask[i]; a < ask[i + 1]; ++a) {
        if (views[a]) st.prefetch(*views[a]);
      }
      const WeightPiece& piece = pieces[i];
      Status s =
          read_into(st, piece.name, piece.shape, &w.slot(piece.slot, piece.layer), piece.offset);
      if (!s.is_ok()) {
        std::lock_guard<std::mutex> lock(error_mu);
        if (i < error_at) {
          error = s;
          error_at = i;
        }
        next = n;
      }
    }
  };
  const int threads = options.threads > 0
                          ? options.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  std::vector<std::thread> helpers;
  for (int t = 1; t < std::min(threads, static_cast<int>(n)); ++t) helpers.emplace_back(convert);
  convert();
  for (auto& t : helpers) t.join();
  HR_RETURN_IF_ERROR(error);
  return w;
}

Result<ModelWeights> load_weights(const std::string& dir) {
  HR_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  HR_ASSIGN_OR_RETURN(auto st, SafetensorsModel::open_dir(dir));
  LoadOptions options;
  options.threads = 0;
  return load_weights_part(*st, config, {0, config.num_layers, true, true}, options);
}

}  // namespace hr::engine
