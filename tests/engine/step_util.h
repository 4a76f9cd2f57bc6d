// Helpers of the backend tests: a step of one sequence, steps of three, and greedy answers
// through the engine.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/backend.h"
#include "engine/engine.h"
#include "engine/weights.h"

namespace hr::engine {

// A model folder's weights, loaded once per test binary (unpacked; each backend packs or uploads
// its own copy).
inline const ModelWeights& loaded_weights(const std::string& dir) {
  static std::map<std::string, ModelWeights> cache;
  auto it = cache.find(dir);
  if (it == cache.end()) {
    auto w = load_weights(dir);
    EXPECT_TRUE(w.is_ok()) << dir << ": " << w.status().to_string();
    it = cache.emplace(dir, w.is_ok() ? std::move(w).value() : ModelWeights{}).first;
  }
  return it->second;
}

// Tokens [from, to) of `ids` (its earlier positions cached in blocks 0, 1, ... in order), with
// the logits of every one of them.
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

// Three sequences: a prefill of each (lengths 7, 1 and 19, pseudo-random tokens), then
// `decodes` steps of one token each; sequence i's blocks are [i * 8, i * 8 + 8). Every step's
// logits, a row per token.
inline std::vector<std::vector<float>> three_sequences(Backend& b, int decodes) {
  const int vocab = b.vocab_size();
  const std::vector<int> lengths = {7, 1, 19};
  const int S = 3, width = 8;
  std::vector<int32_t> table;
  for (int s = 0; s < S; ++s) {
    for (int j = 0; j < width; ++j) table.push_back(s * width + j);
  }
  std::vector<int> pos(S, 0);
  std::vector<std::vector<float>> out;
  uint32_t next = 11;
  for (int step = 0; step <= decodes; ++step) {
    std::vector<int32_t> ids, positions, starts{0}, rows;
    for (int s = 0; s < S; ++s) {
      const int n = step == 0 ? lengths[static_cast<size_t>(s)] : 1;
      for (int i = 0; i < n; ++i) {
        next = next * 1103515245u + 12345u;
        rows.push_back(static_cast<int32_t>(ids.size()));
        ids.push_back(static_cast<int32_t>((next >> 16) % static_cast<uint32_t>(vocab)));
        positions.push_back(pos[static_cast<size_t>(s)]++);
      }
      starts.push_back(static_cast<int32_t>(ids.size()));
    }
    StepInput in;
    in.num_tokens = static_cast<int>(ids.size());
    in.num_seqs = S;
    in.token_ids = ids.data();
    in.positions = positions.data();
    in.seq_start = starts.data();
    in.block_table = table.data();
    in.max_blocks_per_seq = width;
    in.logits_rows = rows.data();
    in.num_logits = static_cast<int>(rows.size());
    std::vector<float> logits(rows.size() * static_cast<size_t>(vocab));
    Status st = b.forward(in, logits.data());
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    out.push_back(std::move(logits));
  }
  return out;
}

// Steps the engine until it has no work, each step required to succeed (the first failure ends
// the run).
inline void run_to_end(Engine& engine) {
  while (engine.has_work()) {
    auto st = engine.step();
    EXPECT_TRUE(st.is_ok()) << st.status().to_string();
    if (!st.is_ok()) break;
  }
}

// Greedy answers through an engine of `options` over `b`, all prompts in one batch, max_tokens
// each (end-of-sequence ignored).
inline std::vector<std::vector<int32_t>> greedy_answers(
    std::shared_ptr<Backend> b, const std::vector<std::vector<int32_t>>& prompts, int max_tokens,
    const EngineOptions& options, int max_model_len = 256) {
  auto engine = Engine::create(std::move(b), nullptr, max_model_len, options);
  EXPECT_TRUE(engine.is_ok()) << engine.status().to_string();
  if (!engine.is_ok()) return {};
  std::vector<std::vector<int32_t>> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.prompt = prompts[i];
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    r.on_event = [&out, i](const TokenEvent& ev) {
      if (ev.token >= 0) out[i].push_back(ev.token);
    };
    EXPECT_TRUE((*engine)->add(std::move(r)).is_ok());
  }
  run_to_end(**engine);
  return out;
}

}  // namespace hr::engine
