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
};

std::vector<std::unique_ptr<ThreadCommunicator>> ThreadCommunicator::create_group(int size) {
  auto shared = std::make_shared<Shared>(size);
  std::vector<std::unique_ptr<ThreadCommunicator>> out;
  for (int r = 0; r < size; ++r) out.emplace_back(new ThreadCommunicator(shared, r));
  return out;
}

int ThreadCommunicator::size() const { return shared_->size; }

void ThreadCommunicator::barrier() {
  std::unique_lock<std::mutex> lock(shared_->mu);
  const uint64_t gen = shared_->generation;
  if (++shared_->arrived == shared_->size) {
    shared_->arrived = 0;
    ++shared_->generation;
    shared_->cv.notify_all();
    return;
  }
  shared_->cv.wait(lock, [&] { return shared_->generation != gen; });
}

bool ThreadCommunicator::meet(const float* in, float* out, size_t n, int root) {
  const auto r = static_cast<size_t>(rank_);
  shared_->ins[r] = in;
  shared_->outs[r] = out;
  shared_->counts[r] = n;
  shared_->roots[r] = root;
  barrier();  // every rank's arguments are in place (the barrier's mutex orders the writes)
  for (int i = 0; i < shared_->size; ++i) {
    const auto k = static_cast<size_t>(i);
    if (shared_->counts[k] != n || shared_->roots[k] != root) return false;
  }
  return true;
}

Status ThreadCommunicator::all_reduce(float* data, size_t n) {
  if (!meet(data, data, n, 0)) {
    barrier();
    return invalid_argument("all_reduce: the ranks' sizes differ", "all_reduce");
  }
  // Each rank sums every rank's values in rank order into its own copy, then all wait before
  // anyone writes its buffer (another rank may still be reading it).
  std::vector<float>& sum = scratch_;
  sum.assign(n, 0.0f);
  for (int i = 0; i < shared_->size; ++i) {
    const float* src = shared_->ins[static_cast<size_t>(i)];
    for (size_t j = 0; j < n; ++j) sum[j] += src[j];
  }
  barrier();
  std::memcpy(data, sum.data(), n * sizeof(float));
  barrier();  // no rank starts the next collective while another still writes
  return Status::ok();
}

Status ThreadCommunicator::all_gather(const float* in, float* out, size_t n) {
  if (!meet(in, out, n, 0)) {
    barrier();
    return invalid_argument("all_gather: the ranks' sizes differ", "all_gather");
  }
  for (int i = 0; i < shared_->size; ++i) {
    std::memcpy(out + static_cast<size_t>(i) * n, shared_->ins[static_cast<size_t>(i)],
                n * sizeof(float));
  }
  barrier();
  return Status::ok();
}

Status ThreadCommunicator::reduce_scatter(const float* in, float* out, size_t n) {
  if (!meet(in, out, n, 0)) {
    barrier();
    return invalid_argument("reduce_scatter: the ranks' sizes differ", "reduce_scatter");
  }
  std::vector<float>& sum = scratch_;
  sum.assign(n, 0.0f);
  const size_t offset = static_cast<size_t>(rank_) * n;
  for (int i = 0; i < shared_->size; ++i) {
    const float* src = shared_->ins[static_cast<size_t>(i)] + offset;
    for (size_t j = 0; j < n; ++j) sum[j] += src[j];
  }
  barrier();  // a rank's `out` may be its own `in`, which the others are reading
  std::memcpy(out, sum.data(), n * sizeof(float));
  barrier();
  return Status::ok();
}

Status ThreadCommunicator::broadcast(float* data, size_t n, int root) {
  // Checked after meeting: every rank answers the same, and none is left waiting.
  if (!meet(data, data, n, root)) {
    barrier();
    return invalid_argument("broadcast: the ranks' sizes or roots differ", "broadcast");
  }
  if (root < 0 || root >= shared_->size) {
    barrier();
    return invalid_argument("broadcast: root " + std::to_string(root) + " is not a rank",
                            "broadcast");
  }
  if (rank_ != root) {
    std::memcpy(data, shared_->ins[static_cast<size_t>(root)], n * sizeof(float));
  }
  barrier();
  return Status::ok();
}

Status ThreadCommunicator::send(const float* data, size_t n, int peer) {
  if (peer < 0 || peer >= shared_->size || peer == rank_) {
    return invalid_argument("send: " + std::to_string(peer) + " is not another rank", "send");
  }
  std::vector<float> message(data, data + n);
  std::lock_guard<std::mutex> lock(shared_->mu);
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
  shared_->cv.wait(lock, [&] { return !box.empty(); });
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
