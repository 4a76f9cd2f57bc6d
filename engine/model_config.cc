// config.json parsing.
#include "engine/model_config.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iterator>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/internal/config_field.h"

namespace hr::engine {

using nlohmann::json;

namespace {

Result<int> get_int(const json& j, const char* key, bool required, int def = 0) {
  HR_ASSIGN_OR_RETURN(int64_t v, internal::config_field(j, key, required, def));
  if (v > std::numeric_limits<int>::max()) {
    return invalid_argument(std::string("config.json: ") + key + " is too large", key);
  }
  return static_cast<int>(v);
}

}  // namespace

std::vector<float> ModelConfig::rope_inv_freq() const {
  std::vector<float> inv(static_cast<size_t>(head_dim / 2));
  for (int i = 0; i < head_dim / 2; ++i) {
    // As PyTorch computes it: in float32.
    float exponent = static_cast<float>(2 * i) / static_cast<float>(head_dim);
    inv[i] = 1.0f / std::pow(static_cast<float>(rope_theta), exponent);
  }
  if (rope_scaling.llama3) {
    const double pi = 3.14159265358979323846;
    double low_wavelen =
        rope_scaling.original_max_position_embeddings / rope_scaling.low_freq_factor;
    double high_wavelen =
        rope_scaling.original_max_position_embeddings / rope_scaling.high_freq_factor;
    for (float& f : inv) {
      double wavelen = 2 * pi / f;
      if (wavelen > low_wavelen) {
        f = static_cast<float>(f / rope_scaling.factor);
      } else if (wavelen >= high_wavelen) {
        double smooth = (rope_scaling.original_max_position_embeddings / wavelen -
                         rope_scaling.low_freq_factor) /
                        (rope_scaling.high_freq_factor - rope_scaling.low_freq_factor);
        f = static_cast<float>((1 - smooth) * f / rope_scaling.factor + smooth * f);
      }
    }
  }
  return inv;
}

namespace {

// RoPE: transformers 5 keeps every setting in rope_parameters; 4 has rope_theta beside an optional
// rope_scaling object.
Status parse_rope(const json& j, ModelConfig* c) {
  const json* settings = nullptr;
  std::string field = "rope_scaling";
  if (j.contains("rope_parameters") && j["rope_parameters"].is_object()) {
    settings = &j["rope_parameters"];
    field = "rope_parameters";
  } else if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    settings = &j["rope_scaling"];
  }
  auto number = [](const json& o, const char* key, double def) {
    return o.contains(key) && o[key].is_number() ? o[key].get<double>() : def;
  };
  c->rope_theta = number(j, "rope_theta", 10000.0);
  if (settings == nullptr) return Status::ok();
  const json& rs = *settings;
  if (field == "rope_parameters") c->rope_theta = number(rs, "rope_theta", c->rope_theta);
  std::string type = rs.value("rope_type", rs.value("type", ""));
  if (type == "llama3") {
    c->rope_scaling.llama3 = true;
    c->rope_scaling.factor = number(rs, "factor", 8.0);
    c->rope_scaling.low_freq_factor = number(rs, "low_freq_factor", 1.0);
    c->rope_scaling.high_freq_factor = number(rs, "high_freq_factor", 4.0);
    c->rope_scaling.original_max_position_embeddings =
        static_cast<int>(number(rs, "original_max_position_embeddings", 8192));
  } else if (type != "default" && !type.empty()) {
    return invalid_argument("config.json: unsupported " + field + " type '" + type + "'", field);
  }
  return Status::ok();
}

// The experts: Mixtral's (every layer) or Qwen3-MoE's (mlp_only_layers and decoder_sparse_step
// leave some layers dense).
Status parse_moe(const json& j, ModelConfig* c) {
  MoeConfig& m = c->moe;
  const bool mixtral = c->model_type == "mixtral";
  // transformers 5 writes Qwen3-MoE's expert count as num_local_experts, as Mixtral's always was.
  const char* count_key =
      !mixtral && j.contains("num_experts") ? "num_experts" : "num_local_experts";
  HR_ASSIGN_OR_RETURN(m.num_experts, get_int(j, count_key, true));
  HR_ASSIGN_OR_RETURN(m.top_k, get_int(j, "num_experts_per_tok", true));
  if (m.num_experts < 1 || m.top_k < 1 || m.top_k > m.num_experts) {
    return invalid_argument(
        "config.json: num_experts_per_tok must be 1 to the number of experts (" +
            std::to_string(m.num_experts) + ")",
        "num_experts_per_tok");
  }
  if (mixtral) {
    m.expert_intermediate_size = c->intermediate_size;
    m.renormalize = true;
    m.sparse_layers.assign(static_cast<size_t>(c->num_layers), true);
  } else {
    HR_ASSIGN_OR_RETURN(m.expert_intermediate_size, get_int(j, "moe_intermediate_size", true));
    if (j.contains("norm_topk_prob") && !j["norm_topk_prob"].is_boolean())
      return invalid_argument("config.json: norm_topk_prob must be true or false",
                              "norm_topk_prob");
    m.renormalize = j.value("norm_topk_prob", false);
    HR_ASSIGN_OR_RETURN(int step, get_int(j, "decoder_sparse_step", false, 1));
    if (step < 1)
      return invalid_argument("config.json: decoder_sparse_step must be positive",
                              "decoder_sparse_step");
    std::vector<bool> dense(static_cast<size_t>(c->num_layers), false);
    if (j.contains("mlp_only_layers") && !j["mlp_only_layers"].is_null()) {
      if (!j["mlp_only_layers"].is_array())
        return invalid_argument("config.json: mlp_only_layers must be a list of layer indices",
                                "mlp_only_layers");
      for (const json& l : j["mlp_only_layers"]) {
        if (!l.is_number_integer() || l.get<int64_t>() < 0 || l.get<int64_t>() >= c->num_layers)
          return invalid_argument("config.json: mlp_only_layers holds " + l.dump() +
                                      ", not a layer index below " + std::to_string(c->num_layers),
                                  "mlp_only_layers");
        dense[static_cast<size_t>(l.get<int>())] = true;
      }
    }
    m.sparse_layers.resize(dense.size());
    for (size_t i = 0; i < dense.size(); ++i)
      m.sparse_layers[i] = !dense[i] && (static_cast<int>(i) + 1) % step == 0;
  }
  if (m.expert_intermediate_size < 1)
    return invalid_argument("config.json: the experts' intermediate size must be positive",
                            mixtral ? "intermediate_size" : "moe_intermediate_size");
  return Status::ok();
}

}  // namespace

Result<ModelConfig> parse_model_config(const std::string& json_text) {
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return invalid_argument("config.json is not a JSON object");
  ModelConfig c;
  c.model_type = j.value("model_type", "");
  static const char* const kSupported[] = {"llama", "mistral",   "qwen2",
                                           "qwen3", "qwen3_moe", "mixtral"};
  if (std::find(std::begin(kSupported), std::end(kSupported), c.model_type) ==
      std::end(kSupported)) {
    return invalid_argument("unsupported model_type '" + c.model_type +
                                "' (supported: llama, mistral, qwen2, qwen3, qwen3_moe, mixtral)",
                            "model_type");
  }
  HR_ASSIGN_OR_RETURN(c.vocab_size, get_int(j, "vocab_size", true));
  HR_ASSIGN_OR_RETURN(c.hidden_size, get_int(j, "hidden_size", true));
  HR_ASSIGN_OR_RETURN(c.intermediate_size, get_int(j, "intermediate_size", true));
  HR_ASSIGN_OR_RETURN(c.num_layers, get_int(j, "num_hidden_layers", true));
  HR_ASSIGN_OR_RETURN(c.num_heads, get_int(j, "num_attention_heads", true));
  HR_ASSIGN_OR_RETURN(c.num_kv_heads, get_int(j, "num_key_value_heads", false, c.num_heads));
  if (c.num_heads == 0 || c.hidden_size == 0 || c.num_layers == 0 || c.vocab_size == 0) {
    return invalid_argument("config.json: sizes must be positive", "hidden_size");
  }
  HR_ASSIGN_OR_RETURN(c.head_dim, get_int(j, "head_dim", false, c.hidden_size / c.num_heads));
  HR_ASSIGN_OR_RETURN(c.max_position_embeddings,
                      get_int(j, "max_position_embeddings", false, 2048));
  if (c.num_kv_heads == 0 || c.num_heads % c.num_kv_heads != 0) {
    return invalid_argument(
        "config.json: num_attention_heads must be a multiple of num_key_value_heads",
        "num_key_value_heads");
  }
  if (c.head_dim == 0 || c.head_dim % 2 != 0) {
    return invalid_argument("config.json: head_dim must be even", "head_dim");
  }
  if (j.contains("hidden_act") && j["hidden_act"] != "silu") {
    return invalid_argument("config.json: only hidden_act silu is supported", "hidden_act");
  }
  c.rms_norm_eps = j.value("rms_norm_eps", 1e-6);
  HR_RETURN_IF_ERROR(parse_rope(j, &c));
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);
  c.qkv_bias = c.model_type == "qwen2" || j.value("attention_bias", false);
  const bool qwen3 = c.model_type == "qwen3" || c.model_type == "qwen3_moe";
  c.qk_norm = qwen3;
  if (qwen3 && j.value("use_sliding_window", false)) {
    return invalid_argument("config.json: sliding-window attention is not supported",
                            "use_sliding_window");
  }
  if (c.model_type == "mixtral" || c.model_type == "qwen3_moe")
    HR_RETURN_IF_ERROR(parse_moe(j, &c));
  if (j.contains("eos_token_id")) {
    if (j["eos_token_id"].is_array()) {
      for (const auto& e : j["eos_token_id"]) c.eos_token_ids.push_back(e.get<int>());
    } else if (j["eos_token_id"].is_number_integer()) {
      c.eos_token_ids.push_back(j["eos_token_id"].get<int>());
    }
  }
  if (j.contains("bos_token_id") && j["bos_token_id"].is_number_integer()) {
    c.bos_token_id = j["bos_token_id"].get<int>();
  }
  return c;
}

Result<ModelConfig> load_model_config(const std::string& dir) {
  std::ifstream in(dir + "/config.json");
  if (!in) return invalid_argument("cannot read " + dir + "/config.json", "model");
  std::stringstream ss;
  ss << in.rdbuf();
  Result<ModelConfig> c = parse_model_config(ss.str());
  if (!c.is_ok()) return c.status().with_context(dir + "/config.json");
  return c;
}

}  // namespace hr::engine
