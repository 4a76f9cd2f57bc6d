// Weight loading and fusing.
#include "engine/weights.h"

#include "engine/safetensors.h"

namespace hr::engine {
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
         l.w_gate_up.size() + l.w_down.size();
  }
  return n;
}

size_t ModelWeights::num_bytes() const { return num_parameters() * sizeof(float); }

Result<ModelWeights> load_weights(const std::string& dir) {
  ModelWeights w;
  HR_ASSIGN_OR_RETURN(w.config, load_model_config(dir));
  HR_ASSIGN_OR_RETURN(auto st, SafetensorsModel::open_dir(dir));
  const ModelConfig& c = w.config;
  const int64_t D = c.hidden_size, F = c.intermediate_size, V = c.vocab_size;
  const int64_t Q = c.q_size(), KV = c.kv_size();
  HR_RETURN_IF_ERROR(read_into(*st, "model.embed_tokens.weight", {V, D}, &w.embed));
  HR_RETURN_IF_ERROR(read_into(*st, "model.norm.weight", {D}, &w.final_norm));
  if (!c.tie_word_embeddings) {
    HR_RETURN_IF_ERROR(read_into(*st, "lm_head.weight", {V, D}, &w.lm_head));
  }
  w.layers.resize(static_cast<size_t>(c.num_layers));
  for (int i = 0; i < c.num_layers; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    HR_RETURN_IF_ERROR(read_into(*st, p + "input_layernorm.weight", {D}, &l.input_norm));
    HR_RETURN_IF_ERROR(read_into(*st, p + "post_attention_layernorm.weight", {D}, &l.post_norm));
    HR_RETURN_IF_ERROR(read_into(*st, p + "self_attn.q_proj.weight", {Q, D}, &l.wqkv, 0));
    HR_RETURN_IF_ERROR(read_into(*st, p + "self_attn.k_proj.weight", {KV, D}, &l.wqkv, Q * D));
    HR_RETURN_IF_ERROR(read_into(*st, p + "self_attn.v_proj.weight", {KV, D}, &l.wqkv, (Q + KV) * D));
    if (c.qkv_bias) {
      HR_RETURN_IF_ERROR(read_into(*st, p + "self_attn.q_proj.bias", {Q}, &l.bqkv, 0));
      HR_RETURN_IF_ERROR(read_into(*st, p + "self_attn.k_proj.bias", {KV}, &l.bqkv, Q));
      HR_RETURN_IF_ERROR(read_into(*st, p + "self_attn.v_proj.bias", {KV}, &l.bqkv, Q + KV));
    }
    HR_RETURN_IF_ERROR(read_into(*st, p + "self_attn.o_proj.weight", {D, Q}, &l.wo));
    HR_RETURN_IF_ERROR(read_into(*st, p + "mlp.gate_proj.weight", {F, D}, &l.w_gate_up, 0));
    HR_RETURN_IF_ERROR(read_into(*st, p + "mlp.up_proj.weight", {F, D}, &l.w_gate_up, F * D));
    HR_RETURN_IF_ERROR(read_into(*st, p + "mlp.down_proj.weight", {D, F}, &l.w_down));
  }
  return w;
}

}  // namespace hr::engine
