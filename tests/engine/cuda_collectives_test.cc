// Device collectives (engine/device_communicator.h): virtual ranks on one device at 1, 2, 3, 4 and
// 8 ranks, every collective against the serial sums in rank order (bitwise, as the CPU engine's
// ThreadCommunicator), eagerly and replayed from a captured CUDA graph with new data in the same
// buffers; calls out of rank order or with differing sizes refused naming the collective, with
// nothing enqueued; the fused all-reduce + residual add + RMSNorm kernel against the CPU backend's
// rms_norm. On a GPU also NCCL, world size 1, through the same interface (loaded with dlopen).
// Skips without a device; also built against the CPU stand-in for the CUDA runtime (simt/).
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <random>
#include <string>

#include "engine/cpu_backend.h"
#include "engine/virtual_ranks.h"
#include "kernels/all_reduce.cuh"
#include "kernels/rms_norm.cuh"
#include "tests/engine/cuda_test_util.h"
#ifndef HEADROOM_SIMT
#include "engine/nccl_communicator.h"
#endif

namespace hr::engine {
namespace {

std::vector<float> values(int rank, int round, size_t n) {
  std::mt19937 gen(static_cast<uint32_t>(rank * 7919 + round));
  return random_vec(n, gen);
}

// Every rank's buffers for one round of the four collectives: `len` floats each (odd, so the
// kernel's tail path runs), reduce-scatter pieces of `len / 10`.
struct RankBuffers {
  static constexpr size_t kLen = 1001, kPiece = 100;
  RankBuffers(int ranks)
      : reduce(kLen),
        gather_in(kLen),
        gather_out(kLen * ranks),
        scatter_in(kPiece * ranks),
        scatter_out(kPiece),
        bcast(kLen) {}
  DeviceBuffer<float> reduce, gather_in, gather_out, scatter_in, scatter_out, bcast;
  void fill(int rank, int round, int ranks) {
    auto put = [](DeviceBuffer<float>& b, const std::vector<float>& v) {
      ASSERT_EQ(cudaMemcpy(b.ptr, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice),
                cudaSuccess);
    };
    put(reduce, values(rank, round, kLen));
    put(gather_in, values(rank, round + 1000, kLen));
    put(scatter_in, values(rank, round + 2000, kPiece * ranks));
    put(bcast, values(rank, round + 3000, kLen));
  }
};

// Ranks 0..N-1 in turn, each collective, as one thread drives virtual ranks.
Status enqueue_round(std::vector<std::unique_ptr<DeviceCommunicator>>& ranks,
                     std::vector<std::unique_ptr<RankBuffers>>& bufs, int root,
                     cudaStream_t stream) {
  const size_t L = RankBuffers::kLen, P = RankBuffers::kPiece;
  for (size_t r = 0; r < ranks.size(); ++r)
    HR_RETURN_IF_ERROR(ranks[r]->all_reduce(bufs[r]->reduce.ptr, L, stream));
  for (size_t r = 0; r < ranks.size(); ++r) {
    HR_RETURN_IF_ERROR(
        ranks[r]->all_gather(bufs[r]->gather_in.ptr, bufs[r]->gather_out.ptr, L, stream));
  }
  for (size_t r = 0; r < ranks.size(); ++r) {
    HR_RETURN_IF_ERROR(
        ranks[r]->reduce_scatter(bufs[r]->scatter_in.ptr, bufs[r]->scatter_out.ptr, P, stream));
  }
  for (size_t r = 0; r < ranks.size(); ++r)
    HR_RETURN_IF_ERROR(ranks[r]->broadcast(bufs[r]->bcast.ptr, L, root, stream));
  return Status::ok();
}

void expect_round(std::vector<std::unique_ptr<RankBuffers>>& bufs, int round, int root) {
  const int n = static_cast<int>(bufs.size());
  const size_t L = RankBuffers::kLen, P = RankBuffers::kPiece;
  std::vector<float> sum(L, 0.0f);
  for (int r = 0; r < n; ++r) {
    const auto v = values(r, round, L);
    for (size_t j = 0; j < L; ++j) sum[j] += v[j];
  }
  for (int r = 0; r < n; ++r) {
    auto& b = *bufs[static_cast<size_t>(r)];
    EXPECT_EQ(b.reduce.get(), sum) << "all_reduce, rank " << r;  // bitwise, every rank
    const auto gathered = b.gather_out.get();
    for (int from = 0; from < n; ++from) {
      const auto v = values(from, round + 1000, L);
      EXPECT_TRUE(std::equal(v.begin(), v.end(), gathered.begin() + from * L))
          << "all_gather, rank " << r << " from " << from;
    }
    std::vector<float> piece(P, 0.0f);
    for (int from = 0; from < n; ++from) {
      const auto wide = values(from, round + 2000, P * n);
      for (size_t j = 0; j < P; ++j) piece[j] += wide[static_cast<size_t>(r) * P + j];
    }
    EXPECT_EQ(b.scatter_out.get(), piece) << "reduce_scatter, rank " << r;
    EXPECT_EQ(b.bcast.get(), values(root, round + 3000, L)) << "broadcast, rank " << r;
  }
}

class VirtualRanksTest : public ::testing::TestWithParam<int> {};

TEST_P(VirtualRanksTest, CollectivesEqualTheSerialSumsEagerlyAndInAGraph) {
  SKIP_WITHOUT_GPU();
  const int n = GetParam();
  auto ranks = VirtualRankGroup::create(n);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(n));
  std::vector<std::unique_ptr<RankBuffers>> bufs;
  for (int r = 0; r < n; ++r) bufs.push_back(std::make_unique<RankBuffers>(n));
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  // Eagerly, twice (the group is ready for the next round).
  for (int round = 0; round < 2; ++round) {
    for (int r = 0; r < n; ++r) bufs[static_cast<size_t>(r)]->fill(r, round, n);
    const Status st = enqueue_round(ranks, bufs, round % n, stream);
    ASSERT_TRUE(st.is_ok()) << st.to_string();
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    expect_round(bufs, round, round % n);
  }
  // Captured once, replayed over new data in the same buffers.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  const int root = n - 1;
  ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
  const Status st = enqueue_round(ranks, bufs, root, stream);
  ASSERT_EQ(cudaStreamEndCapture(stream, &graph), cudaSuccess);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  ASSERT_EQ(cudaGraphInstantiate(&exec, graph, 0), cudaSuccess);
  for (int round = 10; round < 12; ++round) {
    for (int r = 0; r < n; ++r) bufs[static_cast<size_t>(r)]->fill(r, round, n);
    ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    expect_round(bufs, round, root);
  }
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  cudaStreamDestroy(stream);
}

INSTANTIATE_TEST_SUITE_P(Ranks, VirtualRanksTest, ::testing::Values(1, 2, 3, 4, 8));

TEST(VirtualRanksErrors, OutOfOrderOrDifferingCallsAreRefusedAndEnqueueNothing) {
  SKIP_WITHOUT_GPU();
  auto ranks = VirtualRankGroup::create(3);
  DeviceBuffer<float> a(std::vector<float>(8, 1.0f)), b(std::vector<float>(8, 2.0f)),
      c(std::vector<float>(8, 4.0f));
  // Rank 1 before rank 0.
  Status st = ranks[1]->all_reduce(b.ptr, 8, nullptr);
  EXPECT_EQ(st.field(), "all_reduce");
  // Sizes that differ: rank 1 asks for 4.
  ASSERT_TRUE(ranks[0]->all_reduce(a.ptr, 8, nullptr).is_ok());
  st = ranks[1]->all_reduce(b.ptr, 4, nullptr);
  EXPECT_EQ(st.field(), "all_reduce");
  // Another collective mid-way.
  ASSERT_TRUE(ranks[0]->all_reduce(a.ptr, 8, nullptr).is_ok());
  st = ranks[1]->broadcast(b.ptr, 8, 0, nullptr);
  EXPECT_EQ(st.field(), "broadcast");
  EXPECT_EQ(ranks[0]->broadcast(a.ptr, 8, 3, nullptr).field(), "broadcast");  // no rank 3
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(a.get(), std::vector<float>(8, 1.0f));  // nothing ran
  // The group works afterwards.
  ASSERT_TRUE(ranks[0]->all_reduce(a.ptr, 8, nullptr).is_ok());
  ASSERT_TRUE(ranks[1]->all_reduce(b.ptr, 8, nullptr).is_ok());
  ASSERT_TRUE(ranks[2]->all_reduce(c.ptr, 8, nullptr).is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(a.get(), std::vector<float>(8, 7.0f));
  EXPECT_EQ(c.get(), std::vector<float>(8, 7.0f));
  EXPECT_TRUE(VirtualRankGroup::create(9).empty());
}

// The layer boundary through the communicator: virtual ranks' one launch leaves every rank's
// residual stream and normed rows bitwise as an all-reduce and then add_rms_norm do.
TEST(VirtualRanksLayerBoundary, EqualsTheAllReduceThenTheAddAndNorm) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(9);
  const int n = 3, rows = 4, dim = 264;
  const size_t len = static_cast<size_t>(rows) * dim;
  const std::vector<float> residual = random_vec(len, rng, -2.0f, 2.0f);
  const std::vector<float> weight = random_vec(dim, rng, 0.5f, 1.5f);
  std::vector<std::vector<float>> partials;
  for (int r = 0; r < n; ++r) partials.push_back(random_vec(len, rng));
  // Each way: every rank's residual and normed rows.
  auto run = [&](bool fused) {
    auto ranks = VirtualRankGroup::create(n);
    std::vector<std::unique_ptr<DeviceBuffer<float>>> partial, x, w;
    std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>> out;
    for (int r = 0; r < n; ++r) {
      partial.push_back(std::make_unique<DeviceBuffer<float>>(partials[static_cast<size_t>(r)]));
      x.push_back(std::make_unique<DeviceBuffer<float>>(residual));
      w.push_back(std::make_unique<DeviceBuffer<float>>(weight));
      out.push_back(std::make_unique<DeviceBuffer<uint16_t>>(len));
    }
    for (int r = 0; r < n; ++r) {
      auto* o = reinterpret_cast<__nv_bfloat16*>(out[static_cast<size_t>(r)]->ptr);
      if (fused) {
        EXPECT_TRUE(ranks[static_cast<size_t>(r)]
                        ->all_reduce_add_rms_norm(
                            partial[static_cast<size_t>(r)]->ptr, x[static_cast<size_t>(r)]->ptr, o,
                            w[static_cast<size_t>(r)]->ptr, rows, dim, 1e-5f, nullptr)
                        .is_ok());
      } else {
        EXPECT_TRUE(ranks[static_cast<size_t>(r)]
                        ->all_reduce(partial[static_cast<size_t>(r)]->ptr, len, nullptr)
                        .is_ok());
      }
    }
    for (int r = 0; !fused && r < n; ++r) {
      kernels::AddRmsNormParams p;
      p.x = x[static_cast<size_t>(r)]->ptr;
      p.delta = partial[static_cast<size_t>(r)]->ptr;
      p.weight = w[static_cast<size_t>(r)]->ptr;
      p.out = reinterpret_cast<__nv_bfloat16*>(out[static_cast<size_t>(r)]->ptr);
      p.num_rows = rows;
      p.dim = dim;
      p.eps = 1e-5f;
      EXPECT_EQ(kernels::add_rms_norm(p, nullptr), cudaSuccess);
    }
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<std::vector<float>> xs;
    std::vector<std::vector<uint16_t>> outs;
    for (int r = 0; r < n; ++r) {
      xs.push_back(x[static_cast<size_t>(r)]->get());
      outs.push_back(out[static_cast<size_t>(r)]->get());
    }
    return std::make_pair(xs, outs);
  };
  EXPECT_TRUE(VirtualRankGroup::create(n)[0]->fuses_layer_boundary());
  const auto fused = run(true), apart = run(false);
  EXPECT_EQ(fused.first, apart.first);
  EXPECT_EQ(fused.second, apart.second);
  EXPECT_NE(fused.first[0], residual);  // something was added
  // Widths that differ between the ranks are refused.
  auto ranks = VirtualRankGroup::create(2);
  DeviceBuffer<float> a(len), b(len), wt(weight);
  DeviceBuffer<uint16_t> o(len);
  auto* ob = reinterpret_cast<__nv_bfloat16*>(o.ptr);
  ASSERT_TRUE(ranks[0]
                  ->all_reduce_add_rms_norm(a.ptr, b.ptr, ob, wt.ptr, rows, dim, 1e-5f, nullptr)
                  .is_ok());
  EXPECT_EQ(
      ranks[1]
          ->all_reduce_add_rms_norm(a.ptr, b.ptr, ob, wt.ptr, rows * 2, dim / 2, 1e-5f, nullptr)
          .field(),
      "all_reduce_add_rms_norm");
}

// Pipeline stages' hand-offs: messages between two virtual ranks arrive in the order sent, as
// bytes; a receive with nothing sent, of another length, or from no other rank is refused.
TEST(VirtualRanksPointToPoint, MessagesArriveInOrderAndMismatchesAreRefused) {
  SKIP_WITHOUT_GPU();
  auto ranks = VirtualRankGroup::create(3);
  DeviceBuffer<float> a(std::vector<float>(8, 1.0f)), b(std::vector<float>(8, 2.0f));
  DeviceBuffer<int32_t> ids(std::vector<int32_t>{7, -1, 9});
  DeviceBuffer<float> got(std::vector<float>(8, 0.0f));
  DeviceBuffer<int32_t> got_ids(std::vector<int32_t>(3, 0));
  EXPECT_EQ(ranks[2]->recv(got.ptr, 32, 0, nullptr).field(), "recv");  // nothing sent yet
  ASSERT_TRUE(ranks[0]->send(a.ptr, 32, 2, nullptr).is_ok());
  ASSERT_TRUE(ranks[0]->send(ids.ptr, 12, 2, nullptr).is_ok());
  ASSERT_TRUE(ranks[1]->send(b.ptr, 16, 2, nullptr).is_ok());
  ASSERT_TRUE(ranks[2]->recv(got.ptr, 32, 0, nullptr).is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  EXPECT_EQ(got.get(), std::vector<float>(8, 1.0f));
  EXPECT_EQ(ranks[2]->recv(got_ids.ptr, 8, 0, nullptr).field(), "recv");  // 12 bytes were sent
  ASSERT_TRUE(ranks[2]->recv(got.ptr, 16, 1, nullptr).is_ok());
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto halves = got.get();
  EXPECT_EQ(std::vector<float>(halves.begin(), halves.begin() + 4), std::vector<float>(4, 2.0f));
  EXPECT_EQ(std::vector<float>(halves.begin() + 4, halves.end()), std::vector<float>(4, 1.0f));
  EXPECT_EQ(ranks[0]->send(a.ptr, 32, 0, nullptr).field(), "send");  // to itself
  EXPECT_EQ(ranks[0]->recv(a.ptr, 32, 5, nullptr).field(), "recv");  // no rank 5
}

// The layer boundary of a tensor-parallel step: partial sums in rank order added to the residual,
// then RMSNorm to bf16, on every rank alike.
TEST(AllReduceAddRmsNormTest, EqualsTheSumThenTheCpuNorm) {
  SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  for (int n : {1, 2, 4, 8}) {
    const int rows = 5, dim = 520;
    const size_t len = static_cast<size_t>(rows) * dim;
    std::vector<std::unique_ptr<DeviceBuffer<float>>> partial, x;
    std::vector<std::unique_ptr<DeviceBuffer<uint16_t>>> out;
    std::vector<std::vector<float>> host_partial;
    const std::vector<float> residual = random_vec(len, rng, -2.0f, 2.0f);
    const std::vector<float> weight = random_vec(dim, rng, 0.5f, 1.5f);
    DeviceBuffer<float> d_weight(weight);
    kernels::AllReduceAddRmsNormParams p;
    p.num_ranks = n;
    p.num_rows = rows;
    p.dim = dim;
    p.weight = d_weight.ptr;
    for (int r = 0; r < n; ++r) {
      host_partial.push_back(random_vec(len, rng));
      partial.push_back(std::make_unique<DeviceBuffer<float>>(host_partial.back()));
      x.push_back(std::make_unique<DeviceBuffer<float>>(residual));
      out.push_back(std::make_unique<DeviceBuffer<uint16_t>>(len));
      p.partial[r] = partial.back()->ptr;
      p.x[r] = x.back()->ptr;
      p.out[r] = reinterpret_cast<__nv_bfloat16*>(out.back()->ptr);
    }
    ASSERT_EQ(kernels::all_reduce_add_rms_norm(p, nullptr), cudaSuccess);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> want_x = residual, want_norm(len);
    for (size_t i = 0; i < len; ++i) {
      float s = host_partial[0][i];
      for (int r = 1; r < n; ++r) s += host_partial[static_cast<size_t>(r)][i];
      want_x[i] += s;
    }
    for (int row = 0; row < rows; ++row) {
      rms_norm(&want_x[static_cast<size_t>(row) * dim], weight.data(), dim, 1e-5f,
               &want_norm[static_cast<size_t>(row) * dim]);
    }
    for (int r = 0; r < n; ++r) {
      EXPECT_EQ(x[static_cast<size_t>(r)]->get(), want_x) << n << " ranks, rank " << r;
      const auto got = bf16_to_float(out[static_cast<size_t>(r)]->get());
      for (size_t i = 0; i < len; ++i) {
        // bf16 rounding of the same value (the norm's sum order may differ by an ulp of fp32).
        ASSERT_NEAR(got[i], want_norm[i], std::abs(want_norm[i]) * 8e-3 + 1e-6)
            << n << " ranks, rank " << r << ", element " << i;
      }
      EXPECT_EQ(got, bf16_to_float(out[0]->get())) << "rank " << r << " differs from rank 0";
    }
  }
  kernels::AllReduceAddRmsNormParams bad;
  bad.num_ranks = 9;
  bad.num_rows = 1;
  bad.dim = 4;
  EXPECT_EQ(kernels::all_reduce_add_rms_norm(bad, nullptr), cudaErrorInvalidValue);
}

#ifndef HEADROOM_SIMT
// NCCL, world size 1, through the same interface: the path a multi-GPU engine takes, on the one
// GPU a test machine has.
TEST(NcclCommunicatorTest, WorldSizeOneThroughTheSameInterface) {
  SKIP_WITHOUT_GPU();
  auto version = NcclCommunicator::version();
  if (!version.is_ok()) GTEST_SKIP() << version.status().to_string();
  auto ranks = NcclCommunicator::create_all({0});
  ASSERT_TRUE(ranks.is_ok()) << ranks.status().to_string();
  ASSERT_EQ(ranks->size(), 1u);
  std::vector<std::unique_ptr<RankBuffers>> bufs;
  bufs.push_back(std::make_unique<RankBuffers>(1));
  bufs[0]->fill(0, 0, 1);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  const Status st = enqueue_round(*ranks, bufs, 0, stream);
  ASSERT_TRUE(st.is_ok()) << st.to_string();
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  expect_round(bufs, 0, 0);
  cudaStreamDestroy(stream);
  // No fused layer boundary over NCCL: a rank keeps the all-reduce and its norm apart.
  EXPECT_FALSE((*ranks)[0]->fuses_layer_boundary());
}

// ncclCommAbort through DeviceCommunicator::abort (docs/parallel-engine.md "When a rank stops"):
// the communicator is freed, and every later call fails naming the reason, enqueuing nothing.
TEST(NcclCommunicatorTest, AnAbortedRankRefusesEveryLaterCall) {
  SKIP_WITHOUT_GPU();
  auto version = NcclCommunicator::version();
  if (!version.is_ok()) GTEST_SKIP() << version.status().to_string();
  auto ranks = NcclCommunicator::create_all({0});
  ASSERT_TRUE(ranks.is_ok()) << ranks.status().to_string();
  DeviceCommunicator& rank = *(*ranks)[0];
  float* data = nullptr;
  ASSERT_EQ(cudaMalloc(&data, 64 * sizeof(float)), cudaSuccess);
  cudaStream_t stream;
  ASSERT_EQ(cudaStreamCreate(&stream), cudaSuccess);
  ASSERT_TRUE(rank.all_reduce(data, 64, stream).is_ok());
  ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  EXPECT_TRUE(rank.abort("a step ran 300 s"));
  EXPECT_TRUE(rank.abort("again"));  // once is enough; the first reason stands
  for (const Status& st : {rank.all_reduce(data, 64, stream), rank.broadcast(data, 64, 0, stream),
                           rank.send(data, 16, 0, stream)}) {
    EXPECT_EQ(st.code(), StatusCode::kInternal);
    EXPECT_NE(st.message().find("a step ran 300 s"), std::string::npos) << st.message();
  }
  EXPECT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
  ranks->clear();  // (an aborted communicator is not destroyed again)
  cudaStreamDestroy(stream);
  cudaFree(data);
}
#endif

}  // namespace
}  // namespace hr::engine
