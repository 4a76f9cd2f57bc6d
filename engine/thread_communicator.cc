// Collectives among threads: a generation barrier and buffers read in place.
#include "engine/thread_communicator.h"

#include <algorithm>
#include <cstring>
#include <string>

namespace hr::engine {

struct ThreadCommunicator::Shared {
  explicit Shared(int n)
      : size(n),
        ins(static_cast<size_t>(n)),
        outs(static_cast<size_t>(n)),
        counts(static_cast<size_t>(n)),
        roots(static_cast<size_t>(n)),
        mailboxes(static_cast<size_t>(n) * static_cast<size_t>(n)) {}
  const int size;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;          // guarded by mu
  uint64_t generation = 0;  // guarded by mu
  // Each rank's arguments to the collective in progress (written before the first barrier, read
  // between it and the second).
  std::vector<const float*> ins;
  std::vector<float*> outs;
  std::vector<size_t> counts;
  std::vector<int> roots;
  // Point-to-point messages not yet received, [from * size + to] (guarded by mu).
  std::vector<std::deque<std::vector<float>>> mailboxes;
  std::string aborted;  // why the group was aborted; empty: it was not (guarded by mu)
  // Ranks between the barrier that starts a collective's reading of the others' buffers and the
  // one that ends it (guarded by mu). After an abort no rank returns while any reads: its caller
  // may write the buffers a peer still reads.
  int reading = 0;
};

std::vector<std::unique_ptr<ThreadCommunicator>> ThreadCommunicator::create_group(int size) {
  auto shared = std::make_shared<Shared>(size);
  std::vector<std::unique_ptr<ThreadCommunicator>> out;
  for (int r = 0; r < size; ++r) out.emplace_back(new ThreadCommunicator(shared, r));
  return out;
}

int ThreadCommunicator::size() const { return shared_->size; }

namespace {

Status aborted_error(const std::string& reason) {
  return internal_error("the ranks' collectives were aborted: " + reason);
}

}  // namespace

Status ThreadCommunicator::barrier(Reading reading) {
  std::unique_lock<std::mutex> lock(shared_->mu);
  if (reading == Reading::kEnds && --shared_->reading == 0) shared_->cv.notify_all();
  auto aborted = [&] {
    // (Readers reach their next barrier, which ends their reading, whatever happens.)
    shared_->cv.wait(lock, [&] { return shared_->reading == 0; });
    return aborted_error(shared_->aborted);
  };
  if (!shared_->aborted.empty()) return aborted();
  const uint64_t gen = shared_->generation;
  if (++shared_->arrived == shared_->size) {
    shared_->arrived = 0;
    ++shared_->generation;
    // Every rank reads from here, counted as the barrier opens: a rank woken late (an abort
    // meanwhile) still counts before any peer can see the count fall to zero and return.
    if (reading == Reading::kStarts) shared_->reading += shared_->size;
    shared_->cv.notify_all();
  } else {
    shared_->cv.wait(lock, [&] { return shared_->generation != gen || !shared_->aborted.empty(); });
    if (shared_->generation == gen) return aborted();
  }
  return Status::ok();
}

Status ThreadCommunicator::meet(const float* in, float* out, size_t n, int root, const char* what) {
  const auto r = static_cast<size_t>(rank_);
  shared_->ins[r] = in;
  shared_->outs[r] = out;
  shared_->counts[r] = n;
  shared_->roots[r] = root;
  // Every rank's arguments are in place (the barrier's mutex orders the writes).
  HR_RETURN_IF_ERROR(barrier(Reading::kStarts));
  for (int i = 0; i < shared_->size; ++i) {
    const auto k = static_cast<size_t>(i);
    if (shared_->counts[k] != n || shared_->roots[k] != root) {
      // No rank publishes again while another still compares.
      HR_RETURN_IF_ERROR(barrier(Reading::kEnds));
      return invalid_argument(std::string(what) + ": the ranks' sizes or roots differ", what);
    }
  }
  return Status::ok();
}

bool ThreadCommunicator::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(shared_->mu);
    if (shared_->aborted.empty()) shared_->aborted = reason.empty() ? "no reason given" : reason;
  }
  shared_->cv.notify_all();
  return true;
}

Status ThreadCommunicator::all_reduce(float* data, size_t n) {
  HR_RETURN_IF_ERROR(meet(data, data, n, 0, "all_reduce"));
  // Each rank sums every rank's values in rank order into its own copy, then all wait before
  // anyone writes its buffer (another rank may still be reading it).
  std::vector<float>& sum = scratch_;
  sum.assign(n, 0.0f);
  for (int i = 0; i < shared_->size; ++i) {
    const float* src = shared_->ins[static_cast<size_t>(i)];
    for (size_t j = 0; j < n; ++j) sum[j] += src[j];
  }
  HR_RETURN_IF_ERROR(barrier(Reading::kEnds));
  std::memcpy(data, sum.data(), n * sizeof(float));
  return barrier();  // no rank starts the next collective while another still writes
}

Status ThreadCommunicator::all_gather(const float* in, float* out, size_t n) {
  HR_RETURN_IF_ERROR(meet(in, out, n, 0, "all_gather"));
  for (int i = 0; i < shared_->size; ++i) {
    std::memcpy(out + static_cast<size_t>(i) * n, shared_->ins[static_cast<size_t>(i)],
                n * sizeof(float));
  }
  return barrier(Reading::kEnds);
}

Status ThreadCommunicator::reduce_scatter(const float* in, float* out, size_t n) {
  HR_RETURN_IF_ERROR(meet(in, out, n, 0, "reduce_scatter"));
  std::vector<float>& sum = scratch_;
  sum.assign(n, 0.0f);
  const size_t offset = static_cast<size_t>(rank_) * n;
  for (int i = 0; i < shared_->size; ++i) {
    const float* src = shared_->ins[static_cast<size_t>(i)] + offset;
    for (size_t j = 0; j < n; ++j) sum[j] += src[j];
  }
  // A rank's `out` may be its own `in`, which the others read.
  HR_RETURN_IF_ERROR(barrier(Reading::kEnds));
  std::memcpy(out, sum.data(), n * sizeof(float));
  return barrier();
}

Status ThreadCommunicator::broadcast(float* data, size_t n, int root) {
  // Checked after meeting: every rank answers the same, and none is left waiting.
  HR_RETURN_IF_ERROR(meet(data, data, n, root, "broadcast"));
  if (root < 0 || root >= shared_->size) {
    HR_RETURN_IF_ERROR(barrier(Reading::kEnds));
    return invalid_argument("broadcast: root " + std::to_string(root) + " is not a rank",
                            "broadcast");
  }
  if (rank_ != root) {
    std::memcpy(data, shared_->ins[static_cast<size_t>(root)], n * sizeof(float));
  }
  return barrier(Reading::kEnds);
}

Status ThreadCommunicator::send(const float* data, size_t n, int peer) {
  if (peer < 0 || peer >= shared_->size || peer == rank_) {
    return invalid_argument("send: " + std::to_string(peer) + " is not another rank", "send");
  }
  std::vector<float> message(data, data + n);
  std::lock_guard<std::mutex> lock(shared_->mu);
  if (!shared_->aborted.empty()) return aborted_error(shared_->aborted);
  shared_->mailboxes[static_cast<size_t>(rank_ * shared_->size + peer)].push_back(
      std::move(message));
  shared_->cv.notify_all();
  return Status::ok();
}

Status ThreadCommunicator::recv(float* data, size_t n, int peer) {
  if (peer < 0 || peer >= shared_->size || peer == rank_) {
    return invalid_argument("recv: " + std::to_string(peer) + " is not another rank", "recv");
  }
  std::unique_lock<std::mutex> lock(shared_->mu);
  auto& box = shared_->mailboxes[static_cast<size_t>(peer * shared_->size + rank_)];
  shared_->cv.wait(lock, [&] { return !box.empty() || !shared_->aborted.empty(); });
  if (!shared_->aborted.empty()) return aborted_error(shared_->aborted);
  std::vector<float> message = std::move(box.front());
  box.pop_front();
  if (message.size() != n) {
    return invalid_argument("recv: rank " + std::to_string(peer) + " sent " +
                                std::to_string(message.size()) + " values, not " +
                                std::to_string(n),
                            "recv");
  }
  std::memcpy(data, message.data(), n * sizeof(float));
  return Status::ok();
}

}  // namespace hr::engine
