// N ranks on one device (docs/parallel-engine.md): what lets one GPU, or the CPU stand-in for the
// CUDA runtime, run a tensor-parallel engine's exact kernels and collectives, the peers' buffers
// being buffers of the same device. One thread drives the ranks in rank order, all on one stream:
// for each collective, ranks 0 .. N-1 call it in turn; the earlier calls only record their
// buffers, and the last one enqueues the work (the one-shot peer_sum kernel of
// kernels/all_reduce.cuh over every rank's buffer, the fused all-reduce + residual add + RMSNorm
// for the layer boundary, or device-to-device copies). Everything a rank
// enqueued before its call is therefore ordered before the collective, and everything after it
// after, as with NCCL on a stream per rank; and a whole step, collectives included, can be
// captured in one CUDA graph. Sums are in rank order: every rank ends bitwise equal. A call out
// of rank order, or with sizes, root or stream differing from the earlier ranks', is
// kInvalidArgument naming the collective, and the collective is abandoned (no work enqueued).
// Point to point (pipeline stages): a send records where its data is; the matching receive,
// which must come after it (a stage's ranks run after the stage before), enqueues the copy.
#pragma once

#include <memory>
#include <vector>

#include "engine/device_communicator.h"
#include "engine/rank_threads.h"

namespace hr::engine {

class VirtualRankGroup {
 public:
  // The `size` ranks (1 to 8), rank r at index r. With `turns` (engine/rank_threads.h), each rank
  // is driven by a thread of its own taking turns: a collective's call records or enqueues it as
  // above, then hands the turn on and returns when the turn comes back, so every rank reaches
  // each collective in rank order.
  static std::vector<std::unique_ptr<DeviceCommunicator>> create(int size,
                                                                 RankThreads* turns = nullptr);
};

}  // namespace hr::engine
