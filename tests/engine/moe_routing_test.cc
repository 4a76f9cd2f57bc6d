// Host routing (moe_routing.h), the reference of the CUDA routing kernel: softmax top-k with ties
// to the lower expert, with and without renormalising; sigmoid scores chosen within the best
// groups, with a correction bias that steers the choice but not the weights; the scaling factor.
#include "engine/moe_routing.h"

#include <gtest/gtest.h>

#include <cmath>

#include "tests/engine/moe_configs.h"

namespace hr::engine {
namespace {

TEST(MoeRoutingTest, SoftmaxTopKTiesGoToTheLowerExpert) {
  const float logits[] = {1, 3, 3, 0, /* second token */ 0, 0, 0, 0};
  int32_t ids[4];
  float w[4];
  route_tokens(logits, 2, softmax_moe(4, 2, true), nullptr, ids, w);
  EXPECT_EQ(ids[0], 1);
  EXPECT_EQ(ids[1], 2);
  EXPECT_FLOAT_EQ(w[0], 0.5f);
  EXPECT_FLOAT_EQ(w[1], 0.5f);
  EXPECT_EQ(ids[2], 0);  // all tied: the lowest ids
  EXPECT_EQ(ids[3], 1);
  route_tokens(logits, 1, softmax_moe(4, 2, false), nullptr, ids, w);
  const float sum = std::exp(1.f) + 2 * std::exp(3.f) + 1;
  EXPECT_NEAR(w[0], std::exp(3.f) / sum, 1e-6);
  EXPECT_NEAR(w[1], std::exp(3.f) / sum, 1e-6);
}

TEST(MoeRoutingTest, SigmoidGroupLimitedWithBiasAndScaling) {
  const MoeConfig m = sigmoid_grouped_moe(8, 2, 4, 1, 2.5f);  // groups {0,1} {2,3} {4,5} {6,7}
  // Expert 7 alone scores best, but group {2,3} has the best pair.
  const float logits[] = {-4, -4, 1.5f, 1.5f, -4, -4, -4, 3};
  int32_t ids[2];
  float w[2];
  route_tokens(logits, 1, m, nullptr, ids, w);
  EXPECT_EQ(ids[0], 2);
  EXPECT_EQ(ids[1], 3);
  EXPECT_FLOAT_EQ(w[0], 1.25f);
  EXPECT_FLOAT_EQ(w[1], 1.25f);
  // A bias on expert 6 lifts group {6,7} above {2,3}: the choice moves, the weights are the
  // sigmoid scores without the bias.
  float bias[8] = {0, 0, 0, 0, 0, 0, 2, 0};
  route_tokens(logits, 1, m, bias, ids, w);
  EXPECT_EQ(ids[0], 6);  // -4 + bias: sigmoid(-4) + 2 = 2.018 > sigmoid(3) = 0.953
  EXPECT_EQ(ids[1], 7);
  const float s6 = 1 / (1 + std::exp(4.f)), s7 = 1 / (1 + std::exp(-3.f));
  EXPECT_NEAR(w[0], 2.5f * s6 / (s6 + s7), 1e-6);
  EXPECT_NEAR(w[1], 2.5f * s7 / (s6 + s7), 1e-6);
}

}  // namespace
}  // namespace hr::engine
