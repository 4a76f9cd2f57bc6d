// NCCL through dlopen (docs/parallel-engine.md): the engine is compiled against nccl.h but loads
// libnccl.so.2 only when a multi-GPU engine asks for it, as the GPU monitor loads NVML, so a
// worker builds and runs on machines without NCCL. One NcclCommunicator per rank, each over its
// own device; every call enqueues on the given stream (capturable in a CUDA graph, NCCL >= 2.9).
#pragma once

#include <memory>
#include <vector>

#include "engine/device_communicator.h"

namespace hr::engine {

class NcclCommunicator {
 public:
  // One communicator per device of `devices` (ncclCommInitAll: one process driving them all),
  // rank r on devices[r]. kUnavailable naming the library when it cannot be loaded; NCCL's own
  // message otherwise.
  [[nodiscard]] static Result<std::vector<std::unique_ptr<DeviceCommunicator>>> create_all(
      const std::vector<int>& devices);
  // The library's version (e.g. 22809 for 2.28.9), or an error when it cannot be loaded.
  [[nodiscard]] static Result<int> version();
  // One thread driving several ranks wraps each collective's calls (rank 0 .. N-1) in these, so
  // that NCCL launches them together (ncclGroupStart / ncclGroupEnd); a thread per rank needs
  // neither.
  [[nodiscard]] static Status group_start();
  [[nodiscard]] static Status group_end();
};

}  // namespace hr::engine
