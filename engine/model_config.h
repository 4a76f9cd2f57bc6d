// A Llama-family decoder's shape, read from a Hugging Face config.json (model_type llama, mistral,
// qwen2): GQA, RoPE (with llama3 rope_scaling), biases, tied embeddings. Errors name the field.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

namespace hr::engine {

struct RopeScaling {
  bool llama3 = false;
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int original_max_position_embeddings = 8192;
};

struct ModelConfig {
  std::string model_type;
  int vocab_size = 0;
  int hidden_size = 0;
  int intermediate_size = 0;
  int num_layers = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  int max_position_embeddings = 0;
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  bool qkv_bias = false;  // attention_bias (llama) or always (qwen2)
  bool tie_word_embeddings = false;
  std::vector<int> eos_token_ids;
  int bos_token_id = -1;

  int q_size() const { return num_heads * head_dim; }
  int kv_size() const { return num_kv_heads * head_dim; }
  // RoPE inverse frequencies (head_dim / 2 of them), with llama3 scaling applied.
  std::vector<float> rope_inv_freq() const;
};

[[nodiscard]] Result<ModelConfig> parse_model_config(const std::string& json_text);
[[nodiscard]] Result<ModelConfig> load_model_config(const std::string& dir);

}  // namespace hr::engine
