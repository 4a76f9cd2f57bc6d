// A backend whose steps run to completion on the host: submit() resolves fed tokens, runs
// forward() (submit_forward) and samples each logits row on the host (submit_sampling)
// (apply_penalties, the token mask, sample_token, and token_logprobs where asked); collect() hands
// the tokens back in order. The CPU backend and the CPU parallel engine share it.
#pragma once

#include <deque>
#include <vector>

#include "engine/backend.h"

namespace hr::engine {

class HostSampledBackend : public Backend {
 public:
  [[nodiscard]] Status submit(const StepInput& in, const SampleSpec* specs) override;
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
  // A submitted step's tokens, and their log probabilities where asked for (-1 in `asked`: not).
  struct Sampled {
    std::vector<int32_t> tokens;
    std::vector<TokenLogprobs> logprobs;
    std::vector<int> asked;
  };
  std::deque<Sampled> outstanding_;
};

}  // namespace hr::engine
