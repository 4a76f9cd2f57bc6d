// Tensor, expert and pipeline parallelism on the CPU backend (docs/parallel-engine.md): one engine
// of tp x pp ranks, each a CpuBackend holding its shard of the weights (weight_shard.h) and the KV
// cache of its layers and heads, each driven by its own thread. The ranks of a stage meet in a
// ThreadCommunicator (all-reduces of the o and down projections' partial sums, the gathered
// logits); the stages hand their hidden rows on point to point. A step is cut into micro-batches
// (contiguous token ranges, a sequence's later tokens after its earlier ones), so that while
// stage s runs micro-batch m, stage s - 1 runs m + 1 and no stage waits for the whole step. Steps
// queue: submit() hands a step to the ranks and returns, each rank taking the queued steps in
// order, so with a step of other sequences for each stage in flight (step_groups) every stage
// has work while the host samples. The first tensor-parallel rank of the last stage writes the
// logits; sampling is on the host, once (every rank would sample the same token from the same
// gathered logits), when the step is collected. This is the reference the GPU ranks are checked
// against, and the CPU worker's --tensor-parallel / --pipeline-parallel.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/cpu_backend.h"
#include "engine/micro_batches.h"
#include "engine/stage_balance.h"
#include "engine/stage_calibration.h"
#include "engine/thread_communicator.h"
#include "engine/weight_shard.h"

namespace hr::engine {

struct ParallelCpuOptions {
  ParallelDegrees degrees;
  int block_size = 16;
  size_t kv_cache_bytes = 64ull << 20;  // all ranks' caches together
  int num_threads = 0;                  // all ranks' compute threads together; 0: one per core
  int thread_nice = 0;
  bool pipelined = false;  // as CpuBackendOptions::pipelined
  int micro_batches = 0;   // a step's micro-batches with pipeline stages; 0: one per stage
  // Steps of disjoint sequences in flight (Backend::step_groups); 0: one per stage. A step
  // submitted while others are in flight is cut into micro-batches only where each has at least
  // kGroupMicroBatchTokens tokens (a decode step of one group goes whole: the other groups'
  // steps fill the stages); one alone is cut as micro_batches says.
  int step_groups = 0;
  // With pipeline stages and no stage_layers in the degrees: before the backend is handed out,
  // calibration steps time every layer and the ends, and layers move between stages so that the
  // slowest stage is as fast as it can be (stage_balance.h). A part's cost is its time per
  // output token of decode steps of `balance_batch` sequences (after `balance_context` tokens
  // each) plus `balance_prompt_ratio` times its time per prompt token of prefill steps: the
  // stages balanced for work of that many prompt tokens per output token.
  bool balance_stages = false;
  int balance_batch = 8;
  int balance_context = 16;
  double balance_prompt_ratio = 1.0;
};

class ParallelCpuBackend final : public Backend {
 public:
  static constexpr int kGroupMicroBatchTokens = 32;
  // Shards `full` (unpacked) for every rank; errors name the option at fault.
  [[nodiscard]] static Result<std::unique_ptr<ParallelCpuBackend>> create(
      const ModelWeights& full, ParallelCpuOptions options);
  // Each rank reads its own shard straight from the Hugging Face folder's memory-mapped
  // checkpoint (load_shard: a layer at a time, never the whole model in memory), all ranks at
  // once on threads of their own, and packs it.
  [[nodiscard]] static Result<std::unique_ptr<ParallelCpuBackend>> create_from_dir(
      const std::string& dir, ParallelCpuOptions options, LoadStats* stats = nullptr);
  ~ParallelCpuBackend() override;

  const char* name() const override { return "cpu"; }
  int vocab_size() const override { return vocab_size_; }
  int block_size() const override { return options_.block_size; }
  int num_kv_blocks() const override { return num_blocks_; }
  size_t weight_bytes() const override;    // all ranks'
  size_t kv_cache_bytes() const override;  // all ranks'
  // Only with no step outstanding.
  [[nodiscard]] Status forward(const StepInput& in, float* logits) override;
  bool splits_sampling() const override { return true; }
  [[nodiscard]] Status submit_forward(const StepInput& in) override;
  [[nodiscard]] Status submit_sampling(const SampleSpec* specs) override;
  [[nodiscard]] Status collect(int32_t* tokens, TokenLogprobs* logprobs) override;
  void discard() override;
  bool pipelined() const override { return options_.pipelined; }
  int step_groups() const override { return groups_; }
  // Aborts the ranks' communicators: a step whose ranks wait on one another returns its error;
  // every later step fails with kInternal naming `reason`.
  bool abort(const std::string& reason) override;
  int num_ranks() const { return static_cast<int>(ranks_.size()); }
  // Each stage's layers, first to last.
  std::vector<int> stage_layers() const;
  const StageBalance& stage_balance() const { return balance_; }
  // Runs the calibration's steps (the options' balance_*) through the ranks and returns what
  // each part costs per output token: each layer's time on the stage that holds it (its first
  // tensor-parallel rank's), the embedding's and the LM head's. The KV cache is written (in
  // blocks nothing holds yet: call before serving); one too small for the calibration's
  // sequences fails naming balance-context (create() then leaves the split as it is).
  [[nodiscard]] Result<StageCosts> measure_parts();

 private:
  struct Rank {
    int stage = 0;
    int tp_rank = 0;
    std::shared_ptr<ModelWeights> weights;  // the shard; its layers move when stages rebalance
    std::unique_ptr<CpuBackend> backend;
    Communicator* pipeline = nullptr;  // its pipeline group (rank index = stage)
    std::vector<float> hidden, logits;
    std::thread thread;
  };

  ParallelCpuBackend(ParallelCpuOptions options, int vocab_size, int hidden_size, int num_blocks);
  // The backend over every rank's shard (rank stage * tp + tp_rank at that index).
  [[nodiscard]] static Result<std::unique_ptr<ParallelCpuBackend>> assemble(
      std::vector<ModelWeights> shards, ParallelCpuOptions options);
  // Measures the parts, moves layers between stages if that makes the slowest stage faster, and
  // returns the backend to serve with (this one, or one assembled over the moved layers).
  [[nodiscard]] static Result<std::unique_ptr<ParallelCpuBackend>> balance(
      std::unique_ptr<ParallelCpuBackend> b);
  // Stops the rank threads and hands back every rank's shard (the backend is spent).
  std::vector<ModelWeights> take_shards();
  // Ends the rank threads (after the step in progress, if any).
  void stop_ranks();
  // What measure_parts runs (the options' balance_*).
  StageCalibration calibration() const;
  struct QueuedStep;
  // Queues a step for the ranks (its inputs copied; fed tokens already resolved); `logits` null:
  // into the step's own buffer.
  [[nodiscard]] Status queue(const StepInput& in, float* logits);
  // Waits until every rank is done with `step`; its first error.
  Status wait(QueuedStep* step);
  // Waits for the step and samples it (once).
  Status sample(QueuedStep* step);
  // Drops the oldest queued step.
  void pop();
  void rank_loop(Rank* rank);
  Status run_rank(Rank* rank, QueuedStep* step);

  ParallelCpuOptions options_;
  int vocab_size_, hidden_size_, num_blocks_, groups_;
  std::vector<std::vector<std::unique_ptr<ThreadCommunicator>>> tp_groups_, pp_groups_;
  std::vector<std::unique_ptr<Rank>> ranks_;

  // Queued steps, oldest first; steps_[i] is step first_index_ + i. Pushed and popped by the
  // caller's thread under mu_; a rank reads a step's inputs (and the last stage writes its
  // logits) between taking it and counting itself finished.
  std::deque<std::unique_ptr<QueuedStep>> steps_;
  uint64_t first_index_ = 0;  // guarded by mu_
  std::mutex mu_;
  std::condition_variable start_cv_, done_cv_;
  bool stop_ = false;                 // guarded by mu_
  std::string aborted_;               // abort()'s reason (guarded by mu_); empty: none
  bool forwarded_ = false;            // the newest step waits for its sampling specs
  int last_num_logits_ = 0;           // the newest submitted step's, for its successor's fed rows
  std::vector<int32_t> last_tokens_;  // the newest collected step's tokens
  std::vector<int32_t> fed_ids_;
  StageBalance balance_;
};

}  // namespace hr::engine
