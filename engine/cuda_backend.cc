// CUDA forward pass over a flattened batch with a paged KV cache (construction and weight loading
// are in cuda_backend_load.cc).
#include "engine/cuda_backend.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <string>

#include "engine/attention_plan.h"
#include "engine/internal/cuda_status.h"
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

// Byte offsets of one step's inputs inside the staging buffers (each 16-byte aligned).
struct CudaBackend::StepLayout {
  size_t token_ids = 0, fed_rows = 0, positions = 0, slots = 0, logits_rows = 0, block_table = 0,
         decode_items = 0, prefill_items = 0, combine_items = 0, sample_params = 0, total = 0;
  int num_tokens = 0, num_logits = 0;
  // The block tables' row pitch on the device (the attention kernels' max_blocks_per_seq), and
  // the columns given (packed at that width on the host; the rest of each device row is not read).
  int max_blocks_per_seq = 0, table_cols = 0;
  int num_decode = 0, num_prefill = 0, num_combine = 0;
  kernels::AttentionKernel decode_kernel =
      kernels::AttentionKernel::kDecode;  // for the decode items
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
  for (Slot& slot : slots_) {
    if (slot.host) cudaFreeHost(slot.host);
    if (slot.host_tokens) cudaFreeHost(slot.host_tokens);
    if (slot.host_logprobs) cudaFreeHost(slot.host_logprobs);
    if (slot.list_host) cudaFreeHost(slot.list_host);
    if (slot.done) cudaEventDestroy(slot.done);
  }
  if (stream_) cudaStreamDestroy(stream_);
}

size_t CudaBackend::kv_cache_bytes() const {
  return 2ull * config_.num_layers * num_blocks_ * options_.block_size * config_.kv_size() * 2;
}

Status CudaBackend::prepare(const StepInput& in, const SampleSpec* specs, bool graph_shape,
                            int slot_index, int real_seqs, StepLayout* out) {
  const ModelConfig& c = config_;
  const int T = in.num_tokens, S = in.num_seqs, L = in.num_logits, V = c.vocab_size;
  const int bs = options_.block_size, nkv = c.num_kv_heads;
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
  HR_CUDA("selecting the device", cudaSetDevice(options_.device));
  HR_RETURN_IF_ERROR(check_step(in, {V, bs, num_blocks_, prev_num_logits_, real_seqs}));
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
  lay.fused = fused_shapes_ && options_.small_batch_gemv && options_.fused_small_batch &&
              T <= kGemvRows && T <= kernels::kGemvMaxFusedRows && uniform_decode(in);
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
  static_assert(sizeof(kernels::PenaltyToken) == 8 && sizeof(kernels::LogitBias) == 8);
  size_t list_bytes = 0;
  for (int i = 0; specs && i < L; ++i) {
    if (specs[i].penalties.any())
      list_bytes += 8 * static_cast<size_t>(std::max(0, specs[i].num_penalty_tokens));
    list_bytes += 8 * static_cast<size_t>(std::max(0, specs[i].num_logit_bias));
  }
  if (list_bytes > slot.list_bytes)
    HR_RETURN_IF_ERROR(grow_lists(slot, std::max<size_t>(list_bytes * 2, 1 << 17)));
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
  if (specs) {
    auto* sp = reinterpret_cast<kernels::SampleParams*>(h + lay.sample_params);
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
      if (!spec.penalties.any()) continue;
      sp[i].frequency_penalty = spec.penalties.frequency;
      sp[i].presence_penalty = spec.penalties.presence;
      sp[i].repetition_penalty = spec.penalties.repetition;
      sp[i].input_row = spec.penalize_input ? in.logits_rows[i] : -1;
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
  }
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

Status CudaBackend::launch_step(const StepLayout& lay, const char* d, bool sample) {
  const ModelConfig& c = config_;
  const int T = lay.num_tokens, L = lay.num_logits;
  const int D = c.hidden_size, F = c.intermediate_size, V = c.vocab_size;
  const int Q = c.q_size(), KV = c.kv_size(), QKV = Q + 2 * KV;
  const int bs = options_.block_size, nkv = c.num_kv_heads;
  const auto* d_tokens = reinterpret_cast<const int32_t*>(d + lay.token_ids);
  const auto* d_positions = reinterpret_cast<const int32_t*>(d + lay.positions);
  const auto* d_slots = reinterpret_cast<const int32_t*>(d + lay.slots);
  const auto* d_logits_rows = reinterpret_cast<const int32_t*>(d + lay.logits_rows);

  const ProgrammaticLaunch pl = options_.programmatic_launch;
  kernels::set_programmatic_launch(pl == ProgrammaticLaunch::kOn ||
                                   (pl == ProgrammaticLaunch::kAuto && !lay.fused));
  mark("start");
  HR_CUDA("embedding", kernels::embedding_gather(
                           embed_, d_tokens, reinterpret_cast<const int32_t*>(d + lay.fed_rows),
                           tokens_, T, config_.vocab_size, D, x_, input_ids_, stream_));
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
  if (options_.fused_combine) {
    attn.combine_items =
        reinterpret_cast<const kernels::AttentionCombineItem*>(d + lay.combine_items);
    attn.combine_counters = combine_counters_;
  }
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
  // (A kernel, not a memset: the norm after it may be a programmatic launch, whose dependency in a
  // captured graph must be on a kernel.)
  if (fused)
    HR_CUDA("zeroing norm sums", kernels::fill_f32(sumsq_, sumsq_bytes_ / 4, 0.0f, stream_));
  for (int li = 0; li < c.num_layers; ++li) {
    const Layer& W = layers_[static_cast<size_t>(li)];
    rope.bias = W.bqkv;
    rope.k_cache = k_cache_[static_cast<size_t>(li)];
    rope.v_cache = v_cache_[static_cast<size_t>(li)];
    if (!fused || li == 0) {
      norm.delta = li == 0 ? nullptr : delta_;
      norm.weight = W.input_norm;
      HR_CUDA("input norm", kernels::add_rms_norm(norm, stream_));
      mark("norm");
    }
    if (fused && options_.fused_rope) {
      // One GEMV: q/k/v, RoPE and the KV write.
      kernels::GemvParams qp = gemv_params(W.wqkv, T, QKV, D);
      if (li == 0) {
        qp.x = h_;
      } else {
        qp.input = kernels::GemvInput::kRmsNorm;
        qp.resid = r_in;
        qp.resid_sumsq = s_in;
        qp.norm_weight = W.input_norm;
        qp.eps = eps;
      }
      qp.rope = {q_,      rope.k_cache, rope.v_cache, rope.bias, d_positions,
                 d_slots, inv_freq_,    c.num_heads,  nkv,       c.head_dim};
      const Ahead next = ahead(W.wo, D, Q);
      std::copy(next.begin(), next.end(), qp.prefetch);
      HR_CUDA("qkv, rope and KV write", kernels::gemv(qp, stream_));
      mark("qkv_proj");
    } else {
      if (!fused || li == 0) {
        HR_RETURN_IF_ERROR(matmul(h_, W.wqkv, qkv_, GemmOut::kF32, T, QKV, D));
      } else {
        HR_RETURN_IF_ERROR(gemv_normed(r_in, s_in, W.input_norm, eps, W.wqkv, qkv_, false, T, QKV,
                                       D, false, ahead(W.wo, D, Q)));
      }
      mark("qkv_proj");
      HR_CUDA("rope and KV write", kernels::rope_write_kv(rope, stream_));
      mark("rope_kv");
    }
    attn.k_cache = rope.k_cache;
    attn.v_cache = rope.v_cache;
    HR_CUDA("decode attention",
            kernels::paged_attention(
                attn, reinterpret_cast<const kernels::AttentionWorkItem*>(d + lay.decode_items),
                lay.num_decode, lay.decode_kernel, stream_));
    HR_CUDA("prefill attention",
            kernels::paged_attention(
                attn, reinterpret_cast<const kernels::AttentionWorkItem*>(d + lay.prefill_items),
                lay.num_prefill, kernels::AttentionKernel::kPrefill, stream_));
    if (!options_.fused_combine) {
      HR_CUDA(
          "attention combine",
          kernels::paged_attention_combine(
              attn, reinterpret_cast<const kernels::AttentionCombineItem*>(d + lay.combine_items),
              lay.num_combine, stream_));
    }
    mark("attention");
    if (fused) {
      float* sums = sumsq_ + static_cast<size_t>(2 * li) * kernels::kGemvMaxFusedRows;
      HR_RETURN_IF_ERROR(gemv_residual(attn_, W.wo, r_in, r_alt, sums, T, D, Q,
                                       ahead(W.w_gate_up, 2 * F, D, true)));
      mark("o_proj");
      // Each warp computes a gate row and its up row and writes SwiGLU's activation.
      HR_RETURN_IF_ERROR(gemv_normed(r_alt, sums, W.post_norm, eps, W.w_gate_up, act_, true, T, F,
                                     D, true, ahead(W.w_down, D, F)));
      mark("gate_up_proj");
      float* next_sums = sums + kernels::kGemvMaxFusedRows;
      const Ahead next = li + 1 < c.num_layers
                             ? ahead(layers_[static_cast<size_t>(li) + 1].wqkv, QKV, D)
                         : L > 0 ? ahead(lm_head_, V, D)
                                 : Ahead{};
      HR_RETURN_IF_ERROR(gemv_residual(act_, W.w_down, r_alt, r_in, next_sums, T, D, F, next));
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
    HR_RETURN_IF_ERROR(
        gemv_normed(r_in, s_in, final_norm_, eps, lm_head_, logits_, false, L, V, D));
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
    HR_CUDA("sampling", kernels::sample_tokens(
                            logits_, L, V,
                            reinterpret_cast<const kernels::SampleParams*>(d + lay.sample_params),
                            input_ids_, tokens_, logprobs_, stream_));
  }
  mark("sampling");
  return Status::ok();
}

bool CudaBackend::gemv_product(int m, int k) const {
  return options_.small_batch_gemv && m <= kGemvRows && k % 8 == 0;
}

Status CudaBackend::plan_gemms(int T, int L) {
  const ModelConfig& c = config_;
  const int D = c.hidden_size, F = c.intermediate_size, Q = c.q_size(), QKV = Q + 2 * c.kv_size();
  struct Shape {
    int m, n, k;
    GemmOut out;
  };
  // launch_step's products: q/k/v, o, gate/up, down, the LM head.
  for (const Shape& s : {Shape{T, QKV, D, GemmOut::kF32}, Shape{T, D, Q, GemmOut::kF32},
                         Shape{T, 2 * F, D, GemmOut::kBF16}, Shape{T, D, F, GemmOut::kF32},
                         Shape{L, c.vocab_size, D, GemmOut::kF32}}) {
    if (s.m > 0 && !gemv_product(s.m, s.k))
      HR_RETURN_IF_ERROR(gemm_->prepare(s.m, s.n, s.k, s.out));
  }
  return Status::ok();
}

Status CudaBackend::matmul(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, GemmOut out,
                           int m, int n, int k) {
  if (gemv_product(m, k)) {
    kernels::GemvParams p = gemv_params(w, m, n, k);
    p.x = x;
    p.y = y;
    p.y_bf16 = out == GemmOut::kBF16;
    HR_CUDA("gemv", kernels::gemv(p, stream_));
    return Status::ok();
  }
  return gemm_->run(x, w, y, out, m, n, k, stream_);
}

CudaBackend::Ahead CudaBackend::ahead(const __nv_bfloat16* w, int rows, int k, bool halves) const {
  Ahead out{};
  if (options_.prefetch_weights_mb <= 0) return out;
  const size_t matrix = static_cast<size_t>(rows) * k * 2,
               want = static_cast<size_t>(options_.prefetch_weights_mb) << 20;
  if (!halves) {
    out[0] = {w, std::min(matrix, want) / 16 * 16};
    return out;
  }
  const size_t half = std::min(matrix / 2, want / 2) / 16 * 16;
  out[0] = {w, half};
  out[1] = {w + static_cast<size_t>(rows / 2) * k, half};
  return out;
}

Status CudaBackend::gemv_normed(const float* resid, const float* sumsq, const float* norm_weight,
                                float eps, const __nv_bfloat16* w, void* y, bool y_bf16, int m,
                                int n, int k, bool swiglu, const Ahead& next) {
  kernels::GemvParams p = gemv_params(w, m, n, k);
  std::copy(next.begin(), next.end(), p.prefetch);
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

Status CudaBackend::gemv_residual(const __nv_bfloat16* x, const __nv_bfloat16* w,
                                  const float* resid_in, float* resid_out, float* sumsq, int m,
                                  int n, int k, const Ahead& next) {
  kernels::GemvParams p = gemv_params(w, m, n, k);
  std::copy(next.begin(), next.end(), p.prefetch);
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
  return options_.cuda_graphs && !profiling_ && uniform_decode(in);
}

void CudaBackend::clear_graphs() {
  for (auto& [key, exec] : graphs_) cudaGraphExecDestroy(exec);
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

Status CudaBackend::enqueue(const StepInput& given, const SampleSpec* given_specs, int slot) {
  const bool graph = graph_step(given);
  StepInput in = given;
  const SampleSpec* specs = given_specs;
  if (graph) {
    const int pad = graph_batch_size(given.num_seqs) - given.num_seqs;
    if (pad > 0) in = pad_decode_step(given, given_specs, pad, &specs);
  }
  StepLayout lay;
  HR_RETURN_IF_ERROR(prepare(in, specs, graph, slot, given.num_seqs, &lay));
  if (!graph) return launch_step(lay, slots_[slot].dev, specs != nullptr);
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
  auto it = graphs_.find(key);
  if (it == graphs_.end()) {
    // cuBLASLt chooses its algorithms now: not while the stream is being captured.
    HR_RETURN_IF_ERROR(plan_gemms(lay.num_tokens, lay.num_logits));
    HR_CUDA("starting a graph capture",
            cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
    Status launched = launch_step(lay, slots_[slot].dev, sample);
    cudaGraph_t graph_def = nullptr;
    cudaError_t ended = cudaStreamEndCapture(stream_, &graph_def);
    if (!launched.is_ok()) {
      if (graph_def) cudaGraphDestroy(graph_def);
      return launched;
    }
    if (ended != cudaSuccess)
      return internal::cuda_error("capturing a decode step", ended, options_.device);
    cudaGraphExec_t exec = nullptr;
    cudaError_t made = cudaGraphInstantiate(&exec, graph_def, 0);
    cudaGraphDestroy(graph_def);
    if (made != cudaSuccess)
      return internal::cuda_error("instantiating a decode graph", made, options_.device);
    it = graphs_.emplace(key, exec).first;
  }
  HR_CUDA("launching a decode graph", cudaGraphLaunch(it->second, stream_));
  return Status::ok();
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
  for (int size = 1; size <= largest; size = graph_batch_size(size + 1)) {
    for (int slot = 0; slot < 2; ++slot) {
      if (graphs_.count(std::make_tuple(size, true, warm_table_width_, slot))) continue;
      const SampleSpec* specs = nullptr;
      StepInput in = pad_decode_step(none, &greedy, size, &specs);
      StepLayout lay;
      HR_RETURN_IF_ERROR(prepare(in, specs, true, slot, 0, &lay));
      if (slot == 0) {
        // Once eagerly first: every kernel and library call of the step is loaded and set up
        // before any of it is captured.
        HR_RETURN_IF_ERROR(launch_step(lay, slots_[slot].dev, true));
        HR_CUDA("warming up", cudaStreamSynchronize(stream_));
      }
      HR_RETURN_IF_ERROR(launch_graph(lay, slot, true));
      HR_CUDA("warming up", cudaStreamSynchronize(stream_));
    }
    if (size == largest) break;
  }
  HR_CUDA("warming up", cudaStreamSynchronize(stream_));
  prev_num_logits_ = 0;
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
  if (in.fed_rows) return invalid_argument("forward() takes no fed rows");
  if (outstanding_.size() >= 2)
    return internal_error("two steps are outstanding: collect one first");
  Status enqueued = enqueue(in, nullptr, free_slot());
  if (!enqueued.is_ok()) {
    cudaStreamSynchronize(stream_);  // as in submit()
    return enqueued;
  }
  if (in.num_logits > 0) {
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
  if (outstanding_.size() >= 2)
    return internal_error("two steps are outstanding: collect one first");
  if (in.num_logits > 0 && specs == nullptr)
    return invalid_argument("no sampling specs for the logits rows");
  const int index = free_slot();
  Slot& slot = slots_[index];
  Status enqueued = enqueue(in, specs, index);
  if (!enqueued.is_ok()) {
    // What did get queued may still read the slot's pinned inputs: let it finish before they are
    // written again.
    cudaStreamSynchronize(stream_);
    return enqueued;
  }
  cudaError_t queued = cudaSuccess;
  slot.asked.clear();
  const bool any_logprobs =
      specs && std::any_of(specs, specs + in.num_logits,
                           [](const SampleSpec& sp) { return sp.logprobs >= 0; });
  for (int i = 0; any_logprobs && i < in.num_logits; ++i) slot.asked.push_back(specs[i].logprobs);
  if (in.num_logits > 0) {
    queued = cudaMemcpyAsync(slot.host_tokens, tokens_, static_cast<size_t>(in.num_logits) * 4,
                             cudaMemcpyDeviceToHost, stream_);
  }
  if (queued == cudaSuccess && !slot.asked.empty()) {
    queued = cudaMemcpyAsync(slot.host_logprobs, logprobs_,
                             static_cast<size_t>(in.num_logits) * sizeof(kernels::TokenLogprobs),
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
  slot.num_logits = in.num_logits;
  prev_num_logits_ = in.num_logits;
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
  prev_num_logits_ = 0;
}

}  // namespace hr::engine
