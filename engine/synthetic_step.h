// A step made up for measuring a backend rather than serving: `num_seqs` sequences, each with
// `count` new tokens at positions [first_pos, first_pos + count) and logits for its last, over
// blocks of their own (sequence q holds blocks first_block + [q * blocks_per_seq,
// (q + 1) * blocks_per_seq)).
// Used before serving (the pipeline stages' balancing) and by benchmarks: the blocks it writes
// are ones nothing holds yet.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend.h"

namespace hr::engine {

class SyntheticStep {
 public:
  SyntheticStep(int num_seqs, int first_pos, int count, int blocks_per_seq, int vocab_size,
                int first_block = 0);
  const StepInput& input() const { return in_; }
  // Blocks each sequence needs for positions [0, last_pos].
  static int blocks_for(int last_pos, int block_size) { return last_pos / block_size + 1; }

 private:
  std::vector<int32_t> tokens_, positions_, seq_start_, blocks_, logits_rows_;
  StepInput in_;
};

}  // namespace hr::engine
