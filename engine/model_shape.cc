// config.json to weight and cache shapes.
#include "engine/model_shape.h"

#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "engine/internal/config_field.h"
#include "engine/model_config.h"

namespace hr::engine {

using nlohmann::json;

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::kBf16:
      return "bf16";
    case WeightFormat::kFp8:
      return "fp8";
    case WeightFormat::kInt4:
      return "int4";
  }
  return "?";
}

Result<WeightFormat> parse_weight_format(const std::string& name) {
  if (name == "bf16") return WeightFormat::kBf16;
  if (name == "fp8") return WeightFormat::kFp8;
  if (name == "int4") return WeightFormat::kInt4;
  return invalid_argument("unknown weight format '" + name + "' (bf16, fp8 or int4)");
}

namespace {

Result<int64_t> field(const json& j, const char* key, bool required, int64_t def = 0) {
  return internal::config_field(j, key, required, def);
}

// The checkpoint's formats from quantization_config: DeepSeek's fp8 blocks, or compressed-tensors
// with 4-bit integer weights (Kimi K2.5's experts; attention and the LM head left in bf16).
void read_quantization(const json& j, ModelShape* s) {
  if (!j.contains("quantization_config") || !j["quantization_config"].is_object()) return;
  const json& q = j["quantization_config"];
  const std::string method = q.value("quant_method", "");
  if (method == "fp8") {
    s->checkpoint_format = s->checkpoint_expert_format = WeightFormat::kFp8;
    return;
  }
  if (method == "compressed-tensors" && q.contains("config_groups") &&
      q["config_groups"].is_object()) {
    for (const auto& [name, group] : q["config_groups"].items()) {
      const json w = group.value("weights", json::object());
      if (w.value("num_bits", 0) == 4 && w.value("type", "") == "int") {
        s->checkpoint_expert_format = WeightFormat::kInt4;
      }
    }
  }
}

Result<ModelShape> parse_mla(const json& j) {
  ModelShape s;
  s.model_type = j.value("model_type", "");
  HR_ASSIGN_OR_RETURN(s.vocab_size, field(j, "vocab_size", true));
  HR_ASSIGN_OR_RETURN(s.hidden_size, field(j, "hidden_size", true));
  HR_ASSIGN_OR_RETURN(s.intermediate_size, field(j, "intermediate_size", true));
  HR_ASSIGN_OR_RETURN(s.num_layers, field(j, "num_hidden_layers", true));
  HR_ASSIGN_OR_RETURN(s.num_heads, field(j, "num_attention_heads", true));
  s.num_kv_heads = s.num_heads;
  HR_ASSIGN_OR_RETURN(s.q_lora_rank, field(j, "q_lora_rank", false, 0));
  HR_ASSIGN_OR_RETURN(s.kv_lora_rank, field(j, "kv_lora_rank", true));
  HR_ASSIGN_OR_RETURN(s.qk_nope_head_dim, field(j, "qk_nope_head_dim", true));
  HR_ASSIGN_OR_RETURN(s.qk_rope_head_dim, field(j, "qk_rope_head_dim", true));
  HR_ASSIGN_OR_RETURN(s.v_head_dim, field(j, "v_head_dim", true));
  s.mla = true;
  s.head_dim = s.qk_nope_head_dim + s.qk_rope_head_dim;
  s.tie_word_embeddings = j.value("tie_word_embeddings", false);
  HR_ASSIGN_OR_RETURN(s.num_experts, field(j, "n_routed_experts", false, 0));
  if (s.num_experts > 0) {
    HR_ASSIGN_OR_RETURN(s.top_k, field(j, "num_experts_per_tok", true));
    HR_ASSIGN_OR_RETURN(s.expert_intermediate_size, field(j, "moe_intermediate_size", true));
    HR_ASSIGN_OR_RETURN(s.shared_experts, field(j, "n_shared_experts", false, 0));
    HR_ASSIGN_OR_RETURN(int64_t first_dense, field(j, "first_k_dense_replace", false, 0));
    HR_ASSIGN_OR_RETURN(int64_t freq, field(j, "moe_layer_freq", false, 1));
    if (freq == 0)
      return invalid_argument("config.json: moe_layer_freq must be positive", "moe_layer_freq");
    s.router_bias = j.value("topk_method", "") == "noaux_tc";
    for (int64_t l = 0; l < s.num_layers; ++l) {
      s.sparse_layers.push_back(l >= first_dense && l % freq == 0);
    }
  }
  if (s.hidden_size == 0 || s.num_layers == 0 || s.num_heads == 0 || s.vocab_size == 0) {
    return invalid_argument("config.json: sizes must be positive", "hidden_size");
  }
  read_quantization(j, &s);
  return s;
}

}  // namespace

int64_t ModelShape::parameters() const {
  const int64_t D = hidden_size;
  int64_t n = vocab_size * D * (tie_word_embeddings ? 1 : 2) + D;
  for (int64_t l = 0; l < num_layers; ++l) {
    n += 2 * D;  // the layer's two norms
    if (mla) {
      const int64_t H = num_heads;
      n += q_lora_rank > 0 ? q_lora_rank * D + q_lora_rank +
                                 H * (qk_nope_head_dim + qk_rope_head_dim) * q_lora_rank
                           : H * (qk_nope_head_dim + qk_rope_head_dim) * D;
      n += (kv_lora_rank + qk_rope_head_dim) * D + kv_lora_rank +
           H * (qk_nope_head_dim + v_head_dim) * kv_lora_rank + D * H * v_head_dim;
    } else {
      const int64_t qkv = (num_heads + 2 * num_kv_heads) * head_dim;
      n += qkv * D + D * num_heads * head_dim;
      if (qkv_bias) n += qkv;
      if (qk_norm) n += 2 * head_dim;
    }
    if (is_moe_layer(l)) {
      n += num_experts * D + (router_bias ? num_experts : 0);
      n += (num_experts + shared_experts) * 3 * expert_intermediate_size * D;
    } else {
      n += 3 * intermediate_size * D;
    }
  }
  return n;
}

ModelShape shape_of(const ModelConfig& c) {
  ModelShape s;
  s.model_type = c.model_type;
  s.vocab_size = c.vocab_size;
  s.hidden_size = c.hidden_size;
  s.num_layers = c.num_layers;
  s.num_heads = c.num_heads;
  s.num_kv_heads = c.num_kv_heads;
  s.head_dim = c.head_dim;
  s.qkv_bias = c.qkv_bias;
  s.qk_norm = c.qk_norm;
  s.tie_word_embeddings = c.tie_word_embeddings;
  s.intermediate_size = c.intermediate_size;
  s.num_experts = c.moe.num_experts;
  s.top_k = c.moe.top_k;
  s.expert_intermediate_size = c.moe.expert_intermediate_size;
  s.sparse_layers = c.moe.sparse_layers;
  return s;
}

Result<ModelShape> parse_model_shape(const std::string& json_text) {
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) {
    return invalid_argument("config.json is not a JSON object");
  }
  // A multimodal model's language model (Kimi K2.5).
  if (j.contains("text_config") && j["text_config"].is_object()) {
    json text = j["text_config"];
    if (!text.contains("quantization_config") && j.contains("quantization_config")) {
      text["quantization_config"] = j["quantization_config"];
    }
    j = std::move(text);
  }
  const std::string type = j.value("model_type", "");
  if (type == "deepseek_v3" || type == "kimi_k2") return parse_mla(j);
  HR_ASSIGN_OR_RETURN(ModelConfig c, parse_model_config(j.dump()));
  ModelShape s = shape_of(c);
  read_quantization(j, &s);
  return s;
}

Result<ModelShape> load_model_shape(const std::string& dir_or_file) {
  std::string path = dir_or_file;
  if (path.size() < 5 || path.substr(path.size() - 5) != ".json") path += "/config.json";
  std::ifstream in(path);
  if (!in) return invalid_argument("cannot read " + path, "model");
  std::stringstream ss;
  ss << in.rdbuf();
  Result<ModelShape> s = parse_model_shape(ss.str());
  if (!s.is_ok()) return s.status().with_context(path);
  return s;
}

}  // namespace hr::engine
