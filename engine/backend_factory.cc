// Backend selection.
#include "engine/backend_factory.h"

#include <algorithm>

#include "engine/cpu_backend.h"
#ifdef HEADROOM_HAVE_CUDA
#include "engine/cuda_backend.h"
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

// Each --cuda-options setting and the values it takes (the first: what a bare name means).
struct CudaSetting {
  const char* name;
  std::vector<std::string> values;
};
const std::vector<CudaSetting>& cuda_settings() {
  static const std::vector<CudaSetting> settings = {
      {"graphs", {"on", "off"}},
      {"small_batch_gemv", {"on", "off"}},
      {"fused_small_batch", {"on", "off"}},
      {"fused_rope", {"on", "off"}},
      {"fused_combine", {"on", "off"}},
      {"decode_attention", {"tensor_core", "cuda_core", "prefill_tiles"}},
      {"programmatic_launch", {"on", "off", "auto"}},
  };
  return settings;
}

// "a, b or c".
std::string listed(const std::vector<std::string>& items) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) out += (i == 0 ? "" : i + 1 == items.size() ? " or " : ", ") + items[i];
  return out;
}

#ifdef HEADROOM_HAVE_CUDA
void apply_cuda_settings(const CudaSettings& settings, CudaBackendOptions* o) {
  for (const auto& [name, value] : settings) {
    const bool on = value == "on";
    if (name == "graphs") o->cuda_graphs = on;
    if (name == "small_batch_gemv") o->small_batch_gemv = on;
    if (name == "fused_small_batch") o->fused_small_batch = on;
    if (name == "fused_rope") o->fused_rope = on;
    if (name == "fused_combine") o->fused_combine = on;
    if (name == "decode_attention") {
      o->decode_attention = value == "cuda_core"       ? DecodeAttention::kCudaCore
                            : value == "prefill_tiles" ? DecodeAttention::kPrefillTiles
                                                       : DecodeAttention::kTensorCore;
    }
    if (name == "programmatic_launch") {
      o->programmatic_launch = value == "auto" ? ProgrammaticLaunch::kAuto
                               : on            ? ProgrammaticLaunch::kOn
                                               : ProgrammaticLaunch::kOff;
    }
  }
}
#endif

}  // namespace

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
      return invalid_argument("--cuda-options: unknown setting \"" + name + "\" (known: " + listed(names) + ")",
                              "cuda-options");
    }
    const std::string value = eq == std::string::npos ? setting->values.front() : item.substr(eq + 1);
    if (std::find(setting->values.begin(), setting->values.end(), value) == setting->values.end()) {
      return invalid_argument("--cuda-options: " + name + " takes " + listed(setting->values) + ", not \"" +
                                  value + "\"",
                              "cuda-options");
    }
    out.emplace_back(name, value);
  }
  return out;
}

Status check_device(const std::string& device) {
  HR_ASSIGN_OR_RETURN([[maybe_unused]] int index, parse_device(device));
#ifndef HEADROOM_HAVE_CUDA
  if (index >= 0) return invalid_argument("this build has no CUDA backend; use --device cpu", "device");
#endif
  return Status::ok();
}

Result<std::shared_ptr<Backend>> make_backend(const std::string& model_dir, const BackendSpec& spec) {
  HR_RETURN_IF_ERROR(check_device(spec.device));
  HR_ASSIGN_OR_RETURN(int index, parse_device(spec.device));
  if (index < 0) {
    if (!spec.cuda_options.empty()) return invalid_argument("--cuda-options needs a CUDA device", "cuda-options");
    HR_ASSIGN_OR_RETURN(ModelWeights weights, load_weights(model_dir));
    pack_for_cpu(&weights);  // in place: the backend then holds the only copy
    HR_ASSIGN_OR_RETURN(auto cpu, CpuBackend::create(std::make_shared<const ModelWeights>(std::move(weights)),
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
  apply_cuda_settings(settings, &o);
  HR_ASSIGN_OR_RETURN(auto cuda, CudaBackend::create_from_dir(model_dir, o));
  return std::shared_ptr<Backend>(std::move(cuda));
#else
  return invalid_argument("this build has no CUDA backend", "device");
#endif
}

}  // namespace hr::engine
