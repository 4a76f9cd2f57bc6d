// `headroom plan`: the memory plan printed.
#include "cmd/plan.h"

#include <nlohmann/json.hpp>

#include <cctype>
#include <cstdio>

#include "engine/backend_factory.h"

namespace hr::cmd {

namespace {

// "80GiB", "141GB", "81559MiB", "85899345920": bytes.
Result<int64_t> parse_bytes(const std::string& text) {
  size_t end = 0;
  double v = 0;
  try {
    v = std::stod(text, &end);
  } catch (const std::exception&) {
    return invalid_argument("'" + text + "' is not a size like 80GiB", "gpu-memory");
  }
  std::string unit = text.substr(end);
  for (char& c : unit) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  double scale = 0;
  if (unit.empty() || unit == "b") scale = 1;
  if (unit == "kib") scale = 1024.0;
  if (unit == "mib") scale = 1024.0 * 1024;
  if (unit == "gib") scale = 1024.0 * 1024 * 1024;
  if (unit == "tib") scale = 1024.0 * 1024 * 1024 * 1024;
  if (unit == "kb") scale = 1e3;
  if (unit == "mb") scale = 1e6;
  if (unit == "gb") scale = 1e9;
  if (unit == "tb") scale = 1e12;
  if (scale == 0 || !(v > 0)) {
    return invalid_argument("'" + text +
                                "' is not a size like 80GiB (B, KiB, MiB, GiB, TiB, KB, "
                                "MB, GB, TB)",
                            "gpu-memory");
  }
  return static_cast<int64_t>(v * scale);
}

double gib(int64_t bytes) { return static_cast<double>(bytes) / (1024.0 * 1024 * 1024); }

nlohmann::json rank_json(const engine::RankPlan& r) {
  return {{"stage", r.stage},
          {"tp_rank", r.tp_rank},
          {"first_layer", r.first_layer},
          {"num_layers", r.num_layers},
          {"weight_bytes", r.weight_bytes},
          {"activation_bytes", r.activation_bytes},
          {"workspace_bytes", r.workspace_bytes},
          {"graph_bytes", r.graph_bytes},
          {"context_bytes", r.context_bytes},
          {"free_bytes", r.free_bytes},
          {"kv_bytes", r.kv_bytes},
          {"kv_block_bytes", r.kv_block_bytes},
          {"kv_blocks", r.kv_blocks},
          {"kv_tokens", r.kv_tokens}};
}

}  // namespace

int run_plan(PlanCommand c) {
  auto fail = [](const Status& st) {
    std::fprintf(stderr, "headroom: %s\n", st.to_string().c_str());
    return 2;
  };
  Result<engine::ModelShape> shape = engine::load_model_shape(c.model);
  if (!shape.is_ok()) return fail(shape.status());
  Result<int64_t> memory = parse_bytes(c.gpu_memory);
  if (!memory.is_ok()) return fail(memory.status());
  c.options.gpu_memory_bytes = *memory;
  Result<engine::WeightFormat> weights = engine::parse_weight_format(c.weights);
  if (!weights.is_ok())
    return fail(Status(weights.status().code(), weights.status().message(), "weights"));
  c.options.weights = *weights;
  Result<engine::WeightFormat> experts =
      engine::parse_weight_format(c.expert_weights.empty() ? c.weights : c.expert_weights);
  if (!experts.is_ok())
    return fail(Status(experts.status().code(), experts.status().message(), "expert-weights"));
  c.options.experts = *experts;
  if (c.devices > 0 && c.devices != c.options.tp * c.options.pp) {
    if (c.options.tp == 1 && c.options.pp == 1) {
      c.options.tp = c.devices;  // all of them tensor-parallel
    } else {
      return fail(invalid_argument("--devices " + std::to_string(c.devices) + " is not --tp " +
                                       std::to_string(c.options.tp) + " × --pp " +
                                       std::to_string(c.options.pp),
                                   "devices"));
    }
  }
  if (c.stage_layers != "even") {
    Result<engine::StageLayers> stages = engine::parse_stage_layers(c.stage_layers);
    if (!stages.is_ok() || stages->layers.empty()) {
      return fail(
          invalid_argument("--stage-layers takes even or each stage's layer count (30,34), not \"" +
                               c.stage_layers + "\"",
                           "stage-layers"));
    }
    c.options.stage_layers = stages->layers;
  }
  Result<engine::MemoryPlan> plan = engine::plan_memory(*shape, c.options);
  if (!plan.is_ok()) return fail(plan.status());
  const engine::ModelShape& s = *shape;
  if (c.json) {
    nlohmann::json out = {
        {"model", c.model},
        {"model_type", s.model_type},
        {"parameters", plan->parameters},
        {"checkpoint_weights", engine::weight_format_name(s.checkpoint_format)},
        {"checkpoint_experts", engine::weight_format_name(s.checkpoint_expert_format)},
        {"weights", engine::weight_format_name(c.options.weights)},
        {"experts", engine::weight_format_name(c.options.experts)},
        {"tp", plan->tp},
        {"pp", plan->pp},
        {"ep", plan->ep},
        {"gpu_memory_bytes", c.options.gpu_memory_bytes},
        {"total_weight_bytes", plan->total_weight_bytes},
        {"kv_tokens", plan->kv_tokens},
        {"fits", plan->fits},
        {"ranks", nlohmann::json::array()}};
    for (const engine::RankPlan& r : plan->ranks) out["ranks"].push_back(rank_json(r));
    std::printf("%s\n", out.dump().c_str());
    return plan->fits ? 0 : 3;
  }
  const double params = static_cast<double>(plan->parameters);
  std::printf(
      "%s (%s): %.2f %s parameters; checkpoint %s (experts %s); planned as %s (experts %s)\n",
      c.model.c_str(), s.model_type.c_str(), params >= 1e9 ? params / 1e9 : params / 1e6,
      params >= 1e9 ? "B" : "M", engine::weight_format_name(s.checkpoint_format),
      engine::weight_format_name(s.checkpoint_expert_format),
      engine::weight_format_name(c.options.weights), engine::weight_format_name(c.options.experts));
  std::printf("%d device(s) of %.1f GiB: tensor-parallel %d, pipeline %d, expert-parallel %d\n",
              plan->tp * plan->pp, gib(c.options.gpu_memory_bytes), plan->tp, plan->pp, plan->ep);
  std::printf("%-6s %-9s %10s %10s %10s %10s %10s %12s\n", "stage", "layers", "weights", "buffers",
              "other", "free", "kv cache", "kv tokens");
  // other: the CUDA context and cuBLASLt's workspace; free: what is left, from which the captured
  // graphs' allowance and the KV cache come.
  for (const engine::RankPlan& r : plan->ranks) {
    if (r.tp_rank != 0) continue;  // a stage's ranks hold the same
    char layers[32];
    std::snprintf(layers, sizeof(layers), "%lld-%lld", static_cast<long long>(r.first_layer),
                  static_cast<long long>(r.first_layer + r.num_layers - 1));
    std::printf("%-6d %-9s %7.2f GiB %6.2f GiB %6.2f GiB %6.2f GiB %6.2f GiB %12lld\n", r.stage,
                layers, gib(r.weight_bytes), gib(r.activation_bytes),
                gib(r.workspace_bytes + r.context_bytes), gib(r.free_bytes), gib(r.kv_bytes),
                static_cast<long long>(r.kv_tokens));
  }
  std::printf("weights on all devices: %.2f GiB; KV cache for %lld tokens%s\n",
              gib(plan->total_weight_bytes), static_cast<long long>(plan->kv_tokens),
              plan->fits ? "" : " — does not fit: a rank has no room for its KV cache");
  return plan->fits ? 0 : 3;
}

}  // namespace hr::cmd
