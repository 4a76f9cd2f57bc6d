// Virtual ranks: the last caller of a collective enqueues it over every rank's buffers.
#include "engine/virtual_ranks.h"

#include <deque>
#include <mutex>
#include <string>

#include "kernels/all_reduce.cuh"

namespace hr::engine {
namespace {

enum class Op { kNone, kAllReduce, kAllGather, kReduceScatter, kBroadcast, kAllReduceAddNorm };

const char* op_name(Op op) {
  switch (op) {
    case Op::kAllReduce:
      return "all_reduce";
    case Op::kAllGather:
      return "all_gather";
    case Op::kReduceScatter:
      return "reduce_scatter";
    case Op::kBroadcast:
      return "broadcast";
    case Op::kAllReduceAddNorm:
      return "all_reduce_add_rms_norm";
    default:
      return "collective";
  }
}

Status cuda_status(cudaError_t e, Op op) {
  if (e == cudaSuccess) return Status::ok();
  return internal_error(std::string(op_name(op)) + ": " + cudaGetErrorString(e));
}

// A message sent and not yet received: where it is, and how long.
struct Message {
  const void* data = nullptr;
  size_t bytes = 0;
};

// The collective being gathered: each rank's buffers, and the arguments every rank must repeat;
// and the messages in flight between each pair of ranks (sender * size + receiver).
struct Group {
  explicit Group(int n)
      : size(n),
        in(static_cast<size_t>(n)),
        out(static_cast<size_t>(n)),
        x(static_cast<size_t>(n)),
        normed(static_cast<size_t>(n)),
        mail(static_cast<size_t>(n) * n) {}
  const int size;
  Op op = Op::kNone;
  int arrived = 0;
  size_t n = 0;
  int root = 0;
  cudaStream_t stream = nullptr;
  std::vector<const float*> in;
  std::vector<float*> out;
  // The layer boundary's (all_reduce_add_rms_norm): each rank's residual stream and normed rows,
  // rank 0's norm weight (every rank holds the same values), the rows' width and epsilon.
  std::vector<float*> x;
  std::vector<__nv_bfloat16*> normed;
  const float* weight = nullptr;
  int dim = 0;
  float eps = 0;
  std::mutex mail_mu;  // the ranks' threads send and receive without taking turns
  std::vector<std::deque<Message>> mail;
};

class VirtualRank final : public DeviceCommunicator {
 public:
  VirtualRank(std::shared_ptr<Group> group, int rank, RankThreads* turns)
      : g_(std::move(group)), rank_(rank), turns_(turns) {}
  int rank() const override { return rank_; }
  int size() const override { return g_->size; }
  Status all_reduce(float* data, size_t n, cudaStream_t stream) override {
    return arrive(Op::kAllReduce, data, data, n, 0, stream);
  }
  Status all_gather(const float* in, float* out, size_t n, cudaStream_t stream) override {
    return arrive(Op::kAllGather, in, out, n, 0, stream);
  }
  Status reduce_scatter(const float* in, float* out, size_t n, cudaStream_t stream) override {
    return arrive(Op::kReduceScatter, in, out, n, 0, stream);
  }
  Status broadcast(float* data, size_t n, int root, cudaStream_t stream) override {
    if (root < 0 || root >= g_->size) {
      g_->arrived = 0;
      return invalid_argument("broadcast: root " + std::to_string(root) + " is not a rank",
                              "broadcast");
    }
    return arrive(Op::kBroadcast, data, data, n, root, stream);
  }
  bool fuses_layer_boundary() const override { return true; }
  Status all_reduce_add_rms_norm(float* partial, float* x, __nv_bfloat16* out, const float* weight,
                                 int rows, int dim, float eps, cudaStream_t stream) override {
    Group& g = *g_;
    if (rows < 0 || dim <= 0 || x == nullptr || out == nullptr || weight == nullptr) {
      g.arrived = 0;
      return invalid_argument("all_reduce_add_rms_norm: no rows, residual, output or weight",
                              "all_reduce_add_rms_norm");
    }
    if (rank_ == g.arrived) {
      if (rank_ == 0) {
        g.weight = weight;
        g.dim = dim;
        g.eps = eps;
      } else if (g.dim != dim || g.eps != eps) {
        g.arrived = 0;
        return invalid_argument("all_reduce_add_rms_norm: the ranks' widths or epsilons differ",
                                "all_reduce_add_rms_norm");
      }
      g.x[static_cast<size_t>(rank_)] = x;
      g.normed[static_cast<size_t>(rank_)] = out;
    }
    return arrive(Op::kAllReduceAddNorm, partial, partial, static_cast<size_t>(rows) * dim, 0,
                  stream);
  }
  // A send is recorded; the receive, later, enqueues the copy (the sender's stream and the
  // receiver's are the one stream the ranks share, so the copy follows what the sender enqueued
  // before its send).
  Status send(const void* data, size_t bytes, int peer, cudaStream_t) override {
    if (peer < 0 || peer >= g_->size || peer == rank_) {
      return invalid_argument("send: " + std::to_string(peer) + " is no other rank", "send");
    }
    std::lock_guard<std::mutex> lock(g_->mail_mu);
    g_->mail[static_cast<size_t>(rank_ * g_->size + peer)].push_back({data, bytes});
    return Status::ok();
  }
  Status recv(void* data, size_t bytes, int peer, cudaStream_t stream) override {
    if (peer < 0 || peer >= g_->size || peer == rank_) {
      return invalid_argument("recv: " + std::to_string(peer) + " is no other rank", "recv");
    }
    Message m;
    {
      std::lock_guard<std::mutex> lock(g_->mail_mu);
      auto& q = g_->mail[static_cast<size_t>(peer * g_->size + rank_)];
      if (q.empty()) {
        return invalid_argument("recv: rank " + std::to_string(peer) + " sent rank " +
                                    std::to_string(rank_) + " nothing (virtual ranks send first)",
                                "recv");
      }
      m = q.front();
      q.pop_front();
    }
    if (m.bytes != bytes) {
      return invalid_argument("recv: rank " + std::to_string(peer) + " sent " +
                                  std::to_string(m.bytes) + " bytes, not " + std::to_string(bytes),
                              "recv");
    }
    if (bytes == 0) return Status::ok();
    const cudaError_t e = cudaMemcpyAsync(data, m.data, bytes, cudaMemcpyDeviceToDevice, stream);
    if (e != cudaSuccess) return internal_error(std::string("recv: ") + cudaGetErrorString(e));
    return Status::ok();
  }

 private:
  Status arrive(Op op, const float* in, float* out, size_t n, int root, cudaStream_t stream);
  Status run();

  std::shared_ptr<Group> g_;
  int rank_;
  RankThreads* turns_;
};

Status VirtualRank::arrive(Op op, const float* in, float* out, size_t n, int root,
                           cudaStream_t stream) {
  Group& g = *g_;
  if (rank_ != g.arrived) {
    g.arrived = 0;
    return invalid_argument(
        std::string(op_name(op)) + ": rank " + std::to_string(rank_) + " called out of rank order",
        op_name(op));
  }
  if (rank_ == 0) {
    g.op = op;
    g.n = n;
    g.root = root;
    g.stream = stream;
  } else if (g.op != op || g.n != n || g.root != root || g.stream != stream) {
    g.arrived = 0;
    return invalid_argument(
        std::string(op_name(op)) + ": the ranks' collectives, sizes, roots or streams differ",
        op_name(op));
  }
  g.in[static_cast<size_t>(rank_)] = in;
  g.out[static_cast<size_t>(rank_)] = out;
  if (++g.arrived == g.size) {
    g.arrived = 0;
    HR_RETURN_IF_ERROR(run());
  }
  return turns_ ? turns_->pass(rank_) : Status::ok();
}

Status VirtualRank::run() {
  Group& g = *g_;
  const int N = g.size;
  const size_t bytes = g.n * sizeof(float);
  switch (g.op) {
    case Op::kAllReduce: {
      kernels::PeerSumParams p;
      p.num_inputs = p.num_outputs = N;
      for (int r = 0; r < N; ++r) {
        p.in[r] = g.in[static_cast<size_t>(r)];
        p.out[r] = g.out[static_cast<size_t>(r)];
      }
      p.n = g.n;
      return cuda_status(kernels::peer_sum(p, g.stream), g.op);
    }
    case Op::kReduceScatter:
      for (int r = 0; r < N; ++r) {
        kernels::PeerSumParams p;
        p.num_inputs = N;
        for (int j = 0; j < N; ++j) p.in[j] = g.in[static_cast<size_t>(j)] + g.n * r;
        p.num_outputs = 1;
        p.out[0] = g.out[static_cast<size_t>(r)];
        p.n = g.n;
        HR_RETURN_IF_ERROR(cuda_status(kernels::peer_sum(p, g.stream), g.op));
      }
      return Status::ok();
    case Op::kAllGather:
      for (int r = 0; r < N; ++r) {
        for (int j = 0; j < N; ++j) {
          HR_RETURN_IF_ERROR(cuda_status(
              cudaMemcpyAsync(g.out[static_cast<size_t>(r)] + g.n * j, g.in[static_cast<size_t>(j)],
                              bytes, cudaMemcpyDeviceToDevice, g.stream),
              g.op));
        }
      }
      return Status::ok();
    case Op::kBroadcast:
      for (int r = 0; r < N; ++r) {
        if (r == g.root) continue;
        HR_RETURN_IF_ERROR(cuda_status(
            cudaMemcpyAsync(g.out[static_cast<size_t>(r)], g.in[static_cast<size_t>(g.root)], bytes,
                            cudaMemcpyDeviceToDevice, g.stream),
            g.op));
      }
      return Status::ok();
    case Op::kAllReduceAddNorm: {
      kernels::AllReduceAddRmsNormParams p;
      p.num_ranks = N;
      for (int r = 0; r < N; ++r) {
        p.partial[r] = g.in[static_cast<size_t>(r)];
        p.x[r] = g.x[static_cast<size_t>(r)];
        p.out[r] = g.normed[static_cast<size_t>(r)];
      }
      p.weight = g.weight;
      p.dim = g.dim;
      p.num_rows = static_cast<int>(g.n / static_cast<size_t>(g.dim));
      p.eps = g.eps;
      return cuda_status(kernels::all_reduce_add_rms_norm(p, g.stream), g.op);
    }
    default:
      return internal_error("no collective in progress");
  }
}

}  // namespace

std::vector<std::unique_ptr<DeviceCommunicator>> VirtualRankGroup::create(int size,
                                                                          RankThreads* turns) {
  std::vector<std::unique_ptr<DeviceCommunicator>> out;
  if (size < 1 || size > kernels::kMaxPeerRanks) return out;
  auto group = std::make_shared<Group>(size);
  for (int r = 0; r < size; ++r) out.push_back(std::make_unique<VirtualRank>(group, r, turns));
  return out;
}

}  // namespace hr::engine
