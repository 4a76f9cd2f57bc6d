// The memory planner (engine/memory_plan.h) on published configs of large models
// (tests/data/configs/): parameter counts equal the published ones, per-rank weights equal a hand
// count, sharding adds exactly the replicated parts, and the figures in docs/memory-plan.md are
// pinned. That the plan equals what the CUDA backend allocates is checked in
// cuda_backend_test.cc (TheMemoryPlanEqualsWhatTheBackendAllocates).
#include "engine/memory_plan.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

namespace hr::engine {
namespace {

ModelShape shape(const std::string& name) {
  auto s =
      load_model_shape(std::string(HEADROOM_SOURCE_DIR) + "/tests/data/configs/" + name + ".json");
  EXPECT_TRUE(s.is_ok()) << s.status().to_string();
  return s.is_ok() ? *s : ModelShape{};
}

MemoryPlan plan(const ModelShape& s, int tp, int pp = 1, int ep = 1,
                WeightFormat weights = WeightFormat::kBf16,
                WeightFormat experts = WeightFormat::kBf16) {
  PlanOptions o;
  o.tp = tp;
  o.pp = pp;
  o.ep = ep;
  o.weights = weights;
  o.experts = experts;
  o.gpu_memory_bytes = 80ll << 30;
  auto p = plan_memory(s, o);
  EXPECT_TRUE(p.is_ok()) << p.status().to_string();
  return p.is_ok() ? *p : MemoryPlan{};
}

TEST(MemoryPlanTest, ParameterCountsAreThePublishedOnes) {
  EXPECT_EQ(shape("llama-3.3-70b-instruct").parameters(), 70'553'706'496);
  EXPECT_EQ(shape("qwen3-235b-a22b").parameters(), 235'093'634'560);
  EXPECT_EQ(shape("mixtral-8x22b-instruct-v0.1").parameters(), 140'630'071'296);
  const ModelShape kimi = shape("kimi-k2-instruct");
  EXPECT_EQ(kimi.parameters(), 1'026'408'232'448);
  EXPECT_TRUE(kimi.mla);
  EXPECT_EQ(kimi.checkpoint_format, WeightFormat::kFp8);
  EXPECT_FALSE(kimi.sparse_layers[0]);  // first_k_dense_replace
  EXPECT_TRUE(kimi.sparse_layers[1]);
}

// One rank of Llama-3.3-70B at TP8, counted by hand: the embedding whole, an eighth of the LM
// head, and per layer one of the 8 KV heads, 8 of the 64 query heads, an eighth of the MLP.
TEST(MemoryPlanTest, ARanksWeightsAreItsShards) {
  const ModelShape s = shape("llama-3.3-70b-instruct");
  const MemoryPlan p = plan(s, 8);
  ASSERT_EQ(p.ranks.size(), 8u);
  const int64_t D = 8192, V = 128256;
  const int64_t layer = 2 * D * 4 + (8 + 2) * 128 * D * 2 + D * 1024 * 2 + 3 * 3584 * D * 2;
  EXPECT_EQ(p.ranks[3].weight_bytes, V * D * 2 + (V / 8) * D * 2 + D * 4 + 80 * layer);
  EXPECT_EQ(p.ranks[3].weight_bytes, 19'482'050'560);
  // Two KV rows (K and V) of one head of 128 per layer, bf16, 16 tokens a block.
  EXPECT_EQ(p.ranks[3].kv_block_bytes, 2 * 80 * 128 * 2 * 16);
  // Summed over the ranks: one rank's model plus the replicated embedding and norms.
  const MemoryPlan one = plan(s, 1);
  for (int tp : {2, 4, 8}) {
    const MemoryPlan n = plan(s, tp);
    int64_t sum = 0;
    for (const RankPlan& r : n.ranks) sum += r.weight_bytes;
    EXPECT_EQ(sum, one.ranks[0].weight_bytes + (tp - 1) * (V * D * 2 + 80 * 2 * D * 4 + D * 4))
        << tp;
  }
  // Two stages: the layers split 40/40, the embedding on the first, the head on the second.
  const MemoryPlan two = plan(s, 1, 2);
  ASSERT_EQ(two.ranks.size(), 2u);
  EXPECT_EQ(two.ranks[0].num_layers, 40);
  EXPECT_EQ(two.ranks[1].first_layer, 40);
  EXPECT_EQ(two.ranks[0].weight_bytes + two.ranks[1].weight_bytes, one.ranks[0].weight_bytes);
  EXPECT_EQ(two.ranks[0].weight_bytes - two.ranks[1].weight_bytes, -D * 4);
  // Stages of the layers given (a balanced split): 44 and 36, the same bytes in all.
  PlanOptions o;
  o.pp = 2;
  o.stage_layers = {44, 36};
  auto uneven = plan_memory(s, o);
  ASSERT_TRUE(uneven.is_ok()) << uneven.status().to_string();
  EXPECT_EQ(uneven->ranks[0].num_layers, 44);
  EXPECT_EQ(uneven->ranks[1].first_layer, 44);
  EXPECT_EQ(uneven->ranks[1].num_layers, 36);
  const int64_t whole_layer =
      2 * D * 4 + (64 + 16) * 128 * D * 2 + D * 8192 * 2 + 3 * 28672 * D * 2;
  EXPECT_EQ(uneven->ranks[0].weight_bytes - two.ranks[0].weight_bytes, 4 * whole_layer);
  EXPECT_EQ(uneven->ranks[0].weight_bytes + uneven->ranks[1].weight_bytes,
            one.ranks[0].weight_bytes);
}

TEST(MemoryPlanTest, ExpertsShardWholeOrSliced) {
  const ModelShape s = shape("qwen3-235b-a22b");
  const MemoryPlan ep = plan(s, 8, 1, 8);
  const MemoryPlan sliced = plan(s, 8, 1, 1);
  // The same bytes either way for bf16: 16 whole experts or 128 eighths.
  EXPECT_EQ(ep.ranks[0].weight_bytes, sliced.ranks[0].weight_bytes);
  // 4 KV heads on 8 ranks: one replicated on each.
  EXPECT_EQ(ep.ranks[0].kv_block_bytes, 2 * 94 * 128 * 2 * 16);
  // Multi-head latent attention: the compressed cache (512 + 64) whole on every rank.
  const ModelShape kimi = shape("kimi-k2-instruct");
  const MemoryPlan k = plan(kimi, 8, 1, 8);
  EXPECT_EQ(k.ranks[5].kv_block_bytes, 61 * (512 + 64) * 2 * 16);
  EXPECT_FALSE(k.fits);  // 2 TB of bf16 on 8 devices of 80 GiB
  const MemoryPlan k4 = plan(kimi, 8, 1, 8, WeightFormat::kFp8, WeightFormat::kInt4);
  EXPECT_TRUE(k4.fits);  // int4 experts (Kimi K2.5's format) fit
  EXPECT_GT(k4.kv_tokens, 0);
}

// The table in docs/memory-plan.md: each layout's largest rank's weights and the deployment's KV
// tokens on devices of 80 GiB (141 GB where said), with the engine's default step sizes.
TEST(MemoryPlanTest, TheDocumentedFiguresArePinned) {
  struct Row {
    std::string model;
    int tp, pp, ep;
    WeightFormat weights, experts;
    int64_t gpu_memory, weight_bytes, kv_tokens;
  };
  const WeightFormat bf16 = WeightFormat::kBf16, fp8 = WeightFormat::kFp8,
                     int4 = WeightFormat::kInt4;
  const int64_t gib80 = 80ll << 30, gb141 = 141'000'000'000;
  const Row rows[] = {
      {"llama-3.3-70b-instruct", 2, 1, 1, bf16, bf16, gib80, 71'608'336'384, 71'120},
      {"llama-3.3-70b-instruct", 4, 1, 1, bf16, bf16, gib80, 36'857'479'168, 525'888},
      {"llama-3.3-70b-instruct", 8, 1, 1, bf16, bf16, gib80, 19'482'050'560, 1'435'408},
      {"llama-3.3-70b-instruct", 4, 2, 1, bf16, bf16, gib80, 19'216'728'064, 1'445'984},
      {"qwen3-235b-a22b", 8, 1, 8, bf16, bf16, gib80, 60'148'856'832, 455'824},
      {"qwen3-235b-a22b", 8, 1, 8, fp8, fp8, gib80, 30'881'859'072, 1'003'120},
      {"mixtral-8x22b-instruct-v0.1", 4, 1, 1, bf16, bf16, gib80, 70'629'089'280, 223'952},
      {"mixtral-8x22b-instruct-v0.1", 8, 1, 8, bf16, bf16, gib80, 35'522'764'800, 1'547'824},
      {"kimi-k2-instruct", 8, 1, 8, bf16, bf16, gib80, 260'896'512'000, 0},
      {"kimi-k2-instruct", 8, 1, 8, fp8, fp8, gib80, 132'133'273'312, 0},
      {"kimi-k2-instruct", 8, 1, 8, fp8, fp8, gb141, 132'133'273'312, 90'448},
      {"kimi-k2-instruct", 8, 1, 8, bf16, int4, gib80, 78'570'117'120, 70'768},
      {"kimi-k2-instruct", 8, 1, 8, fp8, int4, gib80, 76'611'665'632, 95'840},
  };
  for (const Row& row : rows) {
    SCOPED_TRACE(row.model + " tp " + std::to_string(row.tp) + " pp " + std::to_string(row.pp));
    PlanOptions o;
    o.tp = row.tp;
    o.pp = row.pp;
    o.ep = row.ep;
    o.weights = row.weights;
    o.experts = row.experts;
    o.gpu_memory_bytes = row.gpu_memory;
    auto p = plan_memory(shape(row.model), o);
    ASSERT_TRUE(p.is_ok()) << p.status().to_string();
    int64_t most = 0;
    for (const RankPlan& r : p->ranks) most = std::max(most, r.weight_bytes);
    EXPECT_EQ(most, row.weight_bytes);
    EXPECT_EQ(p->kv_tokens, row.kv_tokens);
    EXPECT_EQ(p->fits, row.kv_tokens > 0);
  }
}

// Each whole-step slot beyond two (a step in flight for each stage) captures decode graphs of its
// own: the allowance grows with the groups, and what is left for the KV cache shrinks.
TEST(MemoryPlanTest, TheGraphAllowanceCountsEachGroupsSlot) {
  const ModelShape llama = shape("llama-3.3-70b-instruct");
  PlanOptions o;
  o.tp = 2;
  o.pp = 4;
  o.gpu_memory_bytes = 80ll << 30;
  auto first = plan_memory(llama, o);
  ASSERT_TRUE(first.is_ok());
  // 8 GiB free once the rest is in place: the graphs' room, not the fraction, bounds the cache.
  o.gpu_memory_bytes += (8ll << 30) - first->ranks[0].free_bytes;
  o.kv_cache_fraction = 0.98;
  auto four = plan_memory(llama, o);
  o.step_groups = 1;
  auto one = plan_memory(llama, o);
  o.pp = 2;
  o.step_groups = 0;
  auto two = plan_memory(llama, o);
  ASSERT_TRUE(four.is_ok() && one.is_ok() && two.is_ok());
  EXPECT_EQ(four->ranks[0].graph_bytes, 2 * o.graph_bytes);
  EXPECT_EQ(one->ranks[0].graph_bytes, o.graph_bytes);
  EXPECT_EQ(two->ranks[0].graph_bytes, o.graph_bytes);
  EXPECT_EQ(one->ranks[0].kv_bytes - four->ranks[0].kv_bytes, o.graph_bytes);
}

TEST(MemoryPlanTest, LayoutsThatDoNotDivideAreRefusedNamingTheOption) {
  const ModelShape llama = shape("llama-3.3-70b-instruct");
  PlanOptions o;
  o.tp = 3;
  auto bad = plan_memory(llama, o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().field(), "tensor-parallel");
  o.tp = 1;
  o.pp = 81;
  EXPECT_EQ(plan_memory(llama, o).status().field(), "pipeline-parallel");
  const ModelShape qwen = shape("qwen3-235b-a22b");
  o = PlanOptions{};
  o.tp = 8;
  o.ep = 2;
  EXPECT_EQ(plan_memory(qwen, o).status().field(), "expert-parallel");
  o = PlanOptions{};
  o.pp = 2;
  for (const std::vector<int>& bad_split :
       {std::vector<int>{40, 41}, std::vector<int>{80, 0}, std::vector<int>{80}}) {
    o.stage_layers = bad_split;
    EXPECT_EQ(plan_memory(llama, o).status().field(), "stage-layers");
  }
}

}  // namespace
}  // namespace hr::engine
