// A parallel engine's ranks on the CUDA backend: shards, communicators, streams, the rank threads,
// and the stages' hand-offs.
#include "engine/parallel_cuda_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <functional>

#include "base/log.h"
#include "engine/internal/cuda_status.h"
#include "engine/micro_batches.h"
#include "engine/peer_communicator.h"
#include "engine/safetensors.h"
#include "engine/virtual_ranks.h"
#ifndef HEADROOM_SIMT  // (NCCL is no part of the CPU stand-in for the CUDA runtime)
#include "engine/nccl_communicator.h"
#endif

namespace hr::engine {

namespace {

// A group's communicators, its rank r at index r.
using Comms = std::vector<std::unique_ptr<DeviceCommunicator>>;

// Over peer pointers, the inbox a stage's hand-offs go through (in pieces of this).
constexpr size_t kPipeMailboxBytes = size_t{8} << 20;

}  // namespace

ParallelCudaBackend::ParallelCudaBackend(const std::vector<int>& devices, bool virtual_ranks,
                                         int tp, int pp)
    : tp_(tp), pp_(pp), virtual_(virtual_ranks) {
  const int world = tp * pp;
  comms_.resize(static_cast<size_t>(world));
  pipes_.resize(static_cast<size_t>(world));
  if (virtual_ranks) {
    const int device = devices.front();
    for (int s = 0; s < pp; ++s) {
      threads_.push_back(
          std::make_unique<RankThreads>(tp, true, [device](int) { cudaSetDevice(device); }));
    }
  } else {
    threads_.push_back(std::make_unique<RankThreads>(
        world, false, [devices](int r) { cudaSetDevice(devices[static_cast<size_t>(r)]); }));
  }
}

ParallelCudaBackend::~ParallelCudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  ranks_.clear();
  if (stream_) cudaStreamDestroy(stream_);
}

void ParallelCudaBackend::make_virtual_pipes() {
  if (pp_ == 1) return;
  for (int t = 0; t < tp_; ++t) {
    Comms group = VirtualRankGroup::create(pp_);
    for (int s = 0; s < pp_; ++s) {
      pipes_[static_cast<size_t>(s * tp_ + t)] = std::move(group[static_cast<size_t>(s)]);
    }
  }
}

Result<std::unique_ptr<ParallelCudaBackend>> ParallelCudaBackend::assemble(
    const std::vector<int>& devices, CudaBackendOptions options, const ParallelDegrees& degrees,
    const std::function<Result<ModelWeights>(int, int)>& shard) {
  const int tp = degrees.tp, pp = degrees.pp, world = tp * pp;
  if (tp < 1 || tp > 8) {
    return invalid_argument(
        "the CUDA backend's tensor-parallel ranks are 1 to 8, not " + std::to_string(tp),
        "tensor-parallel");
  }
  if (pp < 1 || pp > 8) {
    return invalid_argument(
        "the CUDA backend's pipeline stages are 1 to 8, not " + std::to_string(pp),
        "pipeline-parallel");
  }
  if (world < 2) {
    return invalid_argument(
        "a parallel engine has 2 ranks or more (tensor-parallel x "
        "pipeline-parallel)",
        "tensor-parallel");
  }
  if (static_cast<int>(devices.size()) != world) {
    return invalid_argument("the devices name " + std::to_string(devices.size()) + " GPUs for " +
                                std::to_string(world) + " ranks (" + std::to_string(tp) + " x " +
                                std::to_string(pp) + ")",
                            "devices");
  }
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess) {
    cudaGetLastError();
    count = 0;
  }
  for (int d : devices) {
    if (d < 0 || d >= count) {
      return unavailable("no CUDA device " + std::to_string(d) + " here (" + std::to_string(count) +
                         " visible); name others with --devices");
    }
  }
  const bool same =
      std::all_of(devices.begin(), devices.end(), [&](int d) { return d == devices.front(); });
  std::vector<int> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  if (!same && std::adjacent_find(sorted.begin(), sorted.end()) != sorted.end()) {
    return invalid_argument(
        "the ranks' devices are either all one device (virtual ranks) or all different (one GPU "
        "a rank)",
        "devices");
  }
  std::unique_ptr<ParallelCudaBackend> b(new ParallelCudaBackend(devices, same, tp, pp));
  if (same) {
    if (tp > 1) {
      for (int s = 0; s < pp; ++s) {
        Comms group = VirtualRankGroup::create(tp, b->threads_[static_cast<size_t>(s)].get());
        for (int t = 0; t < tp; ++t)
          b->comms_[static_cast<size_t>(s * tp + t)] = std::move(group[static_cast<size_t>(t)]);
      }
    }
    b->make_virtual_pipes();
    if (cudaSetDevice(devices.front()) != cudaSuccess ||
        cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking) != cudaSuccess) {
      return internal_error("creating the ranks' stream on CUDA device " +
                            std::to_string(devices.front()) + ": " +
                            cudaGetErrorString(cudaGetLastError()));
    }
  } else {
    // A group per stage (its tensor-parallel ranks) and per tensor-parallel index (its stages).
    const bool peer = options.rank_collectives == RankCollectives::kPeer;
    auto group = [&](const std::vector<int>& members, bool pipe) -> Result<Comms> {
      if (peer) {
        PeerOptions po;
        if (pipe) {  // (hand-offs only, on to the next stage and back to the first)
          po.staging_bytes = 16 * static_cast<size_t>(members.size());
          po.mailbox_bytes = kPipeMailboxBytes;
          po.ring = true;
        }
        return PeerCommunicator::create_all(members, po);
      }
#ifdef HEADROOM_SIMT
      return unavailable(
          "one GPU a rank over NCCL: the CPU stand-in has none (--cuda-options "
          "rank_collectives=peer)");
#else
      return NcclCommunicator::create_all(members);
#endif
    };
    for (int s = 0; tp > 1 && s < pp; ++s) {
      const std::vector<int> stage(devices.begin() + s * tp, devices.begin() + (s + 1) * tp);
      HR_ASSIGN_OR_RETURN(Comms g, group(stage, false));
      for (int t = 0; t < tp; ++t)
        b->comms_[static_cast<size_t>(s * tp + t)] = std::move(g[static_cast<size_t>(t)]);
    }
    for (int t = 0; pp > 1 && t < tp; ++t) {
      std::vector<int> column;
      for (int s = 0; s < pp; ++s) column.push_back(devices[static_cast<size_t>(s * tp + t)]);
      HR_ASSIGN_OR_RETURN(Comms g, group(column, true));
      for (int s = 0; s < pp; ++s)
        b->pipes_[static_cast<size_t>(s * tp + t)] = std::move(g[static_cast<size_t>(s)]);
    }
  }
  const double fraction = options.kv_cache_fraction;
  if (pp == 1) options.step_groups = 1;  // (no stages: one step's slots suffice)
  if (pp > 1) {
    // With a GPU a rank, a step of other sequences for each stage in flight, and one alone cut
    // into micro-batches. (Virtual ranks run their stages one after another on one stream, where
    // neither pays: steps go one at a time and whole there unless asked. Each rank still has the
    // parts' slots of one a stage, as planned.)
    b->groups_ = same && options.step_groups <= 0 ? 1 : step_groups_for(options.step_groups, pp);
    options.step_groups = b->groups_;
    const int parts = options.micro_batches > 0 ? options.micro_batches : pp;
    b->parts_ = same && options.micro_batches == 0 ? 1 : parts;
    b->part_tokens_ = options.micro_batch_tokens;
    options.max_step_parts = std::max({options.max_step_parts, parts, pp});
    options.micro_batches = b->parts_;  // (each rank warms up the parts' graphs it will replay)
  }
  b->ranks_.resize(static_cast<size_t>(world));
  auto make_rank = [&](int r) -> Status {
    const int s = r / tp, t = r % tp;
    HR_ASSIGN_OR_RETURN(ModelWeights w, shard(s, t));
    CudaBackendOptions o = options;
    o.device = devices[static_cast<size_t>(r)];
    o.tensor_parallel = b->comms_[static_cast<size_t>(r)].get();
    o.turns = nullptr;
    if (same) {
      if (tp > 1) o.turns = b->threads_[static_cast<size_t>(s)].get();
      o.stream = b->stream_;
      // One device's cache split evenly: a given budget by the ranks, or each rank its share of
      // what is still free once its weights are in (the ranks after it load theirs into the rest).
      if (options.kv_cache_bytes > 0) {
        o.kv_cache_bytes = options.kv_cache_bytes / static_cast<size_t>(world);
      } else {
        o.kv_cache_fraction = fraction / (world - r);
      }
    }
    HR_ASSIGN_OR_RETURN(b->ranks_[static_cast<size_t>(r)], CudaBackend::create(w, o));
    return Status::ok();
  };
  if (same) {
    // One after another: each rank's share of the device's free memory is of what the ranks
    // before it left.
    for (int r = 0; r < world; ++r) HR_RETURN_IF_ERROR(make_rank(r));
  } else {
    // Every GPU's rank reads, converts and uploads its own shard at once (the rank threads have
    // their devices set).
    HR_RETURN_IF_ERROR(b->threads_.front()->run(make_rank));
  }
  b->hidden_size_ = b->ranks_.front()->config().hidden_size;
  b->num_blocks_ = b->ranks_.front()->num_kv_blocks();
  for (int r = 0; r < world; ++r) {
    const int blocks = b->ranks_[static_cast<size_t>(r)]->num_kv_blocks();
    if (blocks < b->num_blocks_) {
      b->num_blocks_ = blocks;
      b->check_rank_ = r;
    }
  }
  return b;
}

Result<std::unique_ptr<ParallelCudaBackend>> ParallelCudaBackend::create(
    const ModelWeights& full, const std::vector<int>& devices, CudaBackendOptions options,
    const ParallelDegrees& degrees, const StageCalibration* balance) {
  HR_RETURN_IF_ERROR(check_degrees(full.config, degrees));
  const Build build = [&](const ParallelDegrees& d) {
    return assemble(devices, options, d,
                    [&](int s, int t) { return shard_weights(full, d, s, t); });
  };
  HR_ASSIGN_OR_RETURN(auto b, build(degrees));
  if (!balance || degrees.pp == 1 || !degrees.stage_layers.empty()) return b;
  return balanced(std::move(b), *balance, degrees, build);
}

std::vector<int> ParallelCudaBackend::stage_layers() const {
  std::vector<int> out;
  for (int s = 0; s < pp_; ++s)
    out.push_back(ranks_[static_cast<size_t>(s * tp_)]->config().num_layers);
  return out;
}

Result<std::unique_ptr<ParallelCudaBackend>> ParallelCudaBackend::balanced(
    std::unique_ptr<ParallelCudaBackend> b, const StageCalibration& c, ParallelDegrees degrees,
    const Build& build) {
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  };
  // A cache too small for the calibration's sequences keeps the split as it is.
  if (!calibration_fits(c, b->block_size(), b->num_kv_blocks())) return b;
  const int pp = b->pp_, tp = b->tp_;
  StageBalance report;
  report.ran = true;
  report.layers_before = b->stage_layers();
  // Each stage's parts as its first tensor-parallel rank timed them on its GPU.
  ParallelCudaBackend& m = *b;
  auto timing = [&](bool on) {
    for (auto& r : m.ranks_) r->time_parts(on);
  };
  auto times = [&] {
    StageCosts costs;
    for (int s = 0; s < pp; ++s) {
      const StageCosts& t = m.ranks_[static_cast<size_t>(s * tp)]->part_times();
      costs.layer.insert(costs.layer.end(), t.layer.begin(), t.layer.end());
      if (s == 0) costs.first = t.first;
      if (s == pp - 1) costs.last = t.last;
    }
    return costs;
  };
  HR_ASSIGN_OR_RETURN(StageCosts costs, measure_stage_costs(m, c, timing, times));
  for (int s = 0; s < pp; ++s)
    report.seconds_before.push_back(stage_cost(costs, report.layers_before, s));
  // Within 5% of the best the layers stay where they are: closer than the timing's noise.
  report.layers_after = balance_stages(costs, pp, report.layers_before, 0.05);
  for (int s = 0; s < pp; ++s)
    report.predicted_after.push_back(stage_cost(costs, report.layers_after, s));
  if (report.layers_after != report.layers_before) {
    b.reset();  // (its GPU memory first)
    degrees.stage_layers = report.layers_after;
    Result<std::unique_ptr<ParallelCudaBackend>> moved = build(degrees);
    if (!moved.is_ok()) {
      // (A stage grown past its GPU's memory, say: the split as it was.)
      degrees.stage_layers = report.layers_before;
      report.layers_after = report.layers_before;
      report.predicted_after = report.seconds_before;
      HR_ASSIGN_OR_RETURN(moved, build(degrees));
    }
    b = std::move(moved).value();
  }
  report.calibration_seconds = seconds();
  b->balance_ = std::move(report);
  return b;
}

Result<std::unique_ptr<ParallelCudaBackend>> ParallelCudaBackend::create_from_dir(
    const std::string& dir, const std::vector<int>& devices, CudaBackendOptions options,
    const ParallelDegrees& degrees, LoadStats* stats, const StageCalibration* balance) {
  HR_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  HR_RETURN_IF_ERROR(check_degrees(config, degrees));
  HR_ASSIGN_OR_RETURN(auto st, SafetensorsModel::open_dir(dir));
  const Build build =
      [&](const ParallelDegrees& d) -> Result<std::unique_ptr<ParallelCudaBackend>> {
    const auto t0 = std::chrono::steady_clock::now();
    HR_ASSIGN_OR_RETURN(auto b, assemble(devices, options, d, [&](int s, int t) {
                          return load_shard(*st, config, d, s, t);
                        }));
    if (stats) {
      stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      stats->checkpoint_bytes = 0;
      for (const auto& [name, t] : st->tensors()) stats->checkpoint_bytes += t.num_bytes;
      stats->shard_bytes = b->weight_bytes();
    }
    return b;
  };
  HR_ASSIGN_OR_RETURN(auto b, build(degrees));
  if (!balance || degrees.pp == 1 || !degrees.stage_layers.empty()) return b;
  return balanced(std::move(b), *balance, degrees, build);
}

size_t ParallelCudaBackend::weight_bytes() const {
  size_t n = 0;
  for (const auto& r : ranks_) n += r->weight_bytes();
  return n;
}

size_t ParallelCudaBackend::kv_cache_bytes() const {
  size_t n = 0;
  for (const auto& r : ranks_) n += r->kv_cache_bytes();
  return n;
}

size_t ParallelCudaBackend::num_graphs() const {
  // (Virtual ranks: a stage's last rank holds its graphs, the others a placeholder each.)
  size_t n = 0;
  for (size_t r = 0; r < ranks_.size(); ++r) {
    if (!virtual_ || r % static_cast<size_t>(tp_) == static_cast<size_t>(tp_ - 1))
      n += ranks_[r]->num_graphs();
  }
  return n;
}

Status ParallelCudaBackend::on_ranks(const std::function<Status(int)>& work) {
  if (!virtual_) return threads_.front()->run(work);
  for (int s = 0; s < pp_; ++s) {
    HR_RETURN_IF_ERROR(
        threads_[static_cast<size_t>(s)]->run([&](int t) { return work(s * tp_ + t); }));
  }
  return Status::ok();
}

Status ParallelCudaBackend::check(const StepInput& in) const {
  // (As each rank would refuse it: the steps outstanding, then the step itself.)
  const size_t most = static_cast<size_t>(std::max(2, groups_));
  if (outstanding_.size() >= most)
    return internal_error(std::to_string(most) + " steps are outstanding: collect one first");
  if (forwarded_rows_ >= 0) return internal_error("a forwarded step waits for its sampling");
  // Steps in groups go through the stages one after another, none waiting for the tokens of
  // another: the last stage's tokens do not go back to the first.
  if (groups_ > 1 && in.fed_rows) return invalid_argument("steps in groups take no fed rows");
  HR_RETURN_IF_ERROR(lost());
  return ranks_[static_cast<size_t>(check_rank_)]->check_input(in);
}

Status ParallelCudaBackend::lost() const {
  // (kInternal: the worker takes the engine as lost and stops, so that a fresh process starts
  // clean; an error it took for the work would leave it serving from ranks that cannot step.)
  if (aborted_) {
    std::lock_guard<std::mutex> lock(reason_mu_);
    return internal_error("the ranks' communicators were aborted: " + abort_reason_);
  }
  if (broken_) {
    return internal_error(
        "a step failed part-way on one GPU a rank: the ranks are out of step; restart the engine");
  }
  return Status::ok();
}

Status ParallelCudaBackend::stage_step(int r, const CudaBackend::StepRows& rows, bool sampled,
                                       const std::function<Status(CudaBackend&)>& call) {
  const int s = r / tp_;
  CudaBackend& b = *ranks_[static_cast<size_t>(r)];
  DeviceCommunicator* pipe = pipes_[static_cast<size_t>(r)].get();
  const size_t hidden = static_cast<size_t>(rows.tokens) * hidden_size_ * sizeof(float);
  if (s > 0) HR_RETURN_IF_ERROR(pipe->recv(b.stage_hidden(), hidden, s - 1, b.stream()));
  HR_RETURN_IF_ERROR(call(b));
  if (s < pp_ - 1) HR_RETURN_IF_ERROR(pipe->send(b.stage_hidden(), hidden, s + 1, b.stream()));
  if (sampled) HR_RETURN_IF_ERROR(hand_back_tokens(r, rows));
  return Status::ok();
}

Status ParallelCudaBackend::hand_back_tokens(int r, const CudaBackend::StepRows& rows) {
  const int s = r / tp_;
  // (In groups no step is fed: the first stage would wait for the tokens before its next step.)
  if (pp_ == 1 || groups_ > 1) return Status::ok();
  CudaBackend& b = *ranks_[static_cast<size_t>(r)];
  const size_t bytes = static_cast<size_t>(rows.logits) * sizeof(int32_t);
  if (s == pp_ - 1) {
    return pipes_[static_cast<size_t>(r)]->send(b.sampled_tokens(), bytes, 0, b.stream());
  }
  // Over NCCL the first stage receives in the same run as the last stage sends: the first use
  // of a direction between two ranks connects them, which blocks each side's thread until the
  // other calls. (Virtual ranks receive after every stage has run: receive_tokens.)
  if (s == 0 && !virtual_) {
    return pipes_[static_cast<size_t>(r)]->recv(b.sampled_tokens(), bytes, pp_ - 1, b.stream());
  }
  return Status::ok();
}

Status ParallelCudaBackend::receive_tokens(const CudaBackend::StepRows& rows) {
  // (Over NCCL: in hand_back_tokens; in groups: none.)
  if (pp_ == 1 || !virtual_ || groups_ > 1) return Status::ok();
  return threads_.front()->run([&](int t) -> Status {
    CudaBackend& b = *ranks_[static_cast<size_t>(t)];
    return pipes_[static_cast<size_t>(t)]->recv(b.sampled_tokens(),
                                                static_cast<size_t>(rows.logits) * sizeof(int32_t),
                                                pp_ - 1, b.stream());
  });
}

void ParallelCudaBackend::fail_step() {
  // With a GPU a rank, peers may still wait in a collective or hand-off the failed rank never
  // reached (their kernels trap at the timeout, NCCL's hang): no later step is taken.
  if (!virtual_) broken_ = true;
  for (auto& r : ranks_) r->discard();
  if (virtual_) make_virtual_pipes();
  outstanding_.clear();
  forwarded_rows_ = -1;
}

Status ParallelCudaBackend::forward(const StepInput& in, float* logits) {
  if (in.fed_rows) return invalid_argument("forward() takes no fed rows");
  HR_RETURN_IF_ERROR(check(in));
  const CudaBackend::StepRows rows = ranks_.front()->step_rows(in);
  // The first rank of the last stage returns the gathered logits; the stage's others write theirs
  // (the same) apart.
  const int first_last = (pp_ - 1) * tp_;
  scratch_logits_.resize(static_cast<size_t>(std::max(0, in.num_logits)) * vocab_size() *
                         std::max(0, tp_ - 1));
  const Status st = on_ranks([&](int r) {
    float* out = logits;
    if (r > first_last) {
      out = scratch_logits_.data() +
            static_cast<size_t>(r - first_last - 1) * std::max(0, in.num_logits) * vocab_size();
    }
    return stage_step(r, rows, false, [&](CudaBackend& b) { return b.forward(in, out); });
  });
  if (!st.is_ok()) fail_step();
  return st;
}

Status ParallelCudaBackend::submit(const StepInput& in, const SampleSpec* specs) {
  if (in.num_logits > 0 && specs == nullptr)
    return invalid_argument("no sampling specs for the logits rows");
  HR_RETURN_IF_ERROR(check(in));
  // In groups, cut only when no other step is in flight: else the others fill the stages.
  if (parts_ > 1 && in.num_tokens >= static_cast<int64_t>(parts_) * part_tokens_ &&
      (groups_ == 1 || outstanding_.empty())) {
    split_step(in, parts_, &micro_);
    // A part's logits rows must be a run of the step's, its tokens placed at the first (so the
    // step's logits rows in token order, as the engine makes them; else the step goes whole).
    int next = 0;
    bool runs = true;
    part_specs_.resize(micro_.size());
    for (size_t m = 0; m < micro_.size(); ++m) {
      part_specs_[m].clear();
      for (int i : micro_[m].logits_index) {
        runs = runs && i == next++;
        part_specs_[m].push_back(specs[i]);
      }
    }
    if (runs) return submit_parts(in);
  }
  const CudaBackend::StepRows rows = ranks_.front()->step_rows(in);
  Status st = on_ranks([&](int r) {
    return stage_step(r, rows, true, [&](CudaBackend& b) { return b.submit(in, specs); });
  });
  if (st.is_ok()) st = receive_tokens(rows);
  if (!st.is_ok()) {
    fail_step();
    return st;
  }
  outstanding_.push_back({in.num_logits, {}});
  return Status::ok();
}

Status ParallelCudaBackend::stage_part(int r, int m, int step_logits) {
  const MicroBatch& mb = micro_[static_cast<size_t>(m)];
  CudaBackend::StepPart where;
  where.index = m;
  where.count = static_cast<int>(micro_.size());
  where.first_logit = mb.logits_index.empty() ? 0 : mb.logits_index.front();
  where.step_logits = step_logits;
  const std::vector<SampleSpec>& specs = part_specs_[static_cast<size_t>(m)];
  return stage_step(r, ranks_.front()->step_rows(mb.in), false, [&](CudaBackend& b) {
    return b.submit_part(mb.in, specs.empty() ? nullptr : specs.data(), where);
  });
}

Status ParallelCudaBackend::submit_parts(const StepInput& in) {
  const CudaBackend::StepRows tokens_back{0, in.num_logits};
  const int parts = static_cast<int>(micro_.size());
  Status st = Status::ok();
  if (virtual_) {
    // One stream: micro-batch by micro-batch through the stages (a stage's hidden rows are
    // copied on before it takes the next), then the tokens back.
    for (int m = 0; m < parts && st.is_ok(); ++m)
      st = on_ranks([&](int r) { return stage_part(r, m, in.num_logits); });
    if (st.is_ok()) st = on_ranks([&](int r) { return hand_back_tokens(r, tokens_back); });
    if (st.is_ok()) st = receive_tokens(tokens_back);
  } else {
    // A stream a rank: each rank enqueues its micro-batches in order, each handed on as it is
    // done, and the stages run them at once.
    st = on_ranks([&](int r) -> Status {
      for (int m = 0; m < parts; ++m) HR_RETURN_IF_ERROR(stage_part(r, m, in.num_logits));
      return hand_back_tokens(r, tokens_back);
    });
  }
  if (!st.is_ok()) {
    fail_step();
    return st;
  }
  Submitted done{in.num_logits, {}};
  for (const MicroBatch& mb : micro_) done.parts.push_back(mb.logits_index);
  outstanding_.push_back(std::move(done));
  ++steps_cut_;
  return Status::ok();
}

Status ParallelCudaBackend::submit_forward(const StepInput& in) {
  HR_RETURN_IF_ERROR(check(in));
  const CudaBackend::StepRows rows = ranks_.front()->step_rows(in);
  const Status st = on_ranks([&](int r) {
    return stage_step(r, rows, false, [&](CudaBackend& b) { return b.submit_forward(in); });
  });
  if (!st.is_ok()) {
    fail_step();
    return st;
  }
  forwarded_rows_ = in.num_logits;
  forwarded_step_ = rows;
  return Status::ok();
}

Status ParallelCudaBackend::submit_sampling(const SampleSpec* specs) {
  if (forwarded_rows_ < 0) return internal_error("no forwarded step to sample");
  if (forwarded_rows_ > 0 && specs == nullptr)
    return invalid_argument("no sampling specs for the logits rows");
  const CudaBackend::StepRows rows = forwarded_step_;
  Status st = on_ranks([&](int r) -> Status {
    HR_RETURN_IF_ERROR(ranks_[static_cast<size_t>(r)]->submit_sampling(specs));
    return hand_back_tokens(r, rows);
  });
  if (st.is_ok()) st = receive_tokens(rows);
  if (!st.is_ok()) {
    fail_step();
    return st;
  }
  outstanding_.push_back({forwarded_rows_, {}});
  forwarded_rows_ = -1;
  return Status::ok();
}

Status ParallelCudaBackend::collect(int32_t* tokens, TokenLogprobs* logprobs) {
  if (outstanding_.empty()) return internal_error("no step to collect");
  const Submitted step = std::move(outstanding_.front());
  outstanding_.erase(outstanding_.begin());
  // Every rank's step (or each of its parts) is collected (an earlier stage's has no tokens);
  // the last stage's first rank's tokens are the step's, and its peers must have sampled the
  // same.
  const size_t first_last = static_cast<size_t>((pp_ - 1) * tp_);
  auto collect_all = [&](int rows, int32_t* out, TokenLogprobs* lp) -> Status {
    scratch_tokens_.resize(static_cast<size_t>(std::max(1, rows)));
    for (size_t r = 0; r < ranks_.size(); ++r) {
      Status st = r == first_last ? ranks_[r]->collect(out, lp)
                                  : ranks_[r]->collect(scratch_tokens_.data(), nullptr);
      if (st.is_ok()) st = lost();  // (aborted: the step's kernels were ended part-way)
      if (st.is_ok() && r > first_last &&
          !std::equal(scratch_tokens_.begin(), scratch_tokens_.begin() + rows, out)) {
        st = internal_error("tensor-parallel rank " + std::to_string(r - first_last) +
                            " of the last stage sampled other tokens than its rank 0");
      }
      if (!st.is_ok()) {
        fail_step();  // the ranks after this one still hold the step
        return st;
      }
    }
    return Status::ok();
  };
  if (step.parts.empty()) return collect_all(step.logits, tokens, logprobs);
  // A cut step: its parts in order, each part's rows into the step's.
  for (const std::vector<int>& index : step.parts) {
    const int rows = static_cast<int>(index.size());
    part_tokens_out_.resize(static_cast<size_t>(std::max(1, rows)));
    part_logprobs_.resize(static_cast<size_t>(std::max(1, rows)));
    for (int i = 0; logprobs && i < rows; ++i)
      part_logprobs_[static_cast<size_t>(i)] = logprobs[index[static_cast<size_t>(i)]];
    HR_RETURN_IF_ERROR(
        collect_all(rows, part_tokens_out_.data(), logprobs ? part_logprobs_.data() : nullptr));
    for (int i = 0; i < rows; ++i) {
      tokens[index[static_cast<size_t>(i)]] = part_tokens_out_[static_cast<size_t>(i)];
      if (logprobs)
        logprobs[index[static_cast<size_t>(i)]] = part_logprobs_[static_cast<size_t>(i)];
    }
  }
  return Status::ok();
}

bool ParallelCudaBackend::abort(const std::string& reason) {
  // Virtual ranks' communicators end no wait (no wait crosses threads), and a failed step
  // rebuilds their pipes on the step's thread: nothing to walk here.
  if (virtual_) return false;
  bool any = false;
  {
    std::lock_guard<std::mutex> lock(abort_mu_);
    if (aborted_) return true;
    {
      std::lock_guard<std::mutex> said(reason_mu_);
      abort_reason_ = reason;
    }
    // Lost before the first communicator is aborted: a rank whose step that abort ends
    // part-way must not be collected as a good one while the others are still being aborted.
    aborted_ = true;
    for (auto* group : {&comms_, &pipes_}) {
      for (auto& c : *group) {
        if (c && c->abort(reason)) any = true;
      }
    }
    if (!any) aborted_ = false;  // (none could be: the step goes on as it may)
  }
  if (any) log::error("engine.ranks_aborted", {{"reason", reason}});
  return any;
}

void ParallelCudaBackend::discard() {
  for (auto& r : ranks_) r->discard();
  if (virtual_) make_virtual_pipes();
  outstanding_.clear();
  forwarded_rows_ = -1;
}

Status ParallelCudaBackend::warm_up(int max_blocks_per_seq) {
  return on_ranks(
      [&](int r) { return ranks_[static_cast<size_t>(r)]->warm_up(max_blocks_per_seq); });
}

}  // namespace hr::engine
