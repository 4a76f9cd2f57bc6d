// Collectives between GPUs over peer pointers (engine/peer_communicator.h) at 2, 3, 4 and 8
// ranks, each rank driven by a thread of its own on its own device and stream, all at once: every
// collective against the serial sums in rank order, bitwise, in one launch and in pieces (staging
// smaller than the message), one-shot and two-shot, eagerly and replayed from each rank's captured
// graph over new data, and a message of more than 32 blocks between small ones; the layer
// boundary bitwise equal to the virtual ranks' fused kernel, whole and in pieces of rows, more
// rows than blocks; point-to-point messages of 1 to 3 blocks in the order sent, in pieces of the
// mailbox, and a ring group's mailboxes to the next rank only; and
// a rank that never arrives failing its peer's kernel at the timeout instead of hanging it. On the
// CPU stand-in for the CUDA runtime the devices are simulated (each thread its current device,
// every device reaching the others' memory); on a GPU machine with fewer GPUs than ranks (or
// without peer access) the ranks share device 0, each on a stream of its own.
#include <gtest/gtest.h>

#include <barrier>
#include <cstring>
#include <functional>
#include <map>
#include <random>

#include "engine/peer_communicator.h"
#include "engine/rank_threads.h"
#include "kernels/all_reduce.cuh"
#include "tests/engine/cuda_test_util.h"

namespace hr::engine {
namespace {

// `n` devices that reach each other's memory for the test's length (simulated on the stand-in);
// on a GPU machine with fewer, the ranks share device 0, each on a stream of its own (options():
// allow_shared_device); none without a GPU.
class PeerDevices {
 public:
  explicit PeerDevices(int n) {
#ifdef HEADROOM_SIMT
    hr::simt::set_device_count(n);
#endif
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    cudaGetLastError();
    std::vector<int> d;
    for (int i = 0; i < n && i < count; ++i) d.push_back(i);
    if (static_cast<int>(d.size()) == n && PeerCommunicator::all_peers(d)) {
      devices_ = d;
    } else if (count > 0) {
      devices_.assign(static_cast<size_t>(n), 0);
      options_.allow_shared_device = true;
    }
  }
  // Rank r's device.
  int device(int r) const { return devices_[static_cast<size_t>(r)]; }
  PeerOptions options() const { return options_; }
  ~PeerDevices() {
#ifdef HEADROOM_SIMT
    hr::simt::set_device_count(1);
#endif
    cudaSetDevice(0);
  }
  const std::vector<int>& devices() const { return devices_; }

 private:
  std::vector<int> devices_;
  PeerOptions options_;
};

#define NEED_PEER_DEVICES(peers, n) \
  PeerDevices peers(n);             \
  if (peers.devices().empty()) GTEST_SKIP() << "no CUDA device present"

std::vector<float> values(int rank, int round, size_t n) {
  std::mt19937 gen(static_cast<uint32_t>(rank * 7919 + round));
  return random_vec(n, gen);
}

// Rank order: rank 0's plus rank 1's plus ...
std::vector<float> serial_sum(int ranks, int round, size_t n, size_t offset = 0, size_t total = 0) {
  std::vector<float> sum;
  for (int r = 0; r < ranks; ++r) {
    const auto v = values(r, round, total ? total : n);
    for (size_t i = 0; i < n; ++i) {
      if (r == 0)
        sum.push_back(v[offset + i]);
      else
        sum[i] += v[offset + i];
    }
  }
  return sum;
}

// One rank's buffers and stream, made on its device (by its thread).
struct Rank {
  static constexpr size_t kLen = 1001, kPiece = 101;  // odd: the kernels' partial units run
  cudaStream_t stream = nullptr;
  std::unique_ptr<DeviceBuffer<float>> reduce, gather_in, gather_out, scatter_in, scatter_out,
      bcast;
  void make(int ranks) {
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    reduce = std::make_unique<DeviceBuffer<float>>(kLen);
    gather_in = std::make_unique<DeviceBuffer<float>>(kLen);
    gather_out = std::make_unique<DeviceBuffer<float>>(kLen * ranks);
    scatter_in = std::make_unique<DeviceBuffer<float>>(kPiece * ranks);
    scatter_out = std::make_unique<DeviceBuffer<float>>(kPiece);
    bcast = std::make_unique<DeviceBuffer<float>>(kLen);
  }
  void fill(int rank, int round, int ranks) {
    auto put = [](DeviceBuffer<float>& b, const std::vector<float>& v) {
      ASSERT_EQ(cudaMemcpy(b.ptr, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
    };
    put(*reduce, values(rank, round, kLen));
    put(*gather_in, values(rank, round + 1000, kLen));
    put(*scatter_in, values(rank, round + 2000, kPiece * ranks));
    put(*bcast, values(rank, round + 3000, kLen));
    // (The copies go on the legacy stream, which the rank's stream does not wait for.)
    ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  }
  Status enqueue(DeviceCommunicator& c, int root) {
    HR_RETURN_IF_ERROR(c.all_reduce(reduce->ptr, kLen, stream));
    HR_RETURN_IF_ERROR(c.all_gather(gather_in->ptr, gather_out->ptr, kLen, stream));
    HR_RETURN_IF_ERROR(c.reduce_scatter(scatter_in->ptr, scatter_out->ptr, kPiece, stream));
    return c.broadcast(bcast->ptr, kLen, root, stream);
  }
  void expect(int rank, int round, int ranks, int root) {
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    EXPECT_EQ(reduce->get(), serial_sum(ranks, round, kLen)) << "all_reduce, rank " << rank;
    std::vector<float> gathered;
    for (int r = 0; r < ranks; ++r) {
      const auto v = values(r, round + 1000, kLen);
      gathered.insert(gathered.end(), v.begin(), v.end());
    }
    EXPECT_EQ(gather_out->get(), gathered) << "all_gather, rank " << rank;
    EXPECT_EQ(scatter_out->get(),
              serial_sum(ranks, round + 2000, kPiece, rank * kPiece, kPiece * ranks))
        << "reduce_scatter, rank " << rank;
    EXPECT_EQ(bcast->get(), values(root, round + 3000, kLen)) << "broadcast, rank " << rank;
  }
};

struct Shape {
  int ranks;
  size_t staging_bytes;   // small: every message in pieces
  size_t two_shot_bytes;  // 0: every all-reduce two-shot
};

void PrintTo(const Shape& s, std::ostream* os) {
  *os << s.ranks << " ranks, staging " << s.staging_bytes << ", two-shot from " << s.two_shot_bytes;
}

class PeerCollectivesTest : public ::testing::TestWithParam<Shape> {};

constexpr size_t kBig = 70001;  // floats: 17,501 units of 4, past 32 blocks of 512 threads

TEST_P(PeerCollectivesTest, EqualTheSerialSumsEagerlyAndInEachRanksGraph) {
  const Shape& shape = GetParam();
  const int n = shape.ranks;
  NEED_PEER_DEVICES(peers, n);
  PeerOptions po = peers.options();
  po.staging_bytes = shape.staging_bytes;
  po.two_shot_bytes = shape.two_shot_bytes;
  auto group = PeerCommunicator::create_all(peers.devices(), po);
  ASSERT_TRUE(group.is_ok()) << group.status().to_string();
  ASSERT_EQ(group->size(), static_cast<size_t>(n));
  std::vector<Rank> ranks(static_cast<size_t>(n));
  // Allocating memory and instantiating a graph wait for the whole device, which on a GPU shared
  // by the ranks would wait for a peer's kernel that waits for this rank: every rank's buffers
  // are made before any rank's first launch, and its graph before any rank's first replay. (A
  // rank that fails in between leaves the barrier, so that the others do not wait for it there.)
  std::barrier ready(n);
  RankThreads threads(n, false, [&](int r) { cudaSetDevice(peers.device(r)); });
  const Status st = threads.run([&](int r) -> Status {
    Rank& rank = ranks[static_cast<size_t>(r)];
    DeviceCommunicator& c = *(*group)[static_cast<size_t>(r)];
    EXPECT_EQ(c.rank(), r);
    EXPECT_EQ(c.size(), n);
    rank.make(n);
    std::unique_ptr<DeviceBuffer<float>> big;
    if (shape.staging_bytes >= kBig * 4)
      big = std::make_unique<DeviceBuffer<float>>(values(r, 77, kBig));
    EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
    ready.arrive_and_wait();
    // Eagerly, twice (the flags are ready for the next call).
    for (int round = 0; round < 2; ++round) {
      rank.fill(r, round, n);
      if (Status s = rank.enqueue(c, round % n); !s.is_ok()) {
        ready.arrive_and_drop();
        return s;
      }
      rank.expect(r, round, n, round % n);
    }
    // Captured once by each rank on its own stream, replayed over new data twice.
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    EXPECT_EQ(cudaStreamBeginCapture(rank.stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
    const Status recorded = rank.enqueue(c, n - 1);
    EXPECT_EQ(cudaStreamEndCapture(rank.stream, &graph), cudaSuccess);
    if (!recorded.is_ok()) {
      ready.arrive_and_drop();
      return recorded;
    }
    EXPECT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
    ready.arrive_and_wait();
    for (int round = 10; round < 12; ++round) {
      rank.fill(r, round, n);
      EXPECT_EQ(cudaGraphLaunch(exec, rank.stream), cudaSuccess);
      rank.expect(r, round, n, n - 1);
    }
    // A message of many blocks (more units than a launch has threads, so blocks go round), then
    // small ones again: every block's barrier counts stay in step whatever the grid.
    if (big) {
      HR_RETURN_IF_ERROR(c.all_reduce(big->ptr, kBig, rank.stream));
      rank.fill(r, 20, n);
      HR_RETURN_IF_ERROR(rank.enqueue(c, 0));
      rank.expect(r, 20, n, 0);
      EXPECT_EQ(big->get(), serial_sum(n, 77, kBig)) << "a large all_reduce, rank " << r;
    }
    cudaGraphExecDestroy(exec);
    cudaGraphDestroy(graph);
    cudaStreamDestroy(rank.stream);
    return Status::ok();
  });
  EXPECT_TRUE(st.is_ok()) << st.to_string();
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, PeerCollectivesTest,
    ::testing::Values(Shape{2, size_t{1} << 20, size_t{1} << 20},  // one launch, one-shot
                      Shape{3, size_t{1} << 20, 0},                // two-shot
                      Shape{4, 256, size_t{1} << 20},              // pieces of 64 floats
                      Shape{4, 1024, 0},                           // pieces, two-shot
                      Shape{8, size_t{1} << 20, 0}, Shape{8, 4096, size_t{1} << 20}),
    [](const ::testing::TestParamInfo<Shape>& info) {
      const Shape& s = info.param;
      return std::to_string(s.ranks) + "_ranks_staging_" + std::to_string(s.staging_bytes) +
             (s.two_shot_bytes == 0 ? "_two_shot" : "_one_shot");
    });

// The layer boundary over peers: x and the normed rows bitwise what the virtual ranks' fused
// kernel (kernels::all_reduce_add_rms_norm, every rank's buffers in one launch) leaves, whole and
// in pieces of two rows.
TEST(PeerLayerBoundary, EqualsTheVirtualRanksFusedKernel) {
  const int n = 3, rows = 41, dim = 264;  // (more rows than blocks: a block takes several)
  NEED_PEER_DEVICES(peers, n);
  const size_t len = static_cast<size_t>(rows) * dim;
  std::mt19937 rng(9);
  const std::vector<float> residual = random_vec(len, rng, -2.0f, 2.0f);
  const std::vector<float> weight = random_vec(dim, rng, 0.5f, 1.5f);
  std::vector<std::vector<float>> partials;
  for (int r = 0; r < n; ++r) partials.push_back(random_vec(len, rng));
  // The virtual ranks' launch, on device 0.
  std::vector<float> want_x;
  std::vector<uint16_t> want_out;
  {
    std::vector<std::unique_ptr<DeviceBuffer<float>>> partial, x;
    std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>> out;
    DeviceBuffer<float> w(weight);
    kernels::AllReduceAddRmsNormParams p;
    for (int r = 0; r < n; ++r) {
      partial.push_back(std::make_unique<DeviceBuffer<float>>(partials[static_cast<size_t>(r)]));
      x.push_back(std::make_unique<DeviceBuffer<float>>(residual));
      out.push_back(std::make_unique<DeviceBuffer<uint16_t>>(len));
      p.partial[r] = partial.back()->ptr;
      p.x[r] = x.back()->ptr;
      p.out[r] = reinterpret_cast<__nv_bfloat16*>(out.back()->ptr);
    }
    p.weight = w.ptr;
    p.num_ranks = n;
    p.num_rows = rows;
    p.dim = dim;
    p.eps = 1e-5f;
    ASSERT_EQ(kernels::all_reduce_add_rms_norm(p, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    want_x = x[1]->get();
    want_out = out[1]->get();
    ASSERT_NE(want_x, residual);
  }
  for (size_t staging : {size_t{1} << 20, size_t{2} * dim * 4}) {
    PeerOptions po = peers.options();
    po.staging_bytes = staging;
    auto group = PeerCommunicator::create_all(peers.devices(), po);
    ASSERT_TRUE(group.is_ok()) << group.status().to_string();
    EXPECT_TRUE((*group)[0]->fuses_layer_boundary());
    std::barrier ready(n);
    RankThreads threads(n, false, [&](int r) { cudaSetDevice(peers.device(r)); });
    const Status st = threads.run([&](int r) -> Status {
      // A stream of the rank's own, every rank's buffers filled before any rank's launch (ranks
      // sharing a GPU must not allocate behind each other's waiting kernels).
      cudaStream_t stream;
      EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
      DeviceBuffer<float> partial(partials[static_cast<size_t>(r)]), x(residual), w(weight);
      DeviceBuffer<uint16_t> out(len);
      EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
      ready.arrive_and_wait();
      HR_RETURN_IF_ERROR((*group)[static_cast<size_t>(r)]->all_reduce_add_rms_norm(
          partial.ptr, x.ptr, reinterpret_cast<__nv_bfloat16*>(out.ptr), w.ptr, rows, dim, 1e-5f,
          stream));
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      cudaStreamDestroy(stream);
      EXPECT_EQ(x.get(), want_x) << "rank " << r << ", staging " << staging;
      EXPECT_EQ(out.get(), want_out) << "rank " << r << ", staging " << staging;
      return Status::ok();
    });
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
}

// Pipeline hand-offs: each rank sends every other rank messages of several lengths (some longer
// than the mailbox, so in pieces); each arrives whole and in order. Sends to no other rank, and
// point to point in a group without mailboxes, are refused naming the call.
TEST(PeerPointToPoint, MessagesArriveInOrderInPieces) {
  const int n = 3;
  NEED_PEER_DEVICES(peers, n);
  PeerOptions po = peers.options();
  po.mailbox_bytes = 16 << 10;
  auto group = PeerCommunicator::create_all(peers.devices(), po);
  ASSERT_TRUE(group.is_ok()) << group.status().to_string();
  // 1 to 3 blocks a message; the longest in two pieces of the mailbox.
  const std::vector<size_t> lengths = {5, 100, 9000, 20000};
  auto message = [](int from, int to, size_t k, size_t bytes) {
    std::vector<uint8_t> m(bytes);
    for (size_t i = 0; i < bytes; ++i) m[i] = static_cast<uint8_t>(from * 61 + to * 17 + k * 7 + i);
    return m;
  };
  std::barrier ready(n);
  RankThreads threads(n, false, [&](int r) { cudaSetDevice(peers.device(r)); });
  const Status st = threads.run([&](int r) -> Status {
    DeviceCommunicator& c = *(*group)[static_cast<size_t>(r)];
    cudaStream_t stream;
    EXPECT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
    // Every rank's buffers before any rank's first launch: allocating memory waits for the whole
    // device, which on a GPU shared by the ranks would wait for a peer's kernel that waits for
    // this rank (seen on an H200: the first sender's kernel met its timeout).
    std::map<std::pair<int, int>, std::vector<std::unique_ptr<DeviceBuffer<uint8_t>>>> bufs;
    for (int from = 0; from < n; ++from) {
      for (int to = 0; to < n; ++to) {
        if (from == to || (r != from && r != to)) continue;
        for (size_t k = 0; k < lengths.size(); ++k) {
          bufs[{from, to}].push_back(
              r == from ? std::make_unique<DeviceBuffer<uint8_t>>(message(from, to, k, lengths[k]))
                        : std::make_unique<DeviceBuffer<uint8_t>>(lengths[k]));
        }
      }
    }
    EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
    ready.arrive_and_wait();
    // Every ordered pair in turn: the sender sends all its messages while the receiver takes
    // them (a message longer than the mailbox goes piece by piece as the receiver reads them).
    for (auto& [pair, mine] : bufs) {
      const auto [from, to] = pair;
      for (size_t k = 0; k < lengths.size(); ++k) {
        if (r == from) {
          HR_RETURN_IF_ERROR(c.send(mine[k]->ptr, lengths[k], to, stream));
        } else {
          HR_RETURN_IF_ERROR(c.recv(mine[k]->ptr, lengths[k], from, stream));
        }
      }
      EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
      for (size_t k = 0; r == to && k < lengths.size(); ++k)
        EXPECT_EQ(mine[k]->get(), message(from, to, k, lengths[k])) << from << " -> " << to;
    }
    EXPECT_EQ(c.send(nullptr, 4, r, stream).field(), "send");
    EXPECT_EQ(c.recv(nullptr, 4, n, stream).field(), "recv");
    cudaStreamDestroy(stream);
    return Status::ok();
  });
  EXPECT_TRUE(st.is_ok()) << st.to_string();
  auto no_mail = PeerCommunicator::create_all(peers.devices(), peers.options());
  ASSERT_TRUE(no_mail.is_ok());
  EXPECT_EQ((*no_mail)[0]->send(nullptr, 4, 1, nullptr).field(), "send");
  // A ring's mailboxes: each rank sends to the next and receives from the one before, only.
  PeerOptions ring = po;
  ring.ring = true;
  auto pipes = PeerCommunicator::create_all(peers.devices(), ring);
  ASSERT_TRUE(pipes.is_ok());
  EXPECT_EQ((*pipes)[0]->send(nullptr, 4, 2, nullptr).field(), "send");
  EXPECT_EQ((*pipes)[0]->recv(nullptr, 4, 1, nullptr).field(), "recv");
  EXPECT_EQ((*pipes)[2]->send(nullptr, 4, 1, nullptr).field(), "send");
}

TEST(PeerCommunicatorErrors, BadGroupsAreRefusedNamingTheDevices) {
  NEED_PEER_DEVICES(peers, 2);
  EXPECT_EQ(PeerCommunicator::create_all({0, 0}).status().field(), "devices");  // (not allowed)
  EXPECT_EQ(PeerCommunicator::create_all({}).status().field(), "devices");
  PeerOptions odd = peers.options();
  odd.staging_bytes = 100;
  EXPECT_EQ(PeerCommunicator::create_all(peers.devices(), odd).status().field(), "devices");
  PeerOptions small = peers.options();
  small.staging_bytes = 16;  // (under 16 bytes a rank: no reduce-scatter piece)
  EXPECT_EQ(PeerCommunicator::create_all(peers.devices(), small).status().field(), "devices");
}

// A rank whose peer never calls: its kernel fails at the timeout, with a message that says so,
// instead of waiting for ever. (On a GPU the kernel traps, which ends the process's CUDA context:
// the stand-in alone shows it.)
#ifdef HEADROOM_SIMT
TEST(PeerCommunicatorErrors, ARankWhosePeerNeverArrivesFailsAtTheTimeout) {
  NEED_PEER_DEVICES(peers, 2);
  PeerOptions po = peers.options();
  po.timeout_seconds = 0.2;
  auto group = PeerCommunicator::create_all(peers.devices(), po);
  ASSERT_TRUE(group.is_ok());
  DeviceBuffer<float> data(std::vector<float>(16, 1.0f));
  const Status st = (*group)[0]->all_reduce(data.ptr, 16, nullptr);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("timeout"), std::string::npos) << st.to_string();
  cudaGetLastError();
}
#endif

}  // namespace
}  // namespace hr::engine
