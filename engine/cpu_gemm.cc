// Panel products, one kernel per instruction-set level, picked at run time. The AVX functions are
// compiled for their own target (function attributes) so the rest of the build stays generic
// x86-64; they only run after __builtin_cpu_supports says the CPU (and OS) has the instructions.
#include "engine/cpu_gemm.h"

#include "base/check.h"

#include <algorithm>
#include <utility>

#if defined(__x86_64__)
#define HR_GEMM_X86 1
#include <immintrin.h>
#endif

namespace hr::engine {
namespace {

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

#if HR_GEMM_X86
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

// MR x rows by NP panels: MR * NP accumulators of 16 outputs. Per k step NP loads (one from each
// panel's stream) and MR broadcasts feed MR * NP FMAs.
template <int MR, int NP>
__attribute__((target("avx512f,avx2,fma"))) void tile_avx512(const PanelProduct& p, int i0,
                                                             int p0) {
  const int k = p.k;
  const size_t panel = static_cast<size_t>(kPanelRows) * k;
  const float* w = p.w + panel * p0;
  const float* x = p.x + static_cast<size_t>(i0) * k;
  __m512 acc[MR][NP];
  for (int i = 0; i < MR; ++i) {
    for (int c = 0; c < NP; ++c) acc[i][c] = _mm512_setzero_ps();
  }
  for (int j = 0; j < k; ++j) {
    __m512 wv[NP];
    for (int c = 0; c < NP; ++c) wv[c] = _mm512_loadu_ps(w + panel * c + kPanelRows * j);
    for (int i = 0; i < MR; ++i) {
      __m512 xv = _mm512_set1_ps(x[static_cast<size_t>(i) * k + j]);
      for (int c = 0; c < NP; ++c) acc[i][c] = _mm512_fmadd_ps(xv, wv[c], acc[i][c]);
    }
  }
  for (int c = 0; c < NP; ++c) {
    const int col = (p0 + c) * kPanelRows;
    const __mmask16 mask =
        static_cast<__mmask16>(p.n - col >= kPanelRows ? 0xffffu : (1u << (p.n - col)) - 1);
    for (int i = 0; i < MR; ++i) {
      float* y = p.y + static_cast<size_t>(i0 + i) * p.n + col;
      __m512 v = acc[i][c];
      if (p.accumulate) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(mask, y));
      _mm512_mask_storeu_ps(y, mask, v);
    }
  }
}

// The same with a panel as two 256-bit halves: one panel at a time, so that MR * 2 accumulators,
// the two halves and a broadcast fit AVX2's 16 registers (MR <= 6).
template <int MR>
__attribute__((target("avx2,fma"))) void tile_avx2(const PanelProduct& p, int i0, int p0) {
  const int k = p.k;
  const float* w = p.w + static_cast<size_t>(kPanelRows) * k * p0;
  const float* x = p.x + static_cast<size_t>(i0) * k;
  __m256 acc[MR][2];
  for (int i = 0; i < MR; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
  for (int j = 0; j < k; ++j) {
    __m256 w0 = _mm256_loadu_ps(w + kPanelRows * j);
    __m256 w1 = _mm256_loadu_ps(w + kPanelRows * j + 8);
    for (int i = 0; i < MR; ++i) {
      __m256 xv = _mm256_broadcast_ss(x + static_cast<size_t>(i) * k + j);
      acc[i][0] = _mm256_fmadd_ps(xv, w0, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(xv, w1, acc[i][1]);
    }
  }
  const int col = p0 * kPanelRows;
  const int cols = std::min(kPanelRows, p.n - col);
  for (int i = 0; i < MR; ++i) {
    float* y = p.y + static_cast<size_t>(i0 + i) * p.n + col;
    if (cols == kPanelRows && !p.accumulate) {
      _mm256_storeu_ps(y, acc[i][0]);
      _mm256_storeu_ps(y + 8, acc[i][1]);
      continue;
    }
    alignas(32) float out[kPanelRows];
    _mm256_store_ps(out, acc[i][0]);
    _mm256_store_ps(out + 8, acc[i][1]);
    for (int c = 0; c < cols; ++c) y[c] = p.accumulate ? y[c] + out[c] : out[c];
  }
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
#endif  // HR_GEMM_X86

SimdLevel detect_simd_level() {
#if HR_GEMM_X86
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f")) return SimdLevel::kAvx512;
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return SimdLevel::kAvx2;
#endif
  return SimdLevel::kScalar;
}

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

void pack_panels(const float* w, int n, int k, float* out) {
  for (int pi = 0; pi < num_panels(n); ++pi) {
    float* panel = out + static_cast<size_t>(pi) * kPanelRows * k;
    for (int r = 0; r < kPanelRows; ++r) {
      const int row = pi * kPanelRows + r;
      const float* src = row < n ? w + static_cast<size_t>(row) * k : nullptr;
      for (int j = 0; j < k; ++j)
        panel[static_cast<size_t>(j) * kPanelRows + r] = src ? src[j] : 0.0f;
    }
  }
}

void unpack_row(const float* packed, int k, int r, float* out) {
  const float* panel =
      packed + static_cast<size_t>(r / kPanelRows) * kPanelRows * k + r % kPanelRows;
  for (int j = 0; j < k; ++j) out[j] = panel[static_cast<size_t>(j) * kPanelRows];
}

namespace {

// Plain C++: MR x rows by one panel, 16 accumulators per row that the compiler vectorizes.
template <int MR>
void tile_scalar(const PanelProduct& p, int i0, int p0) {
  const int k = p.k;
  const float* w = p.w + static_cast<size_t>(kPanelRows) * k * p0;
  const float* x = p.x + static_cast<size_t>(i0) * k;
  float acc[MR][kPanelRows] = {};
  for (int j = 0; j < k; ++j) {
    const float* wj = w + kPanelRows * j;
    for (int i = 0; i < MR; ++i) {
      const float xv = x[static_cast<size_t>(i) * k + j];
      for (int c = 0; c < kPanelRows; ++c) acc[i][c] += xv * wj[c];
    }
  }
  const int col = p0 * kPanelRows;
  const int cols = std::min(kPanelRows, p.n - col);
  for (int i = 0; i < MR; ++i) {
    float* y = p.y + static_cast<size_t>(i0 + i) * p.n + col;
    for (int c = 0; c < cols; ++c) y[c] = p.accumulate ? y[c] + acc[i][c] : acc[i][c];
  }
}

// x rows [i0, i0 + MR) against panels [b0, b1): three panels at a time with AVX-512, one
// otherwise.
template <int MR>
void tile_row_group(const PanelProduct& p, int i0, int b0, int b1, SimdLevel level) {
#if HR_GEMM_X86
  if (level == SimdLevel::kAvx512) {
    int c = b0;
    for (; c + 3 <= b1; c += 3) tile_avx512<MR, 3>(p, i0, c);
    if (b1 - c == 2) tile_avx512<MR, 2>(p, i0, c);
    if (b1 - c == 1) tile_avx512<MR, 1>(p, i0, c);
    return;
  }
  if constexpr (MR <= 6) {
    if (level == SimdLevel::kAvx2) {
      for (int c = b0; c < b1; ++c) tile_avx2<MR>(p, i0, c);
      return;
    }
  }
#endif
  for (int c = b0; c < b1; ++c) tile_scalar<MR>(p, i0, c);
}

template <int... MR>
void tile_rows(const PanelProduct& p, int i0, int rows, int b0, int b1, SimdLevel level,
               std::integer_sequence<int, MR...>) {
  ((rows == MR ? tile_row_group<MR>(p, i0, b0, b1, level) : void()), ...);
}

}  // namespace

void multiply_panels(const PanelProduct& p, int panel_begin, int panel_end, SimdLevel level) {
  HR_CHECK(static_cast<int>(level) <= static_cast<int>(cpu_simd_level()))
      << simd_level_name(level) << " is not supported by this CPU";
  HR_CHECK(p.m >= 1 && p.k >= 1 && panel_begin >= 0 && panel_end <= num_panels(p.n))
      << "m=" << p.m << " n=" << p.n << " k=" << p.k;
  // Rows per tile: 8 (AVX-512, 24 of its 32 registers with 3 panels), 6 (AVX2, 12 of 16), 4.
  const int tile_m = level == SimdLevel::kAvx512 ? 8 : level == SimdLevel::kAvx2 ? 6 : 4;
  // Panels per block: about 512 KiB, which stays in L2 while every tile of x rows passes over it
  // (read from memory once, by the first); whole runs of 3, the AVX-512 tile's width, so that
  // only the range's last run may be narrower.
  const int block =
      std::max(3, static_cast<int>((512 << 10) / (sizeof(float) * kPanelRows * p.k)) / 3 * 3);
  for (int b0 = panel_begin; b0 < panel_end; b0 += block) {
    const int b1 = std::min(panel_end, b0 + block);
    for (int i = 0; i < p.m; i += tile_m) {
      tile_rows(p, i, std::min(tile_m, p.m - i), b0, b1, level,
                std::integer_sequence<int, 1, 2, 3, 4, 5, 6, 7, 8>{});
    }
  }
}

float sum_floats(const float* p, size_t n, SimdLevel level) {
  HR_CHECK(static_cast<int>(level) <= static_cast<int>(cpu_simd_level()))
      << simd_level_name(level) << " is not supported by this CPU";
  switch (level) {
#if HR_GEMM_X86
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
