// What each rank of a deployment holds on its device, from a model's shapes alone (no weights
// needed): weights, the CUDA backend's buffers for a step, workspace, an allowance for the CUDA
// context and captured graphs, and what is left for the KV cache, in bytes and tokens.
//
// Sharding (Megatron, docs/memory-plan.md): attention column-parallel by heads (KV heads
// replicated when fewer than ranks; multi-head latent attention's compressed cache replicated on
// every rank), o and down projections row-parallel, the LM head split by vocabulary, the
// embedding whole on the first stage; experts either sharded whole across the tensor-parallel
// ranks (expert parallelism, ep = tp) or each sliced like a dense MLP (ep = 1); pipeline stages
// hold contiguous layers, the embedding on the first, the final norm and LM head on the last.
// Buffers mirror CudaBackend::init_runtime with each rank's local sizes, so that for a model the
// engine runs on one device the plan equals what the backend allocates (a test checks this).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/model_shape.h"

namespace hr::engine {

// sizeof(kernels::TokenLogprobs): one sequence's sampled-token log probabilities (the CUDA
// backend checks it).
constexpr int64_t kTokenLogprobsBytes = 168;

struct PlanOptions {
  int tp = 1;  // tensor-parallel ranks per stage
  int pp = 1;  // pipeline stages
  int ep = 1;  // 1: experts sliced across the tp ranks; tp: sharded whole (expert parallelism)
  // Layers of each stage, first to last (empty: as even as they go); see stage_first_layer.
  std::vector<int> stage_layers;
  int64_t gpu_memory_bytes = 80'000'000'000;   // each device's memory
  WeightFormat weights = WeightFormat::kBf16;  // dense matrices as held on the device
  WeightFormat experts = WeightFormat::kBf16;  // routed experts' matrices
  int max_num_tokens = 2048;                   // tokens per step (the worker's GPU default)
  int max_num_seqs = 256;                      // sequences per step
  int block_size = 16;                         // tokens per KV block
  int num_sms = 132;                           // the device's (attention partials; H100 SXM)
  double kv_cache_fraction = 0.9;              // of what is free once the rest is in place
  int64_t context_bytes = 512ll << 20;         // CUDA context and driver, outside allocations
  int64_t graph_bytes = 256ll << 20;           // captured decode graphs of two steps' slots
  // Steps in flight at once with stages (CudaBackendOptions::step_groups; 0: one per stage): each
  // slot beyond two captures its own decode graphs, another half of graph_bytes.
  int step_groups = 0;
  int64_t workspace_bytes = 32ll << 20;  // cuBLASLt's workspace
};

struct RankPlan {
  int stage = 0;
  int tp_rank = 0;
  int64_t first_layer = 0;
  int64_t num_layers = 0;
  int64_t weight_bytes = 0;
  int64_t activation_bytes = 0;  // step buffers: activations, logits, routing, partials
  int64_t workspace_bytes = 0;
  int64_t graph_bytes = 0;
  int64_t context_bytes = 0;
  int64_t free_bytes = 0;      // left once all of the above is in place (negative: no fit)
  int64_t kv_bytes = 0;        // the KV cache's: kv_cache_fraction of free_bytes, graphs left room
  int64_t kv_block_bytes = 0;  // one block of block_size tokens over this rank's layers
  int64_t kv_blocks = 0;       // usable blocks (one more, the scratch block, is padding's)
  int64_t kv_tokens = 0;
};

struct MemoryPlan {
  int tp = 1, pp = 1, ep = 1;
  int64_t parameters = 0;
  int64_t total_weight_bytes = 0;  // all ranks together
  std::vector<RankPlan> ranks;     // stage by stage, tp ranks in order
  int64_t kv_tokens = 0;           // the deployment's: each stage holds its layers' share
  bool fits = false;               // every rank has room for at least two KV blocks
};

// Errors name the option at fault (tensor-parallel, pipeline-parallel, expert-parallel).
[[nodiscard]] Result<MemoryPlan> plan_memory(const ModelShape& shape, const PlanOptions& options);

// Whether options' tp, pp and ep fit the model: heads and KV heads, the MLP's and the experts'
// rows, experts over ep, stages over layers (the rules the plan and the engine's shards share).
// Errors name tensor-parallel, pipeline-parallel or expert-parallel.
[[nodiscard]] Status check_parallel_layout(const ModelShape& shape, const PlanOptions& options);

// The first layer of pipeline stage `stage` (stage == pp: the model's layer count): with
// `stage_layers` empty, contiguous layers as even as they go ([L s / pp, L (s + 1) / pp)); else
// the stages' counts in order (check_parallel_layout checks them).
int stage_first_layer(int num_layers, int pp, const std::vector<int>& stage_layers, int stage);

// The CUDA backend's step buffers on one rank holding `num_layers` layers, with `options`'
// sharding of `shape` (what plan_memory counts as activation_bytes); the logits, the final
// norm's rows and the sampler's log probabilities only on the last pipeline stage.
int64_t step_buffer_bytes(const ModelShape& shape, const PlanOptions& options, int64_t num_layers,
                          bool last_stage = true);

}  // namespace hr::engine
