// Tensor-parallel ranks of the CUDA backend: shards, communicators, streams, the rank threads.
#include "engine/parallel_cuda_backend.h"

#include <algorithm>
#include <cstring>
#include <functional>

#include "engine/internal/cuda_status.h"
#include "engine/safetensors.h"
#include "engine/virtual_ranks.h"
#ifndef HEADROOM_SIMT  // (NCCL is no part of the CPU stand-in for the CUDA runtime)
#include "engine/nccl_communicator.h"
#endif

namespace hr::engine {

ParallelCudaBackend::ParallelCudaBackend(const std::vector<int>& devices, bool virtual_ranks)
    : threads_(static_cast<int>(devices.size()), virtual_ranks,
               [devices](int r) { cudaSetDevice(devices[static_cast<size_t>(r)]); }) {}

ParallelCudaBackend::~ParallelCudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  ranks_.clear();
  if (stream_) cudaStreamDestroy(stream_);
}

Result<std::unique_ptr<ParallelCudaBackend>> ParallelCudaBackend::assemble(
    const std::vector<int>& devices, CudaBackendOptions options,
    const std::function<Result<ModelWeights>(int)>& shard) {
  const int tp = static_cast<int>(devices.size());
  if (tp < 2 || tp > 8) {
    return invalid_argument(
        "a tensor-parallel engine on the CUDA backend has 2 to 8 ranks, not " + std::to_string(tp),
        "tensor-parallel");
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
  std::unique_ptr<ParallelCudaBackend> b(new ParallelCudaBackend(devices, same));
  if (same) {
    b->comms_ = VirtualRankGroup::create(tp, &b->threads_);
    if (cudaSetDevice(devices.front()) != cudaSuccess ||
        cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking) != cudaSuccess) {
      return internal_error("creating the ranks' stream on CUDA device " +
                            std::to_string(devices.front()) + ": " +
                            cudaGetErrorString(cudaGetLastError()));
    }
  } else {
#ifdef HEADROOM_SIMT
    return unavailable("one GPU a rank needs NCCL, which the CPU stand-in does not have");
#else
    HR_ASSIGN_OR_RETURN(b->comms_, NcclCommunicator::create_all(devices));
#endif
  }
  const double fraction = options.kv_cache_fraction;
  for (int r = 0; r < tp; ++r) {
    HR_ASSIGN_OR_RETURN(ModelWeights w, shard(r));
    CudaBackendOptions o = options;
    o.device = devices[static_cast<size_t>(r)];
    o.tensor_parallel = b->comms_[static_cast<size_t>(r)].get();
    if (same) {
      o.turns = &b->threads_;
      o.stream = b->stream_;
      // One device's cache split evenly: a given budget by the ranks, or each rank its share of
      // what is still free once its weights are in (the ranks after it load theirs into the rest).
      if (options.kv_cache_bytes > 0) {
        o.kv_cache_bytes = options.kv_cache_bytes / static_cast<size_t>(tp);
      } else {
        o.kv_cache_fraction = fraction / (tp - r);
      }
    }
    HR_ASSIGN_OR_RETURN(auto rank, CudaBackend::create(w, o));
    b->ranks_.push_back(std::move(rank));
  }
  b->num_blocks_ = b->ranks_.front()->num_kv_blocks();
  for (const auto& r : b->ranks_) b->num_blocks_ = std::min(b->num_blocks_, r->num_kv_blocks());
  return b;
}

Result<std::unique_ptr<ParallelCudaBackend>> ParallelCudaBackend::create(
    const ModelWeights& full, const std::vector<int>& devices, CudaBackendOptions options,
    int expert_parallel) {
  const ParallelDegrees d{static_cast<int>(devices.size()), 1, expert_parallel};
  HR_RETURN_IF_ERROR(check_degrees(full.config, d));
  return assemble(devices, options, [&](int r) { return shard_weights(full, d, 0, r); });
}

Result<std::unique_ptr<ParallelCudaBackend>> ParallelCudaBackend::create_from_dir(
    const std::string& dir, const std::vector<int>& devices, CudaBackendOptions options,
    int expert_parallel) {
  HR_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  const ParallelDegrees d{static_cast<int>(devices.size()), 1, expert_parallel};
  HR_RETURN_IF_ERROR(check_degrees(config, d));
  HR_ASSIGN_OR_RETURN(auto st, SafetensorsModel::open_dir(dir));
  return assemble(devices, options, [&](int r) { return load_shard(*st, config, d, 0, r); });
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

Status ParallelCudaBackend::on_ranks(const std::function<Status(int)>& work) {
  return threads_.run(work);
}

Status ParallelCudaBackend::forward(const StepInput& in, float* logits) {
  // Every rank ends with the same gathered logits; rank 0's are returned.
  std::vector<std::vector<float>> others(ranks_.size());
  return on_ranks([&](int r) {
    float* out = logits;
    if (r > 0) {
      others[static_cast<size_t>(r)].resize(static_cast<size_t>(in.num_logits) * vocab_size());
      out = others[static_cast<size_t>(r)].data();
    }
    return ranks_[static_cast<size_t>(r)]->forward(in, out);
  });
}

Status ParallelCudaBackend::submit(const StepInput& in, const SampleSpec* specs) {
  HR_RETURN_IF_ERROR(
      on_ranks([&](int r) { return ranks_[static_cast<size_t>(r)]->submit(in, specs); }));
  outstanding_.push_back(in.num_logits);
  return Status::ok();
}

Status ParallelCudaBackend::submit_forward(const StepInput& in) {
  HR_RETURN_IF_ERROR(
      on_ranks([&](int r) { return ranks_[static_cast<size_t>(r)]->submit_forward(in); }));
  forwarded_rows_ = in.num_logits;
  return Status::ok();
}

Status ParallelCudaBackend::submit_sampling(const SampleSpec* specs) {
  if (forwarded_rows_ < 0) return internal_error("no forwarded step to sample");
  HR_RETURN_IF_ERROR(
      on_ranks([&](int r) { return ranks_[static_cast<size_t>(r)]->submit_sampling(specs); }));
  outstanding_.push_back(forwarded_rows_);
  forwarded_rows_ = -1;
  return Status::ok();
}

Status ParallelCudaBackend::collect(int32_t* tokens, TokenLogprobs* logprobs) {
  if (outstanding_.empty()) return internal_error("no step to collect");
  const int rows = outstanding_.front();
  outstanding_.erase(outstanding_.begin());
  HR_RETURN_IF_ERROR(ranks_.front()->collect(tokens, logprobs));
  std::vector<int32_t> theirs(static_cast<size_t>(rows));
  for (size_t r = 1; r < ranks_.size(); ++r) {
    HR_RETURN_IF_ERROR(ranks_[r]->collect(theirs.data(), nullptr));
    if (!std::equal(theirs.begin(), theirs.end(), tokens)) {
      return internal_error("tensor-parallel rank " + std::to_string(r) +
                            " sampled other tokens than rank 0");
    }
  }
  return Status::ok();
}

void ParallelCudaBackend::discard() {
  for (auto& r : ranks_) r->discard();
  outstanding_.clear();
  forwarded_rows_ = -1;
}

Status ParallelCudaBackend::warm_up(int max_blocks_per_seq) {
  return on_ranks(
      [&](int r) { return ranks_[static_cast<size_t>(r)]->warm_up(max_blocks_per_seq); });
}

}  // namespace hr::engine
