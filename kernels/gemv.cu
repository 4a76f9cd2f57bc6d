// GEMV for few rows: one warp per output column n; each lane streams 16-byte pieces of w's row n
// (eight in flight, marked evict-first) and multiplies them with the same pieces of every x row (small, cached).
#include "kernels/gemv.cuh"
#include "kernels/internal/common.cuh"

namespace hr::kernels {
namespace {

constexpr int kWarpsPerBlock = 8;
constexpr int kUnroll = 8;

template <int M>
__global__ void __launch_bounds__(kWarpsPerBlock * 32) gemv_kernel(const __nv_bfloat16* x, const __nv_bfloat16* w,
                                                                   void* y, bool y_bf16, int n, int k) {
  internal::pdl_launch_dependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int col = blockIdx.x * kWarpsPerBlock + warp;
  if (col >= n) return;
  const uint4* wrow = reinterpret_cast<const uint4*>(w + static_cast<size_t>(col) * k);
  const int num_vec = k / 8;
  // The weights are constant: pull this warp's first pieces into L2 while the previous kernel ends.
#pragma unroll
  for (int u = 0; u < kUnroll; ++u) {
    if (lane + 32 * u < num_vec) asm volatile("prefetch.global.L2 [%0];\n" ::"l"(wrow + lane + 32 * u));
  }
  internal::pdl_wait();
  float acc[M];
#pragma unroll
  for (int i = 0; i < M; ++i) acc[i] = 0.0f;
  int v = lane;
  for (; v + 32 * (kUnroll - 1) < num_vec; v += 32 * kUnroll) {
    uint4 wv[kUnroll];
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) wv[u] = __ldcs(wrow + v + 32 * u);  // streamed: read once
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      float wf[8];
      internal::bf16x8_to_float(wv[u], wf);
#pragma unroll
      for (int i = 0; i < M; ++i) {
        float xf[8];
        internal::bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(x + static_cast<size_t>(i) * k) + v + 32 * u), xf);
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i] += wf[j] * xf[j];
      }
    }
  }
  for (; v < num_vec; v += 32) {
    float wf[8];
    internal::bf16x8_to_float(__ldcs(wrow + v), wf);
#pragma unroll
    for (int i = 0; i < M; ++i) {
      float xf[8];
      internal::bf16x8_to_float(__ldg(reinterpret_cast<const uint4*>(x + static_cast<size_t>(i) * k) + v), xf);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[i] += wf[j] * xf[j];
    }
  }
#pragma unroll
  for (int i = 0; i < M; ++i) {
    const float s = internal::warp_sum(acc[i]);
    if (lane == 0) {
      const size_t at = static_cast<size_t>(i) * n + col;
      if (y_bf16) {
        reinterpret_cast<__nv_bfloat16*>(y)[at] = __float2bfloat16_rn(s);
      } else {
        reinterpret_cast<float*>(y)[at] = s;
      }
    }
  }
}

template <int M>
cudaError_t launch(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, bool y_bf16, int n, int k,
                   cudaStream_t stream) {
  const int blocks = (n + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return internal::launch(gemv_kernel<M>, dim3(blocks), dim3(kWarpsPerBlock * 32), 0, stream, x, w, y, y_bf16, n, k);
}

}  // namespace

cudaError_t gemv(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, bool y_bf16, int m, int n, int k,
                 cudaStream_t stream) {
  if (m < 1 || m > kGemvMaxRows || n < 1 || k < 8 || k % 8 != 0 || !x || !w || !y) return cudaErrorInvalidValue;
  if (!internal::aligned16(x) || !internal::aligned16(w)) return cudaErrorMisalignedAddress;
  switch (m) {
    case 1: return launch<1>(x, w, y, y_bf16, n, k, stream);
    case 2: return launch<2>(x, w, y, y_bf16, n, k, stream);
    case 3: return launch<3>(x, w, y, y_bf16, n, k, stream);
    case 4: return launch<4>(x, w, y, y_bf16, n, k, stream);
    case 5: return launch<5>(x, w, y, y_bf16, n, k, stream);
    case 6: return launch<6>(x, w, y, y_bf16, n, k, stream);
    case 7: return launch<7>(x, w, y, y_bf16, n, k, stream);
    default: return launch<8>(x, w, y, y_bf16, n, k, stream);
  }
}

}  // namespace hr::kernels
