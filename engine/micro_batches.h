// A step cut into micro-batches for pipeline stages (docs/parallel-engine.md): contiguous token
// ranges, a sequence's later tokens after its earlier ones (a sequence cut between two attends,
// in the later, to what the earlier wrote into its cache), each with its own sequence starts and
// logits rows, so that while stage s runs micro-batch m, stage s - 1 runs m + 1. And how many
// whole steps such an engine keeps in flight.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend.h"

namespace hr::engine {

// The step's tokens [first_token, first_token + in.num_tokens), its arrays pointing into the
// step's (fed rows too: they name the step before's logits rows, as the whole step's do);
// logits_index[i] is the step's logits row of its row i.
struct MicroBatch {
  StepInput in;
  int first_token = 0;
  std::vector<int32_t> seq_start, logits_rows, logits_index;
};

// Cuts `in` into `parts` micro-batches of tokens as even as they go (at most one per token; one:
// the step as it is). The step's arrays must outlive them.
void split_step(const StepInput& in, int parts, std::vector<MicroBatch>* out);

// Steps of disjoint sequences an engine of `pp` pipeline stages keeps in flight
// (docs/parallel-engine.md): `option` when given (above 0), else one a stage, so that each stage
// runs a step of its own; one without stages. (The backends' step_groups(), and the memory plan's
// decode graphs, which each such step's slot captures.)
inline int step_groups_for(int option, int pp) { return pp <= 1 ? 1 : option > 0 ? option : pp; }

}  // namespace hr::engine
