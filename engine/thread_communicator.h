// N ranks as threads of one process (the CPU backend's parallel ranks): each rank's thread calls
// the collectives on its own ThreadCommunicator; the ranks meet at a barrier, read each other's
// buffers in place (no copies through a shared buffer), and meet again before any returns, so
// no rank writes a buffer another still reads. A collective called with sizes that differ
// between ranks is an error on every rank (kInvalidArgument naming the collective). Thread-safe
// across ranks; one thread per rank. abort() from any thread ends every rank's waits.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/communicator.h"

namespace hr::engine {

class ThreadCommunicator final : public Communicator {
 public:
  // The `size` ranks of one group, rank r at index r.
  static std::vector<std::unique_ptr<ThreadCommunicator>> create_group(int size);

  int rank() const override { return rank_; }
  int size() const override;
  Status all_reduce(float* data, size_t n) override;
  Status all_gather(const float* in, float* out, size_t n) override;
  Status reduce_scatter(const float* in, float* out, size_t n) override;
  Status broadcast(float* data, size_t n, int root) override;
  // send() copies the message into the receiver's mailbox and returns at once.
  Status send(const float* data, size_t n, int peer) override;
  Status recv(float* data, size_t n, int peer) override;
  // The group's: every rank's waits end, and every later call fails at once.
  bool abort(const std::string& reason) override;

  struct Shared;  // the group's meeting point

 private:
  ThreadCommunicator(std::shared_ptr<Shared> shared, int rank)
      : shared_(std::move(shared)), rank_(rank) {}
  // Publishes this rank's pointers and size and waits for every rank; kInvalidArgument naming
  // `what` when the ranks' sizes or roots differ (every rank sees it).
  Status meet(const float* in, float* out, size_t n, int root, const char* what);
  // Whether a barrier starts this rank's reading of the others' buffers, or ends it.
  enum class Reading { kNeither, kStarts, kEnds };
  // Waits until every rank has passed this point; an error once the group is aborted (returned
  // only when no rank reads the others' buffers any more).
  Status barrier(Reading reading = Reading::kNeither);

  std::shared_ptr<Shared> shared_;
  int rank_;
  std::vector<float> scratch_;  // this rank's sums, kept from call to call (a step makes many)
};

}  // namespace hr::engine
