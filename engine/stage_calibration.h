// Measuring a pipeline's parts for balancing its stages (docs/parallel-engine.md "Balancing the
// stages"; stage_balance.h splits the layers from what this measures): calibration steps through
// the backend on KV blocks nothing holds yet, decode steps of `batch` sequences after `context`
// tokens each and prefill chunks, giving each part's time per output token plus `prompt_ratio`
// times its time per prompt token (the stages balanced for work of that many prompt tokens per
// output token). The first step of each kind is not timed.
#pragma once

#include <functional>

#include "base/status.h"
#include "engine/backend.h"
#include "engine/stage_balance.h"

namespace hr::engine {

struct StageCalibration {
  int batch = 8;
  int context = 16;
  double prompt_ratio = 1.0;
};

// Whether a cache of `num_blocks` blocks holds the calibration's sequences (one decode sequence
// at least, and the prefill's).
bool calibration_fits(const StageCalibration& c, int block_size, int num_blocks);

// The parts' costs. The steps go through b.forward(); timing(true) zeroes and starts the parts'
// clocks before the timed steps, times() reads them (each part's seconds since, by stage order),
// and timing(false) stops them at the end. kInvalidArgument naming balance-context when the cache
// holds no sequence of the calibration.
[[nodiscard]] Result<StageCosts> measure_stage_costs(Backend& b, const StageCalibration& c,
                                                     const std::function<void(bool)>& timing,
                                                     const std::function<StageCosts()>& times);

}  // namespace hr::engine
