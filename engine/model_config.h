// A decoder's architecture, read from a Hugging Face config.json: the Llama family (model_type
// llama, mistral, qwen2), Qwen3 (q/k RMSNorm per head before RoPE, explicit head_dim), and the
// mixtures of experts Mixtral and Qwen3-MoE (MoeConfig). GQA, RoPE (llama3 scaling), biases, tied
// embeddings. Reads both transformers 4's form (rope_theta, rope_scaling) and 5's (RoPE settings
// in rope_parameters; num_local_experts for Qwen3-MoE's num_experts). Errors name the field.
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

// How a token's router scores become expert weights.
enum class RouterScoring {
  kSoftmax,  // Mixtral, Qwen3-MoE: softmax over all experts, then the top k
  kSigmoid,  // DeepSeek-V3: sigmoid per expert, top k within the best groups (num_groups)
};

// A mixture-of-experts MLP: each token's router picks top_k of num_experts SwiGLU experts of
// expert_intermediate_size, and the layer's output is their weighted sum.
struct MoeConfig {
  int num_experts = 0;  // 0: a dense model
  int top_k = 0;
  int expert_intermediate_size = 0;
  RouterScoring scoring = RouterScoring::kSoftmax;
  bool renormalize = false;  // the top k weights scaled to sum to 1 (norm_topk_prob)
  // Group-limited routing (DeepSeek-V3): experts in num_groups groups, a token's top k chosen
  // within its topk_groups best groups. 1 and 1: no groups.
  int num_groups = 1;
  int topk_groups = 1;
  float routed_scaling_factor = 1.0f;  // applied to the weights after renormalising
  // Which layers are MoE (the others a dense MLP of intermediate_size): Qwen3-MoE's
  // mlp_only_layers and decoder_sparse_step; every layer for Mixtral.
  std::vector<bool> sparse_layers;
};

struct ModelConfig {
  std::string model_type;
  bool qk_norm = false;  // RMSNorm over each q and k head (weights [head_dim]) before RoPE
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

  MoeConfig moe;

  int q_size() const { return num_heads * head_dim; }
  bool is_moe() const { return moe.num_experts > 0; }
  bool is_moe_layer(int layer) const {
    return is_moe() && moe.sparse_layers[static_cast<size_t>(layer)];
  }
  int kv_size() const { return num_kv_heads * head_dim; }
  // RoPE inverse frequencies (head_dim / 2 of them), with llama3 scaling applied.
  std::vector<float> rope_inv_freq() const;
};

[[nodiscard]] Result<ModelConfig> parse_model_config(const std::string& json_text);
[[nodiscard]] Result<ModelConfig> load_model_config(const std::string& dir);

}  // namespace hr::engine
