// `headroom plan`: what each rank of a deployment holds on its device and what is left for the
// KV cache, from a model's config.json alone (engine/memory_plan.h, docs/memory-plan.md).
#pragma once

#include <string>

#include "engine/memory_plan.h"

namespace hr::cmd {

struct PlanCommand {
  std::string model;                 // a model folder or a config.json
  int devices = 0;                   // 0: tp × pp
  std::string gpu_memory = "80GiB";  // each device's
  std::string weights = "bf16";
  std::string expert_weights = "";    // empty: as --weights
  std::string stage_layers = "even";  // even, or each stage's layer count (30,34)
  bool json = false;
  engine::PlanOptions options;
};

// Prints the plan (a table, or JSON); 0 when it fits, 3 when a rank has no room for its KV
// cache, 2 on bad options.
int run_plan(PlanCommand command);

}  // namespace hr::cmd
