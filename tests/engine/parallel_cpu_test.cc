// The parallel CPU engine (engine/parallel_cpu_backend.h) against one rank: tensor parallelism
// 1/2/4, pipeline parallelism 1/2 (with more micro-batches than stages, so sequences are cut
// between micro-batches) and TP2 x PP2, with experts sharded whole (EP) or sliced, on the bundled
// model, the Qwen3, Mixtral and Qwen3-MoE fixtures and a ~100M-parameter random Llama. Each case
// runs a prefill of three sequences and decode steps after it and requires every logit within
// 1e-5 of the single rank's, then the same greedy tokens through the engine. Also: the slicing
// itself (a shard's tensors are the right rows and columns of the full ones), options that do
// not fit the model refused naming the option, and the KV cache split over the ranks.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <future>
#include <map>
#include <thread>

#include <unistd.h>

#include "engine/cpu_backend.h"
#include "engine/engine.h"
#include "engine/parallel_cpu_backend.h"
#include "engine/safetensors.h"
#include "engine/weight_shard.h"
#include "engine/weights.h"
#include "tests/engine/constrained_util.h"
#include "tests/engine/step_util.h"
#include "tests/testing/random_model.h"

namespace hr::engine {
namespace {

const std::string kModels = std::string(HEADROOM_SOURCE_DIR) + "/models/";

std::string model_dir(const std::string& name) {
  return name == "tiny-reverse" ? kModels + name : kModels + "fixtures/" + name;
}

constexpr size_t kCacheBytes = 8 << 20;

std::shared_ptr<Backend> one_rank(const ModelWeights& w, int blocks) {
  CpuBackendOptions o;
  o.num_threads = 2;
  o.num_kv_blocks = blocks;
  auto b = CpuBackend::create(std::make_shared<const ModelWeights>(w), o);
  EXPECT_TRUE(b.is_ok()) << b.status().to_string();
  return b.is_ok() ? std::shared_ptr<Backend>(std::move(b).value()) : nullptr;
}

std::shared_ptr<ParallelCpuBackend> parallel(const ModelWeights& w, ParallelDegrees d,
                                             int micro_batches = 0) {
  ParallelCpuOptions o;
  o.degrees = d;
  o.kv_cache_bytes = kCacheBytes;
  o.num_threads = 2;
  o.micro_batches = micro_batches;
  auto b = ParallelCpuBackend::create(w, o);
  EXPECT_TRUE(b.is_ok()) << b.status().to_string();
  return b.is_ok() ? std::shared_ptr<ParallelCpuBackend>(std::move(b).value()) : nullptr;
}

// Greedy answers through the engine: a chunked 40-token prompt among short ones.
std::vector<std::vector<int32_t>> greedy(std::shared_ptr<Backend> b, int vocab, int max_tokens) {
  EngineOptions eo;
  eo.scheduler.max_num_seqs = 8;
  eo.scheduler.max_batched_tokens = 24;  // the long prompt prefills in chunks
  std::vector<std::vector<int32_t>> prompts = {{3, 5, 7, 9}, {1}, {}};
  for (int i = 0; i < 40; ++i) prompts[2].push_back((i * 37 + 11) % vocab);
  return greedy_answers(std::move(b), prompts, max_tokens, eo, 128);
}

double max_abs(const std::vector<std::vector<float>>& a) {
  double m = 0;
  for (const auto& v : a) {
    for (float x : v) m = std::max(m, static_cast<double>(std::abs(x)));
  }
  return m;
}

double max_abs_diff(const std::vector<std::vector<float>>& a,
                    const std::vector<std::vector<float>>& b) {
  double d = 0;
  EXPECT_EQ(a.size(), b.size());
  for (size_t s = 0; s < std::min(a.size(), b.size()); ++s) {
    EXPECT_EQ(a[s].size(), b[s].size());
    for (size_t i = 0; i < std::min(a[s].size(), b[s].size()); ++i) {
      d = std::max(d, static_cast<double>(std::abs(a[s][i] - b[s][i])));
    }
  }
  return d;
}

// Within 1e-5 of the logits' scale (the largest magnitude, at least 1): the ranks add the same
// products in another order (a row-parallel product is partial sums added rank by rank), so fp32
// rounding differs by a few ulps of the largest logits. The figures go to the test's XML.
void expect_close(const std::vector<std::vector<float>>& want,
                  const std::vector<std::vector<float>>& got) {
  const double scale = std::max(1.0, max_abs(want));
  const double diff = max_abs_diff(want, got);
  EXPECT_LE(diff, 1e-5 * scale) << "largest logit difference from one rank; largest logit "
                                << scale;
  char text[64];
  std::snprintf(text, sizeof text, "%.3g of %.4g", diff, scale);
  ::testing::Test::RecordProperty("max_logit_diff", text);
}

struct Case {
  std::string model;
  ParallelDegrees degrees;
  int micro_batches = 0;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) {
  std::string m = info.param.model;
  std::replace(m.begin(), m.end(), '-', '_');
  const ParallelDegrees& d = info.param.degrees;
  std::string name = m + "_tp" + std::to_string(d.tp) + "_pp" + std::to_string(d.pp);
  if (d.ep > 1) name += "_ep" + std::to_string(d.ep);
  if (info.param.micro_batches > 0) name += "_mb" + std::to_string(info.param.micro_batches);
  return name;
}

class ParallelCpuTest : public ::testing::TestWithParam<Case> {};

TEST_P(ParallelCpuTest, LogitsAndGreedyTokensEqualOneRank) {
  const Case& c = GetParam();
  const ModelWeights& w = loaded_weights(model_dir(c.model));
  ASSERT_GT(w.layers.size(), 0u);
  auto many = parallel(w, c.degrees, c.micro_batches);
  ASSERT_TRUE(many);
  EXPECT_EQ(many->num_ranks(), c.degrees.tp * c.degrees.pp);
  auto one = one_rank(w, many->num_kv_blocks());
  ASSERT_TRUE(one);
  const int V = w.config.vocab_size;
  expect_close(three_sequences(*one, 4), three_sequences(*many, 4));
  auto want = greedy(one, V, 12);
  auto got = greedy(many, V, 12);
  EXPECT_EQ(got, want);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[2].size(), 12u);
}

INSTANTIATE_TEST_SUITE_P(
    Models, ParallelCpuTest,
    ::testing::Values(Case{"tiny-reverse", {1, 1, 1}}, Case{"tiny-reverse", {2, 1, 1}},
                      Case{"tiny-reverse", {4, 1, 1}},  // KV heads replicated: 2 of them, 4 ranks
                      Case{"tiny-reverse", {1, 2, 1}}, Case{"tiny-reverse", {1, 2, 1}, 3},
                      Case{"tiny-reverse", {2, 2, 1}}, Case{"tiny-reverse", {1, 4, 1}, 5},
                      Case{"qwen3", {2, 1, 1}}, Case{"qwen3", {4, 1, 1}}, Case{"qwen3", {2, 2, 1}},
                      Case{"mixtral", {2, 1, 2}}, Case{"mixtral", {4, 1, 4}},
                      Case{"mixtral", {4, 1, 1}}, Case{"mixtral", {2, 2, 2}},
                      Case{"qwen3-moe", {2, 1, 2}}, Case{"qwen3-moe", {4, 1, 4}},
                      Case{"qwen3-moe", {2, 1, 1}}, Case{"qwen3-moe", {1, 2, 1}},
                      Case{"qwen3-moe", {2, 2, 2}}, Case{"qwen3-moe-step2", {2, 1, 2}},
                      Case{"qwen3-moe-step2", {4, 1, 1}}, Case{"qwen3-moe-step2", {2, 2, 1}, 3}),
    case_name);

// A ~100M-parameter Llama of random weights (12 layers of 768, 12 heads, 4 KV heads, a vocabulary
// of 32,000), written once for the suite.
class Parallel100MTest : public ::testing::TestWithParam<ParallelDegrees> {
 public:
  static void SetUpTestSuite() {
    dir_ = (std::filesystem::temp_directory_path() /
            ("headroom-parallel-100m-" + std::to_string(::getpid())))
               .string();
    hr::testing::RandomLlama spec;  // every embedding row random (no printable-only output)
    hr::testing::write_random_llama(dir_, kModels + "tiny-reverse", spec);
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  static std::string dir_;
};
std::string Parallel100MTest::dir_;

TEST_P(Parallel100MTest, LogitsAndGreedyTokensEqualOneRank) {
  const ModelWeights& w = loaded_weights(dir_);
  ASSERT_GT(w.num_parameters(), 90'000'000u);
  auto many = parallel(w, GetParam());
  ASSERT_TRUE(many);
  auto one = one_rank(w, many->num_kv_blocks());
  ASSERT_TRUE(one);
  const int V = w.config.vocab_size;
  expect_close(three_sequences(*one, 2), three_sequences(*many, 2));
  EXPECT_EQ(greedy(many, V, 6), greedy(one, V, 6));
}

INSTANTIATE_TEST_SUITE_P(Degrees, Parallel100MTest,
                         ::testing::Values(ParallelDegrees{2, 1, 1}, ParallelDegrees{4, 1, 1},
                                           ParallelDegrees{1, 2, 1}, ParallelDegrees{2, 2, 1}),
                         [](const ::testing::TestParamInfo<ParallelDegrees>& info) {
                           return "tp" + std::to_string(info.param.tp) + "_pp" +
                                  std::to_string(info.param.pp);
                         });

// A shard's tensors are the right slices of the full ones.
TEST(WeightShardTest, SlicesHeadsRowsExpertsAndVocabulary) {
  const ModelWeights& w = loaded_weights(model_dir("qwen3-moe"));
  const ModelConfig& c = w.config;
  const int D = c.hidden_size, hd = c.head_dim, Q = c.q_size(), KV = c.kv_size();
  auto s = shard_weights(w, {4, 2, 4}, 1, 3);  // stage 1 of 2 (layers 2, 3), rank 3 of 4
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const WeightShard p = s->shard();
  EXPECT_EQ(p.first_layer, 2);
  EXPECT_EQ(p.num_layers, 2);
  EXPECT_EQ(p.first_q_head, 3);
  EXPECT_EQ(p.num_q_heads, 1);
  EXPECT_EQ(p.first_kv_head, 1);  // head 3 of 4 reads KV head 1 of 2
  EXPECT_EQ(p.first_expert, 6);
  EXPECT_EQ(p.num_experts, 2);
  EXPECT_EQ(p.first_vocab, 195);
  EXPECT_EQ(p.vocab, 65);
  EXPECT_TRUE(s->embed.empty());
  ASSERT_EQ(s->layers.size(), 2u);
  const LayerWeights& full = w.layers[3];
  const LayerWeights& part = s->layers[1];
  ASSERT_EQ(part.wqkv.size(), static_cast<size_t>(3 * hd * D));
  // q row 5 of this rank's head is full row 3 * hd + 5; its first v row is full row Q + KV + hd.
  EXPECT_EQ(part.wqkv[5 * D + 7], full.wqkv[(3 * hd + 5) * D + 7]);
  EXPECT_EQ(part.wqkv[(2 * hd) * D + 1], full.wqkv[(Q + KV + hd) * D + 1]);
  // o's columns of head 3.
  EXPECT_EQ(part.wo[2 * hd + 4], full.wo[2 * Q + 3 * hd + 4]);
  // Expert 7 (this rank's second) whole: its down matrix [D, F] as it is.
  const int FE = c.moe.expert_intermediate_size;
  ASSERT_EQ(part.experts_down.size(), static_cast<size_t>(2 * D * FE));
  EXPECT_EQ(part.experts_down[D * FE + 9], full.experts_down[7 * D * FE + 9]);
  // The LM head's rows 195..259.
  EXPECT_EQ(s->lm_head[2 * D + 3], w.lm_head[197 * D + 3]);

  // Sliced experts (ep 1): rank 1 of 2 holds every expert's intermediate rows [F/2, F).
  auto sliced = shard_weights(w, {2, 1, 1}, 0, 1);
  ASSERT_TRUE(sliced.is_ok());
  const LayerWeights& half = sliced->layers[3];
  const int h = FE / 2;
  EXPECT_EQ(sliced->shard().num_experts, c.moe.num_experts);
  // Expert 5's up row h + 2 (full row FE + h + 2), and its down column h + 1.
  EXPECT_EQ(half.experts_gate_up[(5 * 2 * h + h + 2) * D],
            full.experts_gate_up[(5 * 2 * FE + FE + h + 2) * D]);
  EXPECT_EQ(half.experts_down[5 * D * h + 4 * h + 1],
            full.experts_down[5 * D * FE + 4 * FE + h + 1]);
}

// Each rank's shard read straight from the checkpoint, a layer at a time, equals the full load
// sliced: every tensor bitwise, for every rank of several layouts (tied and untied heads, experts
// whole and sliced, per-expert and fused checkpoints). And the engine built that way answers as
// one rank does.
TEST(WeightShardTest, LoadingAShardFromTheCheckpointEqualsSlicingTheWholeModel) {
  const std::vector<std::pair<std::string, ParallelDegrees>> cases = {
      {"tiny-reverse", {2, 2, 1}}, {"tiny-reverse", {4, 1, 1}}, {"qwen3", {2, 3, 1}},
      {"mixtral", {2, 2, 2}},      {"qwen3-moe", {4, 1, 4}},    {"qwen3-moe-fused", {2, 2, 1}}};
  for (const auto& [model, d] : cases) {
    const std::string dir = model_dir(model);
    const ModelWeights& full = loaded_weights(dir);
    auto st = SafetensorsModel::open_dir(dir);
    ASSERT_TRUE(st.is_ok());
    for (int stage = 0; stage < d.pp; ++stage) {
      for (int t = 0; t < d.tp; ++t) {
        auto want = shard_weights(full, d, stage, t);
        auto got = load_shard(**st, full.config, d, stage, t);
        ASSERT_TRUE(want.is_ok() && got.is_ok()) << model;
        const std::string at =
            model + " stage " + std::to_string(stage) + " rank " + std::to_string(t);
        EXPECT_EQ(got->embed, want->embed) << at;
        EXPECT_EQ(got->final_norm, want->final_norm) << at;
        EXPECT_EQ(got->lm_head, want->lm_head) << at;
        ASSERT_EQ(got->layers.size(), want->layers.size()) << at;
        for (size_t i = 0; i < got->layers.size(); ++i) {
          const LayerWeights &g = got->layers[i], &w = want->layers[i];
          EXPECT_TRUE(g.wqkv == w.wqkv && g.bqkv == w.bqkv && g.wo == w.wo &&
                      g.w_gate_up == w.w_gate_up && g.w_down == w.w_down &&
                      g.input_norm == w.input_norm && g.post_norm == w.post_norm &&
                      g.q_norm == w.q_norm && g.k_norm == w.k_norm && g.router == w.router &&
                      g.experts_gate_up == w.experts_gate_up && g.experts_down == w.experts_down)
              << at << " layer " << i;
        }
      }
    }
  }
  ParallelCpuOptions o;
  o.degrees = {2, 2, 2};
  o.kv_cache_bytes = kCacheBytes;
  o.num_threads = 2;
  LoadStats stats;
  auto from_dir = ParallelCpuBackend::create_from_dir(model_dir("mixtral"), o, &stats);
  ASSERT_TRUE(from_dir.is_ok()) << from_dir.status().to_string();
  EXPECT_GT(stats.checkpoint_bytes, 0u);
  EXPECT_GT(stats.seconds, 0.0);
  std::shared_ptr<Backend> many(std::move(from_dir).value());
  const ModelWeights& w = loaded_weights(model_dir("mixtral"));
  auto one = one_rank(w, many->num_kv_blocks());
  const int V = w.config.vocab_size;
  expect_close(three_sequences(*one, 2), three_sequences(*many, 2));
  EXPECT_EQ(greedy(many, V, 8), greedy(one, V, 8));
  o.degrees = {3, 1, 1};
  EXPECT_EQ(ParallelCpuBackend::create_from_dir(model_dir("mixtral"), o).status().field(),
            "tensor-parallel");
}

TEST(WeightShardTest, DegreesThatDoNotFitAreRefusedNamingTheOption) {
  const ModelWeights& w = loaded_weights(model_dir("qwen3-moe-step2"));  // 4 heads, 2 KV, 6 experts
  auto name = [&](ParallelDegrees d) {
    Status s = check_degrees(w.config, d);
    return s.is_ok() ? std::string("ok") : s.field();
  };
  EXPECT_EQ(name({3, 1, 1}), "tensor-parallel");  // 4 heads over 3
  EXPECT_EQ(name({8, 1, 1}), "tensor-parallel");  // 4 heads over 8
  EXPECT_EQ(name({1, 5, 1}), "pipeline-parallel");
  EXPECT_EQ(name({4, 1, 4}), "expert-parallel");  // 6 experts over 4
  EXPECT_EQ(name({2, 1, 4}), "expert-parallel");  // ep neither 1 nor tp
  EXPECT_EQ(name({2, 2, 2}), "ok");
  EXPECT_EQ(name({1, 2, 1, {3, 1}}), "ok");
  EXPECT_EQ(name({1, 2, 1, {3, 2}}), "stage-layers");     // 5 layers of 4
  EXPECT_EQ(name({1, 2, 1, {4, 0}}), "stage-layers");     // a stage of none
  EXPECT_EQ(name({1, 2, 1, {1, 1, 2}}), "stage-layers");  // three counts for two stages
  ParallelCpuOptions o;
  o.degrees = {4, 1, 4};
  auto b = ParallelCpuBackend::create(w, o);
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().field(), "expert-parallel");
  o.degrees = {2, 2, 1};
  o.kv_cache_bytes = 100;
  b = ParallelCpuBackend::create(w, o);
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().field(), "kv-cache-bytes");
}

// Each rank caches only its layers' and KV heads' share: TP2 x PP2 of a model whose 2 KV heads
// split over 2 ranks holds the cache of one rank in four parts, and as many blocks.
TEST(ParallelCpuBackendTest, TheKvCacheIsSplitOverTheRanks) {
  const ModelWeights& w = loaded_weights(model_dir("tiny-reverse"));
  auto four = parallel(w, {2, 2, 1});
  ASSERT_TRUE(four);
  CpuBackendOptions o;
  o.kv_cache_bytes = kCacheBytes;
  auto one = CpuBackend::create(std::make_shared<const ModelWeights>(w), o);
  ASSERT_TRUE(one.is_ok());
  EXPECT_EQ(four->num_kv_blocks(), (*one)->num_kv_blocks());
  EXPECT_EQ(four->kv_cache_bytes(), (*one)->kv_cache_bytes());
  // TP4 replicates each KV head on two ranks: twice the bytes a block, half the blocks.
  auto tp4 = parallel(w, {4, 1, 1});
  ASSERT_TRUE(tp4);
  EXPECT_EQ(tp4->num_kv_blocks(), (*one)->num_kv_blocks() / 2);
}

// abort() from another thread while steps run (docs/parallel-engine.md "When a rank stops"): the
// step under way returns, with kInternal naming the reason, as does every step after it, and the
// backend's threads end (no rank is left waiting for a peer).
TEST(ParallelCpuBackendTest, AbortEndsTheStepsAndLosesTheBackend) {
  const ModelWeights& w = loaded_weights(model_dir("tiny-reverse"));
  auto b = parallel(w, {2, 2, 1});
  ASSERT_TRUE(b);
  std::vector<int32_t> ids(20);
  for (int i = 0; i < 20; ++i) ids[static_cast<size_t>(i)] = (i * 37 + 11) % w.config.vocab_size;
  std::vector<float> logits;
  ASSERT_TRUE(forward_one_sequence(*b, ids, 0, 20, &logits).is_ok());
  std::atomic<int> steps{0};
  std::atomic<bool> give_up{false};  // (so that a failing test ends rather than steps for ever)
  auto stepping = std::async(std::launch::async, [&] {
    for (;;) {
      Status st = forward_one_sequence(*b, ids, 0, 20, &logits);
      if (!st.is_ok() || give_up) return st;
      ++steps;
    }
  });
  while (steps.load() < 3) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(b->abort("a step ran 300 s"));
  const bool ended = stepping.wait_for(std::chrono::seconds(30)) == std::future_status::ready;
  give_up = true;
  ASSERT_TRUE(ended);
  const Status st = stepping.get();
  EXPECT_EQ(st.code(), StatusCode::kInternal);
  EXPECT_NE(st.message().find("a step ran 300 s"), std::string::npos) << st.message();
  const Status after = forward_one_sequence(*b, ids, 0, 20, &logits);
  EXPECT_EQ(after.code(), StatusCode::kInternal);
  EXPECT_NE(after.message().find("a step ran 300 s"), std::string::npos) << after.message();
  b.reset();  // joins the rank threads: none waits for a peer
}

}  // namespace
}  // namespace hr::engine

namespace hr::engine {
namespace {

// Stages of as many layers as the degrees say hold those layers and compute as one rank does:
// bitwise with pipeline stages alone (a token's arithmetic is the same), within the tolerance
// with tensor parallelism and experts too.
TEST(ParallelCpuBackendTest, StagesOfUnevenLayersEqualOneRank) {
  const ModelWeights& w = loaded_weights(model_dir("tiny-reverse"));  // 4 layers
  for (const std::vector<int>& split : {std::vector<int>{3, 1}, std::vector<int>{1, 3}}) {
    auto many = parallel(w, {1, 2, 1, split});
    ASSERT_TRUE(many);
    EXPECT_EQ(many->stage_layers(), split);
    auto one = one_rank(w, many->num_kv_blocks());
    EXPECT_EQ(max_abs_diff(three_sequences(*one, 2), three_sequences(*many, 2)), 0.0);
    EXPECT_EQ(greedy(many, w.config.vocab_size, 8), greedy(one, w.config.vocab_size, 8));
  }
  const ModelWeights& moe = loaded_weights(model_dir("qwen3-moe"));  // 4 layers, 8 experts
  auto many = parallel(moe, {2, 3, 2, {1, 2, 1}});
  ASSERT_TRUE(many);
  EXPECT_EQ(many->stage_layers(), (std::vector<int>{1, 2, 1}));
  auto one = one_rank(moe, many->num_kv_blocks());
  expect_close(three_sequences(*one, 2), three_sequences(*many, 2));
}

// Answers through the engine with sampling, penalties, a logit bias and log probabilities, for
// eight prompts of different lengths (one chunked).
struct Sampled {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs;
  bool operator==(const Sampled&) const = default;
};
Sampled sampled_answers(std::shared_ptr<Backend> b, int groups_expected) {
  EngineOptions eo;
  eo.scheduler.max_num_seqs = 8;
  eo.scheduler.max_batched_tokens = 24;
  auto engine = Engine::create(std::move(b), nullptr, 128, eo);
  EXPECT_TRUE(engine.is_ok());
  if (!engine.is_ok()) return {};
  EXPECT_EQ((*engine)->step_groups(), groups_expected);
  Sampled out;
  out.tokens.resize(8);
  out.logprobs.resize(8);
  const int vocab = (*engine)->backend().vocab_size();
  std::vector<LogitBias> bias = {{5, 2.0f}, {7, -100.0f}};
  for (int i = 0; i < 8; ++i) {
    GenerationRequest r;
    for (int k = 0; k < 1 + (i * 7) % 30; ++k) r.prompt.push_back((i * 31 + k * 17 + 3) % vocab);
    r.params.max_tokens = 10 + i;
    r.params.ignore_eos = true;
    r.params.temperature = 0.9f;
    r.params.top_k = 40;
    r.params.seed = 100 + static_cast<uint64_t>(i);
    r.params.logprobs = 1;
    r.params.penalties.presence = 0.4f;
    r.params.logit_bias = bias;
    r.on_event = [&out, i](const TokenEvent& ev) {
      if (ev.token < 0) return;
      out.tokens[static_cast<size_t>(i)].push_back(ev.token);
      if (ev.logprobs) out.logprobs[static_cast<size_t>(i)].push_back(ev.logprobs->logprob);
    };
    EXPECT_TRUE((*engine)->add(std::move(r)).is_ok());
  }
  run_to_end(**engine);
  return out;
}

// Steps of disjoint sequences in flight, one group per stage by default (a step queued for the
// ranks while the one before is still in the later stages): sampled answers (seeded, with
// penalties, a bias and log probabilities) equal one rank's, at PP2, PP3 (uneven stages) and PP2
// of experts, and at TP2 x PP2 those of one group; so do those of one group (steps one after
// another, cut into micro-batches), of steps fed from the one before (the backend's pipelined
// option, its fed tokens taken from the queued step), and constrained answers in groups.
TEST(ParallelCpuBackendTest, StepsOfDisjointSequencesInFlightEqualOneRank) {
  struct Run {
    std::string model;
    ParallelDegrees degrees;
  };
  for (const Run& run : {Run{"tiny-reverse", {1, 2, 1}}, Run{"tiny-reverse", {1, 3, 1, {2, 1, 1}}},
                         Run{"tiny-reverse", {2, 2, 1}}, Run{"qwen3-moe", {1, 2, 1}}}) {
    SCOPED_TRACE(run.model + " tp" + std::to_string(run.degrees.tp) + " pp" +
                 std::to_string(run.degrees.pp));
    const ModelWeights& w = loaded_weights(model_dir(run.model));
    auto many = parallel(w, run.degrees);
    ASSERT_TRUE(many);
    EXPECT_EQ(many->step_groups(), run.degrees.pp);
    std::vector<Sampled> got;  // one group, steps fed from the one before, then groups
    for (bool fed : {false, true}) {
      ParallelCpuOptions o;
      o.degrees = run.degrees;
      o.kv_cache_bytes = kCacheBytes;
      o.num_threads = 2;
      o.step_groups = 1;
      o.pipelined = fed;
      auto one_group = ParallelCpuBackend::create(w, o);
      ASSERT_TRUE(one_group.is_ok());
      got.push_back(sampled_answers(std::move(one_group).value(), 1));
    }
    got.push_back(sampled_answers(many, run.degrees.pp));
    // Tensor-parallel ranks add their partial sums in another order than one rank: their logits
    // are within the tolerance (above), not bitwise, so sampling compares them with themselves.
    const Sampled want =
        run.degrees.tp == 1 ? sampled_answers(one_rank(w, many->num_kv_blocks()), 1) : got[0];
    ASSERT_EQ(want.tokens[7].size(), 17u);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(got[i] == want) << i;
  }
  const ModelWeights& w = loaded_weights(model_dir("tiny-reverse"));
  const nlohmann::json ref = nlohmann::json::parse(
      std::ifstream(model_dir("tiny-reverse") + "/reference.json"), nullptr, false);
  ASSERT_FALSE(ref.is_discarded());
  auto many = parallel(w, {1, 2, 1});
  ASSERT_TRUE(many);
  const auto in_groups = constrained_answers(ref, many, true, 8, true);
  const auto alone = constrained_answers(ref, one_rank(w, many->num_kv_blocks()), false, 8, true);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(in_groups.tokens[i], alone.tokens[i]) << "answer " << i;
    if (i % 2) expect_valid_document(in_groups.text[i], "answer " + std::to_string(i));
  }
}

// A model whose LM head is many times a layer (a vocabulary of 32,000 over layers of 256): with
// the layers split evenly the last stage is the slowest by the head's time, so the balancing
// moves layers to the first stage; the moved engine still computes as one rank does.
TEST(ParallelCpuBackendTest, BalancingMovesLayersOffTheStageThatHoldsALargeLmHead) {
  const std::string dir =
      (std::filesystem::temp_directory_path() / ("headroom-balance-" + std::to_string(::getpid())))
          .string();
  hr::testing::RandomLlama spec;
  spec.hidden = 256;
  spec.intermediate = 512;
  spec.layers = 8;
  spec.heads = 4;
  spec.kv_heads = 2;
  hr::testing::write_random_llama(dir, kModels + "tiny-reverse", spec);
  const ModelWeights& w = loaded_weights(dir);
  ParallelCpuOptions o;
  o.degrees = {1, 2, 1};
  o.kv_cache_bytes = kCacheBytes;
  o.num_threads = 2;
  o.balance_stages = true;
  auto made = ParallelCpuBackend::create(w, o);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  std::shared_ptr<ParallelCpuBackend> many(std::move(made).value());
  const StageBalance& b = many->stage_balance();
  ASSERT_TRUE(b.ran);
  EXPECT_EQ(b.layers_before, (std::vector<int>{4, 4}));
  ASSERT_EQ(b.layers_after.size(), 2u);
  EXPECT_GT(b.layers_after[0], 4) << "stage ms before " << b.seconds_before[0] * 1e3 << ", "
                                  << b.seconds_before[1] * 1e3;
  EXPECT_EQ(b.layers_after[0] + b.layers_after[1], 8);
  EXPECT_EQ(many->stage_layers(), b.layers_after);
  // What the split was chosen for: the slowest stage faster, as its measured parts add up.
  EXPECT_LT(std::max(b.predicted_after[0], b.predicted_after[1]),
            std::max(b.seconds_before[0], b.seconds_before[1]));
  auto one = one_rank(w, many->num_kv_blocks());
  EXPECT_EQ(max_abs_diff(three_sequences(*one, 2), three_sequences(*many, 2)), 0.0);
  EXPECT_EQ(greedy(many, w.config.vocab_size, 6), greedy(one, w.config.vocab_size, 6));
  // Explicit layers are taken as they are.
  o.degrees = {1, 2, 1, {4, 4}};
  auto fixed = ParallelCpuBackend::create(w, o);
  ASSERT_TRUE(fixed.is_ok());
  EXPECT_FALSE((*fixed)->stage_balance().ran);
  EXPECT_EQ((*fixed)->stage_layers(), (std::vector<int>{4, 4}));
  // A KV cache of 10 blocks holds none of the calibration's sequences: the split stays even.
  o.degrees = {1, 2, 1};
  o.kv_cache_bytes = 10 * (2 * 8 * 16 * 2 * 64 * sizeof(float));
  auto small = ParallelCpuBackend::create(w, o);
  ASSERT_TRUE(small.is_ok()) << small.status().to_string();
  EXPECT_EQ((*small)->num_kv_blocks(), 10);
  EXPECT_FALSE((*small)->stage_balance().ran);
  EXPECT_EQ((*small)->stage_layers(), (std::vector<int>{4, 4}));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace hr::engine
