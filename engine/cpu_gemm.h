// Matrix products for the CPU backend, on weights packed in panels, vectorized at run time for the
// widest instruction set the CPU has (AVX-512, AVX2 with FMA, or plain C++) whatever the build
// targets. Also the streaming-read loop the engine benchmark uses as its memory-bandwidth
// reference, so both read memory with the same loads.
//
// The panel layout: a weight matrix w[n, k] (row-major, one row per output column) becomes
// ceil(n / 16) panels of 16 rows; a panel stores its rows k-major (w[r, 0] of its 16 rows, then
// w[r, 1], ...), and the rows past n in the last panel are zero. A product then multiplies each
// x value, broadcast, into 16 outputs at once: one kernel for every batch size, which reads each
// panel front to back (a sequential stream the prefetchers follow, as a GEMV wants), keeps a tile
// of x rows by panels in registers with no horizontal sums (as a GEMM wants), and needs no
// re-packing per call.
// Pure functions of their arguments: safe to call from any number of threads at once.
#pragma once

#include <cstddef>

namespace hr::engine {

enum class SimdLevel { kScalar, kAvx2, kAvx512 };

// The widest level this CPU and OS support (checked once).
SimdLevel cpu_simd_level();
const char* simd_level_name(SimdLevel level);

constexpr int kPanelRows = 16;

inline int num_panels(int n) { return (n + kPanelRows - 1) / kPanelRows; }
// Floats a packed [n, k] matrix takes (n rounded up to whole panels).
inline size_t packed_size(int n, int k) {
  return static_cast<size_t>(num_panels(n)) * kPanelRows * static_cast<size_t>(k);
}
// Packs row-major w[n, k] into `out` (packed_size(n, k) floats).
void pack_panels(const float* w, int n, int k, float* out);
// Row r of a packed [n, k] matrix, written to out[0, k).
void unpack_row(const float* packed, int k, int r, float* out);

// y[m, n] = x[m, k] · w[n, k]^T (+ y when accumulate), w packed.
struct PanelProduct {
  const float* x = nullptr;  // [m, k], row-major
  const float* w = nullptr;  // [n, k], packed
  float* y = nullptr;        // [m, n], row-major
  int m = 1;
  int n = 0;
  int k = 0;
  bool accumulate = false;
};

// Computes the columns of panels [panel_begin, panel_end) for every x row: tiles of up to 8 x rows
// by 3 panels (24 vector accumulators with AVX-512) over blocks of panels that stay in L2 while
// every tile of x rows passes over them. Each output is one fp32 sum over k in order; results
// agree with BLAS to float rounding. `level` must not exceed cpu_simd_level().
void multiply_panels(const PanelProduct& p, int panel_begin, int panel_end, SimdLevel level);
inline void multiply_panels(const PanelProduct& p, int panel_begin, int panel_end) {
  multiply_panels(p, panel_begin, panel_end, cpu_simd_level());
}

// The sum of n floats read front to back with the widest loads of `level` and enough independent
// accumulators that the adds never limit the speed: a pure streaming read.
float sum_floats(const float* p, size_t n, SimdLevel level);
inline float sum_floats(const float* p, size_t n) { return sum_floats(p, n, cpu_simd_level()); }

}  // namespace hr::engine
