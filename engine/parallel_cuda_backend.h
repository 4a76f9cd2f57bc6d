// Tensor, expert and pipeline parallelism on the CUDA backend (docs/parallel-engine.md): one
// engine of tp x pp ranks, each a CudaBackend holding its shard of the weights (weight_shard.h:
// its stage's layers, and of those its heads, MLP and experts' rows; the embedding on the first
// stage, its LM head slice on the last) and the KV cache of its layers' KV heads, each driven by
// a thread of its own (rank_threads.h). Rank (stage s, tensor-parallel index t) is s * tp + t.
// The ranks of a stage meet in a DeviceCommunicator for their all-reduces and the gathered
// logits; rank t of each stage hands the residual stream of its step's rows on to rank t of the
// next, point to point, and the last stage, which samples, hands the tokens back to the first
// (whose next step's fed rows read them). Two forms, by the devices named:
// - one GPU per rank (distinct devices): the collectives and hand-offs over NCCL
//   (nccl_communicator.h) or over peer pointers (peer_communicator.h, options.rank_collectives),
//   each rank on its own stream, all running at once, a stage's decode steps captured in CUDA
//   graphs with the collectives inside;
// - virtual ranks, all on one device (the same device named for every rank): the same kernels
//   and collectives, the peers' buffers being buffers of the same device (virtual_ranks.h), so
//   one GPU, or the CPU stand-in for the CUDA runtime, checks a parallel engine against one rank.
//   The stages run one after another on the one stream they share; a stage's threads take turns:
//   a rank enqueues its kernels up to a collective and hands on, and the last to arrive enqueues
//   the collective over every rank's buffers. A stage's decode step is one CUDA graph holding
//   every rank's kernels and the collectives; the hand-offs between stages are copies between
//   the graphs.
// With a GPU a rank and pipeline stages, the engine keeps a step of other sequences in flight
// for each stage (step_groups(); options.step_groups): each rank's stream takes the steps in
// order, so stage s runs one group's step while stage s - 1 runs the next group's, and the last
// stage's tokens stay there (no step is fed from another). A step submitted with no other in
// flight and of enough tokens (options.micro_batch_tokens a part) is cut into micro-batches
// (micro_batches.h; options.micro_batches, one per stage by default), each rank submitting them in
// order (CudaBackend::submit_part) and handing each on as it is done, so that with a GPU a stage,
// stage s runs micro-batch m while stage s - 1 runs m + 1; smaller steps, forward() and the split
// step go whole. Every rank of the last stage samples the same token from the same gathered
// logits; collect() checks that they did.
#pragma once

#include <cuda_runtime.h>

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/cuda_backend.h"
#include "engine/device_communicator.h"
#include "engine/micro_batches.h"
#include "engine/rank_threads.h"
#include "engine/stage_balance.h"
#include "engine/stage_calibration.h"
#include "engine/weight_shard.h"

namespace hr::engine {

class ParallelCudaBackend final : public Backend {
 public:
  // Shards `full` (unpacked) over the degrees' tp x pp ranks (1 to 8 of each, 2 ranks or more),
  // one per entry of `devices` (rank r on devices[r], options.device ignored). The degrees' ep:
  // experts sliced over a stage's ranks (1), or held whole, a share on each (tp); stage_layers
  // as weight_shard.h (empty: as even as they go). options.kv_cache_bytes, when given, is each
  // GPU's, or with virtual ranks all ranks' together (each its share); the fraction is of each
  // GPU's free memory, shared by its ranks. Errors name the option at fault.
  // With `balance`, pipeline stages and no stage_layers in the degrees: before the backend is
  // handed out, calibration steps time every layer and the ends on the GPUs
  // (stage_calibration.h), and when another split makes the slowest stage faster (by over 5%)
  // the backend is built again over it (stage_balance()).
  [[nodiscard]] static Result<std::unique_ptr<ParallelCudaBackend>> create(
      const ModelWeights& full, const std::vector<int>& devices, CudaBackendOptions options,
      const ParallelDegrees& degrees, const StageCalibration* balance = nullptr);
  // Tensor parallelism alone: a rank per device.
  [[nodiscard]] static Result<std::unique_ptr<ParallelCudaBackend>> create(
      const ModelWeights& full, const std::vector<int>& devices, CudaBackendOptions options,
      int expert_parallel = 1) {
    return create(full, devices, options,
                  ParallelDegrees(static_cast<int>(devices.size()), 1, expert_parallel));
  }
  // Each rank's shard read from the Hugging Face folder (load_shard: a layer at a time).
  // With a GPU a rank, every rank reads and uploads its shard at once, on its own thread.
  // Balancing (as create()) reads the moved shards again; `stats` are the last load's.
  [[nodiscard]] static Result<std::unique_ptr<ParallelCudaBackend>> create_from_dir(
      const std::string& dir, const std::vector<int>& devices, CudaBackendOptions options,
      const ParallelDegrees& degrees, LoadStats* stats = nullptr,
      const StageCalibration* balance = nullptr);
  [[nodiscard]] static Result<std::unique_ptr<ParallelCudaBackend>> create_from_dir(
      const std::string& dir, const std::vector<int>& devices, CudaBackendOptions options,
      int expert_parallel = 1) {
    return create_from_dir(dir, devices, options,
                           ParallelDegrees(static_cast<int>(devices.size()), 1, expert_parallel));
  }
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
  int step_groups() const override { return groups_; }
  bool splits_sampling() const override { return true; }
  [[nodiscard]] Status submit_forward(const StepInput& in) override;
  [[nodiscard]] Status submit_sampling(const SampleSpec* specs) override;
  [[nodiscard]] Status warm_up(int max_blocks_per_seq) override;
  // Aborts every rank's communicators that can be (NCCL's), so that a step waiting on a peer
  // that never comes returns; the backend is lost afterwards (kInternal). False when none could
  // (virtual ranks; peer ranks, whose kernels trap at their own timeout).
  bool abort(const std::string& reason) override;
  int num_ranks() const { return static_cast<int>(ranks_.size()); }
  int num_stages() const { return pp_; }
  bool virtual_ranks() const { return virtual_; }
  // The decode graphs captured (with virtual ranks, each holds every rank of a stage's step).
  size_t num_graphs() const;
  // The micro-batches a step of enough tokens is cut into (1: every step whole), and how many of
  // the steps submitted were cut.
  int micro_batches() const { return parts_; }
  // Each stage's layers, and what balancing them found (ran: false when it did not run).
  std::vector<int> stage_layers() const;
  const StageBalance& stage_balance() const { return balance_; }
  int64_t steps_cut() const { return steps_cut_; }
  CudaBackend& rank(int r) { return *ranks_[static_cast<size_t>(r)]; }

 private:
  ParallelCudaBackend(const std::vector<int>& devices, bool virtual_ranks, int tp, int pp);
  // `b` measured and, if another split makes its slowest stage faster, built again over it by
  // `build` (the ranks' memory freed first).
  using Build = std::function<Result<std::unique_ptr<ParallelCudaBackend>>(const ParallelDegrees&)>;
  [[nodiscard]] static Result<std::unique_ptr<ParallelCudaBackend>> balanced(
      std::unique_ptr<ParallelCudaBackend> b, const StageCalibration& c, ParallelDegrees degrees,
      const Build& build);
  // Builds every rank from its shard, given by `shard(stage, tp_rank)`.
  [[nodiscard]] static Result<std::unique_ptr<ParallelCudaBackend>> assemble(
      const std::vector<int>& devices, CudaBackendOptions options, const ParallelDegrees& degrees,
      const std::function<Result<ModelWeights>(int, int)>& shard);
  // The pipeline groups of virtual ranks (again after a failed step: no message left over).
  void make_virtual_pipes();
  // Runs work(r) for every rank r on its own thread: virtual ranks a stage after another, the
  // ranks of one GPU each all at once.
  [[nodiscard]] Status on_ranks(const std::function<Status(int)>& work);
  // The checks a rank would make before enqueueing, made once, so that no rank stops alone and
  // leaves its peers waiting in a collective or a hand-off.
  [[nodiscard]] Status check(const StepInput& in) const;
  // kInternal once the ranks cannot step together any more (aborted, or a step failed part-way
  // on one GPU a rank).
  [[nodiscard]] Status lost() const;
  // Rank r's part of a step: the hidden rows from the stage before, `call` (the rank's own
  // submit, forward...), the rows on to the stage after; `sampled`: the last stage's tokens
  // back to the first.
  [[nodiscard]] Status stage_step(int r, const CudaBackend::StepRows& rows, bool sampled,
                                  const std::function<Status(CudaBackend&)>& call);
  // Rank r's part of handing the tokens the last stage sampled back to the first stage (the
  // last stage sends; over NCCL the first receives here too).
  [[nodiscard]] Status hand_back_tokens(int r, const CudaBackend::StepRows& rows);
  // Virtual ranks: the first stage's ranks receive the tokens, after every stage_step.
  [[nodiscard]] Status receive_tokens(const CudaBackend::StepRows& rows);
  // After a step that failed part-way: the ranks' queued work finished, the hand-offs cleared.
  void fail_step();
  // submit() of a step cut into micro_ (split_step), its specs per part in part_specs_.
  [[nodiscard]] Status submit_parts(const StepInput& in);
  // Rank r's micro-batch m: its hidden rows from the stage before, its submit, its rows on.
  [[nodiscard]] Status stage_part(int r, int m, int step_logits);

  const int tp_, pp_;
  const bool virtual_;
  // Virtual ranks: a stage's threads each (taking turns); one GPU a rank: every rank's.
  std::vector<std::unique_ptr<RankThreads>> threads_;
  std::vector<std::unique_ptr<DeviceCommunicator>> comms_;  // rank r's stage group; none at tp 1
  std::vector<std::unique_ptr<DeviceCommunicator>> pipes_;  // rank r's pipeline; none at pp 1
  cudaStream_t stream_ = nullptr;  // the virtual ranks' (each GPU's rank has its own)
  std::vector<std::unique_ptr<CudaBackend>> ranks_;
  int num_blocks_ = 0;
  int check_rank_ = 0;   // a rank of the fewest KV blocks: check() asks it
  bool broken_ = false;  // a GPU a rank, after a step failed part-way
  // abort()'s, from any thread: aborts one at a time (abort_mu_); aborted_ set before the
  // communicators are walked, the reason before it (reason_mu_, which lost() takes: not held
  // while an abort may hang).
  std::mutex abort_mu_;
  mutable std::mutex reason_mu_;
  std::atomic<bool> aborted_{false};
  std::string abort_reason_;  // guarded by reason_mu_
  StageBalance balance_;
  int hidden_size_ = 0;
  int groups_ = 1;       // steps of disjoint sequences in flight (step_groups())
  int parts_ = 1;        // micro-batches a step of enough tokens is cut into
  int part_tokens_ = 0;  // ... enough: this many a part
  int64_t steps_cut_ = 0;
  std::vector<MicroBatch> micro_;                    // the step being cut
  std::vector<std::vector<SampleSpec>> part_specs_;  // ... each part's specs
  // A submitted, uncollected step: its logits rows, and when it was cut, each part's rows in the
  // step's logits (MicroBatch::logits_index).
  struct Submitted {
    int logits = 0;
    std::vector<std::vector<int>> parts;
  };
  std::vector<Submitted> outstanding_;        // oldest first
  int forwarded_rows_ = -1;                   // a forwarded step's rows until it is sampled
  CudaBackend::StepRows forwarded_step_;      // ... and the rows its ranks enqueued
  std::vector<float> scratch_logits_;         // the other ranks' forward() logits
  std::vector<int32_t> scratch_tokens_;       // the other ranks' collected tokens
  std::vector<int32_t> part_tokens_out_;      // a part's tokens, collected
  std::vector<TokenLogprobs> part_logprobs_;  // ... and its log probabilities
};

}  // namespace hr::engine
