// Staging a step's inputs: packing token ids, positions, slots, block tables, attention work items
// and sampling parameters into one pinned host buffer per slot, copied to the device in one go;
// the buffers grow as steps need.
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

Status CudaBackend::check_bounds(const StepInput& in, int real_seqs) const {
  const int T = in.num_tokens, S = in.num_seqs, L = in.num_logits;
  if (T <= 0) return invalid_argument("empty step");
  if (T > options_.max_num_tokens) {
    return invalid_argument("step of " + std::to_string(T) + " tokens exceeds the backend's " +
                                std::to_string(options_.max_num_tokens),
                            "max-batched-tokens");
  }
  if (S > options_.max_num_seqs || L > options_.max_num_seqs) {
    return invalid_argument("step of " + std::to_string(S) + " sequences exceeds the backend's " +
                                std::to_string(options_.max_num_seqs),
                            "max-num-seqs");
  }
  return check_step(
      in, {config_.vocab_size, options_.block_size, num_blocks_, prev_num_logits_, real_seqs});
}

Status CudaBackend::prepare(const StepInput& in, const SampleSpec* specs, bool graph_shape,
                            int slot_index, int real_seqs, StepLayout* out) {
  const ModelConfig& c = config_;
  const int T = in.num_tokens, S = in.num_seqs, L = in.num_logits;
  const int bs = options_.block_size, nkv = c.num_kv_heads;
  HR_RETURN_IF_ERROR(check_bounds(in, real_seqs));
  HR_CUDA("selecting the device", cudaSetDevice(options_.device));
  HR_RETURN_IF_ERROR(plan_attention(
      in, {c.num_heads, nkv, num_sms_, max_partials_, graph_shape, options_.decode_attention},
      &plan_));
  const auto& decode = plan_.decode;
  const auto& prefill = plan_.prefill;
  const auto& combine = plan_.combine;

  // Pack the step's inputs into the pinned buffer; one copy to the device.
  StepLayout& lay = *out;
  lay = StepLayout{};
  lay.num_tokens = T;
  lay.num_logits = L;
  lay.table_cols = in.max_blocks_per_seq;
  lay.max_blocks_per_seq =
      graph_shape ? graph_table_width(in.max_blocks_per_seq) : in.max_blocks_per_seq;
  lay.num_decode = static_cast<int>(decode.size());
  lay.decode_kernel = plan_.decode_kernel;
  lay.num_prefill = static_cast<int>(prefill.size());
  lay.num_combine = static_cast<int>(combine.size());
  lay.fused = fused_shapes_ && shard_.whole() && options_.small_batch_gemv &&
              options_.fused_small_batch && T <= kGemvRows && T <= kernels::kGemvMaxFusedRows &&
              uniform_decode(in);
  size_t off = 0;
  auto place = [&](size_t bytes) {
    size_t at = off;
    off += align16(bytes);
    return at;
  };
  lay.token_ids = place(T * 4);
  lay.fed_rows = place(T * 4);
  lay.positions = place(T * 4);
  lay.slots = place(T * 4);
  lay.logits_rows = place(static_cast<size_t>(L) * 4);
  lay.decode_items = place(decode.size() * sizeof(kernels::AttentionWorkItem));
  lay.prefill_items = place(prefill.size() * sizeof(kernels::AttentionWorkItem));
  lay.combine_items = place(combine.size() * sizeof(kernels::AttentionCombineItem));
  lay.sample_params = place(static_cast<size_t>(L) * sizeof(kernels::SampleParams));
  lay.block_table =
      place(static_cast<size_t>(S) * lay.max_blocks_per_seq * 4);  // last: see the copy below
  lay.total = off;
  Slot& slot = slots_[slot_index];
  if (lay.total > slot.bytes)
    HR_RETURN_IF_ERROR(grow_slot(slot, std::max<size_t>(lay.total * 2, 1 << 20)));
  char* h = slot.host;
  std::memcpy(h + lay.token_ids, in.token_ids, T * 4);
  if (in.fed_rows) {
    std::memcpy(h + lay.fed_rows, in.fed_rows, T * 4);
  } else {
    std::fill_n(reinterpret_cast<int32_t*>(h + lay.fed_rows), T, -1);
  }
  std::memcpy(h + lay.positions, in.positions, T * 4);
  int32_t* slots = reinterpret_cast<int32_t*>(h + lay.slots);
  for (int s = 0; s < S; ++s) {
    const int32_t* row = in.block_table + static_cast<size_t>(s) * in.max_blocks_per_seq;
    for (int t = in.seq_start[s]; t < in.seq_start[s + 1]; ++t) {
      slots[t] = row[in.positions[t] / bs] * bs + in.positions[t] % bs;
    }
  }
  std::memcpy(h + lay.logits_rows, in.logits_rows, static_cast<size_t>(L) * 4);
  std::memcpy(h + lay.block_table, in.block_table,
              static_cast<size_t>(S) * in.max_blocks_per_seq * 4);
  std::memcpy(h + lay.decode_items, decode.data(), decode.size() * sizeof decode[0]);
  std::memcpy(h + lay.prefill_items, prefill.data(), prefill.size() * sizeof prefill[0]);
  std::memcpy(h + lay.combine_items, combine.data(),
              combine.size() * sizeof(kernels::AttentionCombineItem));
  if (specs) HR_RETURN_IF_ERROR(pack_sampling(specs, L, in.logits_rows, slot, lay));
  // One copy; or, when a graph's block tables are wider than the step's, everything before them
  // and then only the columns given, row by row into the graph's pitch.
  const size_t cols = static_cast<size_t>(lay.table_cols) * 4,
               pitch = static_cast<size_t>(lay.max_blocks_per_seq) * 4;
  const size_t bytes = cols == pitch || S == 0 ? lay.total : lay.block_table;
  HR_CUDA("copying step inputs",
          cudaMemcpyAsync(slot.dev, slot.host, bytes, cudaMemcpyHostToDevice, stream_));
  if (bytes != lay.total) {
    HR_CUDA("copying block tables",
            cudaMemcpy2DAsync(slot.dev + lay.block_table, pitch, h + lay.block_table, cols, cols, S,
                              cudaMemcpyHostToDevice, stream_));
  }
  return Status::ok();
}

Status CudaBackend::pack_sampling(const SampleSpec* specs, int L, const int32_t* logits_rows,
                                  Slot& slot, const StepLayout& lay) {
  static_assert(sizeof(kernels::PenaltyToken) == 8 && sizeof(kernels::LogitBias) == 8);
  size_t list_bytes = 0;
  const size_t mask_bytes = static_cast<size_t>((vocab_size() + 31) / 32) * 4;
  for (int i = 0; i < L; ++i) {
    if (specs[i].penalties.any())
      list_bytes += 8 * static_cast<size_t>(std::max(0, specs[i].num_penalty_tokens));
    list_bytes += 8 * static_cast<size_t>(std::max(0, specs[i].num_logit_bias));
    if (specs[i].allowed) list_bytes += mask_bytes;
  }
  if (list_bytes > slot.list_bytes)
    HR_RETURN_IF_ERROR(grow_lists(slot, std::max<size_t>(list_bytes * 2, 1 << 17)));
  auto* sp = reinterpret_cast<kernels::SampleParams*>(slot.host + lay.sample_params);
  size_t listed = 0;  // bytes of slot.list_host filled
  for (int i = 0; i < L; ++i) {
    const SampleSpec& spec = specs[i];
    sp[i] = kernels::SampleParams{};
    sp[i].temperature = spec.temperature;
    sp[i].top_p = spec.top_p;
    sp[i].top_k = spec.top_k;
    sp[i].random = spec.random;
    sp[i].logprobs = std::min(spec.logprobs, kernels::kMaxTopLogprobs);
    if (spec.num_logit_bias > 0) {
      const int n = spec.num_logit_bias;
      auto* list = reinterpret_cast<kernels::LogitBias*>(slot.list_host + listed);
      for (int k = 0; k < n; ++k) list[k] = {spec.logit_bias[k].token, spec.logit_bias[k].bias};
      sp[i].num_logit_bias = n;
      sp[i].logit_bias = reinterpret_cast<const kernels::LogitBias*>(slot.list_dev + listed);
      listed += 8 * static_cast<size_t>(n);
    }
    if (spec.allowed) {
      std::memcpy(slot.list_host + listed, spec.allowed, mask_bytes);
      sp[i].allowed = reinterpret_cast<const uint32_t*>(slot.list_dev + listed);
      listed += mask_bytes;
    }
    if (!spec.penalties.any()) continue;
    sp[i].frequency_penalty = spec.penalties.frequency;
    sp[i].presence_penalty = spec.penalties.presence;
    sp[i].repetition_penalty = spec.penalties.repetition;
    sp[i].input_row = spec.penalize_input ? logits_rows[i] : -1;
    const int n = std::max(0, spec.num_penalty_tokens);
    auto* list = reinterpret_cast<kernels::PenaltyToken*>(slot.list_host + listed);
    for (int k = 0; k < n; ++k)
      list[k] = {spec.penalty_tokens[k].token, spec.penalty_tokens[k].count};
    sp[i].num_penalty_tokens = n;
    sp[i].penalty_tokens = reinterpret_cast<const kernels::PenaltyToken*>(slot.list_dev + listed);
    listed += 8 * static_cast<size_t>(n);
  }
  if (listed > 0) {
    HR_CUDA("copying sampling lists", cudaMemcpyAsync(slot.list_dev, slot.list_host, listed,
                                                      cudaMemcpyHostToDevice, stream_));
  }
  return Status::ok();
}

Status CudaBackend::regrow(char** host, char** dev, size_t* size, size_t bytes, const char* what) {
  HR_CUDA("waiting for the stream", cudaStreamSynchronize(stream_));
  if (*host) cudaFreeHost(*host);
  if (*dev) {
    cudaFree(*dev);
    allocations_.erase(std::find(allocations_.begin(), allocations_.end(), *dev));
  }
  *host = nullptr;
  *dev = nullptr;
  *size = 0;  // until both allocations below succeed
  HR_CUDA("pinned host buffer", cudaHostAlloc(reinterpret_cast<void**>(host), bytes, 0));
  HR_RETURN_IF_ERROR(alloc(reinterpret_cast<void**>(dev), bytes, what));
  *size = bytes;
  return Status::ok();
}

Status CudaBackend::grow_lists(Slot& slot, size_t bytes) {
  return regrow(&slot.list_host, &slot.list_dev, &slot.list_bytes, bytes, "sampling lists");
}

Status CudaBackend::grow_slot(Slot& slot, size_t bytes) {
  Status grown = regrow(&slot.host, &slot.dev, &slot.bytes, bytes, "step inputs");
  clear_graphs();  // they captured the old buffer's address
  return grown;
}

}  // namespace hr::engine
