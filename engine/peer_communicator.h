// Collectives and hand-offs between the GPUs of one process over peer pointers
// (kernels/peer_collectives.cuh, docs/parallel-engine.md): each rank's kernel reads its peers'
// staging buffers over NVLink (or PCIe) and meets them at barriers of flags in each other's
// memory, so a call is one launch per rank, with no library and no proxy thread, and the layer
// boundary (all-reduce + residual add + RMSNorm) is one launch too. Sums in rank order: the ranks
// end bitwise equal to the virtual ranks of one device (virtual_ranks.h). Messages larger than the
// staging go in pieces, one launch each. The CPU stand-in for the CUDA runtime, which has no NCCL,
// runs the one-GPU-a-rank engine through this communicator, its simulated devices each driven by
// a thread of its own.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

#include "engine/device_communicator.h"

namespace hr::engine {

struct PeerOptions {
  // The bytes a collective moves per launch (larger messages go in pieces); each rank holds twice
  // this of staging (the two-shot form's reduced segments apart).
  size_t staging_bytes = size_t{8} << 20;
  // Point to point: the inbox, on the receiver, of each ordered pair of ranks (0: no send/recv);
  // with `ring`, of each rank to the next only (r to r + 1, the last to the first: a pipeline's
  // hand-offs and its tokens back).
  size_t mailbox_bytes = 0;
  bool ring = false;
  // All-reduces of at least this many bytes a piece take the two-shot form (with 3 ranks or more):
  // reduce-scatter then all-gather, each rank reading 1/N of every peer's data instead of all of
  // it.
  size_t two_shot_bytes = size_t{512} << 10;
  // A rank's kernel that waits longer than this for a peer fails (a trap on a GPU) instead of
  // hanging the engine (a stage's receive waits for the stages before it to run the step).
  double timeout_seconds = 120;
  // Ranks may share a device, each on a stream of its own (tests on a machine of one GPU: the
  // ranks' kernels must then run at once, which CUDA does not promise, though the few blocks a
  // call launches fit any GPU).
  bool allow_shared_device = false;
};

// Each rank calls its collectives from one stream at a time, in the same order as its peers (the
// barrier counts are the rank's, on its device).
class PeerCommunicator {
 public:
  // Whether every device of `devices` reaches every other's memory (cudaDeviceCanAccessPeer).
  [[nodiscard]] static bool all_peers(const std::vector<int>& devices);
  // One communicator per device of `devices` (distinct unless allowed; peer access enabled here
  // both ways; staging of at least 16 bytes a rank),
  // rank r on devices[r] at index r. kUnavailable naming the pair when two devices cannot reach
  // each other; the CUDA call that failed otherwise.
  [[nodiscard]] static Result<std::vector<std::unique_ptr<DeviceCommunicator>>> create_all(
      const std::vector<int>& devices, const PeerOptions& options = {});
};

}  // namespace hr::engine
