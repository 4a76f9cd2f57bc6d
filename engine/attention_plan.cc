// Attention work planning.
#include "engine/attention_plan.h"

#include <algorithm>
#include <string>

namespace hr::engine {

Status plan_attention(const StepInput& in, const AttentionPlanParams& p, AttentionPlan* plan) {
  plan->decode.clear();
  plan->prefill.clear();
  plan->combine.clear();
  plan->num_partials = 0;
  const int nkv = p.num_kv_heads;
  if (nkv <= 0 || p.num_heads < nkv || p.num_heads % nkv != 0 ||
      p.num_heads / nkv > kernels::kAttentionPrefillRows) {
    return invalid_argument(
        std::to_string(p.num_heads) + " query heads over " + std::to_string(nkv) +
        " key/value heads: attention takes groups of 1 to " +
        std::to_string(kernels::kAttentionPrefillRows) + " query heads per key/value head");
  }
  const int group = p.num_heads / nkv;
  using kernels::AttentionKernel;
  plan->decode_kernel = AttentionKernel::kPrefill;
  if (p.decode == DecodeAttention::kCudaCore && group <= kernels::kAttentionDecodeRows) {
    plan->decode_kernel = AttentionKernel::kDecode;
  } else if (p.decode == DecodeAttention::kTensorCore && group <= kernels::kAttentionDecodeTcRows) {
    plan->decode_kernel = AttentionKernel::kDecodeTc;
  }
  const bool decode_kernel = plan->decode_kernel != AttentionKernel::kPrefill;
  const int prefill_tile = kernels::kAttentionPrefillRows / group;
  // Splits are whole tiles of the kernel that will run them.
  const int kTile = plan->decode_kernel == AttentionKernel::kDecode ? kernels::kAttentionKeyTile
                                                                    : kernels::kAttentionTcKeyTile;
  int num_decode_seqs = 0;
  for (int s = 0; s < in.num_seqs; ++s)
    num_decode_seqs += in.seq_start[s + 1] - in.seq_start[s] == 1;
  int want_splits = 1;
  if (num_decode_seqs > 0 && num_decode_seqs * nkv < p.num_sms) {
    want_splits = (2 * p.num_sms + num_decode_seqs * nkv - 1) / (num_decode_seqs * nkv);
    // At most kMaxDecodeSplits: decode graphs fix the splits whatever the context, and a short
    // context's item then merges many empty partials (66 at batch 1 with 4 KV heads on an H100:
    // 24 us a layer at 130 keys, where 16 splits still cover 8k keys at 512 a split).
    want_splits =
        std::max(1, std::min({want_splits, kMaxDecodeSplits, p.max_partials / num_decode_seqs}));
  }
  for (int s = 0; s < in.num_seqs; ++s) {
    const int a = in.seq_start[s], n = in.seq_start[s + 1] - a;
    if (n <= 0)
      return invalid_argument("sequence " + std::to_string(s) + " has no tokens in the step");
    if (n == 1) {
      const int ctx = in.positions[a] + 1;
      int splits = p.fixed_splits ? want_splits : std::min(want_splits, (ctx + kTile - 1) / kTile);
      const int chunk = ((ctx + splits - 1) / splits + kTile - 1) / kTile * kTile;
      if (!p.fixed_splits) splits = (ctx + chunk - 1) / chunk;
      auto& list = decode_kernel ? plan->decode : plan->prefill;
      if (splits <= 1) {
        list.push_back({s, a, 1, 0, ctx, -1, -1});
        continue;
      }
      const int combine = static_cast<int>(plan->combine.size());
      plan->combine.push_back({a, plan->num_partials, splits});
      for (int k = 0; k < splits; ++k) {
        const int begin = std::min(ctx, k * chunk);
        list.push_back(
            {s, a, 1, begin, std::min(ctx, (k + 1) * chunk), plan->num_partials++, combine});
      }
      continue;
    }
    for (int t = a; t < a + n; t += prefill_tile) {
      const int len = std::min(prefill_tile, a + n - t);
      plan->prefill.push_back({s, t, len, 0, in.positions[t + len - 1] + 1, -1, -1});
    }
  }
  std::stable_sort(plan->prefill.begin(), plan->prefill.end(), [](const auto& x, const auto& y) {
    return x.kv_end - x.kv_begin > y.kv_end - y.kv_begin;
  });
  return Status::ok();
}

}  // namespace hr::engine
