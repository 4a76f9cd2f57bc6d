// Pseudo-random token ids and the block table of a made-up step.
#include "engine/synthetic_step.h"

namespace hr::engine {

SyntheticStep::SyntheticStep(int num_seqs, int first_pos, int count, int blocks_per_seq,
                             int vocab_size, int first_block) {
  seq_start_.push_back(0);
  for (int q = 0; q < num_seqs; ++q) {
    for (int p = first_pos; p < first_pos + count; ++p) {
      tokens_.push_back(static_cast<int32_t>((q * 131 + p * 7 + 3) % vocab_size));
      positions_.push_back(p);
    }
    seq_start_.push_back(static_cast<int32_t>(tokens_.size()));
    logits_rows_.push_back(static_cast<int32_t>(tokens_.size()) - 1);
  }
  blocks_.resize(static_cast<size_t>(num_seqs) * blocks_per_seq);
  for (size_t i = 0; i < blocks_.size(); ++i) blocks_[i] = static_cast<int32_t>(first_block + i);
  in_.num_tokens = static_cast<int>(tokens_.size());
  in_.num_seqs = num_seqs;
  in_.token_ids = tokens_.data();
  in_.positions = positions_.data();
  in_.seq_start = seq_start_.data();
  in_.block_table = blocks_.data();
  in_.max_blocks_per_seq = blocks_per_seq;
  in_.logits_rows = logits_rows_.data();
  in_.num_logits = num_seqs;
}

}  // namespace hr::engine
