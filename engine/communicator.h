// Collectives among the ranks of one engine (tensor, expert and pipeline parallelism,
// docs/memory-plan.md): all-reduce, all-gather, reduce-scatter and broadcast. Every rank calls
// each collective with the same sizes, in the same order. Sums run in rank order (0, 1, ...), so
// every rank ends with bitwise the same values, and a run with N ranks is reproducible.
// Implementations: ThreadCommunicator (engine/thread_communicator.h), N ranks as threads of one
// process for the CPU backend; the GPU ones (NCCL, own all-reduce kernels, virtual ranks on one
// device) are the multi-GPU work.
#pragma once

#include <cstddef>
#include <string>

#include "base/status.h"

namespace hr::engine {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // data[0..n) becomes the sum over the ranks of theirs.
  [[nodiscard]] virtual Status all_reduce(float* data, size_t n) = 0;
  // out[r * n .. (r + 1) * n) becomes rank r's in[0..n), for every rank r.
  [[nodiscard]] virtual Status all_gather(const float* in, float* out, size_t n) = 0;
  // out[0..n) becomes the sum over the ranks of their in[rank() * n .. (rank() + 1) * n).
  [[nodiscard]] virtual Status reduce_scatter(const float* in, float* out, size_t n) = 0;
  // data[0..n) becomes rank `root`'s.
  [[nodiscard]] virtual Status broadcast(float* data, size_t n, int root) = 0;
  // Point to point, between pipeline stages: send() hands data[0..n) to rank `peer` (the data may
  // be reused once it returns), and recv() waits for the oldest message from `peer` not yet
  // received, which must hold n values. Messages between two ranks arrive in the order sent.
  [[nodiscard]] virtual Status send(const float* data, size_t n, int peer) = 0;
  [[nodiscard]] virtual Status recv(float* data, size_t n, int peer) = 0;
  // From any thread, while ranks may wait in a collective for a peer that never comes (a stuck
  // step, docs/parallel-engine.md "When a rank stops"): ends every rank's waits, now and later,
  // with kInternal naming `reason`. The group is spent: what a collective under way leaves in
  // its buffers is unspecified. False when this implementation cannot end a wait.
  virtual bool abort(const std::string& reason) { return false; }
};

}  // namespace hr::engine
