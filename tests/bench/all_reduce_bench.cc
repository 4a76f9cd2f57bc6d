// All-reduce microbenchmark (scripts/bench_rank_slice.sh runs it; GPU only): latency by message
// size, 512 B to 32 MiB of fp32, for
//   - our one-shot kernel (kernels/all_reduce.cuh) over 2, 4 and 8 virtual ranks on one device:
//     each rank's buffer read once and the sum written to each; on one GPU this is the kernel's
//     own cost with the peers' reads at local HBM speed, a lower bound for the same kernel over
//     NVLink;
//   - NCCL's all-reduce over every visible GPU (world size 1 on a one-GPU machine: what NCCL
//     costs even with nothing to exchange).
// Each figure is the median over 5 replays of a CUDA graph of 50 back-to-back all-reduces (NCCL
// over several GPUs: 50 calls timed by the host's clock, the graph not holding several devices).
// Prints one JSON object (the last line).
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <nlohmann/json.hpp>
#include <vector>

#include "engine/nccl_communicator.h"
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
