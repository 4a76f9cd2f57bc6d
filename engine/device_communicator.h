// Collectives among an engine's GPU ranks over device buffers (docs/parallel-engine.md): the same
// as Communicator (engine/communicator.h), fp32 (point to point: any bytes), enqueued on a stream
// (stream-ordered: each call only enqueues work, so it is capturable in a CUDA graph). Every rank
// calls each collective with the same sizes, in the same order. Implementations: VirtualRankGroup
// (N ranks on one device, engine/virtual_ranks.h), NcclCommunicator (engine/nccl_communicator.h)
// and PeerCommunicator (one GPU a rank over peer pointers, engine/peer_communicator.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "base/status.h"

namespace hr::engine {

class DeviceCommunicator {
 public:
  virtual ~DeviceCommunicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data[0..n) becomes the sum over the ranks of theirs.
  [[nodiscard]] virtual Status all_reduce(float* data, size_t n, cudaStream_t stream) = 0;
  // out[r * n .. (r + 1) * n) becomes rank r's in[0..n), for every rank r.
  [[nodiscard]] virtual Status all_gather(const float* in, float* out, size_t n,
                                          cudaStream_t stream) = 0;
  // out[0..n) becomes the sum over the ranks of their in[rank() * n .. (rank() + 1) * n).
  [[nodiscard]] virtual Status reduce_scatter(const float* in, float* out, size_t n,
                                              cudaStream_t stream) = 0;
  // data[0..n) becomes rank `root`'s.
  [[nodiscard]] virtual Status broadcast(float* data, size_t n, int root, cudaStream_t stream) = 0;
  // Whether this communicator has the tensor-parallel layer boundary below as one launch.
  virtual bool fuses_layer_boundary() const { return false; }
  // The layer boundary, where fuses_layer_boundary(): partial [rows, dim] (this rank's
  // row-parallel products) summed over the ranks in rank order and added to the residual stream
  // x [rows, dim] (the same on every rank), then each new row RMS-normalised times weight into
  // out [rows, dim] (bf16: the next projection's input) — x and out as all_reduce followed by
  // kernels::add_rms_norm leave them. Virtual ranks launch the fused kernel of
  // kernels/all_reduce.cuh once over every rank's buffers, peer ranks one launch each over their
  // peers' memory; NCCL refuses it (the rank all-reduces, then adds and norms, itself).
  [[nodiscard]] virtual Status all_reduce_add_rms_norm(float*, float*, __nv_bfloat16*, const float*,
                                                       int, int, float, cudaStream_t) {
    return internal_error("this communicator has no fused layer boundary");
  }
  // Point to point, between pipeline stages (any data: `bytes` bytes moved as they are). send()
  // hands data[0..bytes) to rank `peer` once the stream reaches it; recv() fills data with the
  // oldest message from `peer` not yet received, which must be `bytes` long. Messages between two
  // ranks arrive in the order sent. The data may not be written until the stream has passed the
  // call.
  [[nodiscard]] virtual Status send(const void* data, size_t bytes, int peer,
                                    cudaStream_t stream) = 0;
  [[nodiscard]] virtual Status recv(void* data, size_t bytes, int peer, cudaStream_t stream) = 0;
  // As Communicator::abort (engine/communicator.h), from another thread: the kernels of this
  // rank's collectives under way return (NCCL's ncclCommAbort), and every later call fails. For
  // a rank whose thread waits for its stream; one inside a call of this communicator meanwhile
  // races with it (engine/nccl_communicator.cc).
  // False when this implementation cannot (virtual ranks: no wait crosses threads; peer ranks:
  // their kernels trap at their own timeout).
  virtual bool abort(const std::string& reason) { return false; }
};

}  // namespace hr::engine
