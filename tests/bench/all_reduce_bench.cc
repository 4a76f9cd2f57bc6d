// All-reduce microbenchmark (scripts/bench_rank_slice.sh runs it; GPU only): latency by message
// size, 512 B to 32 MiB of fp32, for
//   - our one-shot kernel (kernels/all_reduce.cuh) over 2, 4 and 8 virtual ranks on one device:
//     each rank's buffer read once and the sum written to each; on one GPU this is the kernel's
//     own cost with the peers' reads at local HBM speed, a lower bound for the same kernel over
//     NVLink;
//   - our kernels between GPUs over peer pointers (engine/peer_communicator.h) at 2, 4 and 8
//     ranks, one-shot and two-shot, each rank on a thread and stream of its own: over distinct
//     GPUs where there are enough with peer access, else the ranks sharing GPU 0 (the kernels'
//     and their flag barriers' own cost, the peers' reads at local HBM speed);
//   - NCCL's all-reduce over every visible GPU (world size 1 on a one-GPU machine: what NCCL
//     costs even with nothing to exchange).
// Each figure is the median over 5 replays of a CUDA graph of 50 back-to-back all-reduces (NCCL
// over several GPUs: 50 calls timed by the host's clock, the graph not holding several devices).
// Prints one JSON object (the last line).
#include <cuda_runtime.h>

#include <algorithm>
#include <barrier>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/nccl_communicator.h"
#include "engine/peer_communicator.h"
#include "engine/rank_threads.h"
#include "engine/virtual_ranks.h"

using namespace hr::engine;
using nlohmann::json;

namespace {

constexpr int kPerGraph = 50, kReplays = 5;

// Median microseconds per call of `enqueue` (which enqueues one all-reduce on `stream`), from
// graphs of kPerGraph calls; a negative value when capturing or running fails.
double time_us(cudaStream_t stream, const std::function<bool()>& enqueue) {
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  if (cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal) != cudaSuccess) return -1;
  bool ok = true;
  for (int i = 0; i < kPerGraph && ok; ++i) ok = enqueue();
  if (cudaStreamEndCapture(stream, &graph) != cudaSuccess || !ok) return -1;
  if (cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess) return -1;
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int r = 0; r < kReplays + 1; ++r) {
    cudaEventRecord(e0, stream);
    cudaGraphLaunch(exec, stream);
    cudaEventRecord(e1, stream);
    if (cudaEventSynchronize(e1) != cudaSuccess) return -1;
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (r > 0) ms.push_back(t);  // the first replay warms up
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaGraphExecDestroy(exec);
  cudaGraphDestroy(graph);
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e3 / kPerGraph;
}

// The same without a graph, by the host's clock after every device is idle: for NCCL over
// several GPUs, whose ranks' streams one capture cannot hold.
double time_eager_us(int devices, const std::function<bool()>& enqueue) {
  auto sync_all = [&] {
    for (int d = 0; d < devices; ++d) {
      cudaSetDevice(d);
      cudaDeviceSynchronize();
    }
    cudaSetDevice(0);
  };
  std::vector<double> us;
  for (int r = 0; r < kReplays + 1; ++r) {
    sync_all();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kPerGraph; ++i) {
      if (!enqueue()) return -1;
    }
    sync_all();
    const double t =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) us.push_back(t / kPerGraph);
  }
  std::sort(us.begin(), us.end());
  return us[us.size() / 2];
}

// Our peer kernels at `n` ranks: per size, the slowest rank's median microseconds per call, each
// rank replaying a graph of kPerGraph calls on its own stream, the ranks released together.
json peer_latency(int n, int gpus, const std::vector<size_t>& sizes, bool two_shot) {
  std::vector<int> devices;
  for (int r = 0; r < n; ++r) devices.push_back(r);
  PeerOptions po;
  po.two_shot_bytes = two_shot ? 0 : SIZE_MAX;
  const bool distinct = gpus >= n && PeerCommunicator::all_peers(devices);
  if (!distinct) {
    devices.assign(static_cast<size_t>(n), 0);
    po.allow_shared_device = true;
  }
  auto comms = PeerCommunicator::create_all(devices, po);
  if (!comms.is_ok()) return {{"error", comms.status().to_string()}};
  const size_t max_floats = sizes.back() / sizeof(float);
  std::vector<std::vector<double>> us(static_cast<size_t>(n), std::vector<double>(sizes.size()));
  std::barrier together(n);
  RankThreads threads(n, false, [&](int r) { cudaSetDevice(devices[static_cast<size_t>(r)]); });
  const hr::Status st = threads.run([&](int r) -> hr::Status {
    // (A rank that fails leaves the host's barrier, so that the others do not wait for it there.)
    auto fail = [&](const char* what) {
      together.arrive_and_drop();
      return hr::internal_error(what);
    };
    float* buf = nullptr;
    cudaStream_t stream;
    if (cudaMalloc(&buf, max_floats * sizeof(float)) != cudaSuccess ||
        cudaMemset(buf, 0, max_floats * sizeof(float)) != cudaSuccess ||
        cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking) != cudaSuccess)
      return fail("allocating a rank's buffer");
    cudaEvent_t e0, e1;
    cudaEventCreate(&e0);
    cudaEventCreate(&e1);
    DeviceCommunicator& c = *(*comms)[static_cast<size_t>(r)];
    for (size_t k = 0; k < sizes.size(); ++k) {
      const size_t count = sizes[k] / sizeof(float);
      cudaGraph_t graph;
      cudaGraphExec_t exec;
      cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal);
      bool ok = true;
      for (int i = 0; i < kPerGraph && ok; ++i) ok = c.all_reduce(buf, count, stream).is_ok();
      if (cudaStreamEndCapture(stream, &graph) != cudaSuccess || !ok ||
          cudaGraphInstantiate(&exec, graph, 0) != cudaSuccess)
        return fail("capturing the peer all-reduces");
      std::vector<float> ms;
      for (int rep = 0; rep < kReplays + 1; ++rep) {
        together.arrive_and_wait();
        cudaEventRecord(e0, stream);
        cudaGraphLaunch(exec, stream);
        cudaEventRecord(e1, stream);
        if (cudaEventSynchronize(e1) != cudaSuccess) return fail("a replay failed");
        float t = 0;
        cudaEventElapsedTime(&t, e0, e1);
        if (rep > 0) ms.push_back(t);
      }
      std::sort(ms.begin(), ms.end());
      us[static_cast<size_t>(r)][k] = ms[ms.size() / 2] * 1e3 / kPerGraph;
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
    }
    together.arrive_and_wait();  // (freeing waits for the device, which the others may still use)
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
    cudaStreamDestroy(stream);
    cudaFree(buf);
    return hr::Status::ok();
  });
  if (!st.is_ok()) return {{"error", st.to_string()}};
  json row = json::array();
  for (size_t k = 0; k < sizes.size(); ++k) {
    double worst = 0;
    for (int r = 0; r < n; ++r) worst = std::max(worst, us[static_cast<size_t>(r)][k]);
    row.push_back({{"bytes", sizes[k]}, {"us", worst}});
  }
  return {{"placement", distinct ? "a GPU a rank" : "ranks sharing GPU 0"}, {"latency", row}};
}

}  // namespace

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("{\"error\": \"no CUDA device\"}\n");
    return 1;
  }
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  cudaSetDevice(0);
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  std::vector<size_t> sizes;
  for (size_t b = 512; b <= (32u << 20); b *= 4) sizes.push_back(b);
  const size_t max_floats = sizes.back() / sizeof(float);
  json out = {{"device", prop.name}, {"gpus", devices}, {"calls_per_graph", kPerGraph}};

  // Our kernel over virtual ranks.
  std::vector<float*> bufs(8, nullptr);
  for (float*& b : bufs) {
    if (cudaMalloc(&b, max_floats * sizeof(float)) != cudaSuccess) return 1;
    cudaMemset(b, 0, max_floats * sizeof(float));
  }
  json own = json::object();
  for (int n : {2, 4, 8}) {
    auto ranks = VirtualRankGroup::create(n);
    json row = json::array();
    for (size_t bytes : sizes) {
      const size_t count = bytes / sizeof(float);
      const double us = time_us(stream, [&] {
        for (int r = 0; r < n; ++r) {
          if (!ranks[static_cast<size_t>(r)]
                   ->all_reduce(bufs[static_cast<size_t>(r)], count, stream)
                   .is_ok())
            return false;
        }
        return true;
      });
      row.push_back({{"bytes", bytes}, {"us", us}});
    }
    own[std::to_string(n) + "_virtual_ranks"] = row;
  }
  out["own_one_shot"] = own;

  // Our kernels between GPUs over peer pointers.
  json peer = json::object();
  for (int n : {2, 4, 8}) {
    peer[std::to_string(n) + "_ranks_one_shot"] = peer_latency(n, devices, sizes, false);
    peer[std::to_string(n) + "_ranks_two_shot"] = peer_latency(n, devices, sizes, true);
  }
  out["own_peer"] = peer;
  cudaSetDevice(0);

  // NCCL over every GPU, one thread driving them in a group.
  auto version = NcclCommunicator::version();
  if (!version.is_ok()) {
    out["nccl"] = {{"error", version.status().to_string()}};
  } else {
    std::vector<int> ids(static_cast<size_t>(devices));
    for (int d = 0; d < devices; ++d) ids[static_cast<size_t>(d)] = d;
    auto comms = NcclCommunicator::create_all(ids);
    if (!comms.is_ok()) {
      out["nccl"] = {{"error", comms.status().to_string()}};
    } else {
      std::vector<float*> dev_bufs(static_cast<size_t>(devices));
      std::vector<cudaStream_t> streams(static_cast<size_t>(devices));
      for (int d = 0; d < devices; ++d) {
        cudaSetDevice(d);
        cudaMalloc(&dev_bufs[static_cast<size_t>(d)], max_floats * sizeof(float));
        cudaMemset(dev_bufs[static_cast<size_t>(d)], 0, max_floats * sizeof(float));
        if (d == 0) {
          streams[0] = stream;
        } else {
          cudaStreamCreateWithFlags(&streams[static_cast<size_t>(d)], cudaStreamNonBlocking);
        }
      }
      cudaSetDevice(0);
      json row = json::array();
      for (size_t bytes : sizes) {
        const size_t count = bytes / sizeof(float);
        // In a graph on one GPU; by the host's clock over several.
        const auto one = [&] {
          bool ok = NcclCommunicator::group_start().is_ok();
          for (int d = 0; d < devices && ok; ++d) {
            ok = (*comms)[static_cast<size_t>(d)]
                     ->all_reduce(dev_bufs[static_cast<size_t>(d)], count,
                                  streams[static_cast<size_t>(d)])
                     .is_ok();
          }
          return NcclCommunicator::group_end().is_ok() && ok;
        };
        const double us = devices == 1 ? time_us(stream, one) : time_eager_us(devices, one);
        row.push_back({{"bytes", bytes}, {"us", us}});
      }
      out["nccl"] = {{"version", *version}, {"world_size", devices}, {"latency", row}};
    }
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
