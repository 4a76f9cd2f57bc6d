// The attention planner (host code, no device needed): decode splits cover each context exactly
// once and agree with their combine items (which the in-kernel merge counts on), graph-shaped plans
// give every decode the same number of splits, the partial buffers bound the splits, and prefill
// tiles cover every new token once, longest first.
#include "engine/attention_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace hr::engine {
namespace {

// A step of sequences given as (context length after the step, new tokens).
struct Step {
  std::vector<int32_t> positions, seq_start{0};
  StepInput in;

  explicit Step(const std::vector<std::pair<int, int>>& seqs) {
    for (auto [ctx, n] : seqs) {
      for (int p = ctx - n; p < ctx; ++p) positions.push_back(p);
      seq_start.push_back(static_cast<int32_t>(positions.size()));
    }
    in.num_tokens = static_cast<int>(positions.size());
    in.num_seqs = static_cast<int>(seqs.size());
    in.positions = positions.data();
    in.seq_start = seq_start.data();
  }
};

// Checks the plan's invariants; returns the number of splits of each decoding sequence.
std::map<int, int> check_plan(const Step& step, const AttentionPlanParams& params,
                              const AttentionPlan& plan) {
  std::map<int, int> splits;
  const int group = params.num_heads / params.num_kv_heads;
  std::vector<int> partial_seen(static_cast<size_t>(plan.num_partials), 0);
  std::map<int, std::vector<kernels::AttentionWorkItem>> decode_items;  // by sequence, in order
  for (const auto* list : {&plan.decode, &plan.prefill}) {
    for (const auto& it : *list) {
      const int a = step.seq_start[it.seq], n = step.seq_start[it.seq + 1] - a;
      if (n == 1) {
        EXPECT_EQ(it.q_row, a);
        EXPECT_EQ(it.q_len, 1);
        decode_items[it.seq].push_back(it);
        continue;
      }
      EXPECT_EQ(it.partial, -1) << "prefill tiles are not split";
      EXPECT_LE(it.q_len * group, kernels::kAttentionPrefillRows);
      EXPECT_EQ(it.kv_begin, 0);
      EXPECT_EQ(it.kv_end, step.positions[it.q_row + it.q_len - 1] + 1)
          << "causal: up to the tile's last token";
    }
  }
  for (auto& [seq, items] : decode_items) {
    const int ctx = step.positions[step.seq_start[seq]] + 1;
    splits[seq] = static_cast<int>(items.size());
    if (items.size() == 1) {
      EXPECT_EQ(items[0].partial, -1) << "seq " << seq;
      EXPECT_EQ(items[0].kv_begin, 0);
      EXPECT_EQ(items[0].kv_end, ctx);
      continue;
    }
    // Contiguous key ranges from 0 to ctx (empty ones only at the end), one combine item for all.
    int at = 0;
    const int combine = items[0].combine;
    if (combine < 0 || combine >= static_cast<int>(plan.combine.size())) {
      ADD_FAILURE() << "seq " << seq << ": combine item " << combine << " out of range";
      continue;
    }
    const auto& c = plan.combine[static_cast<size_t>(combine)];
    EXPECT_EQ(c.q_row, step.seq_start[seq]);
    EXPECT_EQ(c.num_splits, static_cast<int>(items.size()));
    for (size_t k = 0; k < items.size(); ++k) {
      const auto& it = items[k];
      EXPECT_EQ(it.combine, combine) << "seq " << seq << " split " << k;
      EXPECT_EQ(it.partial, c.first_partial + static_cast<int>(k))
          << "seq " << seq << " split " << k;
      if (it.partial < 0 || it.partial >= plan.num_partials) {
        ADD_FAILURE() << "seq " << seq << " split " << k << ": partial slot " << it.partial
                      << " out of range";
        continue;
      }
      ++partial_seen[static_cast<size_t>(it.partial)];
      EXPECT_EQ(it.kv_begin, std::min(at, ctx)) << "seq " << seq << " split " << k;
      EXPECT_GE(it.kv_end, it.kv_begin);
      at = it.kv_end;
    }
    EXPECT_EQ(at, ctx) << "seq " << seq;
  }
  for (size_t i = 0; i < partial_seen.size(); ++i)
    EXPECT_EQ(partial_seen[i], 1) << "partial slot " << i;
  EXPECT_LE(plan.num_partials, params.max_partials);
  // Prefill tiles: every multi-token sequence's tokens once; longest key range first.
  std::vector<int> covered(static_cast<size_t>(step.in.num_tokens), 0);
  for (const auto& it : plan.prefill) {
    for (int t = it.q_row; t < it.q_row + it.q_len; ++t) ++covered[static_cast<size_t>(t)];
  }
  for (const auto& it : plan.decode) ++covered[static_cast<size_t>(it.q_row)];
  for (int s = 0; s < step.in.num_seqs; ++s) {
    const int a = step.seq_start[s], n = step.seq_start[s + 1] - a;
    for (int t = a; t < a + n; ++t) {
      EXPECT_EQ(covered[static_cast<size_t>(t)], n == 1 ? splits[s] : 1) << "token " << t;
    }
  }
  for (size_t i = 1; i < plan.prefill.size(); ++i) {
    EXPECT_GE(plan.prefill[i - 1].kv_end - plan.prefill[i - 1].kv_begin,
              plan.prefill[i].kv_end - plan.prefill[i].kv_begin);
  }
  return splits;
}

TEST(AttentionPlanTest, SmallBatchSplitsCoverEachContextOnce) {
  Step step({{1, 1}, {15, 1}, {64, 1}, {65, 1}, {513, 1}, {2000, 1}, {33, 33}, {300, 200}});
  for (DecodeAttention decode :
       {DecodeAttention::kCudaCore, DecodeAttention::kPrefillTiles, DecodeAttention::kTensorCore}) {
    AttentionPlanParams params{32, 8, 132, 1024, false, decode};
    AttentionPlan plan;
    ASSERT_TRUE(plan_attention(step.in, params, &plan).is_ok());
    EXPECT_EQ(plan.decode.empty(), decode == DecodeAttention::kPrefillTiles)
        << "decodes go with the prefill items only when asked to";
    auto splits = check_plan(step, params, plan);
    EXPECT_EQ(splits[0], 1) << "one key: nothing to split";
    EXPECT_GT(splits[5], 1) << "a long context on an idle GPU is split";
    EXPECT_GE(splits[5], splits[4]);
    EXPECT_FALSE(plan.combine.empty());
  }
}

TEST(AttentionPlanTest, GraphShapedPlansSplitEveryDecodeAlike) {
  Step step({{1, 1}, {17, 1}, {500, 1}, {4000, 1}});
  AttentionPlanParams params{32, 8, 132, 1024, true, DecodeAttention::kPrefillTiles};
  AttentionPlan plan;
  ASSERT_TRUE(plan_attention(step.in, params, &plan).is_ok());
  auto splits = check_plan(step, params, plan);
  ASSERT_EQ(splits.size(), 4u);
  EXPECT_GT(splits[0], 1);
  for (auto [seq, n] : splits) EXPECT_EQ(n, splits[0]) << "seq " << seq;
  EXPECT_EQ(plan.combine.size(), 4u);
  EXPECT_EQ(plan.num_partials, 4 * splits[0]);
}

TEST(AttentionPlanTest, PartialBuffersBoundTheSplits) {
  Step step({{4000, 1}, {4000, 1}, {4000, 1}});
  AttentionPlanParams params{32, 8, 132, 7, true, DecodeAttention::kPrefillTiles};
  AttentionPlan plan;
  ASSERT_TRUE(plan_attention(step.in, params, &plan).is_ok());
  auto splits = check_plan(step, params, plan);
  EXPECT_EQ(splits[0], 2) << "7 partial slots for 3 decodes: 2 splits each";
  EXPECT_EQ(plan.num_partials, 6);
}

TEST(AttentionPlanTest, LargeBatchesAreNotSplit) {
  std::vector<std::pair<int, int>> seqs(64, {3000, 1});
  Step step(seqs);
  AttentionPlanParams params{32, 8, 132, 1024, true, DecodeAttention::kPrefillTiles};
  AttentionPlan plan;
  ASSERT_TRUE(plan_attention(step.in, params, &plan).is_ok());
  auto splits = check_plan(step, params, plan);
  for (auto [seq, n] : splits) EXPECT_EQ(n, 1) << "seq " << seq;
  EXPECT_TRUE(plan.combine.empty());
  EXPECT_EQ(plan.num_partials, 0);
}

TEST(AttentionPlanTest, PrefillTilesHoldAtMost128Rows) {
  Step step({{1000, 1000}, {7, 7}, {130, 3}});
  for (auto [heads, kv] : {std::pair{32, 8}, std::pair{32, 32}, std::pair{16, 1}}) {
    AttentionPlanParams params{heads, kv, 132, 1024, false, DecodeAttention::kPrefillTiles};
    AttentionPlan plan;
    ASSERT_TRUE(plan_attention(step.in, params, &plan).is_ok());
    check_plan(step, params, plan);
    const int tile = kernels::kAttentionPrefillRows / (heads / kv);  // tokens per tile
    EXPECT_EQ(static_cast<int>(plan.prefill.size()), (1000 + tile - 1) / tile + 2)
        << heads << "/" << kv;
  }
}

// Each decode kernel takes groups of heads up to its tile's rows (8 on CUDA cores, 16 on tensor
// cores); larger groups go to the prefill kernel. Splits are whole key tiles of the kernel.
TEST(AttentionPlanTest, DecodeKernelsTakeTheGroupsTheirTilesHold) {
  using kernels::AttentionKernel;
  Step step({{1000, 1}, {300, 1}});
  struct Case {
    int heads, kv_heads;
    DecodeAttention decode;
    AttentionKernel expected;
    int key_tile;
  };
  for (const Case& c :
       {Case{32, 8, DecodeAttention::kCudaCore, AttentionKernel::kDecode, 32},
        Case{16, 1, DecodeAttention::kCudaCore, AttentionKernel::kPrefill, 64},
        Case{16, 1, DecodeAttention::kTensorCore, AttentionKernel::kDecodeTc, 64},
        Case{32, 1, DecodeAttention::kTensorCore, AttentionKernel::kPrefill, 64},
        Case{32, 8, DecodeAttention::kPrefillTiles, AttentionKernel::kPrefill, 64}}) {
    AttentionPlanParams params{c.heads, c.kv_heads, 132, 1024, false, c.decode};
    AttentionPlan plan;
    ASSERT_TRUE(plan_attention(step.in, params, &plan).is_ok());
    check_plan(step, params, plan);
    EXPECT_EQ(plan.decode_kernel, c.expected) << c.heads << "/" << c.kv_heads;
    const auto& items = c.expected == AttentionKernel::kPrefill ? plan.prefill : plan.decode;
    EXPECT_TRUE((c.expected == AttentionKernel::kPrefill ? plan.decode : plan.prefill).empty());
    ASSERT_GT(items.size(), 2u) << "both decodes are split";
    for (const auto& it : items) {
      if (it.kv_end < step.positions[step.seq_start[it.seq]] + 1) {
        EXPECT_EQ((it.kv_end - it.kv_begin) % c.key_tile, 0) << "a split ends on a key tile";
      }
    }
  }
}

TEST(AttentionPlanTest, ASequenceWithoutTokensIsAnError) {
  const Step step({{2, 2}, {2, 0}});  // the second sequence has no tokens
  const StepInput& in = step.in;
  AttentionPlan plan;
  Status st = plan_attention(in, {32, 8, 132, 1024, false, DecodeAttention::kPrefillTiles}, &plan);
  EXPECT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("sequence 1"), std::string::npos) << st.to_string();
}

// Head counts the kernels cannot group are refused, not planned (a group larger than a prefill
// tile's rows used to make tiles of no rows, and no key/value heads divided by zero).
TEST(AttentionPlanTest, HeadGroupsTheKernelsCannotTakeAreRefused) {
  const Step step({{1, 1}});
  const StepInput& in = step.in;
  AttentionPlan plan;
  for (auto [heads, kv_heads] :
       {std::pair{256, 1}, std::pair{32, 0}, std::pair{4, 8}, std::pair{12, 8}}) {
    Status st = plan_attention(
        in, {heads, kv_heads, 132, 1024, false, DecodeAttention::kPrefillTiles}, &plan);
    EXPECT_FALSE(st.is_ok()) << heads << "/" << kv_heads;
    EXPECT_NE(st.message().find("query heads"), std::string::npos) << st.to_string();
  }
  EXPECT_TRUE(plan_attention(in, {128, 1, 132, 1024, false, DecodeAttention::kPrefillTiles}, &plan)
                  .is_ok());
}

}  // namespace
}  // namespace hr::engine
