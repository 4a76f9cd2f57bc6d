// CUDA backend construction: options, device memory for weights, activations and the KV cache,
// and the weights themselves (from host fp32 weights, straight from safetensors files, or random
// on the device).
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "engine/cuda_backend.h"

#include "engine/internal/cuda_status.h"
#include "engine/memory_plan.h"
#include "engine/safetensors.h"
#include "engine/weight_shard.h"
#include "kernels/fill.cuh"
#include "kernels/launch.cuh"
#include "kernels/paged_attention.cuh"
#include "kernels/sampling.cuh"

namespace hr::engine {

static_assert(sizeof(kernels::TokenLogprobs) == kTokenLogprobsBytes,
              "engine/memory_plan.h plans the log-probability buffers with this size");

ModelConfig CudaBackend::stage_config(const ModelConfig& c, const WeightShard& s) {
  if (s.pp == 1) return c;
  ModelConfig r = c;
  r.num_layers = s.num_layers;
  if (c.is_moe()) {
    const auto first = c.moe.sparse_layers.begin() + s.first_layer;
    r.moe.sparse_layers.assign(first, first + s.num_layers);
  }
  r.tie_word_embeddings = false;  // the last stage holds the head apart
  return r;
}

Status CudaBackend::check_options() const {
  const ModelConfig& c = config_;
  if (options_.block_size < 1) return invalid_argument("block size must be positive", "block-size");
  if (options_.max_num_tokens < 1 || options_.max_num_tokens > 65535) {
    return invalid_argument("max tokens per step must be 1 to 65535", "max-batched-tokens");
  }
  if (options_.max_num_seqs < 1)
    return invalid_argument("max sequences per step must be positive", "max-num-seqs");
  if (options_.kv_cache_fraction <= 0 || options_.kv_cache_fraction > 0.98) {
    return invalid_argument("KV cache fraction must be in (0, 0.98]", "kv-cache-fraction");
  }
  if (options_.prefetch_weights_mb < 0 || options_.prefetch_weights_mb > 1024) {
    return invalid_argument("weights prefetched ahead must be 0 to 1024 MiB", "cuda-options");
  }
  if (options_.micro_batches < 0 || options_.micro_batches > 64 || options_.max_step_parts < 1 ||
      options_.max_step_parts > 64) {
    return invalid_argument("micro-batches must be 0 (one per stage) to 64", "micro-batches");
  }
  if (options_.step_groups < 0 || options_.step_groups > 64)
    return invalid_argument("step groups must be 0 (one per stage) to 64", "step-groups");
  if (options_.micro_batch_tokens < 1)
    return invalid_argument("micro-batches take at least one token each", "micro-batches");
  if (c.head_dim != 32 && c.head_dim != 64 && c.head_dim != 128) {
    return invalid_argument(
        "the CUDA backend supports head_dim 32, 64 or 128, not " + std::to_string(c.head_dim),
        "head_dim");
  }
  if (c.num_heads / c.num_kv_heads > kernels::kAttentionPrefillRows) {
    return invalid_argument("GQA groups above 128 query heads per KV head are not supported",
                            "num_attention_heads");
  }
  if (c.is_moe()) {
    const MoeConfig& m = c.moe;
    if (m.num_experts > kernels::kMoeMaxExperts || m.top_k > kernels::kMoeMaxTopK) {
      return invalid_argument("the CUDA backend routes among at most " +
                                  std::to_string(kernels::kMoeMaxExperts) + " experts, top " +
                                  std::to_string(kernels::kMoeMaxTopK),
                              "num_experts_per_tok");
    }
    if (m.expert_intermediate_size % 8 != 0) {
      return invalid_argument("the experts' intermediate size must be a multiple of 8",
                              "moe_intermediate_size");
    }
  }
  if (c.hidden_size % 8 != 0 || c.intermediate_size % 8 != 0) {
    return invalid_argument("hidden_size and intermediate_size must be multiples of 8",
                            "hidden_size");
  }
  return Status::ok();
}

Status CudaBackend::open_device() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || options_.device >= count) {
    cudaGetLastError();
    return unavailable("no CUDA device " + std::to_string(options_.device) + " here (" +
                       std::to_string(count) + " visible); use --device cpu or another index");
  }
  HR_CUDA("selecting the device", cudaSetDevice(options_.device));
  if (options_.stream) {
    stream_ = options_.stream;
    owns_stream_ = false;
    return Status::ok();
  }
  HR_CUDA("creating a stream", cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  return Status::ok();
}

Status CudaBackend::alloc(void** p, size_t bytes, const char* what) {
  cudaError_t err = cudaMalloc(p, std::max<size_t>(bytes, 16));
  if (err != cudaSuccess) {
    return internal::cuda_error(
        std::string("allocating ") + what + " (" + std::to_string(bytes) + " bytes)", err,
        options_.device);
  }
  allocations_.push_back(*p);
  return Status::ok();
}

Status CudaBackend::allocate_weights() {
  const ModelConfig& c = config_;
  const size_t D = c.hidden_size, F = c.intermediate_size, V = c.vocab_size;
  const size_t QKV = c.q_size() + 2 * c.kv_size();
  auto bf16 = [&](__nv_bfloat16** p, size_t n, const char* what) {
    weight_bytes_ += n * 2;
    return alloc(reinterpret_cast<void**>(p), n * 2, what);
  };
  auto f32 = [&](float** p, size_t n, const char* what) {
    weight_bytes_ += n * 4;
    return alloc(reinterpret_cast<void**>(p), n * 4, what);
  };
  // (A pipeline stage: the embedding on the first, the final norm and the LM head on the last.)
  if (shard_.first_stage()) HR_RETURN_IF_ERROR(bf16(&embed_, V * D, "embed_tokens"));
  if (!shard_.last_stage()) {
    // no head
  } else if (c.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    HR_RETURN_IF_ERROR(bf16(&lm_head_, static_cast<size_t>(head_rows()) * D, "lm_head"));
    // A rank's padding rows (the last rank's share may hold fewer): zero logits, never gathered.
    HR_CUDA("zeroing the LM head",
            cudaMemset(lm_head_, 0, static_cast<size_t>(head_rows()) * D * 2));
  }
  if (shard_.last_stage()) HR_RETURN_IF_ERROR(f32(&final_norm_, D, "norm"));
  layers_.resize(static_cast<size_t>(c.num_layers));
  // (A rank of expert parallelism holds its share of the experts; the router scores them all.)
  const size_t E = shard_.tp > 1 ? shard_.num_experts : c.moe.num_experts;
  const size_t FE = c.moe.expert_intermediate_size;
  for (int li = 0; li < c.num_layers; ++li) {
    Layer& L = layers_[static_cast<size_t>(li)];
    HR_RETURN_IF_ERROR(bf16(&L.wqkv, QKV * D, "qkv_proj"));
    if (c.qkv_bias) HR_RETURN_IF_ERROR(f32(&L.bqkv, QKV, "qkv bias"));
    HR_RETURN_IF_ERROR(bf16(&L.wo, D * c.q_size(), "o_proj"));
    if (c.is_moe_layer(li)) {
      HR_RETURN_IF_ERROR(f32(&L.router, c.moe.num_experts * D, "router"));
      HR_RETURN_IF_ERROR(bf16(&L.experts_gate_up, E * 2 * FE * D, "experts' gate_up_proj"));
      HR_RETURN_IF_ERROR(bf16(&L.experts_down, E * D * FE, "experts' down_proj"));
    } else {
      HR_RETURN_IF_ERROR(bf16(&L.w_gate_up, 2 * F * D, "gate_up_proj"));
      HR_RETURN_IF_ERROR(bf16(&L.w_down, D * F, "down_proj"));
    }
    if (c.qk_norm) {
      HR_RETURN_IF_ERROR(f32(&L.q_norm, c.head_dim, "q_norm"));
      HR_RETURN_IF_ERROR(f32(&L.k_norm, c.head_dim, "k_norm"));
    }
    HR_RETURN_IF_ERROR(f32(&L.input_norm, D, "input_layernorm"));
    HR_RETURN_IF_ERROR(f32(&L.post_norm, D, "post_attention_layernorm"));
  }
  return Status::ok();
}

Status CudaBackend::upload(void* dst, const std::vector<float>& src, bool bf16) {
  if (!bf16) {
    HR_CUDA("uploading weights",
            cudaMemcpy(dst, src.data(), src.size() * 4, cudaMemcpyHostToDevice));
    return Status::ok();
  }
  std::vector<uint16_t> tmp(src.size());
  for (size_t i = 0; i < src.size(); ++i) tmp[i] = f32_to_bf16(src[i]);
  HR_CUDA("uploading weights", cudaMemcpy(dst, tmp.data(), tmp.size() * 2, cudaMemcpyHostToDevice));
  return Status::ok();
}

Status CudaBackend::fill_random(uint64_t seed) {
  const ModelConfig& c = config_;
  const size_t D = c.hidden_size, F = c.intermediate_size, V = c.vocab_size;
  const size_t QKV = c.q_size() + 2 * c.kv_size();
  // Uniform with the standard deviation of a 1/sqrt(fan_in) initialisation.
  auto fill = [&](__nv_bfloat16* p, size_t n, size_t fan_in) {
    float scale = std::sqrt(3.0f / static_cast<float>(fan_in));
    return kernels::fill_uniform_bf16(p, n, scale, seed++, stream_);
  };
  HR_CUDA("random weights", fill(embed_, V * D, D));
  if (lm_head_ != embed_) HR_CUDA("random weights", fill(lm_head_, V * D, D));
  HR_CUDA("random weights", kernels::fill_f32(final_norm_, D, 1.0f, stream_));
  const size_t E = c.moe.num_experts, FE = c.moe.expert_intermediate_size;
  for (Layer& L : layers_) {
    HR_CUDA("random weights", fill(L.wqkv, QKV * D, D));
    if (L.bqkv) HR_CUDA("random weights", kernels::fill_f32(L.bqkv, QKV, 0.0f, stream_));
    HR_CUDA("random weights", fill(L.wo, D * c.q_size(), c.q_size()));
    if (L.router) {
      // Router logits of standard deviation ~1 (unit-RMS inputs): tokens spread over the experts.
      HR_CUDA("random weights",
              kernels::fill_uniform_f32(L.router, E * D, std::sqrt(3.0f / static_cast<float>(D)),
                                        seed++, stream_));
      HR_CUDA("random weights", fill(L.experts_gate_up, E * 2 * FE * D, D));
      HR_CUDA("random weights", fill(L.experts_down, E * D * FE, FE));
    } else {
      HR_CUDA("random weights", fill(L.w_gate_up, 2 * F * D, D));
      HR_CUDA("random weights", fill(L.w_down, D * F, F));
    }
    if (L.q_norm) {
      HR_CUDA("random weights", kernels::fill_f32(L.q_norm, c.head_dim, 1.0f, stream_));
      HR_CUDA("random weights", kernels::fill_f32(L.k_norm, c.head_dim, 1.0f, stream_));
    }
    HR_CUDA("random weights", kernels::fill_f32(L.input_norm, D, 1.0f, stream_));
    HR_CUDA("random weights", kernels::fill_f32(L.post_norm, D, 1.0f, stream_));
  }
  HR_CUDA("random weights", cudaStreamSynchronize(stream_));
  return Status::ok();
}

Status CudaBackend::init_runtime() {
  const ModelConfig& c = config_;
  const size_t T = options_.max_num_tokens, S = options_.max_num_seqs;
  const size_t D = c.hidden_size, F = c.intermediate_size, V = c.vocab_size;
  const size_t Q = c.q_size(), KV = c.kv_size(), QKV = Q + 2 * KV;
  HR_CUDA("reading device attributes",
          cudaDeviceGetAttribute(&num_sms_, cudaDevAttrMultiProcessorCount, options_.device));
  int smem_optin = 0;
  HR_CUDA("reading device attributes",
          cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                 options_.device));
  kernels::programmatic_launch_supported();  // asked now, outside any graph capture
  warpgroup_gemm_ = kernels::moe_warpgroup_gemm_runs();
  HR_CUDA("reading the GEMV kernels' occupancy", kernels::gemv_prepare());
  fused_shapes_ = D % 8 == 0 && Q % 8 == 0 && F % 8 == 0;
  const size_t smem_needed = kernels::paged_attention_smem_bytes(c.head_dim);
  if (static_cast<size_t>(smem_optin) < smem_needed) {
    return unavailable(
        "CUDA device " + std::to_string(options_.device) + " allows " +
        std::to_string(smem_optin / 1024) +
        " KiB of shared memory per block; attention at head_dim " + std::to_string(c.head_dim) +
        " needs " + std::to_string(smem_needed / 1024) +
        " KiB (an A100, H100 or H200 has enough); use --device cpu or another device");
  }
  HR_ASSIGN_OR_RETURN(gemm_, CublasLtGemm::create(32ull << 20));
  std::vector<float> inv_freq = c.rope_inv_freq();
  // The step's buffers, counted (engine/memory_plan.h plans the same bytes).
  auto act = [&](auto** p, size_t bytes, const char* what) {
    buffer_bytes_ += bytes;
    return alloc(reinterpret_cast<void**>(p), bytes, what);
  };
  HR_RETURN_IF_ERROR(act(&inv_freq_, inv_freq.size() * 4, "rope"));
  HR_RETURN_IF_ERROR(upload(inv_freq_, inv_freq, false));
  HR_RETURN_IF_ERROR(act(&x_, T * D * 4, "activations"));
  // Zero, so that rows no stage before wrote (a later pipeline stage's warm-up) are finite.
  HR_CUDA("zeroing the residual stream", cudaMemsetAsync(x_, 0, T * D * 4, stream_));
  HR_RETURN_IF_ERROR(act(&delta_, T * D * 4, "activations"));
  HR_RETURN_IF_ERROR(act(&h_, T * D * 2, "activations"));
  HR_RETURN_IF_ERROR(act(&qkv_, T * QKV * 4, "activations"));
  HR_RETURN_IF_ERROR(act(&q_, T * Q * 2, "activations"));
  HR_RETURN_IF_ERROR(act(&attn_, T * Q * 2, "activations"));
  HR_RETURN_IF_ERROR(act(&gate_up_, T * 2 * F * 2, "activations"));
  HR_RETURN_IF_ERROR(act(&act_, T * F * 2, "activations"));
  // The head's rows, logits and the sampler's log probabilities: the last pipeline stage's.
  if (shard_.last_stage()) {
    HR_RETURN_IF_ERROR(act(&final_, S * D * 2, "activations"));
    HR_RETURN_IF_ERROR(act(&logits_, S * V * 4, "logits"));
    if (shard_.tp > 1) {
      const size_t share = static_cast<size_t>(head_rows());
      HR_RETURN_IF_ERROR(act(&head_logits_, S * share * 4, "logits"));
      HR_RETURN_IF_ERROR(act(&gathered_logits_, shard_.tp * S * share * 4, "logits"));
    }
    HR_RETURN_IF_ERROR(act(&logprobs_, S * sizeof(kernels::TokenLogprobs), "log probabilities"));
  }
  HR_RETURN_IF_ERROR(act(&tokens_, S * 4, "tokens"));
  HR_RETURN_IF_ERROR(act(&input_ids_, T * 4, "tokens"));
  HR_RETURN_IF_ERROR(
      act(&x2_, static_cast<size_t>(kernels::kGemvMaxFusedRows) * D * 4, "activations"));
  if (c.is_moe()) {
    // A step's (token, choice) pairs, their sorted layout, and the experts' activations and
    // weighted outputs.
    const size_t E = c.moe.num_experts, pairs = T * c.moe.top_k;
    const size_t capacity = kernels::moe_capacity(static_cast<int>(pairs), static_cast<int>(E));
    HR_RETURN_IF_ERROR(act(&moe_.logits, T * E * 4, "MoE routing"));
    HR_RETURN_IF_ERROR(act(&moe_.topk_ids, pairs * 4, "MoE routing"));
    HR_RETURN_IF_ERROR(act(&moe_.topk_weights, pairs * 4, "MoE routing"));
    HR_RETURN_IF_ERROR(act(&moe_.layout.counts, E * 4, "MoE routing"));
    HR_RETURN_IF_ERROR(act(&moe_.layout.offsets, (E + 1) * 4, "MoE routing"));
    HR_RETURN_IF_ERROR(act(&moe_.layout.sorted_pairs, capacity * 4, "MoE routing"));
    HR_RETURN_IF_ERROR(
        act(&moe_.layout.tile_experts, capacity / kernels::kMoeTile * 4, "MoE routing"));
    HR_RETURN_IF_ERROR(act(&moe_.layout.active_experts, E * 4, "MoE routing"));
    HR_RETURN_IF_ERROR(act(&moe_.layout.pair_rows, pairs * 4, "MoE routing"));
    HR_RETURN_IF_ERROR(act(&moe_.route_counter, 4, "MoE routing"));
    HR_CUDA("zeroing the routing counter", cudaMemsetAsync(moe_.route_counter, 0, 4, stream_));
    HR_RETURN_IF_ERROR(
        act(&moe_.act, capacity * c.moe.expert_intermediate_size * 2, "MoE activations"));
    HR_RETURN_IF_ERROR(act(&moe_.out, pairs * D * 4, "MoE outputs"));
  }
  // The fused steps' norm sums and, after them, the q/k/v GEMV's head counters: zeroed together
  // at the start of every fused step (the counters are left at zero by their kernels as well).
  const size_t sums = static_cast<size_t>(2 * c.num_layers) * kernels::kGemvMaxFusedRows;
  sumsq_bytes_ = (sums + static_cast<size_t>(c.num_heads + c.num_kv_heads)) * 4;
  HR_RETURN_IF_ERROR(act(&sumsq_, sumsq_bytes_, "norm sums"));
  head_counters_ = reinterpret_cast<int32_t*>(sumsq_ + sums);
  HR_CUDA("zeroing the norm sums", cudaMemsetAsync(sumsq_, 0, sumsq_bytes_, stream_));
  max_partials_ = std::max(8 * num_sms_, 64);
  HR_RETURN_IF_ERROR(act(&partial_out_,
                         static_cast<size_t>(max_partials_) * c.num_heads * c.head_dim * 4,
                         "attention partials"));
  HR_RETURN_IF_ERROR(act(&partial_ml_, static_cast<size_t>(max_partials_) * c.num_heads * 2 * 4,
                         "attention partials"));
  // Merge counters (fused_combine): one per (combine item, KV head); an item has two splits or
  // more.
  const size_t counter_bytes = static_cast<size_t>(max_partials_ / 2) * c.num_kv_heads * 4;
  HR_RETURN_IF_ERROR(act(&combine_counters_, counter_bytes, "attention merge counters"));
  HR_CUDA("zeroing merge counters", cudaMemsetAsync(combine_counters_, 0, counter_bytes, stream_));
  // A step's parts (submit_part): on the last stage, each part slot's sampled tokens and the
  // step's placed together.
  if (slots_.size() > static_cast<size_t>(whole_slots_) && shard_.last_stage()) {
    for (size_t i = static_cast<size_t>(whole_slots_); i < slots_.size(); ++i)
      HR_RETURN_IF_ERROR(act(&slots_[i].tokens, S * 4, "tokens"));
    HR_RETURN_IF_ERROR(act(&part_tokens_, S * 4, "tokens"));
  }
  for (Slot& slot : slots_) {
    HR_CUDA("pinned host buffer",
            cudaHostAlloc(reinterpret_cast<void**>(&slot.host_tokens), S * 4, 0));
    HR_CUDA("pinned host buffer", cudaHostAlloc(reinterpret_cast<void**>(&slot.host_logprobs),
                                                S * sizeof(kernels::TokenLogprobs), 0));
    HR_CUDA("creating an event", cudaEventCreateWithFlags(&slot.done, cudaEventDisableTiming));
  }

  // The KV cache takes the rest (or the budget given).
  size_t free_bytes = 0, total_bytes = 0;
  HR_CUDA("reading free memory", cudaMemGetInfo(&free_bytes, &total_bytes));
  free_before_kv_ = free_bytes;
  const size_t per_block = 2ull * c.num_layers * options_.block_size * KV * 2;
  size_t budget =
      options_.kv_cache_bytes > 0
          ? options_.kv_cache_bytes
          : static_cast<size_t>(static_cast<double>(free_bytes) * options_.kv_cache_fraction);
  if (budget > free_bytes) {
    return invalid_argument("KV cache budget of " + std::to_string(budget) + " bytes exceeds the " +
                                std::to_string(free_bytes) + " bytes free on the device",
                            "kv-cache-bytes");
  }
  // One block of the budget is the scratch block that padded decode rows write to.
  num_blocks_ = static_cast<int>(std::min<size_t>(budget / per_block, 1u << 30)) - 1;
  if (num_blocks_ < 1) {
    return invalid_argument("KV cache budget of " + std::to_string(budget) +
                                " bytes holds fewer than two blocks "
                                "(one takes " +
                                std::to_string(per_block) + ")",
                            "kv-cache-bytes");
  }
  const size_t layer_bytes = static_cast<size_t>(num_blocks_ + 1) * options_.block_size * KV * 2;
  k_cache_.resize(static_cast<size_t>(c.num_layers));
  v_cache_.resize(static_cast<size_t>(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    HR_RETURN_IF_ERROR(alloc(reinterpret_cast<void**>(&k_cache_[static_cast<size_t>(l)]),
                             layer_bytes, "KV cache"));
    HR_RETURN_IF_ERROR(alloc(reinterpret_cast<void**>(&v_cache_[static_cast<size_t>(l)]),
                             layer_bytes, "KV cache"));
  }
  HR_CUDA("reading free memory", cudaMemGetInfo(&free_after_init_, &total_bytes));
  // The uploads went through cudaMemcpy on the legacy stream, which the backend's non-blocking
  // stream does not wait for, and a copy from pageable memory may return before its DMA lands.
  HR_CUDA("finishing the uploads", cudaDeviceSynchronize());
  return Status::ok();
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(const ModelWeights& w,
                                                         CudaBackendOptions options) {
  if (w.cpu_packed) {
    return invalid_argument(
        "weights packed for the CPU backend cannot go to the GPU; load them again", "weights");
  }
  const WeightShard shard = w.shard();
  if ((shard.tp > 1) != (options.tensor_parallel != nullptr) ||
      (options.tensor_parallel && (options.tensor_parallel->size() != shard.tp ||
                                   options.tensor_parallel->rank() != shard.tp_rank))) {
    return invalid_argument("a tensor-parallel shard needs its rank of a communicator of " +
                                std::to_string(shard.tp) + " ranks, and only a shard takes one",
                            "tensor-parallel");
  }
  const ModelConfig config = stage_config(rank_config(w.config, shard), shard);
  std::unique_ptr<CudaBackend> b(new CudaBackend(config, options));
  b->shard_ = shard;
  HR_RETURN_IF_ERROR(b->check_options());
  HR_RETURN_IF_ERROR(b->open_device());
  HR_RETURN_IF_ERROR(b->allocate_weights());
  for (const WeightPiece& piece : weight_pieces(config)) {
    const std::vector<float>* src = &w.slot(piece.slot, piece.layer);
    if (piece.offset != 0) continue;  // the fused vector goes up whole with its first piece
    void* dst = b->slot_data(piece.slot, piece.layer);
    if (dst == nullptr) continue;  // another pipeline stage's (the embedding, the head)
    HR_RETURN_IF_ERROR(b->upload(dst, *src, !is_vector_slot(piece.slot)));
  }
  HR_RETURN_IF_ERROR(b->init_runtime());
  return b;
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create_from_dir(const std::string& dir,
                                                                  CudaBackendOptions options) {
  HR_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  HR_ASSIGN_OR_RETURN(auto st, SafetensorsModel::open_dir(dir));
  std::unique_ptr<CudaBackend> b(new CudaBackend(config, options));
  HR_RETURN_IF_ERROR(b->check_options());
  HR_RETURN_IF_ERROR(b->open_device());
  HR_RETURN_IF_ERROR(b->allocate_weights());
  std::vector<uint16_t> h16;
  std::vector<float> h32;
  for (const WeightPiece& piece :
       weight_pieces(config, [&](const std::string& name) { return st->find(name) != nullptr; })) {
    size_t n = 1;
    for (int64_t d : piece.shape) n *= static_cast<size_t>(d);
    char* dst = static_cast<char*>(b->slot_data(piece.slot, piece.layer));
    if (is_vector_slot(piece.slot)) {
      h32.resize(n);
      HR_RETURN_IF_ERROR(st->read_f32(piece.name, piece.shape, h32.data()));
      HR_CUDA_OF(b, "uploading " + piece.name,
                 cudaMemcpy(dst + piece.offset * 4, h32.data(), n * 4, cudaMemcpyHostToDevice));
    } else {
      h16.resize(n);
      HR_RETURN_IF_ERROR(st->read_bf16(piece.name, piece.shape, h16.data()));
      HR_CUDA_OF(b, "uploading " + piece.name,
                 cudaMemcpy(dst + piece.offset * 2, h16.data(), n * 2, cudaMemcpyHostToDevice));
    }
  }
  HR_RETURN_IF_ERROR(b->init_runtime());
  return b;
}

void* CudaBackend::slot_data(WeightSlot slot, int layer) const {
  const Layer* l = layer >= 0 ? &layers_[static_cast<size_t>(layer)] : nullptr;
  switch (slot) {
    case WeightSlot::kEmbed:
      return embed_;
    case WeightSlot::kLmHead:
      return lm_head_;
    case WeightSlot::kFinalNorm:
      return final_norm_;
    case WeightSlot::kInputNorm:
      return l->input_norm;
    case WeightSlot::kPostNorm:
      return l->post_norm;
    case WeightSlot::kQkv:
      return l->wqkv;
    case WeightSlot::kQkvBias:
      return l->bqkv;
    case WeightSlot::kO:
      return l->wo;
    case WeightSlot::kGateUp:
      return l->w_gate_up;
    case WeightSlot::kDown:
      return l->w_down;
    case WeightSlot::kQNorm:
      return l->q_norm;
    case WeightSlot::kKNorm:
      return l->k_norm;
    case WeightSlot::kRouter:
      return l->router;
    case WeightSlot::kExpertGateUp:
      return l->experts_gate_up;
    case WeightSlot::kExpertDown:
      return l->experts_down;
  }
  return nullptr;
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create_random(const ModelConfig& config,
                                                                uint64_t seed,
                                                                CudaBackendOptions options) {
  std::unique_ptr<CudaBackend> b(new CudaBackend(config, options));
  HR_RETURN_IF_ERROR(b->check_options());
  HR_RETURN_IF_ERROR(b->open_device());
  HR_RETURN_IF_ERROR(b->allocate_weights());
  HR_RETURN_IF_ERROR(b->fill_random(seed));
  HR_RETURN_IF_ERROR(b->init_runtime());
  return b;
}

}  // namespace hr::engine
