// RoPE + KV cache write: blocks per token (grid.y shares its heads out, so that a decode step
// of one token is several blocks); each thread rotates (head, pair) elements.
#include "kernels/internal/common.cuh"
#include "kernels/internal/norm_rope_head.cuh"
#include "kernels/rope_kv.cuh"

namespace hr::kernels {
namespace {

__global__ void rope_write_kv_kernel(RopeKvParams p) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  const int t = blockIdx.x;
  const int hd = p.head_dim, half = hd / 2;
  const int q_size = p.num_heads * hd, kv_size = p.num_kv_heads * hd;
  const int width = q_size + 2 * kv_size;
  const float* row = p.qkv + static_cast<size_t>(t) * width;
  const float pos = static_cast<float>(p.positions[t]);
  const size_t slot = static_cast<size_t>(p.slot_mapping[t]) * kv_size;
  if (p.q_norm) {
    // A warp per head: its sum of squares, then the normalised pairs rotated.
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, warps = blockDim.x / 32;
    for (int h = blockIdx.y * warps + warp; h < p.num_heads + p.num_kv_heads;
         h += warps * gridDim.y) {
      const int base = h * hd;
      __nv_bfloat16* out = h < p.num_heads ? p.q_out + static_cast<size_t>(t) * q_size + base
                                           : p.k_cache + slot + (base - q_size);
      internal::norm_rope_head(
          [&](int i) { return row[base + i]; }, p.bias ? p.bias + base : nullptr,
          h < p.num_heads ? p.q_norm : p.k_norm, hd, p.eps, pos, p.inv_freq, out, lane);
    }
  }
  // Rotations: query heads, then key heads.
  const int num_pairs = p.q_norm ? 0 : (p.num_heads + p.num_kv_heads) * half;
  const int first = blockIdx.y * blockDim.x + threadIdx.x, step = blockDim.x * gridDim.y;
  for (int e = first; e < num_pairs; e += step) {
    const int h = e / half, i = e % half;
    const int base = h * hd;  // key heads follow the query heads in the row
    float a = row[base + i], b = row[base + i + half];
    if (p.bias) {
      a += p.bias[base + i];
      b += p.bias[base + i + half];
    }
    float s, c;
    sincosf(pos * p.inv_freq[i], &s, &c);
    const float ra = a * c - b * s, rb = b * c + a * s;
    if (h < p.num_heads) {
      __nv_bfloat16* q = p.q_out + static_cast<size_t>(t) * q_size + base;
      q[i] = __float2bfloat16_rn(ra);
      q[i + half] = __float2bfloat16_rn(rb);
    } else {
      __nv_bfloat16* k = p.k_cache + slot + (base - q_size);
      k[i] = __float2bfloat16_rn(ra);
      k[i + half] = __float2bfloat16_rn(rb);
    }
  }
  for (int e = first; e < kv_size; e += step) {
    float v = row[q_size + kv_size + e];
    if (p.bias) v += p.bias[q_size + kv_size + e];
    p.v_cache[slot + e] = __float2bfloat16_rn(v);
  }
}

}  // namespace

cudaError_t rope_write_kv(const RopeKvParams& p, cudaStream_t stream) {
  if (p.num_tokens < 0 || p.num_heads <= 0 || p.num_kv_heads <= 0 || p.head_dim <= 0 ||
      p.head_dim % 2 != 0 || p.num_heads % p.num_kv_heads != 0) {
    return cudaErrorInvalidValue;
  }
  if (!p.qkv || !p.positions || !p.slot_mapping || !p.inv_freq || !p.q_out || !p.k_cache ||
      !p.v_cache || (p.q_norm == nullptr) != (p.k_norm == nullptr)) {
    return cudaErrorInvalidValue;
  }
  if (p.num_tokens == 0) return cudaSuccess;
  // A block per 8 heads of a token (a warp each where the heads are normalised).
  const int head_blocks = (p.num_heads + p.num_kv_heads + 7) / 8;
  return internal::launch(rope_write_kv_kernel, dim3(p.num_tokens, head_blocks), dim3(256), 0,
                          stream, p);
}

}  // namespace hr::kernels
