// Sampling: block-wide argmax, threshold bisections, and an id-ordered prefix walk.
#include "kernels/internal/common.cuh"
#include "kernels/sampling.cuh"

namespace hr::kernels {
namespace {

constexpr int kThreads = 1024;
constexpr int kBisections = 40;


struct ArgMax {
  float v;
  int i;
};

__device__ __forceinline__ ArgMax better(ArgMax a, ArgMax b) {
  if (b.v > a.v || (b.v == a.v && b.i < a.i)) return b;
  return a;
}

__device__ ArgMax block_argmax(ArgMax a, ArgMax* scratch) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ArgMax b{__shfl_xor_sync(0xffffffffu, a.v, o), __shfl_xor_sync(0xffffffffu, a.i, o)};
    a = better(a, b);
  }
  __syncthreads();
  if (lane == 0) scratch[warp] = a;
  __syncthreads();
  a = lane < kThreads / 32 ? scratch[lane] : ArgMax{-INFINITY, 0x7fffffff};
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    ArgMax b{__shfl_xor_sync(0xffffffffu, a.v, o), __shfl_xor_sync(0xffffffffu, a.i, o)};
    a = better(a, b);
  }
  return a;
}

// engine::penalized_logit: one fused multiply-add, as on the host.
__device__ __forceinline__ float penalized(float logit, int count, const SampleParams& sp) {
  if (sp.repetition_penalty != 1.0f) {
    logit = logit > 0.0f ? __fdiv_rn(logit, sp.repetition_penalty) : __fmul_rn(logit, sp.repetition_penalty);
  }
  if (count > 0) logit = __fsub_rn(logit, __fmaf_rn(sp.frequency_penalty, static_cast<float>(count), sp.presence_penalty));
  return logit;
}

bool __device__ __forceinline__ has_penalties(const SampleParams& sp) {
  return sp.frequency_penalty != 0.0f || sp.presence_penalty != 0.0f || sp.repetition_penalty != 1.0f;
}

// Each listed token's logit once (the ids are distinct); the input token, when it counts and is
// not listed, after them.
__device__ void apply_penalties(float* x, int vocab, const SampleParams& sp, const int32_t* input_ids) {
  __shared__ int listed;
  int32_t extra = sp.input_row >= 0 && input_ids ? input_ids[sp.input_row] : -1;
  if (extra >= vocab) extra = -1;
  if (threadIdx.x == 0) listed = 0;
  __syncthreads();
  for (int e = threadIdx.x; e < sp.num_penalty_tokens; e += kThreads) {
    const PenaltyToken p = sp.penalty_tokens[e];
    if (p.token < 0 || p.token >= vocab) continue;
    const bool is_extra = p.token == extra;
    if (is_extra) listed = 1;
    x[p.token] = penalized(x[p.token], p.count + (is_extra ? 1 : 0), sp);
  }
  __syncthreads();
  if (threadIdx.x == 0 && extra >= 0 && !listed) x[extra] = penalized(x[extra], 1, sp);
  __syncthreads();
}

// The row's chosen token (known to thread 0) and, when asked, log probabilities: the sampled
// token's, then the top k found one by one, each the best of the tokens ranked below the one
// before (value descending, id ascending; NaN never). Every thread of the block calls it.
__device__ void emit(const float* x, int vocab, float mx, const SampleParams& sp, int32_t token, int row,
                     int32_t* tokens, TokenLogprobs* logprobs, float* scratch, ArgMax* am_scratch) {
  if (sp.logprobs >= 0 && logprobs) {
    TokenLogprobs* out = logprobs + row;
    // An infinite maximum (+inf, or every logit -inf) is shared by the tokens that have it.
    const bool inf_max = isinf(mx);
    float s = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      if (!isnan(x[i])) s += inf_max ? (x[i] == mx ? 1.0f : 0.0f) : expf(x[i] - mx);
    }
    s = internal::block_sum(s, scratch);
    const float lse = inf_max ? logf(s) : mx + logf(s);
    auto logprob = [&](float v) { return inf_max ? (v == mx ? -lse : -INFINITY) : v - lse; };
    if (threadIdx.x == 0) out->logprob = token >= 0 && token < vocab ? logprob(x[token]) : -INFINITY;
    const int k = min(static_cast<int>(sp.logprobs), kMaxTopLogprobs);
    ArgMax prev{INFINITY, -1};
    int found = 0;
    for (; found < k; ++found) {
      ArgMax b{-INFINITY, 0x7fffffff};
      for (int i = threadIdx.x; i < vocab; i += kThreads) {
        const float v = x[i];
        if (v < prev.v || (v == prev.v && i > prev.i)) b = better(b, ArgMax{v, i});
      }
      b = block_argmax(b, am_scratch);
      if (b.i >= vocab) break;
      if (threadIdx.x == 0) {
        out->top_ids[found] = b.i;
        out->top_logprobs[found] = logprob(b.v);
      }
      prev = b;
    }
    if (threadIdx.x == 0) out->num_top = found;
  }
  if (threadIdx.x == 0) tokens[row] = token;
}

__global__ void __launch_bounds__(kThreads) sample_kernel(float* logits, int vocab, const SampleParams* params,
                                                          const int32_t* input_ids, int32_t* tokens,
                                                          TokenLogprobs* logprobs) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  __shared__ float scratch[32];
  __shared__ ArgMax am_scratch[32];
  __shared__ float chunk_sums[kThreads];
  const int row = blockIdx.x;
  float* x = logits + static_cast<size_t>(row) * vocab;
  const SampleParams sp = params[row];
  if (has_penalties(sp)) apply_penalties(x, vocab, sp, input_ids);
  if (sp.num_logit_bias > 0) {
    for (int e = threadIdx.x; e < sp.num_logit_bias; e += kThreads) {
      const LogitBias b = sp.logit_bias[e];
      if (b.token >= 0 && b.token < vocab) x[b.token] += b.bias;
    }
    __syncthreads();
  }

  ArgMax best{-INFINITY, 0x7fffffff};
  float lo_z = INFINITY;
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    best = better(best, ArgMax{x[i], i});
    if (x[i] > -INFINITY) lo_z = fminf(lo_z, x[i]);  // the least finite logit (NaN fails too)
  }
  best = block_argmax(best, am_scratch);
  if (best.i >= vocab) {
    // No logit compares (all NaN): no token. The host ends the sequence in an error.
    if (threadIdx.x == 0) {
      tokens[row] = -1;
      if (sp.logprobs >= 0 && logprobs) {
        logprobs[row].logprob = NAN;
        logprobs[row].num_top = 0;
      }
    }
    return;
  }
  // +inf outweighs everything: its probability is 1 at any temperature. A -inf maximum leaves
  // nothing to weigh (all tokens banned): the lowest id, as greedy. NaN temperature: greedy.
  if (!(sp.temperature > 0.0f) || sp.top_k == 1 || best.v == INFINITY || best.v == -INFINITY) {
    emit(x, vocab, best.v, sp, best.i, row, tokens, logprobs, scratch, am_scratch);
    return;
  }
  const float mx = best.v;
  const float inv_t = 1.0f / sp.temperature;
  // z = (logit - max) / T <= 0. The kept set is {z >= tau}.
  float tau = -INFINITY;
  if (sp.top_k > 1 && sp.top_k < vocab) {
    float lo = -internal::block_max(-lo_z, scratch);  // min logit: every token kept
    float hi = mx;
    for (int it = 0; it < kBisections; ++it) {
      const float mid = 0.5f * (lo + hi);
      float cnt = 0.0f;
      for (int i = threadIdx.x; i < vocab; i += kThreads) cnt += x[i] >= mid ? 1.0f : 0.0f;
      cnt = internal::block_sum(cnt, scratch);
      if (cnt >= static_cast<float>(sp.top_k)) lo = mid; else hi = mid;
    }
    tau = lo;  // count(logit >= lo) >= k
  }
  auto mass_above = [&](float t) {
    float s = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      if (x[i] >= t) s += __expf((x[i] - mx) * inv_t);
    }
    return internal::block_sum(s, scratch);
  };
  const float total = mass_above(tau);
  if (sp.top_p < 1.0f) {
    const float target = sp.top_p * total;
    float lo = tau == -INFINITY ? -internal::block_max(-lo_z, scratch) : tau;
    float hi = mx;
    for (int it = 0; it < kBisections; ++it) {
      const float mid = 0.5f * (lo + hi);
      if (mass_above(mid) >= target) lo = mid; else hi = mid;
    }
    tau = lo;
  }
  // Walk the kept tokens in id order: each thread sums one contiguous chunk, the chunk holding
  // the draw is found from the chunks' prefix sums, and its thread scans it.
  const int chunk = (vocab + kThreads - 1) / kThreads;
  const int begin = threadIdx.x * chunk, end = min(vocab, begin + chunk);
  float s = 0.0f;
  for (int i = begin; i < end; ++i) {
    if (x[i] >= tau) s += __expf((x[i] - mx) * inv_t);
  }
  chunk_sums[threadIdx.x] = s;
  __syncthreads();
  int32_t pick = best.i;
  if (threadIdx.x == 0) {
    float kept = 0.0f;
    int last = 0;  // the last chunk with weight: rounding left over past it lands there
    for (int c = 0; c < kThreads; ++c) {
      kept += chunk_sums[c];
      if (chunk_sums[c] > 0.0f) last = c;
    }
    const double u01 = static_cast<double>(internal::splitmix64(sp.random) >> 11) * 0x1.0p-53;
    float u = static_cast<float>(u01) * kept;
    int c = 0;
    while (c < last && (chunk_sums[c] < u || chunk_sums[c] == 0.0f)) {
      u -= chunk_sums[c];
      ++c;
    }
    // The last token of weight in that chunk, unless the prefix reaches u sooner. A token of no
    // weight (-inf, or too unlikely for a float) is never drawn.
    const int cb = c * chunk, ce = min(vocab, cb + chunk);
    for (int i = cb; i < ce; ++i) {
      if (!(x[i] >= tau)) continue;  // NaN too, as in the sums above
      const float w = __expf((x[i] - mx) * inv_t);
      if (!(w > 0.0f)) continue;
      pick = i;
      u -= w;
      if (u <= 0.0f) break;
    }
  }
  emit(x, vocab, best.v, sp, pick, row, tokens, logprobs, scratch, am_scratch);
}

}  // namespace

cudaError_t sample_tokens(float* logits, int num_rows, int vocab, const SampleParams* params,
                          const int32_t* input_ids, int32_t* tokens, TokenLogprobs* logprobs,
                          cudaStream_t stream) {
  if (num_rows < 0 || vocab <= 0 || !logits || !params || !tokens) return cudaErrorInvalidValue;
  if (num_rows == 0) return cudaSuccess;
  return internal::launch(sample_kernel, dim3(num_rows), dim3(kThreads), 0, stream, logits, vocab, params,
                          input_ids, tokens, logprobs);
}

}  // namespace hr::kernels
