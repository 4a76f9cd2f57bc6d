// Picks and builds the compute backend named by the worker's --device option: "cpu", or "cuda" /
// "cuda:N" when the CUDA backend is compiled in (a clear error naming --device otherwise).
#pragma once

#include <memory>
#include <string>

#include "base/status.h"
#include "engine/backend.h"
#include "engine/weights.h"

namespace hr::engine {

struct BackendSpec {
  std::string device = "cpu";  // cpu | cuda | cuda:N
  int block_size = 16;
  size_t kv_cache_bytes = 64ull << 20;  // on cuda, 0: 90% of the device memory left after loading
  int max_num_tokens = 8192;            // per step (cuda activation buffers)
  int max_num_seqs = 256;               // per step
  int cpu_thread_nice = 0;              // cpu: nice value of the backend's pool threads
};

// Validates the device string alone (for config validation before loading anything).
[[nodiscard]] Status check_device(const std::string& device);
// Loads the Hugging Face folder `model_dir` onto the device: the CPU backend reads fp32 weights,
// the CUDA backend uploads bf16 straight from the safetensors files.
[[nodiscard]] Result<std::shared_ptr<Backend>> make_backend(const std::string& model_dir,
                                                            const BackendSpec& spec);

}  // namespace hr::engine
