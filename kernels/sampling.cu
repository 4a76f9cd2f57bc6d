// Sampling: block-wide argmax, threshold searches (internal/threshold_search.h), and an id-ordered
// prefix walk.
#include "kernels/internal/common.cuh"
#include "kernels/internal/threshold_search.h"
#include "kernels/sampling.cuh"

namespace hr::kernels {
namespace {

constexpr int kThreads = 1024;
// Log-probability alternatives at or above their threshold are ranked in shared memory; a row
// with more than this many (ties at the threshold) ranks them a pass per alternative instead.
constexpr int kMaxCandidates = 256;

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
    logit = logit > 0.0f ? __fdiv_rn(logit, sp.repetition_penalty)
                         : __fmul_rn(logit, sp.repetition_penalty);
  }
  if (count > 0)
    logit = __fsub_rn(
        logit, __fmaf_rn(sp.frequency_penalty, static_cast<float>(count), sp.presence_penalty));
  return logit;
}

bool __device__ __forceinline__ has_penalties(const SampleParams& sp) {
  return sp.frequency_penalty != 0.0f || sp.presence_penalty != 0.0f ||
         sp.repetition_penalty != 1.0f;
}

// Each listed token's logit once (the ids are distinct); the input token, when it counts and is
// not listed, after them.
__device__ void apply_penalties(float* x, int vocab, const SampleParams& sp,
                                const int32_t* input_ids) {
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

// A block's reduction scratch.
struct Scratch {
  float sum[32];
  float least[32];
  float greatest[32];
  ArgMax am[32];
};

// A probe's three reductions over the block at once; every thread gets the same result (each
// butterfly step adds the same two values on both lanes).
__device__ internal::Probe block_probe(internal::Probe p, Scratch& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  p.weight = internal::warp_sum(p.weight);
  p.least_at_or_above = -internal::warp_max(-p.least_at_or_above);
  p.greatest_below = internal::warp_max(p.greatest_below);
  __syncthreads();  // scratch may still be read by a previous call
  if (lane == 0) {
    s.sum[warp] = p.weight;
    s.least[warp] = p.least_at_or_above;
    s.greatest[warp] = p.greatest_below;
  }
  __syncthreads();
  const bool in = lane < kThreads / 32;
  p.weight = internal::warp_sum(in ? s.sum[lane] : 0.0f);
  p.least_at_or_above = -internal::warp_max(in ? -s.least[lane] : -INFINITY);
  p.greatest_below = internal::warp_max(in ? s.greatest[lane] : -INFINITY);
  return p;
}

// One pass over the row at threshold t: the tokens at or above it (how many, or with kMass their
// weight exp((x - mx) * inv_t), as the draw weighs them), the least of them and the greatest
// logit below. NaN counts nowhere.
template <bool kMass>
__device__ internal::Probe probe_row(const float* x, int vocab, float t, float mx, float inv_t,
                                     Scratch& s) {
  internal::Probe p{0.0f, INFINITY, -INFINITY};
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = x[i];
    if (v >= t) {
      p.weight += kMass ? __expf((v - mx) * inv_t) : 1.0f;
      p.least_at_or_above = fminf(p.least_at_or_above, v);
    } else if (v < t) {
      p.greatest_below = fmaxf(p.greatest_below, v);
    }
  }
  return block_probe(p, s);
}

// Inclusive prefix sums over the block in thread order (a fixed order: same inputs, same sums).
// `totals` holds 32 floats.
__device__ float block_inclusive_scan(float v, float* totals) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  v = internal::warp_inclusive_scan(v);
  __syncthreads();
  if (lane == 31) totals[warp] = v;
  __syncthreads();
  if (warp == 0)
    totals[lane] = internal::warp_inclusive_scan(lane < kThreads / 32 ? totals[lane] : 0.0f);
  __syncthreads();
  return warp > 0 ? v + totals[warp - 1] : v;
}

// Ranks before: value descending, id ascending.
__device__ __forceinline__ bool ranks_before(ArgMax a, ArgMax b) {
  return a.v > b.v || (a.v == b.v && a.i < b.i);
}

// The row's chosen token (known to thread 0) and, when asked, log probabilities: the sampled
// token's, then the top k (value descending, id ascending; NaN never). `fin` holds the number of
// finite logits and the least of them, reduced over the block whenever alternatives are asked.
// Every thread of the block calls it.
__device__ void emit(const float* x, int vocab, float mx, internal::Probe fin,
                     const SampleParams& sp, int32_t token, int row, int32_t* tokens,
                     TokenLogprobs* logprobs, Scratch& scratch) {
  __shared__ int num_candidates;
  __shared__ ArgMax candidates[kMaxCandidates];
  if (sp.logprobs >= 0 && logprobs) {
    TokenLogprobs* out = logprobs + row;
    // An infinite maximum (+inf, or every logit -inf) is shared by the tokens that have it.
    const bool inf_max = isinf(mx);
    float s = 0.0f;
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      if (!isnan(x[i])) s += inf_max ? (x[i] == mx ? 1.0f : 0.0f) : expf(x[i] - mx);
    }
    s = internal::block_sum(s, scratch.sum);
    const float lse = inf_max ? logf(s) : mx + logf(s);
    auto logprob = [&](float v) { return inf_max ? (v == mx ? -lse : -INFINITY) : v - lse; };
    if (threadIdx.x == 0)
      out->logprob = token >= 0 && token < vocab ? logprob(x[token]) : -INFINITY;
    const int k = min(static_cast<int>(sp.logprobs), kMaxTopLogprobs);
    int found = 0;
    bool ranked = false;
    if (k > 0 && !inf_max && fin.weight >= static_cast<float>(k)) {
      // The k-th largest logit, then every token at or above it gathered and ranked in shared
      // memory: a few passes instead of one per alternative.
      const float t = internal::highest_threshold(
          fin.least_at_or_above, mx, static_cast<float>(k),
          [&](float v) { return probe_row<false>(x, vocab, v, mx, 1.0f, scratch); });
      if (threadIdx.x == 0) num_candidates = 0;
      __syncthreads();
      for (int i = threadIdx.x; i < vocab; i += kThreads) {
        if (x[i] >= t) {
          const int slot = atomicAdd(&num_candidates, 1);
          if (slot < kMaxCandidates) candidates[slot] = ArgMax{x[i], i};
        }
      }
      __syncthreads();
      const int m = num_candidates;  // >= k
      if (m <= kMaxCandidates) {
        for (int j = threadIdx.x; j < m; j += kThreads) {
          const ArgMax c = candidates[j];
          int rank = 0;
          for (int q = 0; q < m; ++q) rank += ranks_before(candidates[q], c) ? 1 : 0;
          if (rank < k) {
            out->top_ids[rank] = c.i;
            out->top_logprobs[rank] = logprob(c.v);
          }
        }
        found = k;
        ranked = true;
      }
    }
    if (!ranked) {
      // Infinities, fewer finite logits than alternatives, or more ties at the threshold than
      // shared memory holds: each alternative the best of the tokens ranked below the one before.
      ArgMax prev{INFINITY, -1};
      for (; found < k; ++found) {
        ArgMax b{-INFINITY, 0x7fffffff};
        for (int i = threadIdx.x; i < vocab; i += kThreads) {
          const float v = x[i];
          if (v < prev.v || (v == prev.v && i > prev.i)) b = better(b, ArgMax{v, i});
        }
        b = block_argmax(b, scratch.am);
        if (b.i >= vocab) break;
        if (threadIdx.x == 0) {
          out->top_ids[found] = b.i;
          out->top_logprobs[found] = logprob(b.v);
        }
        prev = b;
      }
    }
    if (threadIdx.x == 0) out->num_top = found;
  }
  if (threadIdx.x == 0) tokens[row] = token;
}

__global__ void __launch_bounds__(kThreads)
    sample_kernel(float* logits, int vocab, const SampleParams* params, const int32_t* input_ids,
                  int32_t* tokens, TokenLogprobs* logprobs) {
  internal::pdl_launch_dependents();
  internal::pdl_wait();
  __shared__ Scratch scratch;
  __shared__ float chunk_ends[kThreads];
  __shared__ int first_reaching, last_weighted;
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
  if (sp.allowed) {
    for (int i = threadIdx.x; i < vocab; i += kThreads) {
      if (!((sp.allowed[i >> 5] >> (i & 31)) & 1u)) x[i] = -INFINITY;
    }
    __syncthreads();
  }

  ArgMax best{-INFINITY, 0x7fffffff};
  internal::Probe fin{0.0f, INFINITY, -INFINITY};  // the finite logits: how many, and the least
  for (int i = threadIdx.x; i < vocab; i += kThreads) {
    const float v = x[i];
    best = better(best, ArgMax{v, i});
    if (isfinite(v)) {
      fin.weight += 1.0f;
      fin.least_at_or_above = fminf(fin.least_at_or_above, v);
    }
  }
  best = block_argmax(best, scratch.am);
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
  // nothing to weigh (all tokens banned): the lowest id, as greedy. A NaN temperature, or one so
  // small that its inverse overflows (the maximum alone has weight then): greedy.
  const float inv_t = 1.0f / sp.temperature;
  const bool draw = sp.temperature > 0.0f && isfinite(sp.temperature) && isfinite(inv_t) &&
                    sp.top_k != 1 && isfinite(best.v);
  if (draw || (sp.logprobs > 0 && logprobs)) fin = block_probe(fin, scratch);
  if (!draw) {
    emit(x, vocab, best.v, fin, sp, best.i, row, tokens, logprobs, scratch);
    return;
  }
  const float mx = best.v, lo_z = fin.least_at_or_above;
  auto count = [&](float t) { return probe_row<false>(x, vocab, t, mx, inv_t, scratch); };
  auto mass = [&](float t) { return probe_row<true>(x, vocab, t, mx, inv_t, scratch); };
  // The kept set is {logit >= tau}: ties at the threshold are all kept.
  float tau = -INFINITY;
  if (sp.top_k > 1 && sp.top_k < vocab) {
    const float k = static_cast<float>(sp.top_k);
    tau = fin.weight >= k ? internal::highest_threshold(lo_z, mx, k, count) : lo_z;
  }
  if (sp.top_p < 1.0f) {
    const float lo = tau == -INFINITY ? lo_z : tau;
    tau = internal::highest_threshold(lo, mx, sp.top_p * mass(lo).weight, mass);
  }
  // Walk the kept tokens in id order: each thread sums one contiguous chunk, a scan of the chunk
  // sums finds the first chunk with weight whose end reaches the draw, and warp 0 walks that
  // chunk 32 tokens at a time.
  const int chunk = (vocab + kThreads - 1) / kThreads;
  const int begin = min(vocab, static_cast<int>(threadIdx.x) * chunk),
            end = min(vocab, begin + chunk);
  float s = 0.0f;
  for (int i = begin; i < end; ++i) {
    if (x[i] >= tau) s += __expf((x[i] - mx) * inv_t);
  }
  const float reach = block_inclusive_scan(s, scratch.sum);
  chunk_ends[threadIdx.x] = reach;
  if (threadIdx.x == 0) {
    first_reaching = kThreads;
    last_weighted = -1;
  }
  __syncthreads();
  const double u01 = static_cast<double>(internal::splitmix64(sp.random) >> 11) * 0x1.0p-53;
  const float u = static_cast<float>(u01) * chunk_ends[kThreads - 1];
  if (s > 0.0f) {
    atomicMax(&last_weighted, static_cast<int>(threadIdx.x));
    if (reach >= u) atomicMin(&first_reaching, static_cast<int>(threadIdx.x));
  }
  __syncthreads();
  // Rounding may leave the draw past every chunk's end: the last chunk with weight takes it. The
  // maximum's chunk always has weight (exp(0) at a finite temperature); were none to, the maximum.
  const int c = first_reaching < kThreads ? first_reaching : last_weighted;
  int32_t pick = best.i;
  if (threadIdx.x < 32 && c >= 0) {
    // The first token of weight whose prefix reaches the draw, else the chunk's last token of
    // weight. A token of no weight (-inf, or too unlikely for a float) is never drawn.
    const int lane = threadIdx.x;
    float left = u - (c > 0 ? chunk_ends[c - 1] : 0.0f);
    const int cb = c * chunk, ce = min(vocab, cb + chunk);
    for (int base = cb; base < ce; base += 32) {
      const int i = base + lane;
      const float v = i < ce ? x[i] : -INFINITY;
      const float w = v >= tau ? __expf((v - mx) * inv_t) : 0.0f;  // NaN weighs nothing, as above
      const float prefix = internal::warp_inclusive_scan(w);
      const unsigned reached = __ballot_sync(0xffffffffu, w > 0.0f && prefix >= left);
      if (reached) {
        pick = base + __ffs(reached) - 1;
        break;
      }
      const unsigned weighted = __ballot_sync(0xffffffffu, w > 0.0f);
      if (weighted) pick = base + 31 - __clz(weighted);
      left -= __shfl_sync(0xffffffffu, prefix, 31);
    }
  }
  emit(x, vocab, mx, fin, sp, pick, row, tokens, logprobs, scratch);
}

}  // namespace

cudaError_t sample_tokens(float* logits, int num_rows, int vocab, const SampleParams* params,
                          const int32_t* input_ids, int32_t* tokens, TokenLogprobs* logprobs,
                          cudaStream_t stream) {
  if (num_rows < 0 || vocab <= 0 || !logits || !params || !tokens) return cudaErrorInvalidValue;
  if (num_rows == 0) return cudaSuccess;
  return internal::launch(sample_kernel, dim3(num_rows), dim3(kThreads), 0, stream, logits, vocab,
                          params, input_ids, tokens, logprobs);
}

}  // namespace hr::kernels
