// A backend whose steps run to completion on the host: submit() resolves fed tokens, runs
// forward() (submit_forward) and samples each logits row on the host (submit_sampling)
// (apply_penalties, the token mask, sample_token, and token_logprobs where asked); collect() hands
// the tokens back in order. The CPU backend and the CPU parallel engine share it.
#pragma once

#include <deque>
#include <vector>

#include "engine/backend.h"

namespace hr::engine {

// A step's tokens sampled on the host, and their log probabilities where asked for (-1 in
// `asked`: not).
struct HostSampled {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
  std::vector<int> asked;
};

// Samples `rows` logits rows of `vocab` (changed in place: penalties, biases, the token mask)
// by specs[row], row_inputs[row] being the row's input token (for the penalties).
HostSampled sample_on_host(float* logits, int vocab, int rows, const SampleSpec* specs,
                           const int32_t* row_inputs);

// `in`'s token ids with each fed row's token taken from `previous` (the step before's sampled
// tokens) into `ids`; an error for a fed row that is not one of them.
[[nodiscard]] Status resolve_fed_tokens(const StepInput& in, const std::vector<int32_t>& previous,
                                        std::vector<int32_t>* ids);

// Copies a sampled step's tokens (and the log probabilities asked for) out, as collect() gives
// them.
void hand_out(const HostSampled& s, int32_t* tokens, TokenLogprobs* logprobs);

class HostSampledBackend : public Backend {
 public:
  // The split step: the forward pass into the logits kept here, then their sampling.
  bool splits_sampling() const override { return true; }
  [[nodiscard]] Status submit_forward(const StepInput& in) override;
  [[nodiscard]] Status submit_sampling(const SampleSpec* specs) override;
  [[nodiscard]] Status collect(int32_t* tokens, TokenLogprobs* logprobs) override;
  void discard() override {
    outstanding_.clear();
    forwarded_ = false;
  }

 private:
  // The forwarded step's logits rows' input tokens (for the penalties), until it is sampled.
  std::vector<int32_t> row_inputs_;
  int num_logits_ = 0;
  bool forwarded_ = false;
  // Logits, fed token ids, and the last submitted step's tokens.
  std::vector<float> logits_;
  std::vector<int32_t> fed_ids_;
  std::vector<int32_t> last_tokens_;
  std::deque<HostSampled> outstanding_;  // submitted steps' tokens
};

}  // namespace hr::engine
