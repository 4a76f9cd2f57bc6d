// Collectives between GPUs over peer pointers, their block-by-block barriers, and the mailboxes of
// the pipeline hand-offs.
#include <algorithm>

#include "kernels/internal/common.cuh"
#include "kernels/peer_collectives.cuh"

namespace hr::kernels {
namespace {

constexpr int kThreads = 512;

__device__ __forceinline__ bool is_aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

// Whether a count that wraps has reached `target`.
__device__ __forceinline__ bool reached(uint32_t value, uint32_t target) {
  return static_cast<int32_t>(value - target) >= 0;
}

// Waits until *flag reaches target. Past the timeout the kernel fails: a trap on a GPU (the
// context is lost, the process learns of it at its next synchronisation), a fault here.
__device__ void wait_flag(const uint32_t* flag, uint32_t target, int64_t timeout_ns) {
  const int64_t start = timeout_ns > 0 ? internal::global_timer_ns() : 0;
  while (!reached(internal::load_acquire_sys(flag), target)) {
#if defined(HEADROOM_SIMT)
    ::hr::simt::spin_pause();
#endif
    if (timeout_ns > 0 && internal::global_timer_ns() - start > timeout_ns) {
#if defined(HEADROOM_SIMT)
      ::hr::simt::fault("a peer collective waited past its timeout: a peer never arrived");
      return;
#else
      __trap();
#endif
    }
  }
}

// Block blockIdx.x meets the same block of every rank: its writes before are visible to theirs
// after. Thread i < N raises this rank's flag in rank i's memory and waits for rank i's in its own.
__device__ void barrier(const PeerGroup& g) {
  __syncthreads();
  const int b = blockIdx.x;
  const uint32_t target = g.passed[b] + 1;
  if (static_cast<int>(threadIdx.x) < g.num_ranks) {
    const int peer = threadIdx.x;
    __threadfence_system();
    internal::store_release_sys(g.flags[peer] + b * kMaxPeerRanks + g.rank, target);
    wait_flag(g.flags[g.rank] + b * kMaxPeerRanks + peer, target, g.timeout_ns);
  }
  __syncthreads();
  if (threadIdx.x == 0) g.passed[b] = target;
}

// Unit u of an array of n floats: its elements [4u, 4u + 4) below n (absent ones read as 0).
__device__ __forceinline__ float4 load_unit(const float* p, size_t u, size_t n) {
  const size_t e = 4 * u;
  if (e + 4 <= n && is_aligned16(p + e)) return *reinterpret_cast<const float4*>(p + e);
  float v[4];
  for (int k = 0; k < 4; ++k) v[k] = e + k < n ? p[e + k] : 0.0f;
  return make_float4(v[0], v[1], v[2], v[3]);
}

__device__ __forceinline__ void store_unit(float* p, size_t u, size_t n, const float4& s) {
  const size_t e = 4 * u;
  if (e + 4 <= n && is_aligned16(p + e)) {
    *reinterpret_cast<float4*>(p + e) = s;
    return;
  }
  const float v[4] = {s.x, s.y, s.z, s.w};
  for (int k = 0; k < 4; ++k) {
    if (e + k < n) p[e + k] = v[k];
  }
}

// A peer's staged unit, past the L1 cache (the peer wrote it since this SM last read the line).
__device__ __forceinline__ float4 staged(const char* staging, size_t u) {
  return __ldcg(reinterpret_cast<const float4*>(staging) + u);
}

__device__ __forceinline__ void add(float4& s, const float4& v) {
  s.x += v.x;
  s.y += v.y;
  s.z += v.z;
  s.w += v.w;
}

// Rank order: rank 0's unit plus rank 1's plus ... (as peer_sum adds them).
__device__ __forceinline__ float4 sum_staged(const PeerGroup& g, size_t offset, size_t u) {
  float4 s = staged(g.staging[0] + offset, u);
  for (int r = 1; r < g.num_ranks; ++r) add(s, staged(g.staging[r] + offset, u));
  return s;
}

__device__ __forceinline__ size_t first_unit() {
  return static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ __forceinline__ size_t unit_stride() {
  return static_cast<size_t>(gridDim.x) * blockDim.x;
}

__global__ void all_reduce_one_shot_kernel(PeerGroup g, float* data, size_t n) {
  internal::pdl_wait();
  const size_t units = (n + 3) / 4;
  float4* mine = reinterpret_cast<float4*>(g.staging[g.rank]);
  for (size_t u = first_unit(); u < units; u += unit_stride()) mine[u] = load_unit(data, u, n);
  barrier(g);
  for (size_t u = first_unit(); u < units; u += unit_stride())
    store_unit(data, u, n, sum_staged(g, 0, u));
  barrier(g);
}

// Units cut into N segments of `seg`: block b handles the same units of each segment, so the
// segment a peer's block b reduced is what this rank's block b gathers.
__global__ void all_reduce_two_shot_kernel(PeerGroup g, float* data, size_t n) {
  internal::pdl_wait();
  const size_t units = (n + 3) / 4;
  const size_t seg = (units + g.num_ranks - 1) / g.num_ranks;
  float4* in = reinterpret_cast<float4*>(g.staging[g.rank]);
  float4* reduced = reinterpret_cast<float4*>(g.staging[g.rank] + g.capacity);
  for (size_t j = first_unit(); j < seg; j += unit_stride()) {
    for (int p = 0; p < g.num_ranks; ++p) {
      const size_t u = p * seg + j;
      if (u < units) in[u] = load_unit(data, u, n);
    }
  }
  barrier(g);
  for (size_t j = first_unit(); j < seg; j += unit_stride()) {
    const size_t u = g.rank * seg + j;
    if (u < units) reduced[u] = sum_staged(g, 0, u);
  }
  barrier(g);
  for (size_t j = first_unit(); j < seg; j += unit_stride()) {
    for (int p = 0; p < g.num_ranks; ++p) {
      const size_t u = p * seg + j;
      if (u < units) store_unit(data, u, n, staged(g.staging[p] + g.capacity, u));
    }
  }
  barrier(g);
}

__global__ void all_gather_kernel(PeerGroup g, const float* in, float* out, size_t n,
                                  size_t stride) {
  internal::pdl_wait();
  const size_t units = (n + 3) / 4;
  float4* mine = reinterpret_cast<float4*>(g.staging[g.rank]);
  for (size_t u = first_unit(); u < units; u += unit_stride()) mine[u] = load_unit(in, u, n);
  barrier(g);
  for (size_t u = first_unit(); u < units; u += unit_stride()) {
    for (int p = 0; p < g.num_ranks; ++p)
      store_unit(out + p * stride, u, n, staged(g.staging[p], u));
  }
  barrier(g);
}

// Staging holds rank p's share of the input at p * units (units of 4 floats).
__global__ void reduce_scatter_kernel(PeerGroup g, const float* in, float* out, size_t n,
                                      size_t stride) {
  internal::pdl_wait();
  const size_t units = (n + 3) / 4;
  float4* mine = reinterpret_cast<float4*>(g.staging[g.rank]);
  for (size_t u = first_unit(); u < units; u += unit_stride()) {
    for (int p = 0; p < g.num_ranks; ++p) mine[p * units + u] = load_unit(in + p * stride, u, n);
  }
  barrier(g);
  for (size_t u = first_unit(); u < units; u += unit_stride())
    store_unit(out, u, n, sum_staged(g, 0, g.rank * units + u));
  barrier(g);
}

__global__ void broadcast_kernel(PeerGroup g, float* data, size_t n, int root) {
  internal::pdl_wait();
  const size_t units = (n + 3) / 4;
  if (g.rank == root) {
    float4* mine = reinterpret_cast<float4*>(g.staging[g.rank]);
    for (size_t u = first_unit(); u < units; u += unit_stride()) mine[u] = load_unit(data, u, n);
  }
  barrier(g);
  if (g.rank != root) {
    for (size_t u = first_unit(); u < units; u += unit_stride())
      store_unit(data, u, n, staged(g.staging[root], u));
  }
  barrier(g);
}

// A row a block at a time, with the arithmetic of all_reduce_add_rms_norm_kernel (all_reduce.cu):
// the same threads per row, the same sums in the same order.
__global__ void all_reduce_add_rms_norm_peers_kernel(PeerGroup g, const float* partial, float* x,
                                                     __nv_bfloat16* out, const float* weight,
                                                     int rows, int dim, float eps) {
  internal::pdl_wait();
  __shared__ float scratch[32];
  float* mine = reinterpret_cast<float*>(g.staging[g.rank]);
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const size_t base = static_cast<size_t>(row) * dim;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) mine[base + c] = partial[base + c];
  }
  barrier(g);
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const size_t base = static_cast<size_t>(row) * dim;
    float ss = 0.0f;
    for (int c = threadIdx.x; c < dim; c += blockDim.x) {
      float sum = __ldcg(reinterpret_cast<const float*>(g.staging[0]) + base + c);
      for (int r = 1; r < g.num_ranks; ++r)
        sum += __ldcg(reinterpret_cast<const float*>(g.staging[r]) + base + c);
      const float v = x[base + c] + sum;
      x[base + c] = v;
      ss += v * v;
    }
    ss = internal::block_sum(ss, scratch);
    if (out != nullptr) {
      const float scale = rsqrtf(ss / static_cast<float>(dim) + eps);
      for (int c = threadIdx.x; c < dim; c += blockDim.x)
        out[base + c] = __float2bfloat16_rn(x[base + c] * scale * weight[c]);
    }
  }
  barrier(g);
}

// Byte unit u (16 bytes, the last one shorter) of a message of `bytes`.
__device__ __forceinline__ void copy_unit(char* dst, const char* src, size_t u, size_t bytes,
                                          bool src_staged) {
  const size_t e = 16 * u;
  if (e + 16 <= bytes && is_aligned16(dst + e) && is_aligned16(src + e)) {
    const uint4* s = reinterpret_cast<const uint4*>(src + e);
    *reinterpret_cast<uint4*>(dst + e) = src_staged ? __ldcg(s) : *s;
    return;
  }
  for (size_t k = e; k < bytes && k < e + 16; ++k) dst[k] = src[k];
}

__global__ void send_kernel(PeerMailbox m, const char* data, size_t bytes) {
  internal::pdl_wait();
  const int b = blockIdx.x;
  const uint32_t seq = m.sent[b] + 1;
  // The inbox is free once the receiver's same block has read the message before.
  if (threadIdx.x == 0) wait_flag(m.consumed + b, seq - 1, m.timeout_ns);
  __syncthreads();
  const size_t units = (bytes + 15) / 16;
  for (size_t u = first_unit(); u < units; u += unit_stride())
    copy_unit(m.inbox, data, u, bytes, false);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    internal::store_release_sys(m.ready + b, seq);
    m.sent[b] = seq;
  }
}

__global__ void recv_kernel(PeerMailbox m, char* data, size_t bytes) {
  internal::pdl_wait();
  const int b = blockIdx.x;
  const uint32_t seq = m.received[b] + 1;
  if (threadIdx.x == 0) wait_flag(m.ready + b, seq, m.timeout_ns);
  __syncthreads();
  const size_t units = (bytes + 15) / 16;
  for (size_t u = first_unit(); u < units; u += unit_stride())
    copy_unit(data, m.inbox, u, bytes, true);
  __syncthreads();
  if (threadIdx.x == 0) {
    __threadfence_system();
    internal::store_release_sys(m.consumed + b, seq);
    m.received[b] = seq;
  }
}

// Blocks for `units` of work a thread each, at most kPeerBlocks (every rank computes the same).
int blocks_for(size_t units) {
  return static_cast<int>(
      std::clamp<size_t>((units + kThreads - 1) / kThreads, 1, static_cast<size_t>(kPeerBlocks)));
}

bool valid(const PeerGroup& g) {
  if (g.num_ranks < 1 || g.num_ranks > kMaxPeerRanks || g.rank < 0 || g.rank >= g.num_ranks ||
      g.passed == nullptr || g.capacity % 16 != 0)
    return false;
  for (int r = 0; r < g.num_ranks; ++r) {
    if (g.flags[r] == nullptr || g.staging[r] == nullptr ||
        (reinterpret_cast<uintptr_t>(g.staging[r]) & 15u) != 0)
      return false;
  }
  return true;
}

// Bytes of n floats in whole units of 4.
size_t unit_bytes(size_t n) { return (n + 3) / 4 * 16; }

}  // namespace

cudaError_t peer_all_reduce(const PeerGroup& g, float* data, size_t n, bool two_shot,
                            cudaStream_t stream) {
  if (!valid(g) || (n > 0 && data == nullptr) || unit_bytes(n) > g.capacity)
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  const size_t units = (n + 3) / 4;
  if (two_shot && g.num_ranks > 1) {
    const size_t seg = (units + g.num_ranks - 1) / g.num_ranks;
    return internal::launch(all_reduce_two_shot_kernel, dim3(blocks_for(seg)), dim3(kThreads), 0,
                            stream, g, data, n);
  }
  return internal::launch(all_reduce_one_shot_kernel, dim3(blocks_for(units)), dim3(kThreads), 0,
                          stream, g, data, n);
}

cudaError_t peer_all_gather(const PeerGroup& g, const float* in, float* out, size_t n,
                            size_t stride, cudaStream_t stream) {
  if (!valid(g) || (n > 0 && (in == nullptr || out == nullptr)) || unit_bytes(n) > g.capacity ||
      stride < n)
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return internal::launch(all_gather_kernel, dim3(blocks_for((n + 3) / 4)), dim3(kThreads), 0,
                          stream, g, in, out, n, stride);
}

cudaError_t peer_reduce_scatter(const PeerGroup& g, const float* in, float* out, size_t n,
                                size_t stride, cudaStream_t stream) {
  if (!valid(g) || (n > 0 && (in == nullptr || out == nullptr)) ||
      unit_bytes(n) * g.num_ranks > g.capacity || stride < n)
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return internal::launch(reduce_scatter_kernel, dim3(blocks_for((n + 3) / 4)), dim3(kThreads), 0,
                          stream, g, in, out, n, stride);
}

cudaError_t peer_broadcast(const PeerGroup& g, float* data, size_t n, int root,
                           cudaStream_t stream) {
  if (!valid(g) || root < 0 || root >= g.num_ranks || (n > 0 && data == nullptr) ||
      unit_bytes(n) > g.capacity)
    return cudaErrorInvalidValue;
  if (n == 0) return cudaSuccess;
  return internal::launch(broadcast_kernel, dim3(blocks_for((n + 3) / 4)), dim3(kThreads), 0,
                          stream, g, data, n, root);
}

cudaError_t peer_all_reduce_add_rms_norm(const PeerGroup& g, const float* partial, float* x,
                                         __nv_bfloat16* out, const float* weight, int rows, int dim,
                                         float eps, cudaStream_t stream) {
  if (!valid(g) || rows < 0 || dim <= 0 || (out != nullptr && weight == nullptr) ||
      static_cast<size_t>(rows) * dim * 4 > g.capacity)
    return cudaErrorInvalidValue;
  if (rows > 0 && (partial == nullptr || x == nullptr)) return cudaErrorInvalidValue;
  if (rows == 0) return cudaSuccess;
  // (The threads all_reduce_add_rms_norm gives a row.)
  const int threads = std::clamp((dim / 4 + 31) / 32 * 32, 128, 1024);
  return internal::launch(all_reduce_add_rms_norm_peers_kernel, dim3(std::min(rows, kPeerBlocks)),
                          dim3(threads), 0, stream, g, partial, x, out, weight, rows, dim, eps);
}

cudaError_t peer_send(const PeerMailbox& m, const void* data, size_t bytes, cudaStream_t stream) {
  if (m.inbox == nullptr || m.ready == nullptr || m.consumed == nullptr || m.sent == nullptr ||
      bytes > m.capacity || (bytes > 0 && data == nullptr))
    return cudaErrorInvalidValue;
  if (bytes == 0) return cudaSuccess;
  return internal::launch(send_kernel, dim3(blocks_for((bytes + 15) / 16)), dim3(kThreads), 0,
                          stream, m, static_cast<const char*>(data), bytes);
}

cudaError_t peer_recv(const PeerMailbox& m, void* data, size_t bytes, cudaStream_t stream) {
  if (m.inbox == nullptr || m.ready == nullptr || m.consumed == nullptr || m.received == nullptr ||
      bytes > m.capacity || (bytes > 0 && data == nullptr))
    return cudaErrorInvalidValue;
  if (bytes == 0) return cudaSuccess;
  return internal::launch(recv_kernel, dim3(blocks_for((bytes + 15) / 16)), dim3(kThreads), 0,
                          stream, m, static_cast<char*>(data), bytes);
}

}  // namespace hr::kernels
