// NCCL's entry points looked up once with dlsym; ranks as communicators of ncclCommInitAll.
#include "engine/nccl_communicator.h"

#include <dlfcn.h>
#include <nccl.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <string>
#include <thread>
#include <type_traits>

namespace hr::engine {
namespace {

struct Nccl {
  decltype(&::ncclGetVersion) get_version = nullptr;
  decltype(&::ncclGetErrorString) error_string = nullptr;
  decltype(&::ncclCommInitAll) init_all = nullptr;
  decltype(&::ncclCommDestroy) destroy = nullptr;
  decltype(&::ncclCommAbort) abort = nullptr;
  decltype(&::ncclAllReduce) all_reduce = nullptr;
  decltype(&::ncclAllGather) all_gather = nullptr;
  decltype(&::ncclReduceScatter) reduce_scatter = nullptr;
  decltype(&::ncclBroadcast) broadcast = nullptr;
  decltype(&::ncclSend) send = nullptr;
  decltype(&::ncclRecv) recv = nullptr;
  decltype(&::ncclGroupStart) group_start = nullptr;
  decltype(&::ncclGroupEnd) group_end = nullptr;
  std::string error;  // why it could not be loaded
};

const Nccl& nccl() {
  static Nccl n;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libnccl.so.2", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
      const char* e = dlerror();
      n.error = std::string("libnccl.so.2 cannot be loaded: ") + (e ? e : "unknown error");
      return;
    }
    bool missing = false;
    auto find = [&](auto* fn, const char* name) {
      *fn = reinterpret_cast<std::remove_pointer_t<decltype(fn)>>(dlsym(lib, name));
      if (*fn == nullptr) {
        n.error = std::string("libnccl.so.2 lacks ") + name;
        missing = true;
      }
    };
    find(&n.get_version, "ncclGetVersion");
    find(&n.error_string, "ncclGetErrorString");
    find(&n.init_all, "ncclCommInitAll");
    find(&n.destroy, "ncclCommDestroy");
    find(&n.abort, "ncclCommAbort");
    find(&n.all_reduce, "ncclAllReduce");
    find(&n.all_gather, "ncclAllGather");
    find(&n.reduce_scatter, "ncclReduceScatter");
    find(&n.broadcast, "ncclBroadcast");
    find(&n.send, "ncclSend");
    find(&n.recv, "ncclRecv");
    find(&n.group_start, "ncclGroupStart");
    find(&n.group_end, "ncclGroupEnd");
    if (missing) n.get_version = nullptr;  // loaded, but not usable
  });
  return n;
}

Status loaded() {
  const Nccl& n = nccl();
  if (n.get_version == nullptr) return unavailable(n.error);
  return Status::ok();
}

Status check(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::ok();
  return internal_error(std::string(what) + ": " + nccl().error_string(r));
}

class NcclRank final : public DeviceCommunicator {
 public:
  NcclRank(ncclComm_t comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  ~NcclRank() override {
    if (!aborted_) nccl().destroy(comm_);  // (an aborted one is freed already)
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  // ncclCommAbort: the kernels of this rank's operations under way return, whatever their peers
  // do, and the communicator's resources are freed. Meant for a rank whose thread waits for its
  // stream (a stuck step's collect). aborted_ is set first, so that calls from then on do not
  // reach NCCL, and calls already past that check are waited for (kCallWaitMs at most) before
  // the communicator is freed; a call still inside NCCL after that (a first send still
  // connecting, say) races with the abort, NCCL allowing one thread a communicator.
  // (Non-blocking communicators, whose calls return at once, would close that window: not
  // done.)
  bool abort(const std::string& reason) override {
    {
      std::lock_guard<std::mutex> lock(abort_mu_);
      if (aborted_) return true;
      reason_ = reason;
      aborted_ = true;
    }
    // (Not under abort_mu_: a call that sees the abort takes it for the reason.)
    for (int waited = 0; calls_.load() > 0 && waited < kCallWaitMs; ++waited)
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ncclResult_t r = nccl().abort(comm_);
    if (r != ncclSuccess) {
      std::lock_guard<std::mutex> lock(abort_mu_);
      abort_error_ = nccl().error_string(r);
    }
    return true;
  }
  Status all_reduce(float* data, size_t n, cudaStream_t stream) override {
    const Call call(*this);
    HR_RETURN_IF_ERROR(usable());
    return check(nccl().all_reduce(data, data, n, ncclFloat32, ncclSum, comm_, stream),
                 "all_reduce");
  }
  Status all_gather(const float* in, float* out, size_t n, cudaStream_t stream) override {
    const Call call(*this);
    HR_RETURN_IF_ERROR(usable());
    return check(nccl().all_gather(in, out, n, ncclFloat32, comm_, stream), "all_gather");
  }
  Status reduce_scatter(const float* in, float* out, size_t n, cudaStream_t stream) override {
    const Call call(*this);
    HR_RETURN_IF_ERROR(usable());
    return check(nccl().reduce_scatter(in, out, n, ncclFloat32, ncclSum, comm_, stream),
                 "reduce_scatter");
  }
  Status broadcast(float* data, size_t n, int root, cudaStream_t stream) override {
    const Call call(*this);
    HR_RETURN_IF_ERROR(usable());
    return check(nccl().broadcast(data, data, n, ncclFloat32, root, comm_, stream), "broadcast");
  }
  Status send(const void* data, size_t bytes, int peer, cudaStream_t stream) override {
    const Call call(*this);
    HR_RETURN_IF_ERROR(usable());
    return check(nccl().send(data, bytes, ncclUint8, peer, comm_, stream), "send");
  }
  Status recv(void* data, size_t bytes, int peer, cudaStream_t stream) override {
    const Call call(*this);
    HR_RETURN_IF_ERROR(usable());
    return check(nccl().recv(data, bytes, ncclUint8, peer, comm_, stream), "recv");
  }

 private:
  static constexpr int kCallWaitMs = 2000;
  // A call under way, counted before it checks aborted_ (both sequentially consistent: either
  // the call sees the abort, or the abort sees the call and waits for it).
  struct Call {
    explicit Call(const NcclRank& r) : rank(r) { rank.calls_.fetch_add(1); }
    ~Call() { rank.calls_.fetch_sub(1); }
    const NcclRank& rank;
  };

  Status usable() const {
    if (!aborted_) return Status::ok();
    std::lock_guard<std::mutex> lock(abort_mu_);
    std::string message = "NCCL rank " + std::to_string(rank_) + " was aborted: " + reason_;
    if (!abort_error_.empty()) message += " (ncclCommAbort: " + abort_error_ + ")";
    return internal_error(message);
  }

  ncclComm_t comm_;
  int rank_, size_;
  mutable std::mutex abort_mu_;
  std::atomic<bool> aborted_{false};  // set by abort(), under abort_mu_
  mutable std::atomic<int> calls_{0};
  std::string reason_, abort_error_;  // guarded by abort_mu_
};

}  // namespace

Result<int> NcclCommunicator::version() {
  HR_RETURN_IF_ERROR(loaded());
  int v = 0;
  HR_RETURN_IF_ERROR(check(nccl().get_version(&v), "ncclGetVersion"));
  return v;
}

Status NcclCommunicator::group_start() {
  HR_RETURN_IF_ERROR(loaded());
  return check(nccl().group_start(), "ncclGroupStart");
}

Status NcclCommunicator::group_end() {
  HR_RETURN_IF_ERROR(loaded());
  return check(nccl().group_end(), "ncclGroupEnd");
}

Result<std::vector<std::unique_ptr<DeviceCommunicator>>> NcclCommunicator::create_all(
    const std::vector<int>& devices) {
  HR_RETURN_IF_ERROR(loaded());
  if (devices.empty()) return invalid_argument("no devices for NCCL", "devices");
  std::vector<ncclComm_t> comms(devices.size());
  HR_RETURN_IF_ERROR(
      check(nccl().init_all(comms.data(), static_cast<int>(devices.size()), devices.data()),
            "ncclCommInitAll"));
  std::vector<std::unique_ptr<DeviceCommunicator>> out;
  for (size_t r = 0; r < comms.size(); ++r) {
    out.push_back(
        std::make_unique<NcclRank>(comms[r], static_cast<int>(r), static_cast<int>(comms.size())));
  }
  return out;
}

}  // namespace hr::engine
