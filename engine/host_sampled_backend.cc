// Host-side sampling for backends that compute a step inside submit().
#include "engine/host_sampled_backend.h"

#include <algorithm>

namespace hr::engine {

HostSampled sample_on_host(float* logits, int vocab, int rows, const SampleSpec* specs,
                           const int32_t* row_inputs) {
  const size_t L = static_cast<size_t>(std::max(0, rows));
  HostSampled out;
  out.tokens.resize(L);
  out.logprobs.resize(L);
  out.asked.assign(L, -1);
  for (size_t i = 0; i < L; ++i) {
    float* row = logits + i * static_cast<size_t>(vocab);
    apply_penalties(row, vocab, specs[i], row_inputs[i]);
    if (specs[i].allowed) apply_token_mask(row, vocab, specs[i].allowed);
    out.tokens[i] = sample_token(row, vocab, specs[i]);
    if (specs[i].logprobs >= 0) {
      out.asked[i] = specs[i].logprobs;
      token_logprobs(row, vocab, out.tokens[i], specs[i].logprobs, &out.logprobs[i]);
    }
  }
  return out;
}

Status resolve_fed_tokens(const StepInput& in, const std::vector<int32_t>& previous,
                          std::vector<int32_t>* ids) {
  ids->assign(in.token_ids, in.token_ids + std::max(0, in.num_tokens));
  for (int t = 0; t < in.num_tokens; ++t) {
    const int32_t row = in.fed_rows[t];
    if (row < 0) continue;
    if (row >= static_cast<int>(previous.size())) {
      return invalid_argument("fed row " + std::to_string(row) +
                              " is not a row of the previous step");
    }
    (*ids)[static_cast<size_t>(t)] = previous[static_cast<size_t>(row)];
  }
  return Status::ok();
}

void hand_out(const HostSampled& s, int32_t* tokens, TokenLogprobs* logprobs) {
  std::copy(s.tokens.begin(), s.tokens.end(), tokens);
  for (size_t i = 0; logprobs && i < s.asked.size(); ++i) {
    if (s.asked[i] >= 0) logprobs[i] = s.logprobs[i];
  }
}

Status HostSampledBackend::submit_forward(const StepInput& in) {
  if (outstanding_.size() >= 2)
    return internal_error("two steps are outstanding: collect one first");
  if (forwarded_) return internal_error("a forwarded step waits for its sampling");
  StepInput resolved = in;
  if (in.fed_rows) {
    HR_RETURN_IF_ERROR(resolve_fed_tokens(in, last_tokens_, &fed_ids_));
    resolved.token_ids = fed_ids_.data();
    resolved.fed_rows = nullptr;
  }
  const int V = vocab_size();
  logits_.resize(static_cast<size_t>(std::max(1, in.num_logits)) * V);
  HR_RETURN_IF_ERROR(forward(resolved, logits_.data()));
  num_logits_ = std::max(0, in.num_logits);
  row_inputs_.resize(static_cast<size_t>(num_logits_));
  for (int i = 0; i < num_logits_; ++i)
    row_inputs_[static_cast<size_t>(i)] = resolved.token_ids[in.logits_rows[i]];
  forwarded_ = true;
  return Status::ok();
}

Status HostSampledBackend::submit_sampling(const SampleSpec* specs) {
  if (!forwarded_) return internal_error("no forwarded step to sample");
  if (num_logits_ > 0 && specs == nullptr)
    return invalid_argument("no sampling specs for the logits rows");
  forwarded_ = false;
  HostSampled out =
      sample_on_host(logits_.data(), vocab_size(), num_logits_, specs, row_inputs_.data());
  last_tokens_ = out.tokens;
  outstanding_.push_back(std::move(out));
  return Status::ok();
}

Status HostSampledBackend::collect(int32_t* tokens, TokenLogprobs* logprobs) {
  if (outstanding_.empty()) return internal_error("no step to collect");
  hand_out(outstanding_.front(), tokens, logprobs);
  outstanding_.pop_front();
  return Status::ok();
}

}  // namespace hr::engine
