// The compute backend interface, shaped for GPUs: weights and the paged KV cache live in backend
// memory; one forward() runs the whole flattened batch (every sequence's new tokens: prefill
// chunks and decodes together) through batched GEMMs, and attention reads K/V through block
// tables. The scheduler and block manager never touch backend memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/status.h"

namespace hr::engine {

// One step's inputs, in host memory. Tokens of one sequence are contiguous, in position order.
struct StepInput {
  int num_tokens = 0;
  int num_seqs = 0;
  const int32_t* token_ids = nullptr;    // [num_tokens]
  const int32_t* positions = nullptr;    // [num_tokens]
  const int32_t* seq_start = nullptr;    // [num_seqs + 1]: token rows of sequence s
  const int32_t* block_table = nullptr;  // [num_seqs, max_blocks_per_seq]
  int max_blocks_per_seq = 0;
  const int32_t* logits_rows = nullptr;  // [num_logits]: token rows whose logits are wanted
  int num_logits = 0;
};

// How one logits row is sampled on the device (backends that sample there): the sampler's
// parameters and 64 bits drawn from the sequence's generator for this step.
struct SampleSpec {
  float temperature = 0.0f;  // <= 0: greedy
  float top_p = 1.0f;
  int top_k = 0;
  uint64_t random = 0;
};

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
  // logits [num_logits, vocab] to `logits` (host memory).
  [[nodiscard]] virtual Status forward(const StepInput& in, float* logits) = 0;
  // Backends that sample on the device (so only token ids come back) say so here and implement
  // forward_sample: the step as forward(), then one token per logits row into `tokens` (host).
  virtual bool samples_on_device() const { return false; }
  [[nodiscard]] virtual Status forward_sample(const StepInput& in, const SampleSpec* specs,
                                              int32_t* tokens) {
    return internal_error(std::string(name()) + " backend does not sample on the device");
  }
};

}  // namespace hr::engine
