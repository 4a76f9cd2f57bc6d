// Model weights in fp32 host memory, laid out for batched GEMMs: q/k/v fused into one matrix and
// gate/up fused into another, so one step issues one GEMM per projection for the whole batch. A
// mixture of experts keeps its experts' matrices the same way, one after another ([experts, 2 F,
// D] and [experts, D, F]), from either checkpoint form: one tensor per expert and projection, or
// transformers 5's fused experts.gate_up_proj / experts.down_proj. Immutable after loading; shared
// read-only by backend threads.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/model_config.h"

namespace hr::engine {

// Where a checkpoint tensor goes (see weight_pieces below).
enum class WeightSlot {
  kEmbed,
  kLmHead,
  kFinalNorm,
  kInputNorm,
  kPostNorm,
  kQkv,
  kQkvBias,
  kO,
  kGateUp,
  kDown,
  kQNorm,
  kKNorm,
  kRouter,
  kExpertGateUp,
  kExpertDown
};

struct LayerWeights {
  std::vector<float> input_norm;  // [D]
  std::vector<float> post_norm;   // [D]
  std::vector<float> wqkv;        // [q + 2 kv, D]
  std::vector<float> bqkv;        // [q + 2 kv] or empty
  std::vector<float> wo;          // [D, q]
  std::vector<float> w_gate_up;   // [2 F, D]: gate rows, then up rows (dense layers)
  std::vector<float> w_down;      // [D, F]
  std::vector<float> q_norm;      // [head_dim] (qk_norm models)
  std::vector<float> k_norm;      // [head_dim]
  // MoE layers (F: the experts' intermediate size):
  std::vector<float> router;           // [E, D]
  std::vector<float> experts_gate_up;  // [E, 2 F, D]: each expert's gate rows, then its up rows
  std::vector<float> experts_down;     // [E, D, F]
};

// The part of a model a ModelWeights holds: the whole model, or one rank's slice of a parallel
// engine (weight_shard.h). Counts are this rank's; the config keeps the whole model's.
struct WeightShard {
  int tp = 1, tp_rank = 0;  // tensor-parallel ranks and this one's index
  int pp = 1, stage = 0;    // pipeline stages and this one's index
  int ep = 1;               // 1: experts sliced across the tp ranks; tp: a share of them whole
  int first_layer = 0, num_layers = 0;  // layers[i] is the model's layer first_layer + i
  int first_q_head = 0, num_q_heads = 0;
  int first_kv_head = 0, num_kv_heads = 0;
  int first_ffn = 0, ffn = 0;                // dense MLP intermediate rows
  int first_expert = 0, num_experts = 0;     // experts held
  int first_expert_ffn = 0, expert_ffn = 0;  // each held expert's intermediate rows
  int first_vocab = 0, vocab = 0;            // LM head rows (on the last stage)
  bool first_stage() const { return stage == 0; }
  bool last_stage() const { return stage == pp - 1; }
  bool whole() const { return tp == 1 && pp == 1; }
};
// The whole model's "shard": every layer, head, row and expert.
WeightShard whole_model(const ModelConfig& c);

struct ModelWeights {
  ModelConfig config;
  // Empty (num_layers 0) for the whole model as loaded; shard() fills it in.
  WeightShard part;
  std::vector<float> embed;       // [V, D]
  std::vector<float> final_norm;  // [D]
  std::vector<float> lm_head;     // [V, D]; empty when tied to embed
  std::vector<LayerWeights> layers;

  // True once pack_for_cpu() (cpu_backend.h) has put the matrices in the CPU kernels' panel layout
  // (cpu_gemm.h): wqkv, wo, w_gate_up, w_down, each expert's matrices and the LM head (the
  // embedding too when tied).
  bool cpu_packed = false;
  const float* lm_head_data() const { return lm_head.empty() ? embed.data() : lm_head.data(); }
  // What these weights hold: `part`, or the whole model when it was not set.
  WeightShard shard() const { return part.num_layers > 0 ? part : whole_model(config); }
  // The vector holding a checkpoint piece's slot (per-layer slots of `layer`).
  std::vector<float>& slot(WeightSlot s, int layer);
  const std::vector<float>& slot(WeightSlot s, int layer) const;
  size_t num_bytes() const;
  size_t num_parameters() const;
};

// Where each checkpoint tensor goes in the fused layout above: one list for every loader (the
// fp32 host loader below, the CUDA backend's direct bf16 upload).
struct WeightPiece {
  std::string name;            // checkpoint tensor name
  std::vector<int64_t> shape;  // expected shape
  WeightSlot slot;
  int layer = -1;     // for per-layer slots
  size_t offset = 0;  // first element inside the slot's fused matrix
};
// `has` says whether the checkpoint holds a tensor, to choose between the experts' two forms
// (none: one tensor per expert).
std::vector<WeightPiece> weight_pieces(
    const ModelConfig& c, const std::function<bool(const std::string&)>& has = nullptr);
// Norm weights, biases and routers stay fp32 on every backend; the matrices may be bf16.
inline bool is_vector_slot(WeightSlot s) {
  return s == WeightSlot::kFinalNorm || s == WeightSlot::kInputNorm || s == WeightSlot::kPostNorm ||
         s == WeightSlot::kQkvBias || s == WeightSlot::kQNorm || s == WeightSlot::kKNorm ||
         s == WeightSlot::kRouter;
}

// Sizes `v` to n floats on transparent huge pages where the kernel allows (every decode step
// streams every weight; with 4 KiB pages that is a TLB miss per page).
void allocate_weight(std::vector<float>* v, size_t n);

// Loads config.json and the safetensors weights of a Hugging Face folder, converting to fp32 on
// every core (LoadOptions). Errors name the missing or misshapen tensor.
[[nodiscard]] Result<ModelWeights> load_weights(const std::string& dir);

// Which tensors load_weights_part reads: layers [first_layer, first_layer + num_layers) (they
// become layers[0..num_layers)), the embedding, and the final norm with the LM head (a tied one
// is the embedding: asked for with `embed`).
struct WeightPart {
  int first_layer = 0;
  int num_layers = 0;
  bool embed = false;
  bool head = false;
};
class SafetensorsModel;
// How a load reads: while tensors are converted, the kernel reads the next ones from the disk,
// up to `read_ahead_bytes` ahead (0: each tensor is read as it is converted), and `threads`
// threads convert tensors side by side (0: one per core), so a cold load runs at the drive's
// speed rather than one core's conversion rate.
struct LoadOptions {
  size_t read_ahead_bytes = 64u << 20;
  int threads = 1;
};
// Those tensors alone, from the checkpoint's memory-mapped files: only their bytes are read.
[[nodiscard]] Result<ModelWeights> load_weights_part(const SafetensorsModel& st,
                                                     const ModelConfig& config,
                                                     const WeightPart& part,
                                                     const LoadOptions& options = {});

}  // namespace hr::engine
