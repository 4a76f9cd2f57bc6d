// Which part of a model one rank of a parallel engine holds (docs/parallel-engine.md), and the
// slicing of full weights into that part. Megatron sharding, as engine/memory_plan.h counts it:
// attention column-parallel by heads (each rank's q heads, and the KV heads they read: a share of
// them, or the one its heads share when there are fewer KV heads than ranks), the o and down
// projections row-parallel (each rank's partial sums are all-reduced), the dense MLP split by its
// intermediate rows, experts either sharded whole across the tensor-parallel ranks (expert
// parallelism, ep = tp) or each sliced like the dense MLP (ep = 1), the router, norms and the
// embedding replicated, and the LM head split by vocabulary (ceil(V / tp) rows a rank, the last
// rank's fewer). Pipeline stages hold contiguous layers (as even as they go, or as many as the
// degrees say): the embedding on the first, the final norm and the LM head on the last.
#pragma once

#include <vector>

#include "base/status.h"
#include "engine/weights.h"

namespace hr::engine {

// The deployment's degrees: tensor-parallel ranks per stage, pipeline stages, and expert
// parallelism (1: experts sliced; tp: experts whole, a share on each rank).
struct ParallelDegrees {
  ParallelDegrees() = default;
  ParallelDegrees(int tp_ranks, int stages, int experts, std::vector<int> layers = {})
      : tp(tp_ranks), pp(stages), ep(experts), stage_layers(std::move(layers)) {}
  int tp = 1;
  int pp = 1;
  int ep = 1;
  // Layers of each stage, first to last; empty: as even as they go (stage_balance.h chooses
  // them by measured time).
  std::vector<int> stage_layers;
};

// What loading every rank's shard took (a parallel backend's create_from_dir).
struct LoadStats {
  double seconds = 0;           // reading, converting and placing every rank's shard
  size_t checkpoint_bytes = 0;  // the checkpoint's tensors
  size_t shard_bytes = 0;       // all ranks' weights as held (fp32 on the CPU, bf16 on a GPU)
};

// Checks the degrees against the model; errors name the option at fault (tensor-parallel,
// pipeline-parallel, expert-parallel).
[[nodiscard]] Status check_degrees(const ModelConfig& c, const ParallelDegrees& d);

// The slice of `full` that rank (stage, tp_rank) holds: per-layer tensors of its layers only,
// with its heads', rows' and experts' slices (ModelWeights::shard says which); the embedding only
// on the first stage (unpacked), the final norm and an untied LM head slice only on the last.
// Unpacked `full` weights only. Errors as check_degrees.
[[nodiscard]] Result<ModelWeights> shard_weights(const ModelWeights& full, const ParallelDegrees& d,
                                                 int stage, int tp_rank);

// The model as tensor-parallel rank `s` computes it: its q heads, KV heads, MLP and experts'
// rows in place of the whole model's; an LM head apart from the embedding (the rank's slice of
// it). Everything else is the model's.
ModelConfig rank_config(const ModelConfig& c, const WeightShard& s);

// The same part read from a checkpoint's memory-mapped files (SafetensorsModel), a layer at a
// time: the rank's memory holds its shard and one whole layer at most, never the whole model.
// Equal to shard_weights(load_weights(dir), ...).
[[nodiscard]] Result<ModelWeights> load_shard(const SafetensorsModel& st, const ModelConfig& c,
                                              const ParallelDegrees& d, int stage, int tp_rank);

}  // namespace hr::engine
