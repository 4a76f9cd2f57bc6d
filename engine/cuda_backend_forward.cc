// The forward pass of one step: embedding, per layer the normed q/k/v products with RoPE and the
// KV write, paged attention, the output and MLP products with their residuals, then the LM head
// and sampling; matrix products by the GEMV kernel for small steps and cuBLASLt otherwise.
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

namespace {

kernels::GemvParams gemv_params(const __nv_bfloat16* w, int m, int n, int k) {
  kernels::GemvParams p;
  p.w = w;
  p.m = m;
  p.n = n;
  p.k = k;
  return p;
}

}  // namespace

Status CudaBackend::launch_step(const StepLayout& lay, int slot, bool sample) {
  const char* d = slots_[static_cast<size_t>(slot)].dev;
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
  // (Not by default on a rank of a parallel engine: its collectives and hand-offs enqueue
  // copies, and a programmatic launch in a captured graph must follow a kernel.)
  kernels::set_programmatic_launch(
      pl == ProgrammaticLaunch::kOn ||
      (pl == ProgrammaticLaunch::kAuto && !lay.fused && shard_.whole()));
  mark("start");
  // A later pipeline stage's residual stream is the stage before's, already in x_; the last
  // stage still reads each row's input token for the sampler's penalties.
  const bool first_stage = shard_.first_stage(), last_stage = shard_.last_stage();
  if (first_stage || last_stage) {
    HR_CUDA("embedding",
            kernels::embedding_gather(first_stage ? embed_ : nullptr, d_tokens,
                                      reinterpret_cast<const int32_t*>(d + lay.fed_rows), tokens_,
                                      T, config_.vocab_size, D, first_stage ? x_ : nullptr,
                                      input_ids_, stream_));
  }
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
  // In those, a MoE layer's down product adds its k rows per token into the residual itself
  // (the experts' GEMV form; their grouped GEMM writes the rows).
  const bool moe_combine =
      fused && options_.moe_combine && options_.moe_experts != MoeExperts::kGroupedGemm;
  float* r_in = x_;
  float* r_alt = x2_;
  const float* s_in = nullptr;
  const float eps = static_cast<float>(c.rms_norm_eps);
  // What the next residual add takes: the last MLP's output, a MoE layer's k rows per token.
  const float* mlp_out = delta_;
  int mlp_rows = 1;
  // A tensor-parallel rank's layer boundaries in one launch where its communicator has them
  // (all_reduce_add_rms_norm): the o product's partial sums with the post-attention norm, and a
  // dense down product's with the next layer's input norm (`partial_pending`: delta_ holds this
  // rank's down product, not the sum).
  const bool boundary = shard_.tp > 1 && options_.fused_all_reduce &&
                        options_.tensor_parallel->fuses_layer_boundary();
  bool partial_pending = false;
  rope.eps = eps;
  // (A kernel, not a memset: the norm after it may be a programmatic launch, whose dependency in a
  // captured graph must be on a kernel.)
  if (fused)
    HR_CUDA("zeroing norm sums", kernels::fill_f32(sumsq_, sumsq_bytes_ / 4, 0.0f, stream_));
  for (int li = 0; li < c.num_layers; ++li) {
    if (li > 0) mark("layer");  // (the layer before ends: time_parts)
    const Layer& W = layers_[static_cast<size_t>(li)];
    // After a MoE layer whose down product did not make the residual add (its k rows per
    // token), the norm kernel makes it, fused or not, and the q/k/v product reads its normalised
    // rows.
    const bool after_moe = li > 0 && c.is_moe_layer(li - 1) && !moe_combine;
    const bool norm_first = !fused || li == 0 || after_moe;
    rope.bias = W.bqkv;
    rope.q_norm = W.q_norm;
    rope.k_norm = W.k_norm;
    rope.k_cache = k_cache_[static_cast<size_t>(li)];
    rope.v_cache = v_cache_[static_cast<size_t>(li)];
    if (norm_first && partial_pending) {
      HR_RETURN_IF_ERROR(options_.tensor_parallel->all_reduce_add_rms_norm(
          delta_, x_, h_, W.input_norm, T, D, eps, stream_));
      partial_pending = false;
      mark("norm");
    } else if (norm_first) {
      norm.x = r_in;
      norm.delta = li == 0 ? nullptr : mlp_out;
      norm.delta_rows = mlp_rows;
      norm.weight = W.input_norm;
      HR_CUDA("input norm", kernels::add_rms_norm(norm, stream_));
      mark("norm");
    }
    if (fused && options_.fused_rope && (!c.qk_norm || kernels::gemv_fuses_qk_norm(c.head_dim))) {
      // One GEMV: q/k/v, Qwen3's q/k norms, RoPE and the KV write (a head's norm by the last
      // block to finish its rows).
      kernels::GemvParams qp = gemv_params(W.wqkv, T, QKV, D);
      if (norm_first) {
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
      if (c.qk_norm) {
        qp.rope.q_norm = W.q_norm;
        qp.rope.k_norm = W.k_norm;
        qp.rope.eps = eps;
        qp.rope.scratch = qkv_;
        qp.rope.head_counters = head_counters_;
      }
      const Ahead next = ahead(W.wo, D, Q);
      std::copy(next.begin(), next.end(), qp.prefetch);
      HR_CUDA("qkv, rope and KV write", kernels::gemv(qp, stream_));
      mark("qkv_proj");
    } else {
      if (norm_first) {
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
      // The o product adds itself into the other residual buffer (prefetching a dense MLP's
      // weights; a MoE layer's experts are not known yet).
      const bool moe = c.is_moe_layer(li);
      float* sums = sumsq_ + static_cast<size_t>(2 * li) * kernels::kGemvMaxFusedRows;
      HR_RETURN_IF_ERROR(gemv_residual(attn_, W.wo, r_in, r_alt, sums, T, D, Q,
                                       moe ? Ahead{} : ahead(W.w_gate_up, 2 * F, D, true)));
      mark("o_proj");
      if (moe && moe_combine) {
        // The routing normalises those rows for the experts (h_); the down product adds their
        // k rows per token into the residual, as the dense down product adds its row.
        float* next_sums = sums + kernels::kGemvMaxFusedRows;
        HR_RETURN_IF_ERROR(moe_layer(W, li, T, r_alt, h_, MoeResidual{r_alt, r_in, next_sums}));
        s_in = next_sums;
        continue;
      }
      if (moe) {
        // The routing normalises those rows for the experts (h_), whose k rows per token the
        // next norm adds; the buffers swap.
        HR_RETURN_IF_ERROR(moe_layer(W, li, T, r_alt, h_, {}));
        std::swap(r_in, r_alt);
        mlp_out = moe_.out;
        mlp_rows = c.moe.top_k;
        continue;
      }
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
    if (boundary) {
      mark("o_proj");
      HR_RETURN_IF_ERROR(options_.tensor_parallel->all_reduce_add_rms_norm(
          delta_, x_, h_, W.post_norm, T, D, eps, stream_));
    } else {
      HR_RETURN_IF_ERROR(reduce_partials(delta_, static_cast<size_t>(T) * D));
      mark("o_proj");
      norm.delta = delta_;
      norm.delta_rows = 1;
      norm.weight = W.post_norm;
      HR_CUDA("post-attention norm", kernels::add_rms_norm(norm, stream_));
    }
    mark("norm");
    if (c.is_moe_layer(li)) {
      HR_RETURN_IF_ERROR(moe_layer(W, li, T, x_, nullptr, {}));
      HR_RETURN_IF_ERROR(
          reduce_partials(moe_.out, static_cast<size_t>(T) * c.moe.top_k * c.hidden_size));
      mlp_out = moe_.out;
      mlp_rows = c.moe.top_k;
      continue;
    }
    mlp_out = delta_;
    mlp_rows = 1;
    HR_RETURN_IF_ERROR(matmul(h_, W.w_gate_up, gate_up_, GemmOut::kBF16, T, 2 * F, D));
    mark("gate_up_proj");
    HR_CUDA("silu_mul", kernels::silu_mul(gate_up_, T, F, act_, stream_));
    mark("silu_mul");
    HR_RETURN_IF_ERROR(matmul(act_, W.w_down, delta_, GemmOut::kF32, T, D, F));
    if (boundary && li + 1 < c.num_layers) {
      partial_pending = true;  // summed with the next layer's input norm
    } else {
      HR_RETURN_IF_ERROR(reduce_partials(delta_, static_cast<size_t>(T) * D));
    }
    mark("down_proj");
  }
  mark("layer");
  if (!last_stage) {
    // The stage's last residual add, which the next stage's first norm does not make: the
    // residual stream goes on whole (the fused path, which keeps it in two buffers, is not a
    // stage's).
    kernels::AddRmsNormParams add;
    add.x = x_;
    add.delta = mlp_out;
    add.delta_rows = mlp_rows;
    add.num_rows = T;
    add.dim = D;
    HR_CUDA("the stage's residual add", kernels::add_rms_norm(add, stream_));
    mark("stage_out");
    return Status::ok();
  }
  if (L == 0) return Status::ok();
  if (fused && (moe_combine || !c.is_moe_layer(c.num_layers - 1))) {
    HR_RETURN_IF_ERROR(
        gemv_normed(r_in, s_in, final_norm_, eps, lm_head_, logits_, false, L, V, D));
  } else {
    norm.x = r_in;
    norm.delta = mlp_out;
    norm.delta_rows = mlp_rows;
    norm.weight = final_norm_;
    norm.rows = d_logits_rows;
    norm.num_rows = L;
    norm.out = final_;
    HR_CUDA("final norm", kernels::add_rms_norm(norm, stream_));
    if (shard_.tp > 1) {
      HR_RETURN_IF_ERROR(matmul(final_, lm_head_, head_logits_, GemmOut::kF32, L, head_rows(), D));
      HR_RETURN_IF_ERROR(gather_logits(L));
    } else {
      HR_RETURN_IF_ERROR(matmul(final_, lm_head_, logits_, GemmOut::kF32, L, V, D));
    }
  }
  mark("lm_head");
  if (sample) {
    HR_CUDA("sampling", kernels::sample_tokens(
                            logits_, L, V,
                            reinterpret_cast<const kernels::SampleParams*>(d + lay.sample_params),
                            input_ids_, sampled_into(slot), logprobs_, stream_));
  }
  mark("sampling");
  return Status::ok();
}

Status CudaBackend::reduce_partials(float* data, size_t n) {
  if (shard_.tp == 1) return Status::ok();
  return options_.tensor_parallel->all_reduce(data, n, stream_);
}

Status CudaBackend::gather_logits(int num_logits) {
  const int tp = shard_.tp, V = config_.vocab_size, share = head_rows();
  const size_t slice = static_cast<size_t>(num_logits) * share;
  HR_RETURN_IF_ERROR(
      options_.tensor_parallel->all_gather(head_logits_, gathered_logits_, slice, stream_));
  // Rank r's [L, share] slice holds vocabulary columns [r * share, r * share + share) of each row.
  for (int r = 0; r < tp; ++r) {
    const int first = std::min(V, r * share), count = std::min(V, first + share) - first;
    if (count <= 0 || num_logits == 0) continue;
    HR_CUDA(
        "placing the gathered logits",
        cudaMemcpy2DAsync(logits_ + first, static_cast<size_t>(V) * 4, gathered_logits_ + slice * r,
                          static_cast<size_t>(share) * 4, static_cast<size_t>(count) * 4,
                          static_cast<size_t>(num_logits), cudaMemcpyDeviceToDevice, stream_));
  }
  return Status::ok();
}

Status CudaBackend::moe_layer(const Layer& W, int li, int T, const float* resid,
                              __nv_bfloat16* normed_out, const MoeResidual& add) {
  const ModelConfig& c = config_;
  const MoeConfig& m = c.moe;
  kernels::MoeRouteParams r;
  // The router's input in fp32, normalised from the residual stream (as the CPU backend routes):
  // bf16 inputs flip more near-tied choices.
  r.resid = resid;
  r.normed_out = normed_out;
  r.norm_weight = W.post_norm;
  r.eps = static_cast<float>(c.rms_norm_eps);
  r.router = W.router;
  r.num_tokens = T;
  r.dim = c.hidden_size;
  r.routing.num_experts = m.num_experts;
  r.routing.top_k = m.top_k;
  r.routing.sigmoid = m.scoring == RouterScoring::kSigmoid;
  r.routing.renormalize = m.renormalize;
  r.routing.num_groups = m.num_groups;
  r.routing.topk_groups = m.topk_groups;
  r.routing.scaling = m.routed_scaling_factor;
  r.logits = moe_.logits;
  r.topk_ids = moe_.topk_ids;
  r.topk_weights = moe_.topk_weights;
  // The routing also sorts the pairs by expert (one launch for a decode step's few tokens).
  const int pairs = T * m.top_k, capacity = kernels::moe_capacity(pairs, m.num_experts);
  r.layout = moe_.layout;
  r.capacity = capacity;
  r.counter = moe_.route_counter;
  r.tiled = options_.moe_router_tiles && T >= kMoeTiledRouteTokens;
  HR_CUDA("MoE routing", kernels::moe_route(r, stream_));
  if (recording_routing_) {
    const size_t per_layer = static_cast<size_t>(options_.max_num_tokens) * m.top_k;
    HR_CUDA(
        "recording the routing",
        cudaMemcpyAsync(routing_record_ + per_layer * li, moe_.topk_ids,
                        static_cast<size_t>(T) * m.top_k * 4, cudaMemcpyDeviceToDevice, stream_));
    routing_record_tokens_ = T;
  }
  mark("moe_route");
  kernels::MoeExpertsParams e;
  e.x = h_;
  e.w_gate_up = W.experts_gate_up;
  e.w_down = W.experts_down;
  e.topk_weights = moe_.topk_weights;
  e.layout = moe_.layout;
  e.num_tokens = T;
  e.top_k = m.top_k;
  e.num_experts = m.num_experts;
  e.dim = c.hidden_size;
  e.ffn = m.expert_intermediate_size;
  e.capacity = capacity;
  e.act = moe_.act;
  e.out = moe_.out;
  e.topk_ids = moe_.topk_ids;
  e.resid_in = add.in;
  e.resid_out = add.out;
  e.out_sumsq = add.sumsq;
  if (shard_.ep > 1) {
    // Experts held whole, a share on each rank: a pair's row is this rank's to write only when
    // its expert is here; the others stay zero for the all-reduce.
    e.first_expert = shard_.first_expert;
    e.num_local_experts = shard_.num_experts;
    HR_CUDA("zeroing the experts' outputs",
            kernels::fill_f32(moe_.out, static_cast<size_t>(T) * m.top_k * c.hidden_size, 0.0f,
                              stream_));
  }
  const MoeExperts how = options_.moe_experts;
  const MoeGemmWarps warps = options_.moe_gemm_warps != MoeGemmWarps::kAuto
                                 ? options_.moe_gemm_warps
                             : warpgroup_gemm_ ? MoeGemmWarps::kWarpgroup
                                               : MoeGemmWarps::k32x32;
  const int gemv_tokens =
      warps == MoeGemmWarps::kWarpgroup ? kMoeGemvTokensWarpgroup : kMoeGemvTokens;
  const auto kernel = how == MoeExperts::kGemv || (how == MoeExperts::kAuto && T <= gemv_tokens)
                          ? kernels::MoeKernel::kGemv
                      : warps == MoeGemmWarps::k64x64 ? kernels::MoeKernel::kGroupedGemmWide
                      : warps == MoeGemmWarps::kWarpgroup
                          ? kernels::MoeKernel::kGroupedGemmWarpgroup
                          : kernels::MoeKernel::kGroupedGemm;
  HR_CUDA("MoE experts", kernels::moe_experts(e, kernel, stream_));
  mark("moe_experts");
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
                         Shape{L, head_rows(), D, GemmOut::kF32}}) {
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

}  // namespace hr::engine
