// Tensor parallelism on the CUDA backend (docs/parallel-engine.md): one engine of N ranks, each a
// CudaBackend holding its shard of the weights (weight_shard.h: its heads, MLP and experts' rows
// and LM head slice) and the KV cache of its KV heads, each driven by a thread of its own
// (rank_threads.h). Two forms, by the devices named:
// - one GPU per rank (distinct devices): the ranks' collectives over NCCL (nccl_communicator.h),
//   each rank on its own stream, running at once, its decode steps captured in CUDA graphs with
//   the NCCL calls inside;
// - virtual ranks, all on one device (the same device named N times): the same kernels and
//   collectives, the peers' buffers being buffers of the same device (virtual_ranks.h), so one GPU,
//   or the CPU stand-in for the CUDA runtime, checks a tensor-parallel engine against one rank.
//   The threads take turns on the one stream they share: a rank enqueues its kernels up to a
//   collective and hands on; the last to arrive enqueues the collective over every rank's
//   buffers. A decode step is one CUDA graph holding every rank's kernels and the collectives.
// Every rank samples the same token from the same gathered logits; collect() checks that they did.
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/cuda_backend.h"
#include "engine/device_communicator.h"
#include "engine/rank_threads.h"
#include "engine/weight_shard.h"

namespace hr::engine {

class ParallelCudaBackend final : public Backend {
 public:
  // Shards `full` (unpacked) over one rank per entry of `devices` (2 to 8 of them; rank r on
  // devices[r], options.device ignored). options.kv_cache_bytes, when given, is each GPU's, or
  // with virtual ranks all ranks' together (each its share); the fraction is of each GPU's free
  // memory, shared by its ranks. Errors name the option at fault.
  // Experts: sliced over the ranks (expert_parallel 1), or held whole, a share on each rank
  // (expert_parallel = the number of ranks).
  [[nodiscard]] static Result<std::unique_ptr<ParallelCudaBackend>> create(
      const ModelWeights& full, const std::vector<int>& devices, CudaBackendOptions options,
      int expert_parallel = 1);
  // Each rank's shard read from the Hugging Face folder (load_shard: a layer at a time).
  [[nodiscard]] static Result<std::unique_ptr<ParallelCudaBackend>> create_from_dir(
      const std::string& dir, const std::vector<int>& devices, CudaBackendOptions options,
      int expert_parallel = 1);
  ~ParallelCudaBackend() override;

  const char* name() const override { return "cuda"; }
  int vocab_size() const override { return ranks_.front()->vocab_size(); }
  int block_size() const override { return ranks_.front()->block_size(); }
  int num_kv_blocks() const override { return num_blocks_; }
  size_t weight_bytes() const override;    // all ranks'
  size_t kv_cache_bytes() const override;  // all ranks'
  [[nodiscard]] Status forward(const StepInput& in, float* logits) override;
  [[nodiscard]] Status submit(const StepInput& in, const SampleSpec* specs) override;
  [[nodiscard]] Status collect(int32_t* tokens, TokenLogprobs* logprobs) override;
  void discard() override;
  bool pipelined() const override { return true; }
  bool splits_sampling() const override { return true; }
  [[nodiscard]] Status submit_forward(const StepInput& in) override;
  [[nodiscard]] Status submit_sampling(const SampleSpec* specs) override;
  [[nodiscard]] Status warm_up(int max_blocks_per_seq) override;
  int num_ranks() const { return static_cast<int>(ranks_.size()); }
  bool virtual_ranks() const { return threads_.take_turns(); }
  // The decode graphs captured (each holds every rank's step).
  size_t num_graphs() const { return ranks_.back()->num_graphs(); }
  CudaBackend& rank(int r) { return *ranks_[static_cast<size_t>(r)]; }

 private:
  ParallelCudaBackend(const std::vector<int>& devices, bool virtual_ranks);
  // Builds every rank from its shard, given in rank order by `shard(r)`.
  [[nodiscard]] static Result<std::unique_ptr<ParallelCudaBackend>> assemble(
      const std::vector<int>& devices, CudaBackendOptions options,
      const std::function<Result<ModelWeights>(int)>& shard);
  // Runs work(r) for every rank r on its own thread.
  [[nodiscard]] Status on_ranks(const std::function<Status(int)>& work);

  RankThreads threads_;
  std::vector<std::unique_ptr<DeviceCommunicator>> comms_;
  cudaStream_t stream_ = nullptr;  // the virtual ranks' (each GPU's rank has its own)
  std::vector<std::unique_ptr<CudaBackend>> ranks_;
  int num_blocks_ = 0;
  std::vector<int> outstanding_;  // rows of submitted, uncollected steps, oldest first
  int forwarded_rows_ = -1;       // a forwarded step's rows until it is sampled
};

}  // namespace hr::engine
