// A random-weight Llama (or, with experts, a Qwen3-MoE in transformers 5's fused expert form) in
// the Hugging Face layout (config.json, model.safetensors written by hand, the tokenizer files of
// another model folder), for benchmarks and tests that need a model larger or longer-lived than
// the bundled one. Each value comes from a hash of its place (about N(0, 0.02); norms one), made
// on every core and written as it is made, so that the same spec writes the same files and a
// model of billions of parameters takes seconds.
#pragma once

#include <cstddef>
#include <string>

namespace hr::testing {

struct RandomLlama {
  int vocab = 32000, hidden = 768, intermediate = 2048, layers = 12, heads = 12, kv_heads = 4;
  int head_dim = 64;
  int context = 2048;  // max_position_embeddings
  double rope_theta = 500000.0;
  bool bf16 = true;  // else f32
  // Embedding rows (also the tied LM head) zero but for the printable ASCII bytes: greedy
  // decoding with the bundled byte-level tokenizer writes text and never ends before max_tokens.
  bool printable_output = false;
  // A mixture of experts when experts > 0: every layer's MLP is `experts` SwiGLU experts of
  // expert_intermediate, top_k per token (qwen3_moe, q/k norms included).
  int experts = 0, top_k = 2, expert_intermediate = 512;
  // An LM head of its own (lm_head.weight) rather than the embedding's, as Llama 3 8B's.
  bool tie = true;
};

// Writes the model to `dir` (created), copying tokenizer.json and tokenizer_config.json from
// `tokenizer_dir`. Returns the bytes of weights written.
size_t write_random_llama(const std::string& dir, const std::string& tokenizer_dir,
                          const RandomLlama& spec);

}  // namespace hr::testing
