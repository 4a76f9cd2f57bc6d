// config.json parsing.
#include "engine/model_config.h"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace hr::engine {

using nlohmann::json;

namespace {

Result<int> get_int(const json& j, const char* key, bool required, int def = 0) {
  if (!j.contains(key) || j[key].is_null()) {
    if (required) return invalid_argument(std::string("config.json: missing ") + key, key);
    return def;
  }
  if (!j[key].is_number_integer() || j[key].get<int64_t>() < 0) {
    return invalid_argument(std::string("config.json: ") + key + " must be a non-negative integer",
                            key);
  }
  return j[key].get<int>();
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

Result<ModelConfig> parse_model_config(const std::string& json_text) {
  json j = json::parse(json_text, nullptr, false);
  if (j.is_discarded() || !j.is_object())
    return invalid_argument("config.json is not a JSON object");
  ModelConfig c;
  c.model_type = j.value("model_type", "");
  if (c.model_type != "llama" && c.model_type != "mistral" && c.model_type != "qwen2") {
    return invalid_argument(
        "unsupported model_type '" + c.model_type + "' (supported: llama, mistral, qwen2)",
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
  c.rope_theta = j.value("rope_theta", 10000.0);
  c.tie_word_embeddings = j.value("tie_word_embeddings", false);
  c.qkv_bias = c.model_type == "qwen2" || j.value("attention_bias", false);
  if (j.contains("rope_scaling") && j["rope_scaling"].is_object()) {
    const json& rs = j["rope_scaling"];
    std::string type = rs.value("rope_type", rs.value("type", ""));
    if (type == "llama3") {
      c.rope_scaling.llama3 = true;
      c.rope_scaling.factor = rs.value("factor", 8.0);
      c.rope_scaling.low_freq_factor = rs.value("low_freq_factor", 1.0);
      c.rope_scaling.high_freq_factor = rs.value("high_freq_factor", 4.0);
      c.rope_scaling.original_max_position_embeddings =
          rs.value("original_max_position_embeddings", 8192);
    } else if (type != "default" && !type.empty()) {
      return invalid_argument("config.json: unsupported rope_scaling type '" + type + "'",
                              "rope_scaling");
    }
  }
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
