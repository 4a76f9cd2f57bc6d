// All-reduce over peer pointers (docs/parallel-engine.md): every rank's buffer is readable from
// the kernel (the ranks of one device as virtual ranks, or peers' buffers mapped over NVLink), and
// one launch sums them in rank order (0, 1, ...) and writes the sum to every rank's buffer
// ("one-shot": each element read once from each rank, written once to each). Sums run in fp32 in
// rank order, so every rank holds bitwise the same values, equal to the CPU engine's
// ThreadCommunicator. The launch itself is the synchronisation: the caller orders it after every
// rank's writes (one stream, or events) and before any rank reads the result.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>

namespace hr::kernels {

constexpr int kMaxPeerRanks = 8;

// out[k][i] = in[0][i] + in[1][i] + ... (in rank order) for every output k and i < n: an
// all-reduce is in = out = every rank's buffer (in place is safe: each element is read from every
// input before it is written anywhere); a reduce-scatter's rank r is in[j] = rank j's buffer + r n
// and out[0] its own. Inputs and outputs 16-byte aligned.
struct PeerSumParams {
  const float* in[kMaxPeerRanks] = {};
  int num_inputs = 0;
  float* out[kMaxPeerRanks] = {};
  int num_outputs = 0;
  size_t n = 0;
};
cudaError_t peer_sum(const PeerSumParams& p, cudaStream_t stream);

// The tensor-parallel layer boundary in one launch: each rank's partial products [rows, dim]
// (the o or down projection's row-parallel output) summed in rank order, added to the residual
// stream x (the same on every rank: rank 0's is read, every rank's written), then RMSNorm of the
// new x times weight to each rank's bf16 out (the next projection's input). A row is one block.
struct AllReduceAddRmsNormParams {
  const float* partial[kMaxPeerRanks] = {};  // [rows, dim] per rank
  float* x[kMaxPeerRanks] = {};              // [rows, dim] residual stream per rank
  __nv_bfloat16* out[kMaxPeerRanks] = {};    // [rows, dim] per rank; null: no norm written
  const float* weight = nullptr;             // [dim]
  int num_ranks = 0;
  int num_rows = 0;
  int dim = 0;
  float eps = 1e-5f;
};
cudaError_t all_reduce_add_rms_norm(const AllReduceAddRmsNormParams& p, cudaStream_t stream);

}  // namespace hr::kernels
