// Cutting a step into contiguous token ranges.
#include "engine/micro_batches.h"

#include <algorithm>

namespace hr::engine {

void split_step(const StepInput& in, int parts, std::vector<MicroBatch>* out) {
  const int T = in.num_tokens;
  const int m = std::max(1, std::min(parts, T));
  out->resize(static_cast<size_t>(m));
  if (m == 1) {  // the step as it is
    MicroBatch& mb = (*out)[0];
    mb.in = in;
    mb.first_token = 0;
    mb.logits_index.resize(static_cast<size_t>(std::max(0, in.num_logits)));
    for (size_t i = 0; i < mb.logits_index.size(); ++i) mb.logits_index[i] = static_cast<int>(i);
    return;
  }
  int s = 0;  // the sequence of the micro-batch's first token
  for (int k = 0; k < m; ++k) {
    const int a = static_cast<int>(static_cast<int64_t>(T) * k / m);
    const int b = static_cast<int>(static_cast<int64_t>(T) * (k + 1) / m);
    MicroBatch& mb = (*out)[static_cast<size_t>(k)];
    while (in.seq_start[s + 1] <= a) ++s;
    mb.seq_start.clear();
    for (int q = s; q < in.num_seqs && in.seq_start[q] < b; ++q) {
      mb.seq_start.push_back(std::max(in.seq_start[q], a) - a);
    }
    mb.seq_start.push_back(b - a);
    mb.logits_rows.clear();
    mb.logits_index.clear();
    for (int i = 0; i < in.num_logits; ++i) {
      const int row = in.logits_rows[i];
      if (row >= a && row < b) {
        mb.logits_rows.push_back(row - a);
        mb.logits_index.push_back(i);
      }
    }
    mb.first_token = a;
    mb.in = in;
    mb.in.num_tokens = b - a;
    mb.in.num_seqs = static_cast<int>(mb.seq_start.size()) - 1;
    mb.in.token_ids = in.token_ids + a;
    mb.in.positions = in.positions + a;
    mb.in.seq_start = mb.seq_start.data();
    mb.in.block_table = in.block_table + static_cast<size_t>(s) * in.max_blocks_per_seq;
    mb.in.logits_rows = mb.logits_rows.data();
    mb.in.num_logits = static_cast<int>(mb.logits_rows.size());
    mb.in.fed_rows = in.fed_rows ? in.fed_rows + a : nullptr;
  }
}

}  // namespace hr::engine
