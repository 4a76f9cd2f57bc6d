// The CPU stand-in for the CUDA runtime itself: what it must catch (a barrier or warp operation
// some threads miss, a read of a cp.async tile before its wait, a read outside a buffer, a race
// that one thread order hides, a programmatic launch some thread of which never waits) and what it
// must compute (shuffles, ballots, mma.sync against a plain product).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/internal/common.cuh"
#include "kernels/internal/mma.cuh"

namespace {

template <typename... Params, typename... Args>
cudaError_t run(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, Args... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

// The same with programmatic stream serialisation.
template <typename... Params, typename... Args>
cudaError_t run_programmatic(void (*kernel)(Params...), dim3 grid, dim3 block, Args... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, args...);
}

template <typename T>
std::vector<T> get(const T* d, size_t n) {
  std::vector<T> v(n);
  EXPECT_EQ(cudaMemcpy(v.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
  return v;
}

// Thread 0 writes a value every thread then reads with no barrier between: forward order hides
// the race (thread 0 runs first), reverse order shows it.
__global__ void unsynchronised_broadcast(int* out) {
  __shared__ int value;
  if (threadIdx.x == 0) value = 42;
  out[threadIdx.x] = value;
  __syncthreads();
  if (threadIdx.x == 0) value = 0;  // (for the next launch)
}

TEST(SimtTest, ARaceShowsInOneOfTheTwoOrders) {
  int* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 64 * sizeof(int)), cudaSuccess);
  hr::simt::set_reverse_order(false);
  ASSERT_EQ(run(unsynchronised_broadcast, dim3(1), dim3(64), 0, out), cudaSuccess);
  const std::vector<int> forward = get(out, 64);
  hr::simt::set_reverse_order(true);
  ASSERT_EQ(run(unsynchronised_broadcast, dim3(1), dim3(64), 0, out), cudaSuccess);
  const std::vector<int> reverse = get(out, 64);
  hr::simt::set_reverse_order(false);
  EXPECT_EQ(forward, std::vector<int>(64, 42));
  EXPECT_NE(reverse, forward);
  cudaFree(out);
}

__global__ void barrier_half_the_block_skips(int* out) {
  if (threadIdx.x < 32) __syncthreads();
  out[threadIdx.x] = 1;
}

__global__ void shuffle_half_the_warp_skips(int* out) {
  int v = threadIdx.x;
  if (threadIdx.x < 16) v = __shfl_xor_sync(0xffffffffu, v, 1);
  out[threadIdx.x] = v;
}

__global__ void read_past_the_end(const int* in, int* out) {
  out[threadIdx.x] = in[threadIdx.x + 1];
}

__global__ void waits_then_writes(int* out) {
  hr::kernels::internal::pdl_wait();
  out[threadIdx.x] = 1;
}

__global__ void writes_without_waiting(int* out) {
  if (threadIdx.x > 0) hr::kernels::internal::pdl_wait();
  out[threadIdx.x] = 1;
}

TEST(SimtTest, AProgrammaticLaunchWhoseThreadsDoNotAllWaitFails) {
  int* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 64 * sizeof(int)), cudaSuccess);
  EXPECT_EQ(run_programmatic(waits_then_writes, dim3(2), dim3(64), out), cudaSuccess);
  EXPECT_EQ(run_programmatic(writes_without_waiting, dim3(2), dim3(64), out),
            cudaErrorLaunchFailure);
  EXPECT_EQ(run(writes_without_waiting, dim3(2), dim3(64), 0, out),
            cudaSuccess);  // (not programmatic)
  cudaGetLastError();
  cudaFree(out);
}

TEST(SimtTest, WhatAGpuWouldHangOrFaultOnFailsTheLaunch) {
  int *in = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMalloc(&in, 64 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, 64 * sizeof(int)), cudaSuccess);
  EXPECT_EQ(run(barrier_half_the_block_skips, dim3(1), dim3(64), 0, out), cudaErrorLaunchFailure);
  EXPECT_EQ(run(shuffle_half_the_warp_skips, dim3(1), dim3(32), 0, out), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);  // sticky until reported
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_DEATH(run(read_past_the_end, dim3(1), dim3(64), 0, in, out), "");
  cudaFree(in);
  cudaFree(out);
}

__global__ void warp_ops(int* out) {
  const int lane = threadIdx.x % 32;
  const int from_3 = __shfl_sync(0xffffffffu, lane * 10, 3);
  const int up = __shfl_up_sync(0xffffffffu, lane, 1);
  const unsigned odd = __ballot_sync(0xffffffffu, lane % 2);
  out[threadIdx.x * 3] = from_3;
  out[threadIdx.x * 3 + 1] = up;
  out[threadIdx.x * 3 + 2] = static_cast<int>(odd);
}

TEST(SimtTest, ShufflesAndBallotsExchangeAmongAWarp) {
  int* out = nullptr;
  ASSERT_EQ(cudaMalloc(&out, 64 * 3 * sizeof(int)), cudaSuccess);
  ASSERT_EQ(run(warp_ops, dim3(1), dim3(64), 0, out), cudaSuccess);
  const std::vector<int> v = get(out, 64 * 3);
  for (int t = 0; t < 64; ++t) {
    const int lane = t % 32;
    EXPECT_EQ(v[t * 3], 30) << t;
    EXPECT_EQ(v[t * 3 + 1], lane == 0 ? 0 : lane - 1) << t;  // lane 0 keeps its own
    EXPECT_EQ(static_cast<unsigned>(v[t * 3 + 2]), 0xaaaaaaaau) << t;
  }
  cudaFree(out);
}

// A 16-byte copy into shared memory, read before and after its group is waited for.
__global__ void copy_then_read(const float* in, float* out) {
  HR_DYNAMIC_SMEM(float, s, 16);
  hr::kernels::internal::cp_async16(s + threadIdx.x * 4, in + threadIdx.x * 4, true);
  hr::kernels::internal::cp_async_commit();
  out[threadIdx.x * 2] = s[threadIdx.x * 4];
  hr::kernels::internal::cp_async_wait<0>();
  out[threadIdx.x * 2 + 1] = s[threadIdx.x * 4];
}

TEST(SimtTest, ACopyIsSeenOnlyAfterItsWait) {
  std::vector<float> host(32 * 4);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<float>(i);
  float *in = nullptr, *out = nullptr;
  ASSERT_EQ(cudaMalloc(&in, host.size() * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&out, 64 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(in, host.data(), host.size() * sizeof(float), cudaMemcpyHostToDevice),
            cudaSuccess);
  ASSERT_EQ(run(copy_then_read, dim3(1), dim3(32), 32 * 4 * sizeof(float), in, out), cudaSuccess);
  const std::vector<float> v = get(out, 64);
  for (int t = 0; t < 32; ++t) {
    EXPECT_TRUE(std::isnan(v[t * 2])) << t << ": read before the wait";
    EXPECT_EQ(v[t * 2 + 1], static_cast<float>(t * 4)) << t;
  }
  // More than 48 KiB of dynamic shared memory needs the kernel's limit raised first.
  EXPECT_EQ(run(copy_then_read, dim3(1), dim3(32), 64 << 10, in, out), cudaErrorInvalidValue);
  cudaFree(in);
  cudaFree(out);
}

// C = A B through ldmatrix fragments and mma.sync: A 16x16 row-major, B 16x8 stored as its
// transpose (8 rows of 16), both bf16 in shared memory.
__global__ void one_mma(const __nv_bfloat16* a, const __nv_bfloat16* bt, float* c) {
  HR_DYNAMIC_SMEM(__nv_bfloat16, s, 16);
  const int lane = threadIdx.x;
  for (int i = lane; i < 16 * 16; i += 32) s[i] = a[i];
  for (int i = lane; i < 8 * 16; i += 32) s[256 + i] = bt[i];
  __syncwarp();
  uint32_t fa[4];
  hr::kernels::internal::ldmatrix_x4(
      fa, s + ((lane % 8) + ((lane / 8) % 2) * 8) * 16 + (lane / 16) * 8);
  const __nv_bfloat16* bp = s + 256 + (lane / 4) * 16 + (lane % 4) * 2;
  float acc[4] = {0, 0, 0, 0};
  hr::kernels::internal::mma16816(acc, fa, *reinterpret_cast<const uint32_t*>(bp),
                                  *reinterpret_cast<const uint32_t*>(bp + 8));
  const int g = lane / 4, t = lane % 4;
  c[g * 8 + 2 * t] = acc[0];
  c[g * 8 + 2 * t + 1] = acc[1];
  c[(g + 8) * 8 + 2 * t] = acc[2];
  c[(g + 8) * 8 + 2 * t + 1] = acc[3];
}

TEST(SimtTest, MmaThroughFragmentsIsTheProduct) {
  std::vector<__nv_bfloat16> a(256), bt(128);
  std::vector<float> af(256), btf(128);
  for (int i = 0; i < 256; ++i) {
    a[i] = __float2bfloat16_rn(static_cast<float>((i * 7) % 13 - 6));
    af[i] = __bfloat162float(a[i]);
  }
  for (int i = 0; i < 128; ++i) {
    bt[i] = __float2bfloat16_rn(static_cast<float>((i * 5) % 11 - 5));
    btf[i] = __bfloat162float(bt[i]);
  }
  __nv_bfloat16 *da = nullptr, *db = nullptr;
  float* dc = nullptr;
  ASSERT_EQ(cudaMalloc(&da, sizeof(__nv_bfloat16) * 256), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&db, sizeof(__nv_bfloat16) * 128), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&dc, sizeof(float) * 128), cudaSuccess);
  cudaMemcpy(da, a.data(), sizeof(__nv_bfloat16) * 256, cudaMemcpyHostToDevice);
  cudaMemcpy(db, bt.data(), sizeof(__nv_bfloat16) * 128, cudaMemcpyHostToDevice);
  ASSERT_EQ(run(one_mma, dim3(1), dim3(32), sizeof(__nv_bfloat16) * 384, da, db, dc), cudaSuccess);
  const std::vector<float> c = get(dc, 128);
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 8; ++j) {
      float ref = 0;
      for (int k = 0; k < 16; ++k) ref += af[i * 16 + k] * btf[j * 16 + k];
      EXPECT_EQ(c[i * 8 + j], ref) << i << "," << j;
    }
  }
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
}

}  // namespace
