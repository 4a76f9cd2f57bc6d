// The compute backend interface, shaped for GPUs: weights and the paged KV cache live in backend
// memory; one forward() runs the whole flattened batch (every sequence's new tokens: prefill
// chunks and decodes together) through batched GEMMs, and attention reads K/V through block
// tables. The scheduler and block manager never touch backend memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/status.h"
#include "engine/sampler.h"

namespace hr::engine {

// One step's inputs, in host memory. Tokens of one sequence are contiguous, in position order.
struct StepInput {
  int num_tokens = 0;
  int num_seqs = 0;
  const int32_t* token_ids = nullptr;  // [num_tokens]
  const int32_t* positions = nullptr;  // [num_tokens]
  const int32_t* seq_start = nullptr;  // [num_seqs + 1]: token rows of sequence s
  // [num_seqs, max_blocks_per_seq]: each row at least as wide as its sequence's blocks; the
  // engine makes them as wide as the step's longest sequence needs, not the longest it allows.
  const int32_t* block_table = nullptr;
  int max_blocks_per_seq = 0;
  const int32_t* logits_rows = nullptr;  // [num_logits]: token rows whose logits are wanted
  int num_logits = 0;
  // Tokens the host has not seen yet (submit() only; null: none): for each token row, -1 to take
  // token_ids[row], or the logits row of the previously submitted step whose sampled token goes
  // there. This is how a pipelined engine plans step N+1 while step N still runs.
  const int32_t* fed_rows = nullptr;  // [num_tokens] or null
};

// What a backend accepts in a step (check_step below).
struct StepBounds {
  int vocab_size = 0;
  int block_size = 0;
  int num_blocks = 0;       // block ids in [0, num_blocks)
  int prev_num_logits = 0;  // fed rows name rows in [0, prev_num_logits)
  // Sequences from this one on are padding: their blocks must all be num_blocks (a scratch block
  // past the cache). -1: every sequence is real.
  int real_seqs = -1;
};

// Checks a step's inputs before anything reads memory through them: the sequences' token ranges,
// token ids (or fed rows), positions within the block table, every block that a sequence's
// attention reads (each column up to its last position, not only those written) and the logits
// rows. kInvalidArgument saying what is wrong.
[[nodiscard]] Status check_step(const StepInput& in, const StepBounds& bounds);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual const char* name() const = 0;
  virtual int vocab_size() const = 0;
  virtual int block_size() const = 0;
  virtual int num_kv_blocks() const = 0;
  virtual size_t weight_bytes() const = 0;
  virtual size_t kv_cache_bytes() const = 0;
  // Writes the new tokens' K/V into their cache slots, runs the model, and writes
  // logits [num_logits, vocab] to `logits` (host memory). Takes no fed rows.
  [[nodiscard]] virtual Status forward(const StepInput& in, float* logits) = 0;
  // The step as forward(), then one token per logits row sampled by specs[row] (on the device
  // where there is one, so that only token ids come back). The step may still be running when
  // this returns; collect() gives its tokens. Steps complete in submission order, and at most two
  // are outstanding (or step_groups(), where that is more): submit one more only after
  // collecting the oldest. Steps run in submission order on every stage, so a step may read the
  // K/V that one still outstanding writes (a prompt's next chunk after the chunk before). A
  // failed submit leaves nothing outstanding that was not before. By default the step goes in
  // its two halves, submit_forward(in) then submit_sampling(specs) (backends that split, below).
  [[nodiscard]] virtual Status submit(const StepInput& in, const SampleSpec* specs);
  // Waits for the oldest outstanding step and writes its num_logits tokens to `tokens` (host),
  // and, when `logprobs` is not null, to logprobs[row] the log probabilities of each row whose
  // spec asked for them (SampleSpec::logprobs >= 0; other rows are left as they are).
  [[nodiscard]] virtual Status collect(int32_t* tokens, TokenLogprobs* logprobs) = 0;
  // Forgets every outstanding step (after a failure), waiting for the device to finish them.
  virtual void discard() = 0;
  // True when submit() returns before the step's work is done, so that the engine can plan the
  // next step meanwhile.
  virtual bool pipelined() const { return false; }
  // How many steps the backend runs at once (its pipeline's stages: while one step is in stage
  // s, the next is in stage s - 1). Above 1, an engine that pipelines keeps that many
  // outstanding (more than two, then, may be), each sampling other sequences than the others in
  // flight, whose tokens the host knows (no fed rows): a sequence that samples is planned again
  // only once its step was collected (a long prompt's next chunk, which samples nothing, may go
  // in the next step at once). 1: one step after another, the next fed from the one before
  // (pipelined()).
  virtual int step_groups() const { return 1; }
  // A step submitted in two halves (structured output's overlap, docs/structured-output.md): its
  // forward pass at once, its sampling once the host knows the specs, which may need the tokens
  // of the step before (a constrained row's mask). submit_forward(in) is submit() without the
  // sampling; submit_sampling(specs) completes that step (specs for its logits rows; `in`'s
  // arrays are read again meanwhile, so they stay as they were until then). Between the two, the
  // step before may be collected. Only backends where splits_sampling() is true take them.
  virtual bool splits_sampling() const { return false; }
  [[nodiscard]] virtual Status submit_forward(const StepInput& in);
  [[nodiscard]] virtual Status submit_sampling(const SampleSpec* specs);

  // Prepares what steps with block tables up to `max_blocks_per_seq` wide will need (the CUDA
  // backend's decode graphs), before serving. Only with no step outstanding.
  [[nodiscard]] virtual Status warm_up(int max_blocks_per_seq) { return Status::ok(); }

  // From any thread, while a step may be blocked in this backend (a rank waiting in a collective
  // for a peer that never comes, docs/parallel-engine.md "When a rank stops"): ends the ranks'
  // waits (their communicators aborted: NCCL's ncclCommAbort), so that the blocked call returns
  // an error. The backend is lost: every later step fails with kInternal naming `reason`. False
  // when it cannot end a blocked wait (one device: nothing waits on a peer; or communicators that
  // end their own waits, as peer kernels do at their timeout): then it is left as it is.
  virtual bool abort(const std::string& reason) { return false; }

  // submit() then collect().
  [[nodiscard]] Status forward_sample(const StepInput& in, const SampleSpec* specs,
                                      int32_t* tokens) {
    HR_RETURN_IF_ERROR(submit(in, specs));
    return collect(tokens, nullptr);
  }
};

}  // namespace hr::engine
