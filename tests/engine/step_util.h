// A step of one sequence for the backend tests: tokens [from, to) of `ids` (its earlier positions
// cached in blocks 0, 1, ... in order), with the logits of every one of them.
#pragma once

#include <vector>

#include "base/status.h"
#include "engine/backend.h"

namespace hr::engine {

inline Status forward_one_sequence(Backend& b, const std::vector<int32_t>& ids, int from, int to,
                                   std::vector<float>* logits) {
  const int T = to - from;
  std::vector<int32_t> tokens(ids.begin() + from, ids.begin() + to), positions(T), rows(T);
  for (int i = 0; i < T; ++i) {
    positions[static_cast<size_t>(i)] = from + i;
    rows[static_cast<size_t>(i)] = i;
  }
  std::vector<int32_t> seq_start{0, T}, table;
  const int blocks = (to + b.block_size() - 1) / b.block_size();
  for (int i = 0; i < blocks; ++i) table.push_back(i);
  StepInput in;
  in.num_tokens = T;
  in.num_seqs = 1;
  in.token_ids = tokens.data();
  in.positions = positions.data();
  in.seq_start = seq_start.data();
  in.block_table = table.data();
  in.max_blocks_per_seq = blocks;
  in.logits_rows = rows.data();
  in.num_logits = T;
  logits->resize(static_cast<size_t>(T) * b.vocab_size());
  return b.forward(in, logits->data());
}

}  // namespace hr::engine
