// Matrix-vector products for decode steps with few rows: y[m, n] = x[m, k] · w[n, k]^T for
// m <= kGemvMaxRows, bound by reading w once at full memory bandwidth (cuBLASLt handles larger m).
// For m <= kGemvMaxFusedRows the input may be the RMS-normalised residual stream (from its rows'
// sums of squares), the output may be SwiGLU's activation (each warp computing a gate row and its
// up row), a residual update that also accumulates the new rows' sums of squares, or an attention
// layer's q/k/v with RoPE applied and K/V written to the paged cache (each warp computing the two
// rows of one rotation pair): a decode layer then needs no separate norm, activation or RoPE
// kernels.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace hr::kernels {

constexpr int kGemvMaxRows = 8;
constexpr int kGemvMaxFusedRows = 2;

// Where the RoPE output mode puts its results (see GemvParams::rope).
struct GemvRope {
  __nv_bfloat16* q_out = nullptr;  // [m, num_heads head_dim]; set: this output mode
  __nv_bfloat16* k_cache = nullptr;
  __nv_bfloat16* v_cache = nullptr;
  const float* bias = nullptr;
  const int32_t* positions = nullptr;
  const int32_t* slot_mapping = nullptr;
  const float* inv_freq = nullptr;
  int num_heads = 0, num_kv_heads = 0, head_dim = 0;
  // Qwen3's q/k norms (set both): each query and key head RMS-normalised with its own weights
  // before the rotation, which needs the head's every row. The warps write their rows (fp32,
  // before the bias) into scratch [m, n], and the last block to finish a head's rows (counted in
  // head_counters [num_heads + num_kv_heads], zero between launches, left at zero) normalises,
  // rotates and stores the head for every token, as rope_write_kv does (the same bits). head_dim
  // / 2 a multiple of 8 (a block's warps within one head).
  const float* q_norm = nullptr;
  const float* k_norm = nullptr;
  float eps = 1e-6f;
  float* scratch = nullptr;
  int32_t* head_counters = nullptr;
};

// A range of device memory to pull into L2: 16-byte aligned, bytes a multiple of 16 (0: none).
struct GemvPrefetch {
  const void* ptr = nullptr;
  size_t bytes = 0;
};

enum class GemvInput {
  kBf16,     // x: [m, k] bf16
  kRmsNorm,  // resid [m, k] fp32, resid_sumsq [m], norm_weight [k]: resid * rsqrt(sumsq / k + eps)
             // * w
};

struct GemvParams {
  const __nv_bfloat16* w = nullptr;  // [n, k] bf16, 16-byte aligned
  int m = 0, n = 0, k = 0;           // k a multiple of 8
  GemvInput input = GemvInput::kBf16;
  const __nv_bfloat16* x = nullptr;
  const float* resid = nullptr;
  const float* resid_sumsq = nullptr;
  const float* norm_weight = nullptr;
  float eps = 1e-5f;
  // Output y [m, n] (fp32, or bf16 when y_bf16) ...
  void* y = nullptr;
  bool y_bf16 = false;
  // ... with swiglu, w has 2n rows (gate rows, then up rows) and y[i, j] = bf16(silu(gate_j) *
  // up_j) ...
  bool swiglu = false;
  // ... or, when resid_out is set, the residual update resid_out = resid_in + x · w^T, with each
  // row's sum of squares added into out_sumsq [m] (zeroed by the caller). resid_out != resid_in.
  const float* resid_in = nullptr;
  float* resid_out = nullptr;
  float* out_sumsq = nullptr;
  // ... or, when rope.q_out is set, w is an attention layer's fused q/k/v matrix (n = (num_heads +
  // 2 num_kv_heads) head_dim rows) and the output goes where rope_write_kv (rope_kv.cuh) puts it:
  // bias added (when given), query and key heads normalised (when rope.q_norm is set) and rotated
  // at positions[i] (rotate-half, inv_freq), queries to q_out [m, num_heads head_dim] bf16, keys
  // and values into k_cache and v_cache [slots, num_kv_heads head_dim] at slot_mapping[i].
  GemvRope rope;
  // Weights of the kernels that follow (the start of the next matrices): the warps of this
  // kernel's last wave of blocks, once their own weight loads are done, pull these into L2 between
  // them, so that memory keeps busy while this kernel drains and the next one launches, and the
  // next one's first loads hit L2. Results do not depend on it.
  GemvPrefetch prefetch[2];
};

cudaError_t gemv(const GemvParams& p, cudaStream_t stream);

// Whether the RoPE output mode takes the q/k norms (GemvRope::q_norm) for heads of `head_dim`: a
// block's warps (pairs) must fall within one head.
bool gemv_fuses_qk_norm(int head_dim);

// Reads, for the current device, how many blocks of each GEMV kernel fit at once (what the weight
// prefetch's last wave is found from), so that no launch has to ask: asking loads the kernel,
// which must not happen inside a graph capture. Call once per device before capturing.
cudaError_t gemv_prepare();

}  // namespace hr::kernels
