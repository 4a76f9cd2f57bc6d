// Shared by the engine benchmark drivers: a batch of requests run to completion through an
// Engine over a given backend, timing its prefill and decode steps apart.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <functional>
#include <memory>
#include <random>

#include "engine/engine.h"

namespace hr::bench {

struct DecodeResult {
  double decode_tok_s = 0;
  double prefill_tok_s = 0;
};

// Runs `batch` requests of `prompt_len` seeded random tokens (ids below 250) and `gen_len`
// generated tokens each to completion on `backend`. `between_steps`, when set, runs after every
// `steps_per_call` decode steps, outside the timed steps.
inline DecodeResult run_requests(std::shared_ptr<engine::Backend> backend, int max_positions,
                                 int batch, int prompt_len, int gen_len,
                                 const std::function<void()>& between_steps = nullptr,
                                 int steps_per_call = 16) {
  using Clock = std::chrono::steady_clock;
  engine::EngineOptions o;
  o.scheduler = {std::max(batch, 1), std::max(2048, batch * prompt_len), 2048};
  auto engine = engine::Engine::create(std::move(backend), nullptr, max_positions, o).value();
  std::mt19937 rng(1);
  for (int b = 0; b < batch; ++b) {
    engine::GenerationRequest r;
    for (int i = 0; i < prompt_len; ++i) r.prompt.push_back(static_cast<int32_t>(rng() % 250));
    r.params.max_tokens = gen_len;
    r.params.ignore_eos = true;
    if (!engine->add(std::move(r)).is_ok()) std::abort();
  }
  double prefill_s = 0, decode_s = 0;
  long prefill_tokens = 0, decode_tokens = 0, decode_steps = 0;
  while (engine->has_work()) {
    auto t0 = Clock::now();
    auto st = engine->step().value();
    double s = std::chrono::duration<double>(Clock::now() - t0).count();
    if (st.num_prefill_tokens > 0) {
      prefill_s += s;
      prefill_tokens += st.num_prefill_tokens;
    } else {
      decode_s += s;
      decode_tokens += st.num_decode_tokens;
      if (between_steps && ++decode_steps % steps_per_call == 0) between_steps();
    }
  }
  return {decode_tokens / decode_s, prefill_tokens / prefill_s};
}

}  // namespace hr::bench
