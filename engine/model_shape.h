// The shapes of a decoder's weights and KV cache, from its config.json alone: what a memory plan
// (engine/memory_plan.h) needs. Covers what the engine runs (ModelConfig: the Llama family,
// Qwen3, Mixtral, Qwen3-MoE) and, for planning ahead of the engine, DeepSeek-V3's layout (also
// Kimi K2's, model_type kimi_k2, and a multimodal config's text_config): multi-head latent
// attention (a compressed KV cache of kv_lora_rank + qk_rope_head_dim per token and layer), shared
// experts and leading dense layers. The checkpoint's weight format is read from its
// quantization_config (fp8 128×128 blocks, or int4 experts as compressed-tensors pack them).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/model_config.h"

namespace hr::engine {

// How a checkpoint stores its matrices.
enum class WeightFormat {
  kBf16,  // 2 bytes an element (and what the engine holds every format in today)
  kFp8,   // 1 byte, with an fp32 scale per 128×128 block (DeepSeek's format)
  kInt4,  // 4 bits, with a bf16 scale per group of 32 along the input (W4A16)
};
const char* weight_format_name(WeightFormat f);
[[nodiscard]] Result<WeightFormat> parse_weight_format(const std::string& name);

struct ModelShape {
  std::string model_type;
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  bool qkv_bias = false;
  bool qk_norm = false;
  bool tie_word_embeddings = false;
  int64_t intermediate_size = 0;  // a dense layer's MLP

  // Mixture of experts (num_experts 0: dense).
  int64_t num_experts = 0;
  int64_t top_k = 0;
  int64_t expert_intermediate_size = 0;
  int64_t shared_experts = 0;  // dense experts of expert_intermediate_size every token uses
  bool router_bias = false;    // e_score_correction_bias
  std::vector<bool> sparse_layers;

  // Multi-head latent attention (DeepSeek-V3, Kimi K2).
  bool mla = false;
  int64_t q_lora_rank = 0;  // 0: q projected straight from the hidden state
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;

  // As stored: the dense matrices' format and the routed experts'.
  WeightFormat checkpoint_format = WeightFormat::kBf16;
  WeightFormat checkpoint_expert_format = WeightFormat::kBf16;

  bool is_moe_layer(int64_t layer) const {
    return num_experts > 0 && sparse_layers[static_cast<size_t>(layer)];
  }
  // Every parameter of the model (embeddings, norms, every expert).
  int64_t parameters() const;
};

// Errors name the config field.
// The shape of a model the engine runs (no multi-head latent attention, no quantization read).
ModelShape shape_of(const ModelConfig& c);
[[nodiscard]] Result<ModelShape> parse_model_shape(const std::string& json_text);
// DIR/config.json, or a config.json file itself.
[[nodiscard]] Result<ModelShape> load_model_shape(const std::string& dir_or_file);

}  // namespace hr::engine
