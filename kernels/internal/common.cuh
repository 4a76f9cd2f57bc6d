// Device helpers shared by the kernels: bf16 vector loads, warp and block reductions. Internal to
// kernels/ (included only by .cu files).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <utility>

#include <cstdint>

#include "kernels/launch.cuh"

// Declares `name`, the kernel's dynamic shared memory as an array of `type`, aligned to `align`
// bytes. (The CPU stand-in for the CUDA runtime, simt/, defines it first, as its own
// per-block buffer.)
#ifndef HR_DYNAMIC_SMEM
#define HR_DYNAMIC_SMEM(type, name, align) \
  extern __shared__ __align__(align)       \
  type name[]
#endif

namespace hr::kernels::internal {

// Eight bf16 values (16 bytes) to floats.
__device__ __forceinline__ void bf16x8_to_float(const uint4& raw, float* out) {
  const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    float2 f = __bfloat1622float2(h[i]);
    out[2 * i] = f.x;
    out[2 * i + 1] = f.y;
  }
}

__device__ __forceinline__ uint4 float_to_bf16x8(const float* in) {
  uint4 raw;
  __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&raw);
#pragma unroll
  for (int i = 0; i < 4; ++i) h[i] = __floats2bfloat162_rn(in[2 * i], in[2 * i + 1]);
  return raw;
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Inclusive prefix sum over the warp's lanes, in lane order (a fixed order: same inputs, same
// sums).
__device__ __forceinline__ float warp_inclusive_scan(float v) {
  const int lane = threadIdx.x % 32;
#pragma unroll
  for (int o = 1; o < 32; o <<= 1) {
    const float n = __shfl_up_sync(0xffffffffu, v, o);
    if (lane >= o) v += n;
  }
  return v;
}

// Sum over the block; every thread gets the result. `scratch` holds 32 floats; blockDim.x is a
// multiple of 32.
__device__ __forceinline__ float block_sum(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
  v = warp_sum(v);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < num_warps ? scratch[lane] : 0.0f;
  return warp_sum(v);
}

__device__ __forceinline__ float block_max(float v, float* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, num_warps = blockDim.x / 32;
  v = warp_max(v);
  __syncthreads();
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  v = lane < num_warps ? scratch[lane] : -INFINITY;
  return warp_max(v);
}

// Programmatic dependent launch: lets the next kernel in the stream be scheduled now, and waits
// until the previous kernel has finished and its writes are visible. No-ops before sm_90 and for
// kernels launched without the attribute. Short kernels let the next one in at once; kernels that
// stream much memory (GEMV, attention) only near the end of their main loop: a kernel let in early
// lets in its own successor as soon as it starts, and a chain of waiting kernels holds SM slots
// and fills L2 with prefetches far ahead of their use.
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(HEADROOM_SIMT)
  ::hr::simt::pdl_wait();  // (checks that every thread of a programmatic launch waits)
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#endif
}

// Flags between GPUs (kernels/peer_collectives.cu): a load that later loads cannot pass and a
// store that earlier stores cannot pass, at system scope (peers over NVLink or PCIe), and the
// global nanosecond timer.
__device__ __forceinline__ uint32_t load_acquire_sys(const uint32_t* p) {
#if defined(HEADROOM_SIMT)
  return __atomic_load_n(p, __ATOMIC_ACQUIRE);
#else
  uint32_t v;
  asm volatile("ld.acquire.sys.global.u32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
#endif
}
__device__ __forceinline__ void store_release_sys(uint32_t* p, uint32_t v) {
#if defined(HEADROOM_SIMT)
  __atomic_store_n(p, v, __ATOMIC_RELEASE);
#else
  asm volatile("st.release.sys.global.u32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
#endif
}
__device__ __forceinline__ int64_t global_timer_ns() {
#if defined(HEADROOM_SIMT)
  return ::hr::simt::now_ns();
#else
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
  return static_cast<int64_t>(t);
#endif
}

// Pulls the 16-byte-aligned range [p, p + bytes) into L2 (bytes a multiple of 16, under 4 GiB):
// one bulk prefetch on sm_90, one line of 128 bytes per lane of the warp elsewhere (the whole warp
// calls it there). On the CPU stand-in (simt/), a range outside every allocation fails.
__device__ __forceinline__ void prefetch_l2_range(const void* p, size_t bytes, int lane) {
#if defined(HEADROOM_SIMT)
  if (lane == 0 && ((reinterpret_cast<uintptr_t>(p) & 15u) != 0 || bytes % 16 != 0)) {
    ::hr::simt::fault("L2 bulk prefetch not in 16-byte pieces");
  }
  if (lane == 0) ::hr::simt::check_device_range(p, bytes, "L2 prefetch");
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (lane == 0) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(p),
                 "r"(static_cast<uint32_t>(bytes))
                 : "memory");
  }
#else
  for (size_t off = static_cast<size_t>(lane) * 128; off < bytes; off += 32 * 128) {
    asm volatile("prefetch.global.L2 [%0];\n" ::"l"(static_cast<const char*>(p) + off));
  }
#endif
}

// Pulls the line holding p into L2.
__device__ __forceinline__ void prefetch_l2(const void* p) {
#if defined(HEADROOM_SIMT)
  ::hr::simt::check_device_range(p, 1, "L2 prefetch");
#else
  asm volatile("prefetch.global.L2 [%0];\n" ::"l"(p));
#endif
}

// Launches `kernel` on `stream`, with programmatic stream serialisation when it is switched on.
template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = programmatic_launch() ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

// What ask(device) says (yes or no) of the current device, asked once per device and kept; false
// when the current device cannot be read. Each call site's lambda keeps answers of its own.
template <typename Ask>
bool once_per_device(Ask ask) {
  constexpr int kMaxDevices = 64;
  static std::atomic<int> known[kMaxDevices];  // 0: not asked yet, 1: yes, 2: no
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return false;
  const bool kept = device >= 0 && device < kMaxDevices;
  if (kept) {
    if (int k = known[device].load(std::memory_order_relaxed); k != 0) return k == 1;
  }
  const bool yes = ask(device);
  if (kept) known[device].store(yes ? 1 : 2, std::memory_order_relaxed);
  return yes;
}

// Raises `Kernel`'s dynamic shared-memory limit to `bytes` on the current device, once per device.
template <auto Kernel>
cudaError_t allow_dynamic_smem(size_t bytes) {
  constexpr int kMaxDevices = 64;
  static std::atomic<bool> done[kMaxDevices];
  int dev = 0;
  cudaError_t err = cudaGetDevice(&dev);
  if (err != cudaSuccess) return err;
  if (dev < kMaxDevices && done[dev].load(std::memory_order_acquire)) return cudaSuccess;
  err = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(bytes));
  if (err == cudaSuccess && dev < kMaxDevices) done[dev].store(true, std::memory_order_release);
  return err;
}

// A 64-bit mix (splitmix64's finaliser): counter-based random numbers for fills and sampling.
__device__ __forceinline__ uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace hr::kernels::internal
