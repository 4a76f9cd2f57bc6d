// Collectives between GPUs over peer pointers (docs/parallel-engine.md): one GPU a rank, every
// rank's memory reachable from every other's kernels (NVLink or PCIe peer access, one process).
// Each rank launches the same kernel on its own stream; the launches meet at barriers made of
// flags in each other's memory, block by block (block b of a rank waits for block b of every
// other, so no grid-wide barrier and no co-residency is needed). A call copies its input into the
// rank's staging buffer, crosses a barrier, reads the peers' staging and writes its result, and
// crosses a second barrier before returning, so that no rank overwrites its staging while a peer
// still reads it. Sums run in fp32 in rank order (0, 1, ...): bitwise what kernels::peer_sum and
// all_reduce_add_rms_norm give the virtual ranks of one device. The flags count each block's
// barriers on the device itself, so a call captured in a CUDA graph replays correctly. A wait
// that lasts past the group's timeout traps (the kernel fails instead of hanging when a peer
// never arrives). Every message fits the staging capacity: the caller cuts larger ones.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "kernels/all_reduce.cuh"

namespace hr::kernels {

// The most blocks a peer collective launches (each block has flags of its own).
constexpr int kPeerBlocks = 32;
// Flags per rank: [kPeerBlocks][kMaxPeerRanks], slot [b][i] the barrier rank i's block b reached.
constexpr int kPeerFlags = kPeerBlocks * kMaxPeerRanks;

// Rank `rank`'s handles on its group's memory (engine/peer_communicator.h allocates it): every
// rank's flags and staging, and its own barrier counts. Flags and counts start zeroed.
struct PeerGroup {
  uint32_t* flags[kMaxPeerRanks] = {};  // rank j's [kPeerFlags], on its device
  char* staging[kMaxPeerRanks] = {};    // rank j's [2 * capacity] bytes, 16-byte aligned
  uint32_t* passed = nullptr;           // this rank's [kPeerBlocks] barriers passed per block
  size_t capacity = 0;                  // bytes of a message's staging (a multiple of 16)
  int rank = 0;
  int num_ranks = 0;
  int64_t timeout_ns = 0;  // a barrier's longest wait (0: no limit)
};

// data[0..n) becomes the sum over the ranks of theirs (n * 4 <= capacity). `two_shot`: each rank
// sums a 1/N segment of every rank's data and the ranks then gather the segments (N times less
// reading per rank, one barrier more), for large messages; else each sums all of it.
cudaError_t peer_all_reduce(const PeerGroup& g, float* data, size_t n, bool two_shot,
                            cudaStream_t stream);
// out[r * stride + i] = rank r's in[i] for i < n (n * 4 <= capacity; stride >= n).
cudaError_t peer_all_gather(const PeerGroup& g, const float* in, float* out, size_t n,
                            size_t stride, cudaStream_t stream);
// out[i] = sum over ranks r of r's in[rank * stride + i] for i < n (N * ceil4(n) * 4 <=
// capacity; stride >= n).
cudaError_t peer_reduce_scatter(const PeerGroup& g, const float* in, float* out, size_t n,
                                size_t stride, cudaStream_t stream);
// data[0..n) becomes rank root's (n * 4 <= capacity).
cudaError_t peer_broadcast(const PeerGroup& g, float* data, size_t n, int root,
                           cudaStream_t stream);
// The tensor-parallel layer boundary (as all_reduce_add_rms_norm in all_reduce.cuh, over peers):
// partial [rows, dim] summed over the ranks in rank order, added to x (the same on every rank),
// x written, then RMSNorm of each row times weight to bf16 out (null: none). rows * dim * 4 <=
// capacity.
cudaError_t peer_all_reduce_add_rms_norm(const PeerGroup& g, const float* partial, float* x,
                                         __nv_bfloat16* out, const float* weight, int rows, int dim,
                                         float eps, cudaStream_t stream);

// One direction between two ranks (pipeline hand-offs): the sender's kernel writes a message
// into the receiver's inbox and raises the receiver's `ready` flags; the receiver's kernel
// copies it out and raises the sender's `consumed` flags, which the sender's next message waits
// for. Messages arrive in the order sent; each fits the inbox.
struct PeerMailbox {
  char* inbox = nullptr;         // on the receiver's device, `capacity` bytes, 16-byte aligned
  uint32_t* ready = nullptr;     // on the receiver's: [kPeerBlocks] messages written, per block
  uint32_t* consumed = nullptr;  // on the sender's: [kPeerBlocks] messages read, per block
  uint32_t* sent = nullptr;      // on the sender's: [kPeerBlocks] its own count
  uint32_t* received = nullptr;  // on the receiver's: [kPeerBlocks] its own count
  size_t capacity = 0;
  int64_t timeout_ns = 0;
};
cudaError_t peer_send(const PeerMailbox& m, const void* data, size_t bytes, cudaStream_t stream);
cudaError_t peer_recv(const PeerMailbox& m, void* data, size_t bytes, cudaStream_t stream);

}  // namespace hr::kernels
