// CUDA forward pass over a flattened batch with a paged KV cache.
#include "engine/cuda_backend.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "engine/attention_plan.h"
#include "engine/safetensors.h"
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
namespace {

Status cuda_error(const char* op, cudaError_t err, int device) {
  return internal_error(std::string(op) + " failed on cuda:" + std::to_string(device) + ": " +
                        cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

uint16_t to_bf16_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;  // NaN
  u += 0x7fffu + ((u >> 16) & 1u);                       // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

size_t align16(size_t n) { return (n + 15) & ~size_t{15}; }

// Steps of up to this many tokens use the GEMV kernel: on an H100 it reads the 8B model's weight
// matrices at 0.56-1.0 of copy bandwidth for one or two rows against cuBLASLt's 0.45-0.92, ties at
// four and falls behind by eight (bench_gpu.sh's weight_read_fraction).
constexpr int kGemvRows = 2;

kernels::GemvParams gemv_params(const __nv_bfloat16* w, int m, int n, int k) {
  kernels::GemvParams p;
  p.w = w;
  p.m = m;
  p.n = n;
  p.k = k;
  return p;
}

}  // namespace

#define HR_CUDA_OF(backend, op, expr)                                        \
  do {                                                                       \
    cudaError_t hr_cuda_err_ = (expr);                                       \
    if (hr_cuda_err_ != cudaSuccess) {                                       \
      return cuda_error(std::string(op).c_str(), hr_cuda_err_, (backend)->options_.device); \
    }                                                                        \
  } while (0)

#define HR_CUDA(op, expr)                                                   \
  do {                                                                      \
    cudaError_t hr_cuda_err_ = (expr);                                      \
    if (hr_cuda_err_ != cudaSuccess) return cuda_error(op, hr_cuda_err_, options_.device); \
  } while (0)

// Byte offsets of one step's inputs inside the staging buffers (each 16-byte aligned).
struct CudaBackend::StepLayout {
  size_t token_ids = 0, positions = 0, slots = 0, logits_rows = 0, block_table = 0, decode_items = 0,
         prefill_items = 0, combine_items = 0, sample_params = 0, total = 0;
  int num_tokens = 0, num_logits = 0, max_blocks_per_seq = 0;
  int num_decode = 0, num_prefill = 0, num_combine = 0;
  bool fused = false;  // the small-batch path with norms and activation folded into GEMVs
};

CudaBackend::CudaBackend(const ModelConfig& config, CudaBackendOptions options)
    : config_(config), options_(options) {}

CudaBackend::~CudaBackend() {
  if (stream_) cudaStreamSynchronize(stream_);
  clear_graphs();
  for (cudaEvent_t e : mark_events_) cudaEventDestroy(e);
  gemm_.reset();
  for (void* p : allocations_) cudaFree(p);
  if (host_staging_) cudaFreeHost(host_staging_);
  if (host_tokens_) cudaFreeHost(host_tokens_);
  if (stream_) cudaStreamDestroy(stream_);
}

Status CudaBackend::check_options() const {
  const ModelConfig& c = config_;
  if (options_.block_size < 1) return invalid_argument("block size must be positive", "block-size");
  if (options_.max_num_tokens < 1 || options_.max_num_tokens > 65535) {
    return invalid_argument("max tokens per step must be 1 to 65535", "max-batched-tokens");
  }
  if (options_.max_num_seqs < 1) return invalid_argument("max sequences per step must be positive", "max-num-seqs");
  if (options_.kv_cache_fraction <= 0 || options_.kv_cache_fraction > 0.98) {
    return invalid_argument("KV cache fraction must be in (0, 0.98]", "kv-cache-fraction");
  }
  if (c.head_dim != 32 && c.head_dim != 64 && c.head_dim != 128) {
    return invalid_argument("the CUDA backend supports head_dim 32, 64 or 128, not " +
                            std::to_string(c.head_dim), "head_dim");
  }
  if (c.num_heads / c.num_kv_heads > kernels::kAttentionPrefillRows) {
    return invalid_argument("GQA groups above 64 query heads per KV head are not supported", "num_attention_heads");
  }
  if (c.hidden_size % 8 != 0 || c.intermediate_size % 8 != 0) {
    return invalid_argument("hidden_size and intermediate_size must be multiples of 8", "hidden_size");
  }
  return Status::ok();
}

Status CudaBackend::open_device() {
  HR_CUDA("selecting the device", cudaSetDevice(options_.device));
  HR_CUDA("creating a stream", cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  return Status::ok();
}

Status CudaBackend::alloc(void** p, size_t bytes, const char* what) {
  cudaError_t err = cudaMalloc(p, std::max<size_t>(bytes, 16));
  if (err != cudaSuccess) {
    return cuda_error((std::string("allocating ") + what + " (" + std::to_string(bytes) + " bytes)").c_str(),
                      err, options_.device);
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
  HR_RETURN_IF_ERROR(bf16(&embed_, V * D, "embed_tokens"));
  if (c.tie_word_embeddings) {
    lm_head_ = embed_;
  } else {
    HR_RETURN_IF_ERROR(bf16(&lm_head_, V * D, "lm_head"));
  }
  HR_RETURN_IF_ERROR(f32(&final_norm_, D, "norm"));
  layers_.resize(static_cast<size_t>(c.num_layers));
  for (Layer& L : layers_) {
    HR_RETURN_IF_ERROR(bf16(&L.wqkv, QKV * D, "qkv_proj"));
    if (c.qkv_bias) HR_RETURN_IF_ERROR(f32(&L.bqkv, QKV, "qkv bias"));
    HR_RETURN_IF_ERROR(bf16(&L.wo, D * c.q_size(), "o_proj"));
    HR_RETURN_IF_ERROR(bf16(&L.w_gate_up, 2 * F * D, "gate_up_proj"));
    HR_RETURN_IF_ERROR(bf16(&L.w_down, D * F, "down_proj"));
    HR_RETURN_IF_ERROR(f32(&L.input_norm, D, "input_layernorm"));
    HR_RETURN_IF_ERROR(f32(&L.post_norm, D, "post_attention_layernorm"));
  }
  return Status::ok();
}

Status CudaBackend::upload(void* dst, const std::vector<float>& src, bool bf16) {
  if (!bf16) {
    HR_CUDA("uploading weights", cudaMemcpy(dst, src.data(), src.size() * 4, cudaMemcpyHostToDevice));
    return Status::ok();
  }
  std::vector<uint16_t> tmp(src.size());
  for (size_t i = 0; i < src.size(); ++i) tmp[i] = to_bf16_bits(src[i]);
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
  for (Layer& L : layers_) {
    HR_CUDA("random weights", fill(L.wqkv, QKV * D, D));
    if (L.bqkv) HR_CUDA("random weights", kernels::fill_f32(L.bqkv, QKV, 0.0f, stream_));
    HR_CUDA("random weights", fill(L.wo, D * c.q_size(), c.q_size()));
    HR_CUDA("random weights", fill(L.w_gate_up, 2 * F * D, D));
    HR_CUDA("random weights", fill(L.w_down, D * F, F));
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
  HR_ASSIGN_OR_RETURN(gemm_, CublasLtGemm::create(32ull << 20));
  std::vector<float> inv_freq = c.rope_inv_freq();
  HR_RETURN_IF_ERROR(alloc(reinterpret_cast<void**>(&inv_freq_), inv_freq.size() * 4, "rope"));
  HR_RETURN_IF_ERROR(upload(inv_freq_, inv_freq, false));
  auto act = [&](auto** p, size_t bytes, const char* what) {
    return alloc(reinterpret_cast<void**>(p), bytes, what);
  };
  HR_RETURN_IF_ERROR(act(&x_, T * D * 4, "activations"));
  HR_RETURN_IF_ERROR(act(&delta_, T * D * 4, "activations"));
  HR_RETURN_IF_ERROR(act(&h_, T * D * 2, "activations"));
  HR_RETURN_IF_ERROR(act(&qkv_, T * QKV * 4, "activations"));
  HR_RETURN_IF_ERROR(act(&q_, T * Q * 2, "activations"));
  HR_RETURN_IF_ERROR(act(&attn_, T * Q * 2, "activations"));
  HR_RETURN_IF_ERROR(act(&gate_up_, T * 2 * F * 2, "activations"));
  HR_RETURN_IF_ERROR(act(&act_, T * F * 2, "activations"));
  HR_RETURN_IF_ERROR(act(&final_, S * D * 2, "activations"));
  HR_RETURN_IF_ERROR(act(&logits_, S * V * 4, "logits"));
  HR_RETURN_IF_ERROR(act(&tokens_, S * 4, "tokens"));
  HR_RETURN_IF_ERROR(act(&x2_, static_cast<size_t>(kernels::kGemvMaxFusedRows) * D * 4, "activations"));
  sumsq_bytes_ = static_cast<size_t>(2 * c.num_layers) * kernels::kGemvMaxFusedRows * 4;
  HR_RETURN_IF_ERROR(act(&sumsq_, sumsq_bytes_, "norm sums"));
  max_partials_ = std::max(8 * num_sms_, 64);
  HR_RETURN_IF_ERROR(act(&partial_out_, static_cast<size_t>(max_partials_) * c.num_heads * c.head_dim * 4,
                         "attention partials"));
  HR_RETURN_IF_ERROR(act(&partial_ml_, static_cast<size_t>(max_partials_) * c.num_heads * 2 * 4,
                         "attention partials"));
  HR_CUDA("pinned host buffer", cudaHostAlloc(reinterpret_cast<void**>(&host_tokens_), S * 4, 0));

  // The KV cache takes the rest (or the budget given).
  size_t free_bytes = 0, total_bytes = 0;
  HR_CUDA("reading free memory", cudaMemGetInfo(&free_bytes, &total_bytes));
  free_before_kv_ = free_bytes;
  const size_t per_block = 2ull * c.num_layers * options_.block_size * KV * 2;
  size_t budget = options_.kv_cache_bytes > 0
                      ? options_.kv_cache_bytes
                      : static_cast<size_t>(static_cast<double>(free_bytes) * options_.kv_cache_fraction);
  if (budget > free_bytes) {
    return invalid_argument("KV cache budget of " + std::to_string(budget) + " bytes exceeds the " +
                            std::to_string(free_bytes) + " bytes free on the device", "kv-cache-bytes");
  }
  num_blocks_ = static_cast<int>(std::min<size_t>(budget / per_block, 1u << 30));
  if (num_blocks_ < 1) {
    return invalid_argument("KV cache budget of " + std::to_string(budget) + " bytes holds no block (one takes " +
                            std::to_string(per_block) + ")", "kv-cache-bytes");
  }
  const size_t layer_bytes = static_cast<size_t>(num_blocks_) * options_.block_size * KV * 2;
  k_cache_.resize(static_cast<size_t>(c.num_layers));
  v_cache_.resize(static_cast<size_t>(c.num_layers));
  for (int l = 0; l < c.num_layers; ++l) {
    HR_RETURN_IF_ERROR(act(&k_cache_[static_cast<size_t>(l)], layer_bytes, "KV cache"));
    HR_RETURN_IF_ERROR(act(&v_cache_[static_cast<size_t>(l)], layer_bytes, "KV cache"));
  }
  HR_CUDA("reading free memory", cudaMemGetInfo(&free_after_init_, &total_bytes));
  return Status::ok();
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create(const ModelWeights& w, CudaBackendOptions options) {
  std::unique_ptr<CudaBackend> b(new CudaBackend(w.config, options));
  HR_RETURN_IF_ERROR(b->check_options());
  HR_RETURN_IF_ERROR(b->open_device());
  HR_RETURN_IF_ERROR(b->allocate_weights());
  for (const WeightPiece& piece : weight_pieces(w.config)) {
    const std::vector<float>* src = &w.slot(piece.slot, piece.layer);
    if (piece.offset != 0) continue;  // the fused vector goes up whole with its first piece
    HR_RETURN_IF_ERROR(b->upload(b->slot_data(piece.slot, piece.layer), *src, !is_vector_slot(piece.slot)));
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
  for (const WeightPiece& piece : weight_pieces(config)) {
    size_t n = 1;
    for (int64_t d : piece.shape) n *= static_cast<size_t>(d);
    char* dst = static_cast<char*>(b->slot_data(piece.slot, piece.layer));
    if (is_vector_slot(piece.slot)) {
      h32.resize(n);
      HR_RETURN_IF_ERROR(st->read_f32(piece.name, piece.shape, h32.data()));
      HR_CUDA_OF(b, "uploading " + piece.name, cudaMemcpy(dst + piece.offset * 4, h32.data(), n * 4, cudaMemcpyHostToDevice));
    } else {
      h16.resize(n);
      HR_RETURN_IF_ERROR(st->read_bf16(piece.name, piece.shape, h16.data()));
      HR_CUDA_OF(b, "uploading " + piece.name, cudaMemcpy(dst + piece.offset * 2, h16.data(), n * 2, cudaMemcpyHostToDevice));
    }
  }
  HR_RETURN_IF_ERROR(b->init_runtime());
  return b;
}

void* CudaBackend::slot_data(WeightSlot slot, int layer) const {
  const Layer* l = layer >= 0 ? &layers_[static_cast<size_t>(layer)] : nullptr;
  switch (slot) {
    case WeightSlot::kEmbed: return embed_;
    case WeightSlot::kLmHead: return lm_head_;
    case WeightSlot::kFinalNorm: return final_norm_;
    case WeightSlot::kInputNorm: return l->input_norm;
    case WeightSlot::kPostNorm: return l->post_norm;
    case WeightSlot::kQkv: return l->wqkv;
    case WeightSlot::kQkvBias: return l->bqkv;
    case WeightSlot::kO: return l->wo;
    case WeightSlot::kGateUp: return l->w_gate_up;
    case WeightSlot::kDown: return l->w_down;
  }
  return nullptr;
}

Result<std::unique_ptr<CudaBackend>> CudaBackend::create_random(const ModelConfig& config, uint64_t seed,
                                                                CudaBackendOptions options) {
  std::unique_ptr<CudaBackend> b(new CudaBackend(config, options));
  HR_RETURN_IF_ERROR(b->check_options());
  HR_RETURN_IF_ERROR(b->open_device());
  HR_RETURN_IF_ERROR(b->allocate_weights());
  HR_RETURN_IF_ERROR(b->fill_random(seed));
  HR_RETURN_IF_ERROR(b->init_runtime());
  return b;
}

size_t CudaBackend::kv_cache_bytes() const {
  return 2ull * config_.num_layers * num_blocks_ * options_.block_size * config_.kv_size() * 2;
}

Status CudaBackend::prepare(const StepInput& in, const SampleSpec* specs, bool graph_shape, StepLayout* out) {
  const ModelConfig& c = config_;
  const int T = in.num_tokens, S = in.num_seqs, L = in.num_logits, V = c.vocab_size;
  const int bs = options_.block_size, nkv = c.num_kv_heads;
  if (T <= 0) return invalid_argument("empty step");
  if (T > options_.max_num_tokens) {
    return invalid_argument("step of " + std::to_string(T) + " tokens exceeds the backend's " +
                            std::to_string(options_.max_num_tokens), "max-batched-tokens");
  }
  if (S > options_.max_num_seqs || L > options_.max_num_seqs) {
    return invalid_argument("step of " + std::to_string(S) + " sequences exceeds the backend's " +
                            std::to_string(options_.max_num_seqs), "max-num-seqs");
  }
  HR_CUDA("selecting the device", cudaSetDevice(options_.device));

  for (int s = 0; s < S; ++s) {
    for (int t = in.seq_start[s]; t < in.seq_start[s + 1]; ++t) {
      if (in.token_ids[t] < 0 || in.token_ids[t] >= V) {
        return invalid_argument("token id " + std::to_string(in.token_ids[t]) + " is out of range");
      }
      if (in.positions[t] < 0 || in.positions[t] / bs >= in.max_blocks_per_seq) {
        return invalid_argument("position " + std::to_string(in.positions[t]) + " is outside the block table");
      }
    }
  }
  HR_RETURN_IF_ERROR(plan_attention(
      in, {c.num_heads, nkv, num_sms_, max_partials_, graph_shape, options_.tensor_core_decode}, &plan_));
  const auto& decode = plan_.decode;
  const auto& prefill = plan_.prefill;
  const auto& combine = plan_.combine;

  // Pack the step's inputs into the pinned buffer; one copy to the device.
  StepLayout& lay = *out;
  lay = StepLayout{};
  lay.num_tokens = T;
  lay.num_logits = L;
  lay.max_blocks_per_seq = in.max_blocks_per_seq;
  lay.num_decode = static_cast<int>(decode.size());
  lay.num_prefill = static_cast<int>(prefill.size());
  lay.num_combine = static_cast<int>(combine.size());
  lay.fused = options_.small_batch_gemv && options_.fused_small_batch && T <= kGemvRows &&
              T <= kernels::kGemvMaxFusedRows && uniform_decode(in);
  size_t off = 0;
  auto place = [&](size_t bytes) {
    size_t at = off;
    off += align16(bytes);
    return at;
  };
  lay.token_ids = place(T * 4);
  lay.positions = place(T * 4);
  lay.slots = place(T * 4);
  lay.logits_rows = place(static_cast<size_t>(L) * 4);
  lay.block_table = place(static_cast<size_t>(S) * in.max_blocks_per_seq * 4);
  lay.decode_items = place(decode.size() * sizeof(kernels::AttentionWorkItem));
  lay.prefill_items = place(prefill.size() * sizeof(kernels::AttentionWorkItem));
  lay.combine_items = place(combine.size() * sizeof(kernels::AttentionCombineItem));
  lay.sample_params = place(static_cast<size_t>(L) * sizeof(kernels::SampleParams));
  lay.total = off;
  if (lay.total > staging_bytes_) {
    HR_CUDA("waiting for the stream", cudaStreamSynchronize(stream_));
    if (host_staging_) cudaFreeHost(host_staging_);
    if (dev_staging_) {
      cudaFree(dev_staging_);
      allocations_.erase(std::find(allocations_.begin(), allocations_.end(), dev_staging_));
    }
    host_staging_ = nullptr;
    dev_staging_ = nullptr;
    clear_graphs();  // they captured the old buffer's address
    size_t bytes = std::max<size_t>(lay.total * 2, 1 << 20);
    HR_CUDA("pinned host buffer", cudaHostAlloc(reinterpret_cast<void**>(&host_staging_), bytes, 0));
    HR_RETURN_IF_ERROR(alloc(reinterpret_cast<void**>(&dev_staging_), bytes, "step inputs"));
    staging_bytes_ = bytes;
  }
  char* h = host_staging_;
  std::memcpy(h + lay.token_ids, in.token_ids, T * 4);
  std::memcpy(h + lay.positions, in.positions, T * 4);
  int32_t* slots = reinterpret_cast<int32_t*>(h + lay.slots);
  for (int s = 0; s < S; ++s) {
    const int32_t* row = in.block_table + static_cast<size_t>(s) * in.max_blocks_per_seq;
    for (int t = in.seq_start[s]; t < in.seq_start[s + 1]; ++t) {
      const int block = row[in.positions[t] / bs];
      if (block < 0 || block >= num_blocks_) {
        return invalid_argument("block " + std::to_string(block) + " is outside the KV cache");
      }
      slots[t] = block * bs + in.positions[t] % bs;
    }
  }
  for (int i = 0; i < L; ++i) {
    if (in.logits_rows[i] < 0 || in.logits_rows[i] >= T) return invalid_argument("logits row out of range");
  }
  std::memcpy(h + lay.logits_rows, in.logits_rows, static_cast<size_t>(L) * 4);
  std::memcpy(h + lay.block_table, in.block_table, static_cast<size_t>(S) * in.max_blocks_per_seq * 4);
  std::memcpy(h + lay.decode_items, decode.data(), decode.size() * sizeof decode[0]);
  std::memcpy(h + lay.prefill_items, prefill.data(), prefill.size() * sizeof prefill[0]);
  std::memcpy(h + lay.combine_items, combine.data(), combine.size() * sizeof(kernels::AttentionCombineItem));
  if (specs) {
    auto* sp = reinterpret_cast<kernels::SampleParams*>(h + lay.sample_params);
    for (int i = 0; i < L; ++i) {
      sp[i] = kernels::SampleParams{};
      sp[i].temperature = specs[i].temperature;
      sp[i].top_p = specs[i].top_p;
      sp[i].top_k = specs[i].top_k;
      sp[i].random = specs[i].random;
    }
  }
  HR_CUDA("copying step inputs",
          cudaMemcpyAsync(dev_staging_, host_staging_, lay.total, cudaMemcpyHostToDevice, stream_));
  return Status::ok();
}

Status CudaBackend::launch_step(const StepLayout& lay, bool sample) {
  const ModelConfig& c = config_;
  const int T = lay.num_tokens, L = lay.num_logits;
  const int D = c.hidden_size, F = c.intermediate_size, V = c.vocab_size;
  const int Q = c.q_size(), KV = c.kv_size(), QKV = Q + 2 * KV;
  const int bs = options_.block_size, nkv = c.num_kv_heads;
  char* d = dev_staging_;
  const auto* d_tokens = reinterpret_cast<const int32_t*>(d + lay.token_ids);
  const auto* d_positions = reinterpret_cast<const int32_t*>(d + lay.positions);
  const auto* d_slots = reinterpret_cast<const int32_t*>(d + lay.slots);
  const auto* d_logits_rows = reinterpret_cast<const int32_t*>(d + lay.logits_rows);

  const ProgrammaticLaunch pl = options_.programmatic_launch;
  kernels::set_programmatic_launch(pl == ProgrammaticLaunch::kOn || (pl == ProgrammaticLaunch::kAuto && !lay.fused));
  mark("start");
  HR_CUDA("embedding", kernels::embedding_gather(embed_, d_tokens, T, D, x_, stream_));
  mark("embedding");
  kernels::AddRmsNormParams norm;
  norm.x = x_;
  norm.num_rows = T;
  norm.dim = D;
  norm.eps = static_cast<float>(c.rms_norm_eps);
  norm.out = h_;
  kernels::PagedAttentionParams attn;
  attn.q = q_;
  attn.block_table = reinterpret_cast<const int32_t*>(d + lay.block_table);
  attn.positions = d_positions;
  attn.out = attn_;
  attn.partial_out = partial_out_;
  attn.partial_ml = partial_ml_;
  attn.max_blocks_per_seq = lay.max_blocks_per_seq;
  attn.block_size = bs;
  attn.num_heads = c.num_heads;
  attn.num_kv_heads = nkv;
  attn.head_dim = c.head_dim;
  attn.scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  kernels::RopeKvParams rope;
  rope.qkv = qkv_;
  rope.positions = d_positions;
  rope.slot_mapping = d_slots;
  rope.inv_freq = inv_freq_;
  rope.q_out = q_;
  rope.num_tokens = T;
  rope.num_heads = c.num_heads;
  rope.num_kv_heads = nkv;
  rope.head_dim = c.head_dim;

  // Small uniform decode steps run each layer as four GEMVs with the norms, the residual adds and
  // the activation folded in; the residual stream then alternates between x_ and x2_, and each
  // residual write accumulates its rows' sums of squares into sumsq_ for the next norm.
  const bool fused = lay.fused;
  float* r_in = x_;
  float* r_alt = x2_;
  const float* s_in = nullptr;
  const float eps = static_cast<float>(c.rms_norm_eps);
  if (fused) HR_CUDA("zeroing norm sums", cudaMemsetAsync(sumsq_, 0, sumsq_bytes_, stream_));
  for (int li = 0; li < c.num_layers; ++li) {
    const Layer& W = layers_[static_cast<size_t>(li)];
    if (!fused || li == 0) {
      norm.delta = li == 0 ? nullptr : delta_;
      norm.weight = W.input_norm;
      HR_CUDA("input norm", kernels::add_rms_norm(norm, stream_));
      mark("norm");
      HR_RETURN_IF_ERROR(matmul(h_, W.wqkv, qkv_, GemmOut::kF32, T, QKV, D));
    } else {
      HR_RETURN_IF_ERROR(gemv_normed(r_in, s_in, W.input_norm, eps, W.wqkv, qkv_, false, T, QKV, D));
    }
    mark("qkv_proj");
    rope.bias = W.bqkv;
    rope.k_cache = k_cache_[static_cast<size_t>(li)];
    rope.v_cache = v_cache_[static_cast<size_t>(li)];
    HR_CUDA("rope and KV write", kernels::rope_write_kv(rope, stream_));
    mark("rope_kv");
    attn.k_cache = rope.k_cache;
    attn.v_cache = rope.v_cache;
    HR_CUDA("decode attention",
            kernels::paged_attention(attn, reinterpret_cast<const kernels::AttentionWorkItem*>(d + lay.decode_items),
                                     lay.num_decode, true, stream_));
    HR_CUDA("prefill attention",
            kernels::paged_attention(attn, reinterpret_cast<const kernels::AttentionWorkItem*>(d + lay.prefill_items),
                                     lay.num_prefill, false, stream_));
    HR_CUDA("attention combine",
            kernels::paged_attention_combine(
                attn, reinterpret_cast<const kernels::AttentionCombineItem*>(d + lay.combine_items),
                lay.num_combine, stream_));
    mark("attention");
    if (fused) {
      float* sums = sumsq_ + static_cast<size_t>(2 * li) * kernels::kGemvMaxFusedRows;
      HR_RETURN_IF_ERROR(gemv_residual(attn_, W.wo, r_in, r_alt, sums, T, D, Q));
      mark("o_proj");
      // Each warp computes a gate row and its up row and writes SwiGLU's activation.
      HR_RETURN_IF_ERROR(gemv_normed(r_alt, sums, W.post_norm, eps, W.w_gate_up, act_, true, T, F, D, true));
      mark("gate_up_proj");
      float* next_sums = sums + kernels::kGemvMaxFusedRows;
      HR_RETURN_IF_ERROR(gemv_residual(act_, W.w_down, r_alt, r_in, next_sums, T, D, F));
      s_in = next_sums;
      mark("down_proj");
      continue;
    }
    HR_RETURN_IF_ERROR(matmul(attn_, W.wo, delta_, GemmOut::kF32, T, D, Q));
    mark("o_proj");
    norm.delta = delta_;
    norm.weight = W.post_norm;
    HR_CUDA("post-attention norm", kernels::add_rms_norm(norm, stream_));
    mark("norm");
    HR_RETURN_IF_ERROR(matmul(h_, W.w_gate_up, gate_up_, GemmOut::kBF16, T, 2 * F, D));
    mark("gate_up_proj");
    HR_CUDA("silu_mul", kernels::silu_mul(gate_up_, T, F, act_, stream_));
    mark("silu_mul");
    HR_RETURN_IF_ERROR(matmul(act_, W.w_down, delta_, GemmOut::kF32, T, D, F));
    mark("down_proj");
  }
  if (L == 0) return Status::ok();
  if (fused) {
    HR_RETURN_IF_ERROR(gemv_normed(r_in, s_in, final_norm_, eps, lm_head_, logits_, false, L, V, D));
  } else {
    norm.delta = delta_;
    norm.weight = final_norm_;
    norm.rows = d_logits_rows;
    norm.num_rows = L;
    norm.out = final_;
    HR_CUDA("final norm", kernels::add_rms_norm(norm, stream_));
    HR_RETURN_IF_ERROR(matmul(final_, lm_head_, logits_, GemmOut::kF32, L, V, D));
  }
  mark("lm_head");
  if (sample) {
    HR_CUDA("sampling", kernels::sample_tokens(logits_, L, V,
                                               reinterpret_cast<const kernels::SampleParams*>(d + lay.sample_params),
                                               tokens_, stream_));
  }
  mark("sampling");
  return Status::ok();
}

Status CudaBackend::matmul(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, GemmOut out, int m, int n,
                           int k) {
  if (options_.small_batch_gemv && m <= kGemvRows && k % 8 == 0) {
    kernels::GemvParams p = gemv_params(w, m, n, k);
    p.x = x;
    p.y = y;
    p.y_bf16 = out == GemmOut::kBF16;
    HR_CUDA("gemv", kernels::gemv(p, stream_));
    return Status::ok();
  }
  return gemm_->run(x, w, y, out, m, n, k, stream_);
}

Status CudaBackend::gemv_normed(const float* resid, const float* sumsq, const float* norm_weight, float eps,
                                const __nv_bfloat16* w, void* y, bool y_bf16, int m, int n, int k, bool swiglu) {
  kernels::GemvParams p = gemv_params(w, m, n, k);
  p.input = kernels::GemvInput::kRmsNorm;
  p.resid = resid;
  p.resid_sumsq = sumsq;
  p.norm_weight = norm_weight;
  p.eps = eps;
  p.y = y;
  p.y_bf16 = y_bf16;
  p.swiglu = swiglu;
  HR_CUDA("normed gemv", kernels::gemv(p, stream_));
  return Status::ok();
}

Status CudaBackend::gemv_residual(const __nv_bfloat16* x, const __nv_bfloat16* w, const float* resid_in,
                                  float* resid_out, float* sumsq, int m, int n, int k) {
  kernels::GemvParams p = gemv_params(w, m, n, k);
  p.x = x;
  p.resid_in = resid_in;
  p.resid_out = resid_out;
  p.out_sumsq = sumsq;
  HR_CUDA("residual gemv", kernels::gemv(p, stream_));
  return Status::ok();
}

bool CudaBackend::uniform_decode(const StepInput& in) {
  if (in.num_tokens != in.num_seqs || in.num_logits != in.num_seqs) return false;
  for (int s = 0; s < in.num_seqs; ++s) {
    if (in.seq_start[s + 1] != s + 1 || in.logits_rows[s] != s) return false;
  }
  return true;
}

bool CudaBackend::graph_step(const StepInput& in) const {
  return options_.cuda_graphs && !profiling_ &&
         config_.num_heads / config_.num_kv_heads <= kernels::kAttentionDecodeRows && uniform_decode(in);
}

void CudaBackend::clear_graphs() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
  graphs_.clear();
}

Status CudaBackend::enqueue(const StepInput& in, const SampleSpec* specs) {
  const bool graph = graph_step(in);
  StepLayout lay;
  HR_RETURN_IF_ERROR(prepare(in, specs, graph, &lay));
  if (!graph) return launch_step(lay, specs != nullptr);
  // Decode steps of one batch size have one shape: capture the step once, then replay it.
  const auto key = std::make_tuple(in.num_seqs, specs != nullptr, in.max_blocks_per_seq);
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    HR_CUDA("starting a graph capture", cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    Status launched = launch_step(lay, specs != nullptr);
    cudaGraph_t graph_def = nullptr;
    cudaError_t ended = cudaStreamEndCapture(stream_, &graph_def);
    if (!launched.is_ok()) {
      if (graph_def) cudaGraphDestroy(graph_def);
      return launched;
    }
    if (ended != cudaSuccess) return cuda_error("capturing a decode step", ended, options_.device);
    cudaGraphExec_t exec = nullptr;
    cudaError_t made = cudaGraphInstantiate(&exec, graph_def, 0);
    cudaGraphDestroy(graph_def);
    if (made != cudaSuccess) return cuda_error("instantiating a decode graph", made, options_.device);
    it = graphs_.emplace(key, exec).first;
  }
  HR_CUDA("launching a decode graph", cudaGraphLaunch(it->second, stream_));
  return Status::ok();
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
  for (size_t i = 1; i < num_marks_; ++i) {
    float ms = 0;
    if (cudaEventElapsedTime(&ms, mark_events_[i - 1], mark_events_[i]) == cudaSuccess) {
      profile_[mark_names_[i]] += ms;
    } else {
      cudaGetLastError();
    }
  }
  num_marks_ = 0;
  ++profiled_steps_;
}

void CudaBackend::set_profiling(bool on) {
  profiling_ = on;
  profile_.clear();
  profiled_steps_ = 0;
  num_marks_ = 0;
  clear_graphs();
}

Status CudaBackend::forward(const StepInput& in, float* logits) {
  HR_RETURN_IF_ERROR(enqueue(in, nullptr));
  if (in.num_logits > 0) {
    HR_CUDA("copying logits", cudaMemcpyAsync(logits, logits_, static_cast<size_t>(in.num_logits) * config_.vocab_size * 4,
                                              cudaMemcpyDeviceToHost, stream_));
  }
  HR_CUDA("running the step", cudaStreamSynchronize(stream_));
  collect_marks();
  return Status::ok();
}

Status CudaBackend::forward_sample(const StepInput& in, const SampleSpec* specs, int32_t* tokens) {
  HR_RETURN_IF_ERROR(enqueue(in, specs));
  if (in.num_logits > 0) {
    HR_CUDA("copying tokens", cudaMemcpyAsync(host_tokens_, tokens_, static_cast<size_t>(in.num_logits) * 4,
                                              cudaMemcpyDeviceToHost, stream_));
  }
  HR_CUDA("running the step", cudaStreamSynchronize(stream_));
  collect_marks();
  std::memcpy(tokens, host_tokens_, static_cast<size_t>(in.num_logits) * 4);
  return Status::ok();
}

}  // namespace hr::engine
