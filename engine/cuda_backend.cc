// The CUDA backend's lifetime and its Backend interface: forward (tests), submit/collect (the
// engine's pipelined steps) and per-phase profiling. Construction and weight loading are in
// cuda_backend_load.cc, the staging of a step's inputs in cuda_backend_staging.cc, the forward
// pass in cuda_backend_forward.cc, and CUDA graphs of decode steps in cuda_backend_graphs.cc.
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

CudaBackend::CudaBackend(const ModelConfig& config, CudaBackendOptions options)
    : config_(config),
      options_(options),
      shard_(whole_model(config)),
      whole_slots_(std::max(2, options.step_groups)),
      slots_(static_cast<size_t>(whole_slots_) +
             (options.max_step_parts > 1 ? 2 * static_cast<size_t>(options.max_step_parts) : 0)),
      whole_slot_(whole_slots_ - 1) {}

int CudaBackend::free_slot() const {
  for (int k = 1; k <= whole_slots_; ++k) {
    const int slot = (whole_slot_ + k) % whole_slots_;
    if (forwarded_.pending && forwarded_.slot == slot) continue;
    if (std::find(outstanding_.begin(), outstanding_.end(), slot) == outstanding_.end())
      return slot;
  }
  return (whole_slot_ + 1) % whole_slots_;  // (none free: check_whole_slot_free refuses first)
}

Status CudaBackend::check_whole_slot_free() const {
  if (whole_steps_outstanding() < static_cast<size_t>(whole_slots_)) return Status::ok();
  return internal_error(std::to_string(whole_slots_) + " steps are outstanding: collect one first");
}

int CudaBackend::head_rows() const {
  return shard_.tp > 1 ? (config_.vocab_size + shard_.tp - 1) / shard_.tp : config_.vocab_size;
}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  clear_graphs();
  for (cudaEvent_t e : mark_events_) cudaEventDestroy(e);
  gemm_.reset();
  for (void* p : allocations_) cudaFree(p);
  for (Slot& slot : slots_) {
    if (slot.host) cudaFreeHost(slot.host);
    if (slot.host_tokens) cudaFreeHost(slot.host_tokens);
    if (slot.host_logprobs) cudaFreeHost(slot.host_logprobs);
    if (slot.list_host) cudaFreeHost(slot.list_host);
    if (slot.done) cudaEventDestroy(slot.done);
  }
  if (stream_ && owns_stream_) cudaStreamDestroy(stream_);
}

size_t CudaBackend::kv_cache_bytes() const {
  return 2ull * config_.num_layers * num_blocks_ * options_.block_size * config_.kv_size() * 2;
}

void CudaBackend::mark(const char* phase) {
  if (!profiling_) return;
  if (num_marks_ == mark_events_.size()) {
    cudaEvent_t e = nullptr;
    if (cudaEventCreate(&e) != cudaSuccess) {
      cudaGetLastError();  // not a kernel's failure: keep it from being reported as one
      return;
    }
    mark_events_.push_back(e);
    mark_names_.emplace_back();
  }
  mark_names_[num_marks_] = phase;
  if (cudaEventRecord(mark_events_[num_marks_], stream_) == cudaSuccess) {
    ++num_marks_;
  } else {
    cudaGetLastError();
  }
}

void CudaBackend::collect_marks() {
  if (!profiling_ || num_marks_ == 0) return;
  auto elapsed_ms = [&](size_t from, size_t to) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, mark_events_[from], mark_events_[to]) != cudaSuccess) {
      cudaGetLastError();
      return 0.0f;
    }
    return ms;
  };
  for (size_t i = 1; i < num_marks_; ++i) {
    // ("layer" only closes a layer for time_parts; its phase is empty.)
    if (mark_names_[i] != "layer") profile_[mark_names_[i]] += elapsed_ms(i - 1, i);
  }
  if (timing_parts_) {
    // The parts: up to the embedding's mark, each layer up to its "layer" mark, the rest.
    size_t from = 0, layer = 0;
    for (size_t i = 1; i < num_marks_; ++i) {
      const std::string& name = mark_names_[i];
      if (name == "embedding" && layer == 0) {
        part_times_.first += elapsed_ms(from, i) / 1e3;
        from = i;
      } else if (name == "layer" && layer < part_times_.layer.size()) {
        part_times_.layer[layer++] += elapsed_ms(from, i) / 1e3;
        from = i;
      }
    }
    part_times_.last += elapsed_ms(from, num_marks_ - 1) / 1e3;
  }
  num_marks_ = 0;
  ++profiled_steps_;
}

void CudaBackend::time_parts(bool on) {
  set_profiling(on);
  timing_parts_ = on;
  part_times_.layer.assign(static_cast<size_t>(config_.num_layers), 0.0);
  part_times_.first = part_times_.last = 0;
}

Status CudaBackend::set_routing_record(bool on) {
  if (!config_.is_moe()) return invalid_argument("not a mixture of experts", "model");
  if (on && !routing_record_) {
    const size_t bytes =
        static_cast<size_t>(config_.num_layers) * options_.max_num_tokens * config_.moe.top_k * 4;
    HR_RETURN_IF_ERROR(alloc(reinterpret_cast<void**>(&routing_record_), bytes, "routing record"));
  }
  recording_routing_ = on;
  clear_graphs();  // captured graphs copy the choices or not
  return Status::ok();
}

Result<std::vector<int32_t>> CudaBackend::routing_record(int layer) {
  if (!recording_routing_ || layer < 0 || layer >= config_.num_layers ||
      !config_.is_moe_layer(layer))
    return invalid_argument("no routing recorded for layer " + std::to_string(layer), "layer");
  HR_CUDA("waiting for the step", cudaStreamSynchronize(stream_));
  const size_t k = config_.moe.top_k, per_layer = static_cast<size_t>(options_.max_num_tokens) * k;
  std::vector<int32_t> out(static_cast<size_t>(routing_record_tokens_) * k);
  HR_CUDA("reading the routing", cudaMemcpy(out.data(), routing_record_ + per_layer * layer,
                                            out.size() * 4, cudaMemcpyDeviceToHost));
  return out;
}

void CudaBackend::set_profiling(bool on) {
  profiling_ = on;
  profile_.clear();
  profiled_steps_ = 0;
  num_marks_ = 0;
  clear_graphs();
}

Status CudaBackend::forward(const StepInput& in, float* logits) {
  if (in.fed_rows) return invalid_argument("forward() takes no fed rows");
  HR_RETURN_IF_ERROR(check_whole_slot_free());
  // (The step is done before this returns: a later submit may take its slot.)
  Status enqueued = enqueue(in, nullptr, free_slot());
  if (!enqueued.is_ok()) {
    cudaStreamSynchronize(stream_);  // as in submit()
    return enqueued;
  }
  if (in.num_logits > 0 && shard_.last_stage()) {  // (an earlier stage makes no logits)
    const cudaError_t queued = cudaMemcpyAsync(
        logits, logits_, static_cast<size_t>(in.num_logits) * config_.vocab_size * 4,
        cudaMemcpyDeviceToHost, stream_);
    if (queued != cudaSuccess) {
      cudaStreamSynchronize(stream_);  // the step still reads the slot's pinned inputs
      return internal::cuda_error("copying logits", queued, options_.device);
    }
  }
  HR_CUDA("running the step", cudaStreamSynchronize(stream_));
  collect_marks();
  return Status::ok();
}

Status CudaBackend::submit(const StepInput& in, const SampleSpec* specs) {
  HR_RETURN_IF_ERROR(check_whole_slot_free());
  if (in.num_logits > 0 && specs == nullptr)
    return invalid_argument("no sampling specs for the logits rows");
  if (forwarded_.pending) return internal_error("a forwarded step waits for its sampling");
  const int index = free_slot();
  Status enqueued = enqueue(in, specs, index);
  if (!enqueued.is_ok()) {
    // What did get queued may still read the slot's pinned inputs: let it finish before they are
    // written again.
    cudaStreamSynchronize(stream_);
    return enqueued;
  }
  return finish_submit(index, in.num_logits, specs);
}

Status CudaBackend::submit_part(const StepInput& in, const SampleSpec* specs,
                                const StepPart& where) {
  if (where.count <= 1) return submit(in, specs);
  if (where.count > options_.max_step_parts || where.index < 0 || where.index >= where.count)
    return internal_error("part " + std::to_string(where.index) + " of " +
                          std::to_string(where.count) + ": the backend takes steps in up to " +
                          std::to_string(options_.max_step_parts) + " parts");
  if (outstanding_.size() - whole_steps_outstanding() >=
      2 * static_cast<size_t>(options_.max_step_parts))
    return internal_error("two steps are outstanding: collect one first");
  if (in.num_logits > 0 && specs == nullptr)
    return invalid_argument("no sampling specs for the logits rows");
  if (forwarded_.pending) return internal_error("a forwarded step waits for its sampling");
  // Every part's fed rows name the step before's rows.
  if (where.index == 0) {
    part_half_ = 1 - part_half_;
    part_prev_logits_ = prev_num_logits_;
  }
  prev_num_logits_ = part_prev_logits_;
  const int index = whole_slots_ + part_half_ * options_.max_step_parts + where.index;
  Status enqueued = enqueue(in, specs, index);
  // The last stage's tokens placed in the step's, and at the last part the step's made the ones
  // a later step's fed rows read.
  const bool placing = enqueued.is_ok() && shard_.last_stage();
  if (placing && in.num_logits > 0) {
    enqueued = check_cuda(
        "placing a part's tokens",
        cudaMemcpyAsync(part_tokens_ + where.first_logit, slots_[static_cast<size_t>(index)].tokens,
                        static_cast<size_t>(in.num_logits) * 4, cudaMemcpyDeviceToDevice, stream_));
  }
  if (placing && enqueued.is_ok() && where.index == where.count - 1 && where.step_logits > 0) {
    enqueued = check_cuda(
        "placing a step's tokens",
        cudaMemcpyAsync(tokens_, part_tokens_, static_cast<size_t>(where.step_logits) * 4,
                        cudaMemcpyDeviceToDevice, stream_));
  }
  if (!enqueued.is_ok()) {
    cudaStreamSynchronize(stream_);  // as in submit()
    prev_num_logits_ = 0;
    return enqueued;
  }
  HR_RETURN_IF_ERROR(finish_submit(index, in.num_logits, specs));
  prev_num_logits_ = where.index == where.count - 1 ? where.step_logits : part_prev_logits_;
  return Status::ok();
}

Status CudaBackend::submit_forward(const StepInput& in) {
  HR_RETURN_IF_ERROR(check_whole_slot_free());
  if (forwarded_.pending) return internal_error("a forwarded step waits for its sampling");
  const int index = free_slot();
  StepLayout lay;
  Status enqueued = enqueue(in, nullptr, index, &lay);
  if (!enqueued.is_ok()) {
    cudaStreamSynchronize(stream_);  // as in submit()
    return enqueued;
  }
  whole_slot_ = index;
  forwarded_.pending = true;
  forwarded_.slot = index;
  forwarded_.num_logits = in.num_logits;  // the real rows (a decode graph's padding is not sampled)
  forwarded_.sample_params = lay.sample_params;
  forwarded_.logits_rows.assign(in.logits_rows, in.logits_rows + std::max(0, in.num_logits));
  return Status::ok();
}

Status CudaBackend::submit_sampling(const SampleSpec* specs) {
  if (!forwarded_.pending) return internal_error("no forwarded step to sample");
  const int L = forwarded_.num_logits, index = forwarded_.slot;
  if (L > 0 && specs == nullptr) return invalid_argument("no sampling specs for the logits rows");
  forwarded_.pending = false;
  Slot& slot = slots_[index];
  StepLayout lay;
  lay.sample_params = forwarded_.sample_params;
  auto check = [&](const char* op, cudaError_t e) {
    return e == cudaSuccess ? Status::ok() : internal::cuda_error(op, e, options_.device);
  };
  // (An earlier pipeline stage samples nothing: its step is only outstanding.)
  const bool sampling = L > 0 && shard_.last_stage();
  Status sampled =
      !sampling ? Status::ok() : pack_sampling(specs, L, forwarded_.logits_rows.data(), slot, lay);
  const size_t bytes = static_cast<size_t>(L) * sizeof(kernels::SampleParams);
  if (sampled.is_ok() && sampling) {
    sampled = check("copying sampling parameters",
                    cudaMemcpyAsync(slot.dev + lay.sample_params, slot.host + lay.sample_params,
                                    bytes, cudaMemcpyHostToDevice, stream_));
  }
  if (sampled.is_ok() && sampling) {
    // (After a copy: not a programmatic launch.)
    kernels::set_programmatic_launch(false);
    sampled =
        check("sampling", kernels::sample_tokens(logits_, L, config_.vocab_size,
                                                 reinterpret_cast<const kernels::SampleParams*>(
                                                     slot.dev + lay.sample_params),
                                                 input_ids_, tokens_, logprobs_, stream_));
  }
  if (!sampled.is_ok()) {
    // The forward pass is queued: let it end, and let no later step be fed from it.
    cudaStreamSynchronize(stream_);
    prev_num_logits_ = 0;
    return sampled;
  }
  return finish_submit(index, L, specs);
}

Status CudaBackend::finish_submit(int index, int num_logits, const SampleSpec* specs) {
  Slot& slot = slots_[index];
  cudaError_t queued = cudaSuccess;
  slot.asked.clear();
  // An earlier pipeline stage's step has no tokens to collect (but its rows may be fed).
  const int sampled = shard_.last_stage() ? num_logits : 0;
  const bool any_logprobs = specs && std::any_of(specs, specs + sampled, [](const SampleSpec& sp) {
                              return sp.logprobs >= 0;
                            });
  for (int i = 0; any_logprobs && i < sampled; ++i) slot.asked.push_back(specs[i].logprobs);
  if (sampled > 0) {
    queued = cudaMemcpyAsync(slot.host_tokens, sampled_into(index),
                             static_cast<size_t>(sampled) * 4, cudaMemcpyDeviceToHost, stream_);
  }
  if (queued == cudaSuccess && !slot.asked.empty()) {
    queued = cudaMemcpyAsync(slot.host_logprobs, logprobs_,
                             static_cast<size_t>(num_logits) * sizeof(kernels::TokenLogprobs),
                             cudaMemcpyDeviceToHost, stream_);
  }
  if (queued == cudaSuccess) queued = cudaEventRecord(slot.done, stream_);
  if (queued != cudaSuccess) {
    // The step itself is queued: let it end, and let no later step be fed from it.
    cudaStreamSynchronize(stream_);
    prev_num_logits_ = 0;
    return internal::cuda_error("queueing a step's tokens", queued, options_.device);
  }
  if (profiling_) {
    // Per-step phase times: no overlap while profiling. A step that fails here is not outstanding.
    const cudaError_t ran = cudaEventSynchronize(slot.done);
    if (ran != cudaSuccess) {
      cudaStreamSynchronize(stream_);
      prev_num_logits_ = 0;
      return internal::cuda_error("running the step", ran, options_.device);
    }
    collect_marks();
  }
  slot.num_logits = sampled;
  prev_num_logits_ = num_logits;
  if (index < whole_slots_) whole_slot_ = index;
  outstanding_.push_back(index);
  return Status::ok();
}

Status CudaBackend::collect(int32_t* tokens, TokenLogprobs* logprobs) {
  if (outstanding_.empty()) return internal_error("no step to collect");
  const Slot& slot = slots_[outstanding_.front()];
  HR_CUDA("running the step", cudaEventSynchronize(slot.done));
  outstanding_.pop_front();
  std::memcpy(tokens, slot.host_tokens, static_cast<size_t>(slot.num_logits) * 4);
  for (size_t i = 0; logprobs && i < slot.asked.size(); ++i) {
    if (slot.asked[i] < 0) continue;
    const kernels::TokenLogprobs& from = slot.host_logprobs[i];
    TokenLogprobs& to = logprobs[i];
    to.logprob = from.logprob;
    to.num_top = std::clamp(from.num_top, 0, kMaxTopLogprobs);
    std::copy(from.top_ids, from.top_ids + to.num_top, to.top_ids);
    std::copy(from.top_logprobs, from.top_logprobs + to.num_top, to.top_logprobs);
  }
  return Status::ok();
}

void CudaBackend::discard() {
  if (stream_) cudaStreamSynchronize(stream_);
  outstanding_.clear();
  forwarded_.pending = false;
  prev_num_logits_ = 0;
  part_prev_logits_ = 0;
}

Status CudaBackend::check_cuda(const char* op, cudaError_t e) const {
  return e == cudaSuccess ? Status::ok() : internal::cuda_error(op, e, options_.device);
}

}  // namespace hr::engine
