// Mixture-of-experts kernels: routing, the sort of (token, choice) pairs by expert, and the
// experts' products over that sorted layout. A MoE layer on the GPU is
//   moe_route    router logits in fp32 from the normalised rows (a warp per expert, blocks over
//                experts and tokens), then scores and each token's top k (a warp per token), then
//                (given a layout) moe_align's sort; up to kRouteTokens tokens (decode) all of it
//                is one launch, the last block to finish taking the top k and the sort;
//   moe_align    pairs counted and sorted by expert (one block, no host round trip), each expert's
//                rows padded to a multiple of kMoeTile, the tiles' experts, the active experts;
//   moe_experts  gate/up with SwiGLU fused, then down with each pair's routing weight applied in
//                the epilogue: per active expert a GEMV that streams the expert's weights once for
//                all its rows (few pairs: decode), or a grouped GEMM on tensor cores over the
//                sorted tiles (prefill);
// and the weighted sum over a token's k outputs is taken by the next residual add
// (AddRmsNormParams::delta_rows), or at decode's few tokens by the down product itself
// (MoeExpertsParams::resid_out), in choice order, so the result does not depend on the order the
// pairs were sorted in. Every size the launches depend on comes from the host (the step's token
// count): the kernels are capturable in CUDA graphs. The CPU reference: engine/moe_routing.h and
// the CPU backend's experts.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

namespace hr::kernels {

// Rows of the sorted layout per grouped-GEMM tile: each expert's rows start at a multiple of it.
constexpr int kMoeTile = 64;
constexpr int kMoeMaxExperts = 512;
constexpr int kMoeMaxTopK = 16;
constexpr int kMoeMaxGroups = 32;

// How router scores become experts and weights (engine/moe_routing.h has the reference).
struct MoeRouting {
  int num_experts = 0;
  int top_k = 0;
  bool sigmoid = false;  // else softmax
  bool renormalize = false;
  int num_groups = 1;  // sigmoid scoring: top k within the topk_groups best groups
  int topk_groups = 1;
  float scaling = 1.0f;
};

// The pairs (token * top_k + choice) sorted by expert.
struct MoeLayout {
  int32_t* counts = nullptr;          // [num_experts] pairs per expert
  int32_t* offsets = nullptr;         // [num_experts + 1] each expert's first row (padded)
  int32_t* sorted_pairs = nullptr;    // [capacity] each row's pair; -1: padding
  int32_t* tile_experts = nullptr;    // [capacity / kMoeTile] each tile's expert; -1: unused
  int32_t* active_experts = nullptr;  // [num_experts] experts with pairs, in id order, then -1
  int32_t* pair_rows = nullptr;       // [num_pairs] each pair's row (sorted_pairs' inverse)
};

struct MoeRouteParams {
  // The router's input: the layer's normalised rows in bf16, or (when resid is given) normalised
  // here in fp32 from the residual stream: resid[t] / rms(resid[t]) * norm_weight.
  const __nv_bfloat16* x = nullptr;    // [num_tokens, dim]
  const float* resid = nullptr;        // [num_tokens, dim]
  const float* norm_weight = nullptr;  // [dim]
  float eps = 1e-6f;
  const float* router = nullptr;  // [num_experts, dim]
  const float* bias = nullptr;    // [num_experts] the choice's correction bias, or null
  int num_tokens = 0;
  int dim = 0;  // a multiple of 4
  MoeRouting routing;
  float* logits = nullptr;        // [num_tokens, num_experts] scratch
  int32_t* topk_ids = nullptr;    // [num_tokens, top_k], best first, ties to the lower expert
  float* topk_weights = nullptr;  // [num_tokens, top_k]
  // Optional, of the residual-stream form: the normalised rows in bf16 (the experts' input).
  __nv_bfloat16* normed_out = nullptr;  // [num_tokens, dim]
  // Optional: the pairs also sorted into `layout` (as moe_align does), `capacity` =
  // moe_capacity(num_tokens * top_k, num_experts); `counter`: one int, zero between launches.
  MoeLayout layout;
  int capacity = 0;
  int32_t* counter = nullptr;
  // More than kMoeFusedRouteTokens tokens (prefill): the logits as a tiled product (64 tokens by
  // 128 experts a block, each row read once a tile of experts); false: a block per 8 tokens and
  // 4 experts, as decode's few tokens take them.
  bool tiled = true;
};

// Tokens up to which moe_route with a layout is one launch.
constexpr int kMoeFusedRouteTokens = 8;

cudaError_t moe_route(const MoeRouteParams& p, cudaStream_t stream);

// Rows the sorted layout needs at most: every pair, and each expert's padding to the tile.
inline int moe_capacity(int num_pairs, int num_experts) {
  const int padded = num_pairs + num_experts * (kMoeTile - 1);
  return (padded + kMoeTile - 1) / kMoeTile * kMoeTile;
}

// One block; `capacity` = moe_capacity(num_pairs, num_experts). Within an expert the pairs' order
// is not fixed (atomics); nothing computed from the layout depends on it.
cudaError_t moe_align(const int32_t* topk_ids, int num_pairs, int num_experts, int capacity,
                      const MoeLayout& layout, cudaStream_t stream);

struct MoeExpertsParams {
  const __nv_bfloat16* x = nullptr;          // [num_tokens, dim] gate/up's input
  const __nv_bfloat16* w_gate_up = nullptr;  // [num_experts, 2 ffn, dim]: gate rows, then up rows
  const __nv_bfloat16* w_down = nullptr;     // [num_experts, dim, ffn]
  const float* topk_weights = nullptr;       // [num_tokens * top_k]
  MoeLayout layout;                          // as moe_align left it (read only here)
  int num_tokens = 0;
  int top_k = 0;
  int num_experts = 0;
  int dim = 0;  // multiples of 8
  int ffn = 0;
  int capacity = 0;              // moe_capacity(num_tokens * top_k, num_experts)
  __nv_bfloat16* act = nullptr;  // [capacity, ffn] SwiGLU's activations, in sorted rows
  float* out = nullptr;          // [num_tokens * top_k, dim] each pair's output times its weight
  // ... or, when resid_out is set (the GEMV form, at most kMoeCombineTokens tokens, the experts
  // held whole), the residual update resid_out[t] = resid_in[t] + the sum of token t's k outputs
  // times their weights, in choice order (as add_rms_norm's delta_rows sums `out`), with each new
  // row's sum of squares added into out_sumsq [num_tokens] (zeroed by the caller), and `out`
  // unused: a decode step's next norm is then folded into the next product's input (GemvInput::
  // kRmsNorm) instead of a kernel of its own. topk_ids and layout.pair_rows find each pair's expert
  // and row. resid_out != resid_in.
  const int32_t* topk_ids = nullptr;  // [num_tokens * top_k]
  const float* resid_in = nullptr;    // [num_tokens, dim]
  float* resid_out = nullptr;         // [num_tokens, dim]
  float* out_sumsq = nullptr;         // [num_tokens]
  // Expert parallelism: w_gate_up and w_down hold experts [first_expert, first_expert +
  // num_local_experts) only (0: all of them). Pairs routed to other experts are skipped and their
  // rows of `out` left as they were (a rank zeroes them; the ranks' all-reduce fills them in).
  int first_expert = 0;
  int num_local_experts = 0;
  // The GEMV form pulls the active experts' down weights into L2 (and streams the weights
  // evict-first) when they come to at most this many bytes: one token's 8 experts in
  // Qwen3-30B-A3B (24 MB) fit beside the stream in an H100's 50 MB; a batch of 16's ~100 experts
  // would thrash it (measured 9% slower at batch 16).
  size_t prefetch_limit = size_t{32} << 20;
};

// Tokens up to which the experts' down product may write the residual update (resid_out).
constexpr int kMoeCombineTokens = 8;

enum class MoeKernel {
  kGemv,         // per active expert, its weights streamed once for all its rows (decode)
  kGroupedGemm,  // tensor-core tiles of kMoeTile sorted rows (prefill), warps of 32 x 32
  // ... warps of all kMoeTile rows x 64 weight columns: more products per fragment loaded
  kGroupedGemmWide,
  // ... a warpgroup a tile, Hopper's wgmma (sm_90a only: cudaErrorNotSupported elsewhere)
  kGroupedGemmWarpgroup,
};

cudaError_t moe_experts(const MoeExpertsParams& p, MoeKernel kernel, cudaStream_t stream);

// Whether the current device runs kGroupedGemmWarpgroup: a Hopper GPU, and this build's sm_90a
// code (asked once per device).
bool moe_warpgroup_gemm_runs();

}  // namespace hr::kernels
