// Backend selection.
#include "engine/backend_factory.h"

#include <algorithm>
#include <cstdio>
#include <type_traits>

#include "base/log.h"
#include "engine/cpu_backend.h"
#include "engine/parallel_cpu_backend.h"
#ifdef HEADROOM_HAVE_CUDA
#include "engine/cuda_backend.h"
#include "engine/device.h"
#include "engine/memory_plan.h"
#include "engine/parallel_cuda_backend.h"
#include "kernels/device.cuh"
#endif

namespace hr::engine {
namespace {

// The CUDA device index of "cuda" or "cuda:N"; -1 for "cpu"; an error otherwise.
Result<int> parse_device(const std::string& device) {
  if (device == "cpu") return -1;
  if (device == "cuda") return 0;
  if (device.rfind("cuda:", 0) == 0 && device.size() > 5 && device.size() <= 8 &&
      device.find_first_not_of("0123456789", 5) == std::string::npos) {
    return std::stoi(device.substr(5));
  }
  return invalid_argument("device must be cpu, cuda or cuda:N, not \"" + device + "\"", "device");
}

// The spec's expert parallelism, 0 (auto) resolved: experts whole on each rank when they split
// evenly over the tensor-parallel ranks, else sliced.
int expert_parallel(const BackendSpec& spec, int num_experts) {
  if (spec.expert_parallel > 0) return spec.expert_parallel;
  return num_experts > 0 && num_experts % spec.tensor_parallel == 0 ? spec.tensor_parallel : 1;
}

// "a, b or c".
std::string listed(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i)
    out += (i == 0 ? "" : i + 1 == items.size() ? " or " : ", ") + items[i];
  return out;
}

#ifdef HEADROOM_HAVE_CUDA
// The option field each setting names.
template <typename F>
void for_each_cuda_field(CudaBackendOptions& o, F&& f) {
  f("graphs", o.cuda_graphs);
  f("small_batch_gemv", o.small_batch_gemv);
  f("fused_small_batch", o.fused_small_batch);
  f("fused_rope", o.fused_rope);
  f("fused_combine", o.fused_combine);
  f("fused_all_reduce", o.fused_all_reduce);
  f("rank_collectives", o.rank_collectives);
  f("decode_attention", o.decode_attention);
  f("programmatic_launch", o.programmatic_launch);
  f("prefetch_weights", o.prefetch_weights_mb);
  f("moe_experts", o.moe_experts);
  f("moe_gemm_warps", o.moe_gemm_warps);
  f("moe_router_tiles", o.moe_router_tiles);
  f("moe_combine", o.moe_combine);
}

// A field's values and their setting texts.
std::vector<std::pair<bool, const char*>> field_values(bool) {
  return {{true, "on"}, {false, "off"}};
}
std::vector<std::pair<DecodeAttention, const char*>> field_values(DecodeAttention) {
  return {{DecodeAttention::kTensorCore, "tensor_core"},
          {DecodeAttention::kCudaCore, "cuda_core"},
          {DecodeAttention::kPrefillTiles, "prefill_tiles"}};
}
std::vector<std::pair<int, const char*>> field_values(int) {  // prefetch_weights: MiB
  return {{8, "8mb"}, {0, "off"}, {4, "4mb"}, {16, "16mb"}};
}
std::vector<std::pair<MoeExperts, const char*>> field_values(MoeExperts) {
  return {{MoeExperts::kAuto, "auto"},
          {MoeExperts::kGemv, "gemv"},
          {MoeExperts::kGroupedGemm, "grouped_gemm"}};
}
std::vector<std::pair<MoeGemmWarps, const char*>> field_values(MoeGemmWarps) {
  return {{MoeGemmWarps::kAuto, "auto"},
          {MoeGemmWarps::k32x32, "32x32"},
          {MoeGemmWarps::k64x64, "64x64"},
          {MoeGemmWarps::kWarpgroup, "warpgroup"}};
}
std::vector<std::pair<RankCollectives, const char*>> field_values(RankCollectives) {
  return {{RankCollectives::kNccl, "nccl"}, {RankCollectives::kPeer, "peer"}};
}
std::vector<std::pair<ProgrammaticLaunch, const char*>> field_values(ProgrammaticLaunch) {
  return {{ProgrammaticLaunch::kOn, "on"},
          {ProgrammaticLaunch::kOff, "off"},
          {ProgrammaticLaunch::kAuto, "auto"}};
}

// Applies parsed settings; an error for one that names no field or value (a table out of step).
Status apply_cuda_settings(const CudaSettings& settings, CudaBackendOptions* o) {
  for (const auto& [name, value] : settings) {
    bool applied = false;
    for_each_cuda_field(*o, [&](const char* field_name, auto& field) {
      if (name != field_name) return;
      for (const auto& [v, text] : field_values(field)) {
        if (value == text) {
          field = v;
          applied = true;
        }
      }
    });
    if (!applied)
      return internal_error("--cuda-options: setting " + name + "=" + value +
                            " has no option field");
  }
  return Status::ok();
}

// Every setting as name=value, comma-separated.
std::string describe(CudaBackendOptions o) {
  std::string out;
  for_each_cuda_field(o, [&](const char* name, const auto& field) {
    for (const auto& [v, text] : field_values(field)) {
      if (field != v) continue;
      if (!out.empty()) out += ',';
      out.append(name).append("=").append(text);
    }
  });
  return out;
}
#endif

}  // namespace

const std::vector<CudaSetting>& cuda_settings() {
  static const std::vector<CudaSetting> settings = {
      {"graphs", {"on", "off"}},
      {"small_batch_gemv", {"on", "off"}},
      {"fused_small_batch", {"on", "off"}},
      {"fused_rope", {"on", "off"}},
      {"fused_combine", {"on", "off"}},
      {"fused_all_reduce", {"on", "off"}},
      {"rank_collectives", {"nccl", "peer"}},
      {"decode_attention", {"tensor_core", "cuda_core", "prefill_tiles"}},
      {"programmatic_launch", {"on", "off", "auto"}},
      {"prefetch_weights", {"8mb", "off", "4mb", "16mb"}},
      {"moe_experts", {"auto", "gemv", "grouped_gemm"}},
      {"moe_gemm_warps", {"auto", "32x32", "64x64", "warpgroup"}},
      {"moe_router_tiles", {"on", "off"}},
      {"moe_combine", {"on", "off"}},
  };
  return settings;
}

std::string cuda_options_help() {
  std::string out =
      "CUDA backend settings, comma-separated name=value (a bare name: its first value):";
  for (const auto& s : cuda_settings()) {
    out += std::string(&s == &cuda_settings().front() ? " " : ", ") + s.name + " (";
    for (const auto& v : s.values) out += (&v == &s.values.front() ? "" : "|") + v;
    out += ")";
  }
  return out;
}

Result<CudaSettings> parse_cuda_options(const std::string& text) {
  CudaSettings out;
  size_t at = 0;
  while (at <= text.size() && !text.empty()) {
    const size_t end = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, end - at);
    at = end + 1;
    const size_t eq = item.find('=');
    const std::string name = item.substr(0, eq);
    const CudaSetting* setting = nullptr;
    for (const auto& s : cuda_settings()) {
      if (name == s.name) setting = &s;
    }
    if (setting == nullptr) {
      std::vector<std::string> names;
      for (const auto& s : cuda_settings()) names.push_back(s.name);
      return invalid_argument(
          "--cuda-options: unknown setting \"" + name + "\" (known: " + listed(names) + ")",
          "cuda-options");
    }
    const std::string value =
        eq == std::string::npos ? setting->values.front() : item.substr(eq + 1);
    if (std::find(setting->values.begin(), setting->values.end(), value) == setting->values.end()) {
      return invalid_argument("--cuda-options: " + name + " takes " + listed(setting->values) +
                                  ", not \"" + value + "\"",
                              "cuda-options");
    }
    out.emplace_back(name, value);
  }
  return out;
}

Result<std::string> describe_cuda_options(const std::string& cuda_options) {
  HR_ASSIGN_OR_RETURN(CudaSettings settings, parse_cuda_options(cuda_options));
#ifdef HEADROOM_HAVE_CUDA
  CudaBackendOptions o;
  HR_RETURN_IF_ERROR(apply_cuda_settings(settings, &o));
  return describe(o);
#else
  return std::string();
#endif
}

#ifdef HEADROOM_HAVE_CUDA
std::string describe_cuda_backend_options(const CudaBackendOptions& options) {
  return describe(options);
}
#endif

#ifdef HEADROOM_HAVE_CUDA
namespace {

// What the device will hold (engine/memory_plan.h), said before the weights load: a model that
// will not fit is told at once, and the figures can be held against the backend's own after.
// Each device's plan (engine/memory_plan.h) before loading: one GPU, or a GPU a rank (the
// degrees; the largest rank's weights and the smallest rank's free bytes).
void log_memory_plan(const std::string& model_dir, const CudaBackendOptions& o,
                     const ParallelDegrees& d = {}) {
  Result<ModelShape> shape = load_model_shape(model_dir);
  if (!shape.is_ok()) return;  // the load reports it
  PlanOptions p;
  p.tp = d.tp;
  p.pp = d.pp;
  p.ep = d.ep;
  p.stage_layers = d.stage_layers;
  p.max_num_tokens = o.max_num_tokens;
  p.max_num_seqs = o.max_num_seqs;
  p.block_size = o.block_size;
  p.kv_cache_fraction = o.kv_cache_fraction;
  p.step_groups = o.step_groups;
  for (const GpuInfo& gpu : list_gpus()) {
    if (gpu.index == o.device) p.gpu_memory_bytes = static_cast<int64_t>(gpu.total_memory_bytes);
  }
  int sms = 0;
  if (cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, o.device) == cudaSuccess) {
    p.num_sms = sms;
  }
  Result<MemoryPlan> plan = plan_memory(*shape, p);
  if (!plan.is_ok()) return;
  int64_t weights = 0, buffers = 0, free_bytes = plan->ranks.front().free_bytes;
  for (const RankPlan& r : plan->ranks) {
    weights = std::max(weights, r.weight_bytes);
    buffers = std::max(buffers, r.activation_bytes);
    free_bytes = std::min(free_bytes, r.free_bytes);
  }
  log::info("backend.memory_plan", {{"gpu_memory_bytes", p.gpu_memory_bytes},
                                    {"ranks", static_cast<int64_t>(plan->ranks.size())},
                                    {"weight_bytes", weights},
                                    {"buffer_bytes", buffers},
                                    {"free_bytes", free_bytes},
                                    {"kv_tokens", plan->kv_tokens},
                                    {"fits", plan->fits}});
}

}  // namespace
#endif

Status check_device(const std::string& device) {
  HR_ASSIGN_OR_RETURN([[maybe_unused]] int index, parse_device(device));
#ifndef HEADROOM_HAVE_CUDA
  if (index >= 0)
    return invalid_argument("this build has no CUDA backend; use --device cpu", "device");
#endif
  return Status::ok();
}

namespace {

// Numbers of up to three digits separated by commas; empty when the text is not that.
std::vector<int> number_list(const std::string& text) {
  std::vector<int> out;
  size_t at = 0;
  while (at <= text.size()) {
    const size_t comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    if (item.empty() || item.size() > 3 ||
        item.find_first_not_of("0123456789") != std::string::npos) {
      return {};
    }
    out.push_back(std::stoi(item));
    at = comma + 1;
  }
  return out;
}

// "a,b,c" of the values times `scale` (integers as they are, others to two decimals).
template <typename T>
std::string joined(const std::vector<T>& values, double scale) {
  std::string out;
  for (const T& v : values) {
    if (!out.empty()) out += ',';
    if constexpr (std::is_integral_v<T>) {
      out += std::to_string(v);
    } else {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.2f", v * scale);
      out += buf;
    }
  }
  return out;
}

// What balancing the stages found, when it ran.
void log_stage_balance(const StageBalance& b) {
  if (!b.ran) return;
  log::info("backend.stage_balance", {{"layers_before", joined(b.layers_before, 1)},
                                      {"layers_after", joined(b.layers_after, 1)},
                                      {"stage_ms_before", joined(b.seconds_before, 1e3)},
                                      {"stage_ms_predicted", joined(b.predicted_after, 1e3)},
                                      {"calibration_seconds", b.calibration_seconds}});
}

}  // namespace

Result<std::vector<int>> parse_device_list(const std::string& text) {
  std::vector<int> out = number_list(text);
  if (out.empty()) {
    return invalid_argument(
        "--devices takes GPU indexes separated by commas (0,1,2,3), not \"" + text + "\"",
        "devices");
  }
  return out;
}

Result<StageLayers> parse_stage_layers(const std::string& text) {
  if (text == "auto") return StageLayers{{}, true};
  if (text == "even") return StageLayers{{}, false};
  std::vector<int> layers = number_list(text);
  if (layers.empty() || std::count(layers.begin(), layers.end(), 0) > 0) {
    return invalid_argument(
        "--stage-layers takes auto, even or each stage's layer count (30,34), not \"" + text + "\"",
        "stage-layers");
  }
  return StageLayers{std::move(layers), false};
}

#ifdef HEADROOM_HAVE_CUDA
namespace {
// Settings a device cannot run, refused before anything loads: the grouped GEMM on warpgroups is
// Hopper's (wgmma).
Status check_settings_fit_devices(const CudaBackendOptions& o, const std::vector<int>& devices) {
  if (o.moe_gemm_warps != MoeGemmWarps::kWarpgroup) return Status::ok();
  for (int d : devices) {
    kernels::DeviceInfo info;
    // (A device that cannot be read is left to the load, which names it.)
    if (kernels::device_info(d, &info) != cudaSuccess || info.compute_major == 9) continue;
    return invalid_argument(
        "--cuda-options: moe_gemm_warps=warpgroup needs a Hopper GPU (compute "
        "capability 9.x); device " +
            std::to_string(d) + " is " + std::to_string(info.compute_major) + "." +
            std::to_string(info.compute_minor),
        "cuda-options");
  }
  return Status::ok();
}
}  // namespace
#endif

Result<std::shared_ptr<Backend>> make_backend(const std::string& model_dir,
                                              const BackendSpec& spec) {
  HR_RETURN_IF_ERROR(check_device(spec.device));
  HR_ASSIGN_OR_RETURN(int index, parse_device(spec.device));
  if (index < 0) {
    if (!spec.cuda_options.empty())
      return invalid_argument("--cuda-options needs a CUDA device", "cuda-options");
    if (spec.tensor_parallel * spec.pipeline_parallel > 1) {
      HR_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(model_dir));
      ParallelCpuOptions o;
      o.degrees = {spec.tensor_parallel, spec.pipeline_parallel,
                   expert_parallel(spec, config.moe.num_experts), spec.stage_layers.layers};
      o.block_size = spec.block_size;
      o.kv_cache_bytes = spec.kv_cache_bytes;
      o.thread_nice = spec.cpu_thread_nice;
      o.balance_stages = spec.stage_layers.balance;
      o.balance_batch = std::min(spec.max_num_seqs, 16);
      LoadStats load;
      HR_ASSIGN_OR_RETURN(auto many, ParallelCpuBackend::create_from_dir(model_dir, o, &load));
      log_stage_balance(many->stage_balance());
      log::info(
          "backend.parallel",
          {{"tensor_parallel", o.degrees.tp},
           {"pipeline_parallel", o.degrees.pp},
           {"expert_parallel", o.degrees.ep},
           {"kv_blocks", many->num_kv_blocks()},
           {"load_seconds", load.seconds},
           {"checkpoint_bytes", static_cast<int64_t>(load.checkpoint_bytes)},
           {"checkpoint_bytes_per_s",
            load.seconds > 0 ? static_cast<double>(load.checkpoint_bytes) / load.seconds : 0.0}});
      return std::shared_ptr<Backend>(std::move(many));
    }
    HR_ASSIGN_OR_RETURN(ModelWeights weights, load_weights(model_dir));
    pack_for_cpu(&weights);  // in place: the backend then holds the only copy
    HR_ASSIGN_OR_RETURN(
        auto cpu,
        CpuBackend::create(std::make_shared<const ModelWeights>(std::move(weights)),
                           {spec.block_size, spec.kv_cache_bytes, 0, spec.cpu_thread_nice}));
    return std::shared_ptr<Backend>(std::move(cpu));
  }
#ifdef HEADROOM_HAVE_CUDA
  CudaBackendOptions o;
  o.device = index;
  o.block_size = spec.block_size;
  o.kv_cache_bytes = spec.kv_cache_bytes;
  o.max_num_tokens = spec.max_num_tokens;
  o.max_num_seqs = spec.max_num_seqs;
  HR_ASSIGN_OR_RETURN(CudaSettings settings, parse_cuda_options(spec.cuda_options));
  HR_RETURN_IF_ERROR(apply_cuda_settings(settings, &o));
  log::info("backend.cuda_settings", {{"device", index}, {"settings", describe(o)}});
  const int world = spec.tensor_parallel * spec.pipeline_parallel;
  // The ranks' devices: as --devices names them, else the device and the ones after it.
  std::vector<int> devices = world > 1 ? spec.devices : std::vector<int>{};
  if (devices.empty()) {
    for (int r = 0; r < world; ++r) devices.push_back(index + r);
  }
  HR_RETURN_IF_ERROR(check_settings_fit_devices(o, devices));
  if (world > 1) {
    HR_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(model_dir));
    const int ep = expert_parallel(spec, config.moe.num_experts);
    const ParallelDegrees degrees(spec.tensor_parallel, spec.pipeline_parallel, ep,
                                  spec.stage_layers.layers);
    // (Virtual ranks share one device: the plan, a device a rank, is not theirs.)
    std::vector<int> sorted = devices;
    std::sort(sorted.begin(), sorted.end());
    if (std::adjacent_find(sorted.begin(), sorted.end()) == sorted.end()) {
      CudaBackendOptions first = o;
      first.device = devices.front();
      log_memory_plan(model_dir, first, degrees);
    }
    LoadStats load;
    StageCalibration calibration;
    calibration.batch = std::min(spec.max_num_seqs, 16);
    HR_ASSIGN_OR_RETURN(auto many, ParallelCudaBackend::create_from_dir(
                                       model_dir, devices, o, degrees, &load,
                                       spec.stage_layers.balance ? &calibration : nullptr));
    log_stage_balance(many->stage_balance());
    std::string named;
    for (int d : devices) named += (named.empty() ? "" : ",") + std::to_string(d);
    log::info(
        "backend.parallel",
        {{"tensor_parallel", spec.tensor_parallel},
         {"pipeline_parallel", spec.pipeline_parallel},
         {"expert_parallel", ep},
         {"devices", named},
         {"virtual_ranks", many->virtual_ranks()},
         {"weight_bytes", static_cast<int64_t>(many->weight_bytes())},
         {"kv_cache_bytes", static_cast<int64_t>(many->kv_cache_bytes())},
         {"kv_tokens", static_cast<int64_t>(many->num_kv_blocks()) * o.block_size},
         {"load_seconds", load.seconds},
         {"checkpoint_bytes", static_cast<int64_t>(load.checkpoint_bytes)},
         {"checkpoint_bytes_per_s",
          load.seconds > 0 ? static_cast<double>(load.checkpoint_bytes) / load.seconds : 0.0}});
    return std::shared_ptr<Backend>(std::move(many));
  }
  log_memory_plan(model_dir, o);
  HR_ASSIGN_OR_RETURN(auto cuda, CudaBackend::create_from_dir(model_dir, o));
  log::info("backend.memory",
            {{"weight_bytes", static_cast<int64_t>(cuda->weight_bytes())},
             {"buffer_bytes", static_cast<int64_t>(cuda->buffer_bytes())},
             {"kv_cache_bytes", static_cast<int64_t>(cuda->kv_cache_bytes())},
             {"kv_tokens", static_cast<int64_t>(cuda->num_kv_blocks()) * o.block_size}});
  return std::shared_ptr<Backend>(std::move(cuda));
#else
  return invalid_argument("this build has no CUDA backend", "device");
#endif
}

}  // namespace hr::engine
