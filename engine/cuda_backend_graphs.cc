// CUDA graphs of decode steps: steps of one sequence length class are padded to a captured batch
// size and replayed from a cache of graphs captured at warm-up, so that a decode step costs one
// launch.
#include "engine/cuda_backend.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "engine/attention_plan.h"
#include "engine/internal/cuda_status.h"
#include "engine/internal/cuda_step.h"
#include "kernels/embedding.cuh"
#include "kernels/fill.cuh"
#include "kernels/gemv.cuh"
#include "kernels/launch.cuh"
#include "kernels/paged_attention.cuh"
#include "kernels/rms_norm.cuh"
#include "kernels/rope_kv.cuh"
#include "kernels/sampling.cuh"
#include "kernels/silu_mul.cuh"

namespace hr::engine {

bool CudaBackend::uniform_decode(const StepInput& in) {
  if (in.num_tokens != in.num_seqs || in.num_logits != in.num_seqs) return false;
  for (int s = 0; s < in.num_seqs; ++s) {
    if (in.seq_start[s + 1] != s + 1 || in.logits_rows[s] != s) return false;
  }
  return true;
}

bool CudaBackend::graph_step(const StepInput& in) const {
  return options_.cuda_graphs && !profiling_ && uniform_decode(in);
}

CudaBackend::StepRows CudaBackend::step_rows(const StepInput& in) const {
  if (!graph_step(in)) return {in.num_tokens, in.num_logits};
  const int rows = graph_batch_size(in.num_seqs);
  return {rows, rows};
}

void CudaBackend::clear_graphs() {
  for (auto& [key, exec] : graphs_) {
    if (exec) cudaGraphExecDestroy(exec);
  }
  graphs_.clear();
}

int CudaBackend::graph_batch_size(int batch) const {
  int size = batch <= 2     ? batch
             : batch <= 4   ? 4
             : batch <= 256 ? (batch + 7) / 8 * 8
                            : (batch + 15) / 16 * 16;
  return std::max(batch, std::min({size, options_.max_num_seqs, options_.max_num_tokens}));
}

StepInput CudaBackend::pad_decode_step(const StepInput& in, const SampleSpec* specs, int pad,
                                       const SampleSpec** padded_specs) {
  const int S = in.num_seqs, P = S + pad, W = in.max_blocks_per_seq;
  pad_ids_.assign(in.token_ids, in.token_ids + S);
  pad_ids_.resize(static_cast<size_t>(P), 0);
  pad_positions_.assign(in.positions, in.positions + S);
  pad_positions_.resize(static_cast<size_t>(P), 0);
  pad_seq_start_.resize(static_cast<size_t>(P) + 1);
  pad_rows_.resize(static_cast<size_t>(P));
  for (int s = 0; s <= P; ++s) pad_seq_start_[static_cast<size_t>(s)] = s;
  for (int s = 0; s < P; ++s) pad_rows_[static_cast<size_t>(s)] = s;
  pad_table_.assign(in.block_table, in.block_table + static_cast<size_t>(S) * W);
  pad_table_.resize(static_cast<size_t>(P) * W, num_blocks_);
  if (in.fed_rows) {
    pad_fed_.assign(in.fed_rows, in.fed_rows + S);
    pad_fed_.resize(static_cast<size_t>(P), -1);
  }
  StepInput out = in;
  out.num_tokens = P;
  out.num_seqs = P;
  out.num_logits = P;
  out.token_ids = pad_ids_.data();
  out.positions = pad_positions_.data();
  out.seq_start = pad_seq_start_.data();
  out.block_table = pad_table_.data();
  out.logits_rows = pad_rows_.data();
  out.fed_rows = in.fed_rows ? pad_fed_.data() : nullptr;
  if (specs) {
    pad_specs_.assign(specs, specs + S);
    pad_specs_.resize(static_cast<size_t>(P), SampleSpec{});
    *padded_specs = pad_specs_.data();
  }
  return out;
}

Status CudaBackend::enqueue(const StepInput& given, const SampleSpec* given_specs, int slot,
                            StepLayout* layout) {
  const bool graph = graph_step(given);
  StepInput in = given;
  const SampleSpec* specs = given_specs;
  if (graph) {
    const int pad = graph_batch_size(given.num_seqs) - given.num_seqs;
    if (pad > 0) in = pad_decode_step(given, given_specs, pad, &specs);
  }
  StepLayout lay;
  HR_RETURN_IF_ERROR(prepare(in, specs, graph, slot, given.num_seqs, &lay));
  if (layout) *layout = lay;
  if (!graph) return launch_step(lay, slot, specs != nullptr);
  return launch_graph(lay, slot, specs != nullptr);
}

int CudaBackend::graph_table_width(int cols) const {
  return cols <= warm_table_width_ ? warm_table_width_
                                   : static_cast<int>(std::bit_ceil(static_cast<unsigned>(cols)));
}

Status CudaBackend::launch_graph(const StepLayout& lay, int slot, bool sample) {
  // Decode steps of one graph batch size have one shape: capture the step once per slot, then
  // replay it.
  const auto key = std::make_tuple(lay.num_tokens, sample, lay.max_blocks_per_seq, slot);
  if (options_.turns) return launch_shared_graph(lay, slot, sample, key);
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    // cuBLASLt chooses its algorithms now: not while the stream is being captured.
    HR_RETURN_IF_ERROR(plan_gemms(lay.num_tokens, lay.num_logits));
    HR_CUDA("starting a graph capture",
            cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    HR_ASSIGN_OR_RETURN(cudaGraphExec_t exec, end_capture(launch_step(lay, slot, sample)));
    it = graphs_.emplace(key, exec).first;
  }
  HR_CUDA("launching a decode graph", cudaGraphLaunch(it->second, stream_));
  return Status::ok();
}

Result<cudaGraphExec_t> CudaBackend::end_capture(Status recorded) {
  cudaGraph_t graph_def = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(stream_, &graph_def);
  if (!recorded.is_ok()) {
    if (graph_def) cudaGraphDestroy(graph_def);
    return recorded;
  }
  if (ended != cudaSuccess)
    return internal::cuda_error("capturing a decode step", ended, options_.device);
  cudaGraphExec_t exec = nullptr;
  const cudaError_t made = cudaGraphInstantiate(&exec, graph_def, 0);
  cudaGraphDestroy(graph_def);
  if (made != cudaSuccess)
    return internal::cuda_error("instantiating a decode graph", made, options_.device);
  return exec;
}

Status CudaBackend::launch_shared_graph(const StepLayout& lay, int slot, bool sample,
                                        const GraphKey& key) {
  // Virtual ranks on one stream: one graph holds every rank's step, captured from the last rank's
  // prepared inputs on (each rank packed its own before its first pass), and the last rank
  // launches it; the others keep the key alone. Every rank passes the turn twice here: once when
  // its inputs are on their way, once when its part of the step is enqueued.
  RankThreads& turns = *options_.turns;
  const int rank = shard_.tp_rank;
  const bool last = rank == turns.size() - 1;
  const bool capture = graphs_.find(key) == graphs_.end();
  if (capture) {
    HR_RETURN_IF_ERROR(plan_gemms(lay.num_tokens, lay.num_logits));
    if (last) {
      HR_CUDA("starting a graph capture",
              cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    }
  }
  Status st = turns.pass(rank);
  if (st.is_ok() && capture) st = launch_step(lay, slot, sample);
  if (!last) {
    if (!st.is_ok()) return st;
    if (capture) graphs_.emplace(key, nullptr);
    return turns.pass(rank);
  }
  if (capture) {
    HR_ASSIGN_OR_RETURN(cudaGraphExec_t exec, end_capture(st));
    graphs_.emplace(key, exec);
  }
  HR_RETURN_IF_ERROR(st);
  HR_CUDA("launching the ranks' decode graph", cudaGraphLaunch(graphs_.at(key), stream_));
  return turns.pass(rank);
}

Status CudaBackend::warm_up(int max_blocks_per_seq) {
  if (!outstanding_.empty()) return internal_error("warm_up with steps outstanding");
  if (max_blocks_per_seq < 1)
    return invalid_argument("block tables must be at least one block wide");
  // The graphs' pitch, also for graphs captured later (graphs switched on after this).
  warm_table_width_ = std::max(warm_table_width_, max_blocks_per_seq);
  if (!options_.cuda_graphs || profiling_) return Status::ok();
  const int largest = graph_batch_size(std::min(options_.max_num_seqs, options_.max_num_tokens));
  // Staging slots big enough for any step (growing one later would drop the graphs): the
  // per-token arrays, the block tables, the per-row arrays, and attention items for every token and
  // every possible split, generously.
  const size_t T = static_cast<size_t>(options_.max_num_tokens),
               S = static_cast<size_t>(options_.max_num_seqs);
  const size_t item =
      std::max(sizeof(kernels::AttentionWorkItem), sizeof(kernels::AttentionCombineItem));
  const size_t bound = 5 * T * 4 + S * static_cast<size_t>(warm_table_width_) * 4 +
                       S * (4 + sizeof(kernels::SampleParams)) +
                       (2 * T + static_cast<size_t>(max_partials_)) * item + 16 * 16;
  for (Slot& slot : slots_) {
    if (slot.bytes < bound) HR_RETURN_IF_ERROR(grow_slot(slot, bound));
  }
  // An empty step padded to each size: every row decodes into the scratch block. Each waits for
  // the one before, which read its slot's pinned inputs.
  StepInput none;
  none.max_blocks_per_seq = warm_table_width_;
  const SampleSpec greedy;
  // A cut step's parts (submit_part): a decode step of S sequences is cut when S is at least
  // micro_batches x micro_batch_tokens, its parts of S / micro_batches sequences each.
  const int parts = options_.micro_batches;
  const int largest_part =
      parts > 1
          ? graph_batch_size(
                (std::min(options_.max_num_seqs, options_.max_num_tokens) + parts - 1) / parts)
          : 0;
  for (int size = 1; size <= largest; size = graph_batch_size(size + 1)) {
    for (int slot = 0; slot < static_cast<int>(slots_.size()); ++slot) {
      if (slot >= whole_slots_ && ((slot - whole_slots_) % options_.max_step_parts >= parts ||
                                   size < options_.micro_batch_tokens || size > largest_part))
        continue;
      if (graphs_.count(std::make_tuple(size, true, warm_table_width_, slot))) continue;
      const SampleSpec* specs = nullptr;
      StepInput in = pad_decode_step(none, &greedy, size, &specs);
      StepLayout lay;
      HR_RETURN_IF_ERROR(prepare(in, specs, true, slot, 0, &lay));
      if (slot == 0) {
        // Once eagerly first: every kernel and library call of the step is loaded and set up
        // before any of it is captured.
        HR_RETURN_IF_ERROR(launch_step(lay, slot, true));
        HR_CUDA("warming up", cudaStreamSynchronize(stream_));
      }
      HR_RETURN_IF_ERROR(launch_graph(lay, slot, true));
      HR_CUDA("warming up", cudaStreamSynchronize(stream_));
    }
    if (size == largest) break;
  }
  HR_CUDA("warming up", cudaStreamSynchronize(stream_));
  prev_num_logits_ = 0;
  part_prev_logits_ = 0;
  return Status::ok();
}

}  // namespace hr::engine
