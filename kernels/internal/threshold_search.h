// The threshold search behind top-k, top-p and the log-probability alternatives: the largest value
// t of a row such that the tokens at or above t weigh at least `need` (count, or probability
// mass). Plain C++ that also compiles as device code, so that host tests check the search itself;
// the sampling kernel supplies a probe that makes one block-wide pass over its row.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define HR_HOST_DEVICE __host__ __device__
#else
#define HR_HOST_DEVICE
#endif

namespace hr::kernels::internal {

// What one pass over a row tells about a threshold t. NaN counts nowhere.
struct Probe {
  float weight = 0.0f;             // of the values >= t
  float least_at_or_above = 0.0f;  // min {x : x >= t}; +inf when none
  float greatest_below = 0.0f;     // max {x : x < t}; -inf when none
};

// Probes after which the midpoint is taken between the bounds' bit patterns rather than their
// values: value halving finds ordinary logits' thresholds soonest, bit halving bounds the search
// (32 more probes at most) whatever the range.
constexpr int kValueHalvings = 24;

// The order-preserving key of a float (not NaN), and back.
HR_HOST_DEVICE inline uint32_t float_key(float f) {
  uint32_t u;
#if defined(__CUDA_ARCH__)
  u = __float_as_uint(f);
#else
  std::memcpy(&u, &f, sizeof u);
#endif
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

HR_HOST_DEVICE inline float key_float(uint32_t k) {
  const uint32_t u = (k & 0x80000000u) ? (k & 0x7fffffffu) : ~k;
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
#endif
}

// The largest value t of the row with probe(t).weight >= need, given `lo`, a value of the row
// whose probe meets `need`, and `top`, the row's largest value (both finite). The weight must not
// grow with t. Each probe lands strictly between two values of the row and moves a bound onto a
// value, so the search ends as soon as no value lies between the bounds, and never takes more
// than kValueHalvings + 32 probes. `probes` (may be null) counts them.
template <typename ProbeFn>
HR_HOST_DEVICE float highest_threshold(float lo, float top, float need, ProbeFn&& probe,
                                       int* probes = nullptr) {
  // Adding +0 makes -0 +0: fminf and fmaxf may give either zero when both meet, so lanes that
  // reduced in different orders agree on the bounds' bits (the bit halving reads them).
  lo += 0.0f;
  float hi = top + 0.0f;  // the largest value not yet known to fall short
  int n = 0;
  while (hi > lo) {
    float mid;
    if (n < kValueHalvings) {
      mid = 0.5f * lo + 0.5f * hi;  // no overflow; in [lo, hi]
    } else {
      const uint32_t klo = float_key(lo), khi = float_key(hi);
      mid = key_float(klo + (khi - klo + 1u) / 2u);  // in (lo, hi] as keys
    }
    if (!(mid > lo)) mid = hi;  // adjacent floats, or -0.0 and +0.0
    const Probe p = probe(mid);
    ++n;
    if (p.weight >= need) {
      lo = p.least_at_or_above + 0.0f;  // the same tokens as at mid
    } else {
      hi = p.greatest_below + 0.0f;  // >= lo, which lies below mid
    }
  }
  if (probes) *probes = n;
  return lo;
}

}  // namespace hr::kernels::internal
