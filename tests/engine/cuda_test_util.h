// Helpers shared by the kernel tests: device buffers, random inputs, and the skip without a GPU.
// The sampling tests also build against the CPU stand-in for the CUDA runtime (simt/, where
// HEADROOM_SIMT is defined): there the "device" is always present.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <vector>

#include "engine/safetensors.h"

#ifdef HEADROOM_SIMT
#define SKIP_WITHOUT_GPU() (void)0
#else
#include "engine/device.h"
#define SKIP_WITHOUT_GPU() \
  if (::hr::engine::list_gpus().empty()) GTEST_SKIP() << "no CUDA device present"
#endif

namespace hr::engine {

#ifdef HEADROOM_SIMT
constexpr bool kOnSimt = true;
#else
constexpr bool kOnSimt = false;
#endif

// Draws for the statistical checks: a quarter on the CPU stand-in, where a row costs about a
// millisecond of fiber switches (the checks hold at either count).
constexpr int kDrawDivisor = kOnSimt ? 4 : 1;

// Rounds in place to bf16 and returns the bits.
inline std::vector<uint16_t> to_bf16(std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) {
    out[i] = f32_to_bf16(v[i]);
    v[i] = bf16_to_f32(out[i]);
  }
  return out;
}

inline std::vector<float> bf16_to_float(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f32(v[i]);
  return out;
}

inline std::vector<float> random_vec(size_t n, std::mt19937& rng, float lo = -1.0f,
                                     float hi = 1.0f) {
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

// A device buffer holding a copy of a host vector; poisoned with 0xFF bytes when empty-initialised.
template <typename T>
struct DeviceBuffer {
  T* ptr = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(&ptr, std::max<size_t>(1, n) * sizeof(T)), cudaSuccess);
    cudaMemset(ptr, 0xFF, n * sizeof(T));
  }
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size()) {
    cudaMemcpy(ptr, v.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { cudaFree(ptr); }
  std::vector<T> get() const {
    std::vector<T> v(n);
    EXPECT_EQ(cudaMemcpy(v.data(), ptr, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

}  // namespace hr::engine
