// Picks and builds the compute backend named by the worker's --device option: "cpu", or "cuda" /
// "cuda:N" when the CUDA backend is compiled in (a clear error naming --device otherwise).
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "engine/backend.h"
#include "engine/weights.h"

namespace hr::engine {

// How a CPU engine's pipeline stages split the layers.
struct StageLayers {
  std::vector<int> layers;  // each stage's, first to last; empty: see balance
  bool balance = false;     // with no list: balanced by measured stage time, else as even
};

struct BackendSpec {
  std::string device = "cpu";  // cpu | cuda | cuda:N
  int block_size = 16;
  size_t kv_cache_bytes = 64ull << 20;  // on cuda, 0: 90% of the device memory left after loading
  int max_num_tokens = 8192;            // per step (cuda activation buffers)
  int max_num_seqs = 256;               // per step
  int cpu_thread_nice = 0;              // cpu: nice value of the backend's pool threads
  // Ranks (parallel_cpu_backend.h, parallel_cuda_backend.h): tensor-parallel ranks per stage,
  // pipeline stages, expert parallelism (0: tp when the experts split over it on the CPU
  // backend, else 1). On cuda: rank (stage s, tensor-parallel index t) on devices[s * tp + t]
  // (empty: the device's index and the ones after it; one index repeated: virtual ranks there).
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  int expert_parallel = 0;
  std::vector<int> devices;
  // With pipeline stages: each stage's layers (parse_stage_layers; balanced by measured time on
  // the CPU backend only).
  StageLayers stage_layers;
  std::string cuda_options;  // cuda: settings, see parse_cuda_options
};

// The CUDA backend's settings, as --cuda-options gives them: comma-separated, each name=value or a
// bare name (its first value below). graphs, small_batch_gemv, fused_small_batch, fused_rope,
// fused_combine and fused_all_reduce take on or off; rank_collectives takes nccl or peer;
// decode_attention takes tensor_core, cuda_core or prefill_tiles; programmatic_launch takes on, off
// or auto; prefetch_weights takes 8mb, off, 4mb or 16mb; moe_experts takes auto, gemv or
// grouped_gemm; moe_gemm_warps takes auto, 32x32, 64x64 or warpgroup; moe_router_tiles and
// moe_combine take on or off. Errors name the setting at fault.
using CudaSettings = std::vector<std::pair<std::string, std::string>>;
// Every setting and the values it takes (the first: what a bare name means), and the flag's help.
struct CudaSetting {
  std::string name;
  std::vector<std::string> values;
};
const std::vector<CudaSetting>& cuda_settings();
std::string cuda_options_help();
[[nodiscard]] Result<CudaSettings> parse_cuda_options(const std::string& text);
// Every setting of the CUDA backend, name=value, once `cuda_options` is applied to the defaults
// (what the backend logs as backend.cuda_settings when it starts); empty without the CUDA backend.
[[nodiscard]] Result<std::string> describe_cuda_options(const std::string& cuda_options);
#ifdef HEADROOM_HAVE_CUDA
struct CudaBackendOptions;
// The same name=value list for a CUDA backend's options as they are (what --cuda-options would
// give them): a benchmark names the settings it measured.
std::string describe_cuda_backend_options(const CudaBackendOptions& options);
#endif

// Validates the device string alone (for config validation before loading anything).
[[nodiscard]] Status check_device(const std::string& device);
// The GPU indexes of a comma-separated list ("0,1,2,3"; --devices); errors name devices.
[[nodiscard]] Result<std::vector<int>> parse_device_list(const std::string& text);
// --stage-layers: "auto" (the stages balanced by measured time: empty list, balance true),
// "even" (as even as they go: empty, false) or each stage's layer count ("30,34"); errors name
// stage-layers.
[[nodiscard]] Result<StageLayers> parse_stage_layers(const std::string& text);
// Loads the Hugging Face folder `model_dir` onto the device: the CPU backend reads fp32 weights,
// the CUDA backend uploads bf16 straight from the safetensors files.
[[nodiscard]] Result<std::shared_ptr<Backend>> make_backend(const std::string& model_dir,
                                                            const BackendSpec& spec);

}  // namespace hr::engine
