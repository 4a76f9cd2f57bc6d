// The calibration steps that measure a pipeline's parts.
#include "engine/stage_calibration.h"

#include <algorithm>
#include <vector>

#include "engine/synthetic_step.h"

namespace hr::engine {
namespace {

// Decode steps timed; prefill chunks of kChunk tokens for kPrefillSeqs sequences, kPrefillSteps
// of them timed.
constexpr int kDecodeSteps = 6, kChunk = 32, kPrefillSteps = 2, kPrefillSeqs = 2;

int blocks_per_seq(const StageCalibration& c, int block_size) {
  return std::max(SyntheticStep::blocks_for(c.context + kDecodeSteps, block_size),
                  SyntheticStep::blocks_for(kChunk * (kPrefillSteps + 1) - 1, block_size));
}

}  // namespace

bool calibration_fits(const StageCalibration& c, int block_size, int num_blocks) {
  return num_blocks >= (kPrefillSeqs + 1) * blocks_per_seq(c, block_size);
}

Result<StageCosts> measure_stage_costs(Backend& b, const StageCalibration& c,
                                       const std::function<void(bool)>& timing,
                                       const std::function<StageCosts()>& times) {
  // Decode: B sequences prefilled to `context` tokens, then steps of one token each. Prefill: two
  // more sequences' prompts in chunks. Fewer decode sequences if the cache is small.
  const int per_seq = blocks_per_seq(c, b.block_size());
  const int B = std::min(c.batch, b.num_kv_blocks() / per_seq - kPrefillSeqs);
  if (B < 1) {
    return invalid_argument("the KV cache holds no sequence of the balancing's context",
                            "balance-context");
  }
  const int vocab = b.vocab_size();
  std::vector<float> logits(static_cast<size_t>(std::max(B, kPrefillSeqs)) * vocab);
  auto run = [&](int seqs, int first_pos, int count, int first_block) {
    const SyntheticStep step(seqs, first_pos, count, per_seq, vocab, first_block);
    return b.forward(step.input(), logits.data());
  };
  // Each part's time per token of the timed steps.
  auto per_token = [&](double tokens) {
    StageCosts costs = times();
    for (double& x : costs.layer) x /= tokens;
    costs.first /= tokens;
    costs.last /= tokens;
    return costs;
  };
  HR_RETURN_IF_ERROR(run(B, 0, c.context, 0));
  HR_RETURN_IF_ERROR(run(B, c.context, 1, 0));
  timing(true);
  for (int i = 1; i <= kDecodeSteps; ++i) HR_RETURN_IF_ERROR(run(B, c.context + i, 1, 0));
  StageCosts costs = per_token(static_cast<double>(B) * kDecodeSteps);
  if (c.prompt_ratio > 0) {
    HR_RETURN_IF_ERROR(run(kPrefillSeqs, 0, kChunk, B * per_seq));
    timing(true);
    for (int i = 1; i <= kPrefillSteps; ++i)
      HR_RETURN_IF_ERROR(run(kPrefillSeqs, i * kChunk, kChunk, B * per_seq));
    const StageCosts prefill =
        per_token(static_cast<double>(kPrefillSeqs) * kChunk * kPrefillSteps);
    for (size_t i = 0; i < costs.layer.size(); ++i)
      costs.layer[i] += c.prompt_ratio * prefill.layer[i];
    costs.first += c.prompt_ratio * prefill.first;
    costs.last += c.prompt_ratio * prefill.last;
  }
  timing(false);
  return costs;
}

}  // namespace hr::engine
