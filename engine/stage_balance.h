// Pipeline stages balanced by measured time (docs/parallel-engine.md "Balancing the stages"): a
// pipeline's throughput is its slowest stage's, so the layers are split where the largest stage
// time is least, from each layer's measured time and the first and last stages' own work (the
// embedding; the final norm and the LM head, which on a decode step can cost several layers).
#pragma once

#include <vector>

namespace hr::engine {

// What a step costs, part by part (seconds, or any one unit).
struct StageCosts {
  std::vector<double> layer;  // each layer's, in order
  double first = 0;           // the first stage's own (the embedding)
  double last = 0;            // the last stage's own (final norm, LM head, logits)
};

// Stage s's cost when the stages hold `stage_layers` layers (first to last).
double stage_cost(const StageCosts& costs, const std::vector<int>& stage_layers, int stage);
// The largest of the stages' costs.
double slowest_stage(const StageCosts& costs, const std::vector<int>& stage_layers);

// The layer counts of `pp` contiguous stages (each at least one layer) whose slowest stage is
// the fastest possible; `current` (empty: the even split) when its slowest stage is within
// `tolerance` (a fraction) of that best, so measurement noise moves nothing. Needs
// 1 <= pp <= layers.
std::vector<int> balance_stages(const StageCosts& costs, int pp,
                                const std::vector<int>& current = {}, double tolerance = 0);

// What balancing a backend's stages found (its stage_balance()).
struct StageBalance {
  bool ran = false;
  std::vector<int> layers_before, layers_after;  // each stage's layers
  // Each stage's time per output token (decode plus the prompt ratio's prefill), as measured
  // before, and as the measured parts add up for the new split.
  std::vector<double> seconds_before, predicted_after;
  double calibration_seconds = 0;  // the calibration steps and the move
};

// Layers as even as they go ([L s / pp, L (s + 1) / pp)), as counts.
std::vector<int> even_stages(int num_layers, int pp);

}  // namespace hr::engine
