// Launching the attention kernels (internal to kernels/): one block per (work item, KV head), a
// kernel instantiated for each supported head_dim.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "kernels/internal/common.cuh"
#include "kernels/paged_attention.cuh"

namespace hr::kernels::internal {

// Calls f(std::integral_constant<int, head_dim>) for head_dim 32, 64 or 128.
template <typename F>
cudaError_t for_head_dim(int head_dim, F&& f) {
  switch (head_dim) {
    case 32:
      return f(std::integral_constant<int, 32>{});
    case 64:
      return f(std::integral_constant<int, 64>{});
    case 128:
      return f(std::integral_constant<int, 128>{});
    default:
      return cudaErrorInvalidValue;
  }
}

// Runs Kernel(p, items) on a (num_items, num_kv_heads) grid of `threads`-thread blocks with
// `smem` bytes of dynamic shared memory.
template <auto Kernel>
cudaError_t launch_attention(const PagedAttentionParams& p, const AttentionWorkItem* items,
                             int num_items, int threads, size_t smem, cudaStream_t stream) {
  cudaError_t err = allow_dynamic_smem<Kernel>(smem);
  if (err != cudaSuccess) return err;
  return launch(Kernel, dim3(num_items, p.num_kv_heads), dim3(threads), smem, stream, p, items);
}

}  // namespace hr::kernels::internal
