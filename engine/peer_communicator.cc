// A group's memory on each rank's device (flags, staging, mailboxes), and its collectives cut into
// pieces that fit the staging.
#include "engine/peer_communicator.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <string>

#include "kernels/peer_collectives.cuh"

namespace hr::engine {

namespace {

std::string device_name(int d) { return "cuda:" + std::to_string(d); }

// Every rank's device memory, freed on its own device once the last rank's communicator goes.
struct PeerGroupMemory {
  struct Allocation {
    int device;
    void* ptr;
  };
  std::vector<Allocation> allocations;

  ~PeerGroupMemory() {
    int current = 0;
    cudaGetDevice(&current);
    for (const Allocation& a : allocations) {
      cudaSetDevice(a.device);
      cudaFree(a.ptr);
    }
    cudaSetDevice(current);
  }

  // `bytes` on `device` (`zeroed`: once the device's legacy stream has run).
  Result<char*> allocate(int device, size_t bytes, const char* what, bool zeroed = false) {
    void* p = nullptr;
    cudaError_t e = cudaSetDevice(device);
    if (e == cudaSuccess) e = cudaMalloc(&p, bytes);
    if (e == cudaSuccess) allocations.push_back({device, p});
    if (e == cudaSuccess && zeroed) e = cudaMemset(p, 0, bytes);
    if (e != cudaSuccess) {
      cudaGetLastError();
      return internal_error(std::string("allocating the peer collectives' ") + what + " on " +
                            device_name(device) + ": " + cudaGetErrorName(e) + " (" +
                            cudaGetErrorString(e) + ")");
    }
    return static_cast<char*>(p);
  }
};

class PeerRank final : public DeviceCommunicator {
 public:
  PeerRank(std::shared_ptr<PeerGroupMemory> memory, const PeerOptions& options, int device,
           const kernels::PeerGroup& view, std::vector<kernels::PeerMailbox> to,
           std::vector<kernels::PeerMailbox> from)
      : memory_(std::move(memory)),
        options_(options),
        device_(device),
        view_(view),
        to_(std::move(to)),
        from_(std::move(from)) {}

  int rank() const override { return view_.rank; }
  int size() const override { return view_.num_ranks; }

  Status all_reduce(float* data, size_t n, cudaStream_t stream) override {
    const size_t piece = view_.capacity / 4;
    for (size_t at = 0; at < n; at += piece) {
      const size_t m = std::min(piece, n - at);
      const bool two_shot = size() > 2 && m * 4 >= options_.two_shot_bytes;
      HR_RETURN_IF_ERROR(
          launched("all_reduce", kernels::peer_all_reduce(view_, data + at, m, two_shot, stream)));
    }
    return Status::ok();
  }

  Status all_gather(const float* in, float* out, size_t n, cudaStream_t stream) override {
    const size_t piece = view_.capacity / 4;
    for (size_t at = 0; at < n; at += piece) {
      const size_t m = std::min(piece, n - at);
      HR_RETURN_IF_ERROR(
          launched("all_gather", kernels::peer_all_gather(view_, in + at, out + at, m, n, stream)));
    }
    return Status::ok();
  }

  Status reduce_scatter(const float* in, float* out, size_t n, cudaStream_t stream) override {
    // (Each piece's share of every rank, in whole units of 4 floats: create_all gives at least
    // one.)
    const size_t piece = view_.capacity / 16 / static_cast<size_t>(size()) * 4;
    for (size_t at = 0; at < n; at += piece) {
      const size_t m = std::min(piece, n - at);
      HR_RETURN_IF_ERROR(launched(
          "reduce_scatter", kernels::peer_reduce_scatter(view_, in + at, out + at, m, n, stream)));
    }
    return Status::ok();
  }

  Status broadcast(float* data, size_t n, int root, cudaStream_t stream) override {
    if (root < 0 || root >= size()) {
      return invalid_argument("broadcast: root " + std::to_string(root) + " is not a rank",
                              "broadcast");
    }
    const size_t piece = view_.capacity / 4;
    for (size_t at = 0; at < n; at += piece) {
      const size_t m = std::min(piece, n - at);
      HR_RETURN_IF_ERROR(
          launched("broadcast", kernels::peer_broadcast(view_, data + at, m, root, stream)));
    }
    return Status::ok();
  }

  bool fuses_layer_boundary() const override { return true; }

  Status all_reduce_add_rms_norm(float* partial, float* x, __nv_bfloat16* out, const float* weight,
                                 int rows, int dim, float eps, cudaStream_t stream) override {
    if (rows < 0 || dim <= 0 || x == nullptr || out == nullptr || weight == nullptr) {
      return invalid_argument("all_reduce_add_rms_norm: no rows, residual, output or weight",
                              "all_reduce_add_rms_norm");
    }
    const int piece = static_cast<int>(
        std::min<size_t>(view_.capacity / (static_cast<size_t>(dim) * 4), 1u << 30));
    if (piece == 0) {
      return invalid_argument("all_reduce_add_rms_norm: a row of " + std::to_string(dim) +
                                  " floats exceeds the peer staging",
                              "all_reduce_add_rms_norm");
    }
    for (int at = 0; at < rows; at += piece) {
      const int m = std::min(piece, rows - at);
      const size_t off = static_cast<size_t>(at) * dim;
      HR_RETURN_IF_ERROR(
          launched("all_reduce_add_rms_norm",
                   kernels::peer_all_reduce_add_rms_norm(view_, partial + off, x + off, out + off,
                                                         weight, m, dim, eps, stream)));
    }
    return Status::ok();
  }

  Status send(const void* data, size_t bytes, int peer, cudaStream_t stream) override {
    HR_RETURN_IF_ERROR(check_peer(true, peer));
    const kernels::PeerMailbox& m = to_[static_cast<size_t>(peer)];
    const char* p = static_cast<const char*>(data);
    for (size_t at = 0; at < bytes; at += m.capacity) {
      HR_RETURN_IF_ERROR(launched(
          "send", kernels::peer_send(m, p + at, std::min(m.capacity, bytes - at), stream)));
    }
    return Status::ok();
  }

  Status recv(void* data, size_t bytes, int peer, cudaStream_t stream) override {
    HR_RETURN_IF_ERROR(check_peer(false, peer));
    const kernels::PeerMailbox& m = from_[static_cast<size_t>(peer)];
    char* p = static_cast<char*>(data);
    for (size_t at = 0; at < bytes; at += m.capacity) {
      HR_RETURN_IF_ERROR(launched(
          "recv", kernels::peer_recv(m, p + at, std::min(m.capacity, bytes - at), stream)));
    }
    return Status::ok();
  }

 private:
  Status check_peer(bool sending, int peer) const {
    const char* what = sending ? "send" : "recv";
    if (peer < 0 || peer >= size() || peer == rank()) {
      return invalid_argument(std::string(what) + ": " + std::to_string(peer) + " is no other rank",
                              what);
    }
    const int next = (rank() + 1) % size(), before = (rank() + size() - 1) % size();
    if (options_.mailbox_bytes == 0 || (options_.ring && peer != (sending ? next : before))) {
      return invalid_argument(std::string(what) + ": no mailbox " +
                                  (sending ? "to rank " : "from rank ") + std::to_string(peer) +
                                  " in this group",
                              what);
    }
    return Status::ok();
  }

  Status launched(const char* what, cudaError_t e) const {
    if (e == cudaSuccess) return Status::ok();
    cudaGetLastError();
    return internal_error(std::string("peer ") + what + " on " + device_name(device_) + ": " +
                          cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
  }

  std::shared_ptr<PeerGroupMemory> memory_;
  const PeerOptions options_;
  const int device_;
  const kernels::PeerGroup view_;
  const std::vector<kernels::PeerMailbox> to_, from_;  // by peer (none for this rank)
};

}  // namespace

bool PeerCommunicator::all_peers(const std::vector<int>& devices) {
  for (int a : devices) {
    for (int b : devices) {
      int can = 0;
      if (a != b && (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can)) {
        cudaGetLastError();
        return false;
      }
    }
  }
  return true;
}

Result<std::vector<std::unique_ptr<DeviceCommunicator>>> PeerCommunicator::create_all(
    const std::vector<int>& devices, const PeerOptions& options) {
  const int n = static_cast<int>(devices.size());
  if (n < 1 || n > kernels::kMaxPeerRanks) {
    return invalid_argument("peer collectives take 1 to " + std::to_string(kernels::kMaxPeerRanks) +
                                " ranks, not " + std::to_string(n),
                            "devices");
  }
  std::vector<int> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  if (!options.allow_shared_device &&
      std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end())
    return invalid_argument("peer collectives take distinct devices", "devices");
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  if (options.staging_bytes < 16 * static_cast<size_t>(n) || options.staging_bytes % 16 != 0 ||
      options.mailbox_bytes % 16 != 0) {
    return invalid_argument(
        "the peer staging (16 bytes a rank at least) and mailboxes are whole multiples of 16 bytes",
        "devices");
  }
  int current = 0;
  cudaGetDevice(&current);
  for (int a : sorted) {
    for (int b : sorted) {
      if (a == b) continue;
      int can = 0;
      if (cudaDeviceCanAccessPeer(&can, a, b) != cudaSuccess || !can) {
        cudaGetLastError();
        cudaSetDevice(current);
        return unavailable(device_name(a) + " cannot reach " + device_name(b) +
                           "'s memory (no peer access): use NCCL for these ranks");
      }
      cudaSetDevice(a);
      const cudaError_t e = cudaDeviceEnablePeerAccess(b, 0);
      if (e != cudaSuccess && e != cudaErrorPeerAccessAlreadyEnabled) {
        cudaSetDevice(current);
        return internal_error("enabling " + device_name(a) + "'s access to " + device_name(b) +
                              ": " + cudaGetErrorName(e));
      }
      cudaGetLastError();  // (already enabled is no error)
    }
  }
  auto memory = std::make_shared<PeerGroupMemory>();
  // Each rank's control words: its flags, its barriers passed, and per peer its mailboxes' four
  // counts (ready and received as a receiver, consumed and sent as a sender).
  const size_t blocks = kernels::kPeerBlocks;
  const size_t words = kernels::kPeerFlags + blocks + 4 * blocks * static_cast<size_t>(n);
  std::vector<uint32_t*> control(static_cast<size_t>(n));
  std::vector<char*> staging(static_cast<size_t>(n)), inboxes(static_cast<size_t>(n * n));
  auto allocate_rank = [&](int r) -> Status {
    const int d = devices[static_cast<size_t>(r)];
    HR_ASSIGN_OR_RETURN(char* c, memory->allocate(d, words * 4, "flags", true));
    HR_ASSIGN_OR_RETURN(char* s, memory->allocate(d, 2 * options.staging_bytes, "staging"));
    control[static_cast<size_t>(r)] = reinterpret_cast<uint32_t*>(c);
    staging[static_cast<size_t>(r)] = s;
    for (int from = 0; from < n && options.mailbox_bytes > 0; ++from) {
      if (from == r || (options.ring && (from + 1) % n != r)) continue;
      HR_ASSIGN_OR_RETURN(char* in, memory->allocate(d, options.mailbox_bytes, "mailbox"));
      inboxes[static_cast<size_t>(from * n + r)] = in;
    }
    return Status::ok();
  };
  Status failed = Status::ok();
  for (int r = 0; r < n && failed.is_ok(); ++r) failed = allocate_rank(r);
  // The zeroed flags in place before any kernel of the group runs (the memsets went on each
  // device's legacy stream, which the ranks' streams need not wait for).
  for (int r = 0; r < n && failed.is_ok(); ++r) {
    const int d = devices[static_cast<size_t>(r)];
    cudaError_t e = cudaSetDevice(d);
    if (e == cudaSuccess) e = cudaStreamSynchronize(nullptr);
    if (e != cudaSuccess) {
      failed = internal_error("zeroing the peer collectives' flags on " + device_name(d) + ": " +
                              cudaGetErrorName(e));
    }
  }
  cudaSetDevice(current);
  HR_RETURN_IF_ERROR(failed);
  const int64_t timeout_ns = static_cast<int64_t>(options.timeout_seconds * 1e9);
  // Rank r's words for peer p: [0] ready from p, [1] received from p, [2] consumed by p, [3] sent
  // to p, each kPeerBlocks long.
  auto counts = [&](int r, int p, int which) {
    return control[static_cast<size_t>(r)] + kernels::kPeerFlags + blocks +
           (static_cast<size_t>(p) * 4 + which) * blocks;
  };
  // The direction sender -> receiver, as both see it.
  auto mailbox = [&](int sender, int receiver) {
    kernels::PeerMailbox m;
    m.inbox = inboxes[static_cast<size_t>(sender * n + receiver)];
    m.ready = counts(receiver, sender, 0);
    m.received = counts(receiver, sender, 1);
    m.consumed = counts(sender, receiver, 2);
    m.sent = counts(sender, receiver, 3);
    m.capacity = options.mailbox_bytes;
    m.timeout_ns = timeout_ns;
    return m;
  };
  std::vector<std::unique_ptr<DeviceCommunicator>> out;
  for (int r = 0; r < n; ++r) {
    kernels::PeerGroup view;
    for (int j = 0; j < n; ++j) {
      view.flags[j] = control[static_cast<size_t>(j)];
      view.staging[j] = staging[static_cast<size_t>(j)];
    }
    view.passed = control[static_cast<size_t>(r)] + kernels::kPeerFlags;
    view.capacity = options.staging_bytes;
    view.rank = r;
    view.num_ranks = n;
    view.timeout_ns = timeout_ns;
    std::vector<kernels::PeerMailbox> to(static_cast<size_t>(n)), from(static_cast<size_t>(n));
    for (int p = 0; p < n && options.mailbox_bytes > 0; ++p) {
      if (p == r) continue;
      if (!options.ring || (r + 1) % n == p) to[static_cast<size_t>(p)] = mailbox(r, p);
      if (!options.ring || (p + 1) % n == r) from[static_cast<size_t>(p)] = mailbox(p, r);
    }
    out.push_back(std::make_unique<PeerRank>(memory, options, devices[static_cast<size_t>(r)], view,
                                             std::move(to), std::move(from)));
  }
  return out;
}

}  // namespace hr::engine
