// Matrix-vector products for the CPU backend's decode steps (one to eight token rows), vectorized
// at run time for the widest instruction set the CPU has (AVX-512, AVX2 with FMA, or plain C++)
// whatever the build targets. Also the streaming-read loop the engine benchmark uses as its
// memory-bandwidth reference, so both read memory with the same loads.
// Pure functions of their arguments: safe to call from any number of threads at once.
#pragma once

#include <cstddef>

namespace hr::engine {

enum class SimdLevel { kScalar, kAvx2, kAvx512 };

// The widest level this CPU and OS support (checked once).
SimdLevel cpu_simd_level();
const char* simd_level_name(SimdLevel level);

// The most token rows (x rows) one GEMV call takes; larger batches go to BLAS sgemm.
constexpr int kMaxGemvM = 8;

// y[m, n] = x[m, k] · w[n, k]^T (+ y when accumulate): each weight row dotted with every x row.
struct GemvProblem {
  const float* x = nullptr;  // [m, k]
  const float* w = nullptr;  // [n, k], row-major
  float* y = nullptr;        // [m, n]
  int m = 1;                 // 1 to kMaxGemvM
  int n = 0;
  int k = 0;
  bool accumulate = false;
};

// Computes columns [row_begin, row_end) of y (rows of w). Each weight row is read once, front to
// back, one row after the other: a single sequential stream, which the hardware prefetchers follow
// at full speed (interleaving several rows, or software prefetch, measured slower). Sums are fp32
// in an order that differs from BLAS; results agree with it to float rounding. `level` must not
// exceed cpu_simd_level().
void gemv_rows(const GemvProblem& p, int row_begin, int row_end, SimdLevel level);
inline void gemv_rows(const GemvProblem& p, int row_begin, int row_end) {
  gemv_rows(p, row_begin, row_end, cpu_simd_level());
}

// y[m, n] = x[m, k] · w[n, k]^T for columns [row_begin, row_end) with any m, in register tiles of
// 8 x rows by 3 weight rows over cache-sized blocks of weight rows: for batches too large for the
// GEMV (whose loads, one per FMA, then limit it) and too small for BLAS to pay for its packing.
// AVX-512 only: check gemm_tiles_supported().
bool gemm_tiles_supported();
void gemm_tiles(const GemvProblem& p, int row_begin, int row_end);

// The sum of n floats read front to back with the widest loads of `level` and enough independent
// accumulators that the adds never limit the speed: a pure streaming read.
float sum_floats(const float* p, size_t n, SimdLevel level);
inline float sum_floats(const float* p, size_t n) { return sum_floats(p, n, cpu_simd_level()); }

}  // namespace hr::engine
