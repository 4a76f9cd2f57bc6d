// Backend selection.
#include "engine/backend_factory.h"

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

}  // namespace

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
  HR_ASSIGN_OR_RETURN(auto cuda, CudaBackend::create_from_dir(model_dir, o));
  return std::shared_ptr<Backend>(std::move(cuda));
#else
  return invalid_argument("this build has no CUDA backend", "device");
#endif
}

}  // namespace hr::engine
