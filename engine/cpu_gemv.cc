// GEMV kernels, one per instruction-set level, picked at run time. The AVX functions are compiled
// for their own target (function attributes) so the rest of the build stays generic x86-64; they
// only run after __builtin_cpu_supports says the CPU (and OS) has the instructions.
#include "engine/cpu_gemv.h"

#include "base/check.h"

#include <algorithm>

#if defined(__x86_64__)
#define HR_GEMV_X86 1
#define HR_GEMV_X86_ONLY(e) (e)
#include <immintrin.h>
#else
#define HR_GEMV_X86_ONLY(e) false
#endif

namespace hr::engine {
namespace {

// Plain C++: each x row against the weight row in turn (the row is in L1 after the first), with
// eight partial sums that the compiler keeps in vector registers.
void gemv_scalar(const GemvProblem& p, int row_begin, int row_end) {
  const int k = p.k;
  const int k8 = k & ~7;
  for (int r = row_begin; r < row_end; ++r) {
    const float* w = p.w + static_cast<size_t>(r) * k;
    for (int i = 0; i < p.m; ++i) {
      const float* x = p.x + static_cast<size_t>(i) * k;
      float acc[8] = {};
      for (int j = 0; j < k8; j += 8) {
        for (int q = 0; q < 8; ++q) acc[q] += w[j + q] * x[j + q];
      }
      float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      for (int j = k8; j < k; ++j) s += w[j] * x[j];
      float& out = p.y[static_cast<size_t>(i) * p.n + r];
      out = p.accumulate ? out + s : s;
    }
  }
}

float sum_scalar(const float* p, size_t n) {
  float acc[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int q = 0; q < 8; ++q) acc[q] += p[i + q];
  }
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < n; ++i) s += p[i];
  return s;
}

#if HR_GEMV_X86
#if defined(__GNUC__) && !defined(__clang__)
// GCC 12's AVX-512 intrinsics (_mm512_reduce_add_ps, the 512-to-256 casts) start from
// _mm256_undefined_*(), which -Wuninitialized reports wherever they inline: a false positive.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

__attribute__((target("avx2,fma"))) inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Two independent FMA chains per x row (16 floats of w per step), then 8, then a scalar tail. With
// more than 4 x rows one chain each, so that the accumulators fit AVX2's 16 registers.
template <int M>
__attribute__((target("avx2,fma"))) void gemv_avx2(const GemvProblem& p, int row_begin,
                                                   int row_end) {
  constexpr int U = M > 4 ? 1 : 2;
  const int k = p.k;
  const int k_steps = k & ~(8 * U - 1);
  const int k8 = k & ~7;
  for (int r = row_begin; r < row_end; ++r) {
    const float* w = p.w + static_cast<size_t>(r) * k;
    __m256 acc[M][U];
    for (int i = 0; i < M; ++i) {
      for (int u = 0; u < U; ++u) acc[i][u] = _mm256_setzero_ps();
    }
    int j = 0;
    for (; j < k_steps; j += 8 * U) {
      for (int u = 0; u < U; ++u) {
        __m256 wv = _mm256_loadu_ps(w + j + 8 * u);
        for (int i = 0; i < M; ++i) {
          const float* x = p.x + static_cast<size_t>(i) * k + j + 8 * u;
          acc[i][u] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x), acc[i][u]);
        }
      }
    }
    if (j < k8) {
      __m256 wv = _mm256_loadu_ps(w + j);
      for (int i = 0; i < M; ++i) {
        acc[i][0] =
            _mm256_fmadd_ps(wv, _mm256_loadu_ps(p.x + static_cast<size_t>(i) * k + j), acc[i][0]);
      }
      j += 8;
    }
    for (int i = 0; i < M; ++i) {
      const float* x = p.x + static_cast<size_t>(i) * k;
      __m256 sum = acc[i][0];
      for (int u = 1; u < U; ++u) sum = _mm256_add_ps(sum, acc[i][u]);
      float s = hsum_avx2(sum);
      for (int t = j; t < k; ++t) s += w[t] * x[t];
      float& out = p.y[static_cast<size_t>(i) * p.n + r];
      out = p.accumulate ? out + s : s;
    }
  }
}

// Two independent FMA chains per x row (32 floats of w per step), then 16, then a masked tail.
template <int M>
__attribute__((target("avx512f,avx2,fma"))) void gemv_avx512(const GemvProblem& p, int row_begin,
                                                             int row_end) {
  const int k = p.k;
  const int k32 = k & ~31;
  const int k16 = k & ~15;
  const __mmask16 tail = static_cast<__mmask16>((1u << (k & 15)) - 1);
  for (int r = row_begin; r < row_end; ++r) {
    const float* w = p.w + static_cast<size_t>(r) * k;
    __m512 acc[M][2];
    for (int i = 0; i < M; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    int j = 0;
    for (; j < k32; j += 32) {
      __m512 w0 = _mm512_loadu_ps(w + j);
      __m512 w1 = _mm512_loadu_ps(w + j + 16);
      for (int i = 0; i < M; ++i) {
        const float* x = p.x + static_cast<size_t>(i) * k + j;
        acc[i][0] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x), acc[i][0]);
        acc[i][1] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + 16), acc[i][1]);
      }
    }
    if (j < k16) {
      __m512 w0 = _mm512_loadu_ps(w + j);
      for (int i = 0; i < M; ++i) {
        acc[i][0] =
            _mm512_fmadd_ps(w0, _mm512_loadu_ps(p.x + static_cast<size_t>(i) * k + j), acc[i][0]);
      }
      j += 16;
    }
    if (tail) {
      __m512 w0 = _mm512_maskz_loadu_ps(tail, w + j);
      for (int i = 0; i < M; ++i) {
        __m512 x = _mm512_maskz_loadu_ps(tail, p.x + static_cast<size_t>(i) * k + j);
        acc[i][1] = _mm512_fmadd_ps(w0, x, acc[i][1]);
      }
    }
    for (int i = 0; i < M; ++i) {
      float s = _mm512_reduce_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]));
      float& out = p.y[static_cast<size_t>(i) * p.n + r];
      out = p.accumulate ? out + s : s;
    }
  }
}

// A register tile of MR x rows by NR weight rows: MR*NR accumulators, and per 16 floats of k only
// MR + NR loads for MR*NR FMAs, so the FMAs rather than the loads set the pace (a GEMV tile has
// one load per FMA). The caller keeps the weight rows of a block in cache across x-row groups.
template <int MR, int NR>
__attribute__((target("avx512f,avx2,fma"))) void tile_avx512(const GemvProblem& p, int i0,
                                                             int r0) {
  const int k = p.k;
  const int k16 = k & ~15;
  const __mmask16 tail = static_cast<__mmask16>((1u << (k & 15)) - 1);
  __m512 acc[MR][NR];
  for (int i = 0; i < MR; ++i) {
    for (int c = 0; c < NR; ++c) acc[i][c] = _mm512_setzero_ps();
  }
  const float* x = p.x + static_cast<size_t>(i0) * k;
  const float* w = p.w + static_cast<size_t>(r0) * k;
  for (int j = 0; j < k16; j += 16) {
    __m512 wv[NR];
    for (int c = 0; c < NR; ++c) wv[c] = _mm512_loadu_ps(w + static_cast<size_t>(c) * k + j);
    for (int i = 0; i < MR; ++i) {
      __m512 xv = _mm512_loadu_ps(x + static_cast<size_t>(i) * k + j);
      for (int c = 0; c < NR; ++c) acc[i][c] = _mm512_fmadd_ps(wv[c], xv, acc[i][c]);
    }
  }
  if (tail) {
    __m512 wv[NR];
    for (int c = 0; c < NR; ++c) {
      wv[c] = _mm512_maskz_loadu_ps(tail, w + static_cast<size_t>(c) * k + k16);
    }
    for (int i = 0; i < MR; ++i) {
      __m512 xv = _mm512_maskz_loadu_ps(tail, x + static_cast<size_t>(i) * k + k16);
      for (int c = 0; c < NR; ++c) acc[i][c] = _mm512_fmadd_ps(wv[c], xv, acc[i][c]);
    }
  }
  for (int i = 0; i < MR; ++i) {
    for (int c = 0; c < NR; ++c) {
      float s = _mm512_reduce_add_ps(acc[i][c]);
      float& out = p.y[static_cast<size_t>(i0 + i) * p.n + r0 + c];
      out = p.accumulate ? out + s : s;
    }
  }
}

// x rows [i0, i0 + MR) against weight rows [r0, r1), NR at a time.
template <int MR>
__attribute__((target("avx512f,avx2,fma"))) void tile_rows_avx512(const GemvProblem& p, int i0,
                                                                  int r0, int r1) {
  int r = r0;
  for (; r + 3 <= r1; r += 3) tile_avx512<MR, 3>(p, i0, r);
  for (; r < r1; ++r) tile_avx512<MR, 1>(p, i0, r);
}

__attribute__((target("avx2,fma"))) float sum_avx2(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  float s = hsum_avx2(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  for (; i < n; ++i) s += p[i];
  return s;
}

__attribute__((target("avx512f,avx2,fma"))) float sum_avx512(const float* p, size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_loadu_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_loadu_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_loadu_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_loadu_ps(p + i + 48));
  }
  float s = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
  for (; i < n; ++i) s += p[i];
  return s;
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // HR_GEMV_X86

SimdLevel detect_simd_level() {
#if HR_GEMV_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return SimdLevel::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SimdLevel::kAvx2;
#endif
  return SimdLevel::kScalar;
}

#if HR_GEMV_X86
template <int M>
void gemv_simd(const GemvProblem& p, int row_begin, int row_end, SimdLevel level) {
  if (level == SimdLevel::kAvx512) return gemv_avx512<M>(p, row_begin, row_end);
  return gemv_avx2<M>(p, row_begin, row_end);
}
#endif

}  // namespace

SimdLevel cpu_simd_level() {
  static const SimdLevel level = detect_simd_level();
  return level;
}

const char* simd_level_name(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return "avx512";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kScalar:
      return "scalar";
  }
  return "?";
}

bool gemm_tiles_supported() { return HR_GEMV_X86_ONLY(cpu_simd_level() == SimdLevel::kAvx512); }

void gemm_tiles(const GemvProblem& p, int row_begin, int row_end) {
  HR_CHECK(gemm_tiles_supported()) << "gemm_tiles needs AVX-512";
#if HR_GEMV_X86
  // Weight rows in blocks that stay in L2 while every group of 8 x rows passes over them.
  const int block = std::max(3, static_cast<int>((96 << 10) / (sizeof(float) * p.k)) / 3 * 3);
  for (int b0 = row_begin; b0 < row_end; b0 += block) {
    int b1 = std::min(row_end, b0 + block);
    int i = 0;
    for (; i + 8 <= p.m; i += 8) tile_rows_avx512<8>(p, i, b0, b1);
    switch (p.m - i) {
      case 1: tile_rows_avx512<1>(p, i, b0, b1); break;
      case 2: tile_rows_avx512<2>(p, i, b0, b1); break;
      case 3: tile_rows_avx512<3>(p, i, b0, b1); break;
      case 4: tile_rows_avx512<4>(p, i, b0, b1); break;
      case 5: tile_rows_avx512<5>(p, i, b0, b1); break;
      case 6: tile_rows_avx512<6>(p, i, b0, b1); break;
      case 7: tile_rows_avx512<7>(p, i, b0, b1); break;
      default: break;
    }
  }
#else
  (void)p;
  (void)row_begin;
  (void)row_end;
#endif
}

void gemv_rows(const GemvProblem& p, int row_begin, int row_end, SimdLevel level) {
  HR_CHECK(static_cast<int>(level) <= static_cast<int>(cpu_simd_level()))
      << simd_level_name(level) << " is not supported by this CPU";
  HR_CHECK(p.m >= 1 && p.m <= kMaxGemvM) << "m=" << p.m;
#if HR_GEMV_X86
  if (level != SimdLevel::kScalar) {
    switch (p.m) {
      case 1:
        return gemv_simd<1>(p, row_begin, row_end, level);
      case 2:
        return gemv_simd<2>(p, row_begin, row_end, level);
      case 3:
        return gemv_simd<3>(p, row_begin, row_end, level);
      case 4:
        return gemv_simd<4>(p, row_begin, row_end, level);
      case 5:
        return gemv_simd<5>(p, row_begin, row_end, level);
      case 6:
        return gemv_simd<6>(p, row_begin, row_end, level);
      case 7:
        return gemv_simd<7>(p, row_begin, row_end, level);
      case 8:
        return gemv_simd<8>(p, row_begin, row_end, level);
    }
  }
#endif
  gemv_scalar(p, row_begin, row_end);
}

float sum_floats(const float* p, size_t n, SimdLevel level) {
  HR_CHECK(static_cast<int>(level) <= static_cast<int>(cpu_simd_level()))
      << simd_level_name(level) << " is not supported by this CPU";
  switch (level) {
#if HR_GEMV_X86
    case SimdLevel::kAvx512:
      return sum_avx512(p, n);
    case SimdLevel::kAvx2:
      return sum_avx2(p, n);
#endif
    default:
      return sum_scalar(p, n);
  }
}

}  // namespace hr::engine
