// The CPU backend against Hugging Face transformers on the fixtures of models/fixtures/ (Qwen3
// dense, Qwen3-MoE in two layouts, Mixtral; scripts/make_fixtures.py): logits at every position
// within 1e-4, the same greedy continuations, the same experts wherever the router's margin
// between the k-th and (k+1)-th score exceeds 1e-3 (with their weights within 1e-4); the fused
// expert form loading to the same model; and a sequence's tokens the same alone and in a batch of
// 64.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <fstream>
#include <map>
#include <sstream>

#include "engine/cpu_backend.h"
#include "engine/engine.h"
#include "engine/weights.h"
#include "tests/engine/step_util.h"

namespace hr::engine {
namespace {

const std::string kFixtures = std::string(HEADROOM_SOURCE_DIR) + "/models/fixtures/";

nlohmann::json load_json(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

std::shared_ptr<const ModelWeights> load(const std::string& name) {
  auto w = load_weights(kFixtures + name);
  EXPECT_TRUE(w.is_ok()) << name << ": " << w.status().to_string();
  if (!w.is_ok()) return nullptr;
  return std::make_shared<const ModelWeights>(std::move(w).value());
}

std::shared_ptr<CpuBackend> backend(std::shared_ptr<const ModelWeights> w) {
  CpuBackendOptions o;
  o.kv_cache_bytes = 32 << 20;
  o.num_threads = 2;
  auto b = CpuBackend::create(std::move(w), o);
  EXPECT_TRUE(b.is_ok()) << b.status().to_string();
  return b.is_ok() ? std::shared_ptr<CpuBackend>(std::move(b).value()) : nullptr;
}

// Per MoE layer: [tokens, top_k] experts and weights, as the backend chose them.
struct Routing {
  std::vector<int32_t> experts;
  std::vector<float> weights;
};

// One step over one whole sequence, with logits at every position.
std::vector<float> forward_all(CpuBackend& b, const std::vector<int32_t>& ids,
                               std::map<int, Routing>* routing = nullptr, int top_k = 0) {
  if (routing) {
    b.set_routing_observer([routing, top_k](int layer, int n, const int32_t* e, const float* w) {
      (*routing)[layer] = {std::vector<int32_t>(e, e + n * top_k),
                           std::vector<float>(w, w + n * top_k)};
    });
  }
  std::vector<float> logits;
  Status s = forward_one_sequence(b, ids, 0, static_cast<int>(ids.size()), &logits);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  b.set_routing_observer(nullptr);
  return logits;
}

// Greedy answers through the engine, all prompts in one batch.
std::vector<std::vector<int32_t>> greedy(std::shared_ptr<Backend> b,
                                         const std::vector<std::vector<int32_t>>& prompts,
                                         int max_tokens) {
  EngineOptions eo;
  eo.scheduler.max_num_seqs = 64;
  return greedy_answers(std::move(b), prompts, max_tokens, eo);
}

class FixtureTest : public testing::TestWithParam<std::string> {};

TEST_P(FixtureTest, LogitsGreedyAndExpertsMatchTransformers) {
  const std::string name = GetParam();
  auto w = load(name);
  ASSERT_TRUE(w);
  auto ref = load_json(kFixtures + name + "/reference.json");
  if (ref.contains("same_as"))  // the same model in another form: the same answers
    ref = load_json(kFixtures + ref["same_as"].get<std::string>() + "/reference.json");
  EXPECT_EQ(w->config.model_type, ref["model_type"].get<std::string>());
  auto b = backend(w);
  ASSERT_TRUE(b);
  const int V = b->vocab_size(), K = w->config.moe.top_k;
  double max_diff = 0;
  int routed = 0, compared = 0, near_ties = 0;
  std::vector<std::vector<int32_t>> prompts, answers;
  for (const auto& p : ref["prompts"]) {
    std::vector<int32_t> ids = p["prompt"].get<std::vector<int32_t>>();
    prompts.push_back(ids);
    answers.push_back(p["greedy"].get<std::vector<int32_t>>());
    ids.insert(ids.end(), answers.back().begin(), answers.back().end());
    std::map<int, Routing> routing;
    const auto logits = forward_all(*b, ids, &routing, K);
    const auto& want = p["logits"];
    ASSERT_EQ(want.size(), ids.size());
    for (size_t t = 0; t < ids.size(); ++t) {
      ASSERT_EQ(want[t].size(), static_cast<size_t>(V));
      for (int v = 0; v < V; ++v) {
        const double d = std::abs(logits[t * V + v] - want[t][v].get<double>());
        max_diff = std::max(max_diff, d);
      }
    }
    if (!p.contains("routing")) continue;
    ASSERT_EQ(routing.size(), p["routing"].size()) << name << ": MoE layers";
    for (const auto& layer : p["routing"]) {
      const int li = layer["layer"].get<int>();
      ASSERT_TRUE(routing.count(li)) << name << ": layer " << li << " was not routed";
      const Routing& got = routing[li];
      for (size_t t = 0; t < ids.size(); ++t) {
        ++routed;
        if (layer["margins"][t].get<double>() <= 1e-3) {
          ++near_ties;
          continue;
        }
        ++compared;
        for (int j = 0; j < K; ++j) {
          EXPECT_EQ(got.experts[t * K + j], layer["experts"][t][j].get<int>())
              << name << " layer " << li << " token " << t << " choice " << j;
          EXPECT_NEAR(got.weights[t * K + j], layer["weights"][t][j].get<double>(), 1e-4)
              << name << " layer " << li << " token " << t << " choice " << j;
        }
      }
    }
  }
  EXPECT_LT(max_diff, 1e-4) << name;
  std::printf("%s: logits within %.2g; experts compared at %d of %d token-layers (%d near-ties)\n",
              name.c_str(), max_diff, compared, routed, near_ties);
  if (w->config.is_moe()) {
    EXPECT_GT(compared, routed / 2) << name;
  }
  // The greedy continuations, through the engine (prefill, then a decode step per token).
  const auto got = greedy(b, prompts, static_cast<int>(answers[0].size()));
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(got[i], answers[i]) << name << " " << i;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureTest,
                         testing::Values("qwen3", "qwen3-moe", "qwen3-moe-step2", "mixtral",
                                         "qwen3-moe-fused"),
                         [](const testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (char& ch : n)
                             if (ch == '-') ch = '_';
                           return n;
                         });

// transformers 5's fused experts (gate_up_proj, down_proj) load to the very weights of the
// per-expert tensors.
TEST(FixtureLoadTest, FusedExpertsLoadAsThePerExpertTensors) {
  auto a = load("qwen3-moe"), b = load("qwen3-moe-fused");
  ASSERT_TRUE(a && b);
  for (size_t l = 0; l < a->layers.size(); ++l) {
    EXPECT_EQ(a->layers[l].experts_gate_up, b->layers[l].experts_gate_up) << l;
    EXPECT_EQ(a->layers[l].experts_down, b->layers[l].experts_down) << l;
    EXPECT_EQ(a->layers[l].router, b->layers[l].router) << l;
    EXPECT_EQ(a->layers[l].w_gate_up, b->layers[l].w_gate_up) << l;
  }
  EXPECT_FALSE(a->layers[0].experts_gate_up.empty());
  EXPECT_TRUE(a->layers[1].experts_gate_up.empty());  // mlp_only_layers: [1]
  EXPECT_FALSE(a->layers[1].w_gate_up.empty());
}

// A sequence's tokens do not depend on what else is in its steps: 64 sequences at once (their
// experts' rows gathered with other sequences' rows) give what each gives alone.
TEST(FixtureBatchTest, TokensAreTheSameAloneAndInABatchOf64) {
  auto w = load("qwen3-moe");
  ASSERT_TRUE(w);
  std::vector<std::vector<int32_t>> prompts;
  for (int i = 0; i < 64; ++i) {
    std::vector<int32_t> p{256};
    for (int j = 0; j < 3 + i % 13; ++j) p.push_back((i * 31 + j * 17 + 5) % 256);
    prompts.push_back(p);
  }
  const auto batched = greedy(backend(w), prompts, 16);
  int differ = 0;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const auto alone = greedy(backend(w), {prompts[i]}, 16);
    EXPECT_EQ(alone[0], batched[i]) << "sequence " << i;
    differ += batched[i] != batched[0];
  }
  EXPECT_GT(differ, 32);  // the answers differ from one another: the test can tell them apart
}

}  // namespace
}  // namespace hr::engine
