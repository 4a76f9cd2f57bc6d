// Checking a step's inputs.
#include "engine/backend.h"

#include <algorithm>

namespace hr::engine {

Status check_step(const StepInput& in, const StepBounds& b) {
  const int T = in.num_tokens, S = in.num_seqs, L = in.num_logits, W = in.max_blocks_per_seq;
  if (T <= 0) return invalid_argument("empty step");
  if (S <= 0 || S > T) {
    return invalid_argument("a step of " + std::to_string(T) + " tokens cannot hold " +
                            std::to_string(S) + " sequences");
  }
  if (L < 0 || L > T)
    return invalid_argument(std::to_string(L) + " logits rows in a step of " + std::to_string(T));
  if (W <= 0) return invalid_argument("the block table has no columns");
  if (in.seq_start[0] != 0 || in.seq_start[S] != T) {
    return invalid_argument("the sequences' token ranges do not cover the step's tokens");
  }
  const int real = b.real_seqs < 0 ? S : b.real_seqs;
  for (int s = 0; s < S; ++s) {
    const int begin = in.seq_start[s], end = in.seq_start[s + 1];
    if (end < begin)
      return invalid_argument("sequence " + std::to_string(s) + " ends before it starts");
    int last = -1;
    for (int t = begin; t < end; ++t) {
      if (in.fed_rows && in.fed_rows[t] >= 0) {
        if (in.fed_rows[t] >= b.prev_num_logits) {
          return invalid_argument("fed row " + std::to_string(in.fed_rows[t]) +
                                  " is not a row of the previous step");
        }
      } else if (in.token_ids[t] < 0 || in.token_ids[t] >= b.vocab_size) {
        return invalid_argument("token id " + std::to_string(in.token_ids[t]) + " is out of range");
      }
      if (in.positions[t] < 0 || in.positions[t] / b.block_size >= W) {
        return invalid_argument("position " + std::to_string(in.positions[t]) +
                                " is outside the block table");
      }
      last = std::max(last, in.positions[t]);
    }
    const int32_t* row = in.block_table + static_cast<size_t>(s) * W;
    for (int col = 0; last >= 0 && col <= last / b.block_size; ++col) {
      const int block = row[col];
      if (block < 0 || (s < real ? block >= b.num_blocks : block != b.num_blocks)) {
        return invalid_argument("block " + std::to_string(block) + " is outside the KV cache");
      }
    }
  }
  for (int i = 0; i < L; ++i) {
    if (in.logits_rows[i] < 0 || in.logits_rows[i] >= T)
      return invalid_argument("logits row out of range");
  }
  return Status::ok();
}

Status Backend::submit(const StepInput& in, const SampleSpec* specs) {
  if (in.num_logits > 0 && specs == nullptr)
    return invalid_argument("no sampling specs for the logits rows");
  HR_RETURN_IF_ERROR(submit_forward(in));
  return submit_sampling(specs);
}

Status Backend::submit_forward(const StepInput&) {
  return internal_error(std::string("the ") + name() + " backend does not split its steps");
}

Status Backend::submit_sampling(const SampleSpec*) {
  return internal_error(std::string("the ") + name() + " backend does not split its steps");
}

}  // namespace hr::engine
