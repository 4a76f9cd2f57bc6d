// The engine on the bundled model: batch invariance, chunked prefill, prefix caching and
// preemption all give the same greedy answers as one request alone (and as PyTorch). Also the CPU
// backend's parts: its GEMV against a double-precision reference at every SIMD level this CPU
// has, and its thread pool.
#include "engine/engine.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <sstream>

#include "engine/chat_template.h"
#include "engine/cpu_backend.h"
#include "engine/cpu_gemm.h"
#include "engine/sampler.h"
#include "engine/thread_pool.h"
#include "engine/weights.h"
#include "tests/engine/constrained_util.h"

namespace hr::engine {
namespace {

const std::string kModelDir = std::string(HEADROOM_SOURCE_DIR) + "/models/tiny-reverse";

struct Fixture {
  std::shared_ptr<const ModelWeights> weights;
  std::shared_ptr<const Tokenizer> tokenizer;
  nlohmann::json cases;

  static Fixture& get() {
    static Fixture f = [] {
      Fixture x;
      ModelWeights w = load_weights(kModelDir).value();
      pack_for_cpu(&w);  // once, for every engine the tests build
      x.weights = std::make_shared<const ModelWeights>(std::move(w));
      x.tokenizer = std::shared_ptr<const Tokenizer>(Tokenizer::load(kModelDir).value().release());
      std::ifstream in(kModelDir + "/reference.json");
      std::stringstream ss;
      ss << in.rdbuf();
      x.cases = nlohmann::json::parse(ss.str())["cases"];
      return x;
    }();
    return f;
  }

  std::shared_ptr<Backend> backend(int block_size, size_t kv_bytes, bool pipelined) {
    CpuBackendOptions bo;
    bo.block_size = block_size;
    bo.kv_cache_bytes = kv_bytes;
    bo.num_threads = 1;
    bo.pipelined = pipelined;
    auto backend = CpuBackend::create(weights, bo);
    EXPECT_TRUE(backend.is_ok());
    return std::shared_ptr<Backend>(std::move(backend).value());
  }

  std::unique_ptr<Engine> engine(std::shared_ptr<Backend> backend, SchedulerConfig sc) {
    EngineOptions o;
    o.scheduler = sc;
    auto e =
        Engine::create(std::move(backend), tokenizer, weights->config.max_position_embeddings, o)
            .value();
    EXPECT_EQ(e->pipelined(), e->backend().pipelined());
    return e;
  }

  // With `pipelined`, the engine plans each step before collecting the one before (as on a GPU).
  std::unique_ptr<Engine> engine(SchedulerConfig sc, int block_size = 16, size_t kv_bytes = 8 << 20,
                                 bool pipelined = false) {
    return engine(backend(block_size, kv_bytes, pipelined), sc);
  }
};

struct Outcome {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
  std::string text;
  FinishReason reason = FinishReason::kNone;
  Usage usage;
};

// Adds every prompt, runs to completion, returns outcomes in order.
std::vector<Outcome> run_all(Engine& e, const std::vector<std::vector<int32_t>>& prompts,
                             RequestClass cls = RequestClass::kSync, SamplingParams params = {},
                             const std::string& cache_namespace = "") {
  std::vector<Outcome> out(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    GenerationRequest r;
    r.prompt = prompts[i];
    r.cache_namespace = cache_namespace;
    r.params = params;
    if (r.params.max_tokens == 256) r.params.max_tokens = 40;
    r.cls = cls;
    r.on_event = [&out, i](const TokenEvent& ev) {
      if (ev.token >= 0) out[i].tokens.push_back(ev.token);
      if (ev.logprobs) out[i].logprobs.push_back(*ev.logprobs);
      out[i].text += ev.text_delta;
      if (ev.finished) {
        out[i].reason = ev.finish_reason;
        out[i].usage = ev.usage;
      }
    };
    EXPECT_TRUE(e.add(std::move(r)).is_ok());
  }
  for (int guard = 0; e.has_work() && guard < 10000; ++guard) {
    auto st = e.step();
    EXPECT_TRUE(st.is_ok()) << st.status().to_string();
  }
  return out;
}

std::vector<std::vector<int32_t>> prompts(int n, int offset = 0) {
  std::vector<std::vector<int32_t>> p;
  for (int i = 0; i < n; ++i) {
    p.push_back(Fixture::get()
                    .cases[static_cast<size_t>(offset + i)]["prompt_ids"]
                    .get<std::vector<int32_t>>());
  }
  return p;
}

std::vector<int32_t> expected(int i) {
  return Fixture::get().cases[static_cast<size_t>(i)]["output_ids"].get<std::vector<int32_t>>();
}

TEST(EngineTest, BatchOf32EqualsEachAloneAndPyTorch) {
  auto& f = Fixture::get();
  auto batch = f.engine({64, 512, 512});
  auto together = run_all(*batch, prompts(32));
  for (int i = 0; i < 32; ++i) {
    auto alone_engine = f.engine({64, 512, 512});
    auto alone = run_all(*alone_engine, prompts(1, i));
    EXPECT_EQ(together[static_cast<size_t>(i)].tokens, alone[0].tokens) << i;
    EXPECT_EQ(together[static_cast<size_t>(i)].tokens, expected(i)) << i;
    std::string text = f.cases[static_cast<size_t>(i)]["text"];
    EXPECT_EQ(together[static_cast<size_t>(i)].text, std::string(text.rbegin(), text.rend()));
    EXPECT_EQ(together[static_cast<size_t>(i)].reason, FinishReason::kStop);
    EXPECT_EQ(together[static_cast<size_t>(i)].usage.prompt_tokens,
              static_cast<int>(prompts(1, i)[0].size()));
  }
}

TEST(EngineTest, TinyChunkedPrefillEqualsUnchunked) {
  auto& f = Fixture::get();
  auto chunked = f.engine({8, 8, 3});
  auto out = run_all(*chunked, prompts(12, 40));
  for (int i = 0; i < 12; ++i) EXPECT_EQ(out[static_cast<size_t>(i)].tokens, expected(40 + i)) << i;
}

// Cached prompt blocks are shared within a namespace (an account) and never across: another
// account's identical prompt finds nothing, whatever it guesses.
TEST(EngineTest, PrefixCacheIsSharedOnlyWithinANamespace) {
  auto& f = Fixture::get();
  auto e = f.engine({8, 512, 512}, /*block_size=*/4);
  const auto p = prompts(1, 9);
  const int cached = (static_cast<int>(p[0].size()) - 1) / 4 * 4;
  EXPECT_EQ(run_all(*e, p, RequestClass::kSync, {}, "account-a")[0].usage.cached_tokens, 0);
  EXPECT_EQ(run_all(*e, p, RequestClass::kSync, {}, "account-b")[0].usage.cached_tokens, 0);
  EXPECT_EQ(run_all(*e, p, RequestClass::kSync, {})[0].usage.cached_tokens, 0);
  EXPECT_EQ(run_all(*e, p, RequestClass::kAsync, {}, "account-a")[0].usage.cached_tokens, cached);
  EXPECT_EQ(run_all(*e, p, RequestClass::kSync, {}, "account-b")[0].usage.cached_tokens, cached);
  EXPECT_EQ(run_all(*e, p, RequestClass::kSync, {})[0].usage.cached_tokens, cached);
  EXPECT_NE(BlockManager::namespace_root("account-a"), BlockManager::namespace_root("account-b"));
  EXPECT_EQ(BlockManager::namespace_root(""), 0u);
}

// A prefix the operator made public is shared across accounts, but only its own full blocks:
// what follows it in a prompt is still the account's alone, so another account sending the very
// same prompt hits the public blocks and nothing more, and the answers equal uncached ones.
TEST(EngineTest, APublicPrefixIsSharedAcrossAccountsAndNothingAfterIt) {
  auto& f = Fixture::get();
  std::vector<int32_t> pub = prompts(1, 3)[0];
  pub.insert(pub.end(), pub.begin(), pub.end());  // long enough for a few blocks
  pub.resize(8);                                  // two blocks of 4
  auto with_tail = [&](int case_index, bool reversed) {
    std::vector<int32_t> p = pub;
    auto tail = prompts(1, case_index)[0];
    if (reversed) std::reverse(tail.begin(), tail.end());  // tails that differ from their start
    p.insert(p.end(), tail.begin(), tail.end());
    return p;
  };
  const std::vector<int32_t> a = with_tail(9, false), b = with_tail(10, true);
  ASSERT_NE(a[8], b[8]);
  ASSERT_GE(a.size(), 14u);
  EngineOptions o;
  o.scheduler = {8, 512, 512};
  o.public_prefixes = {pub};
  auto e = Engine::create(f.backend(4, 8 << 20, false), f.tokenizer,
                          f.weights->config.max_position_embeddings, o)
               .value();
  const auto first = run_all(*e, {a}, RequestClass::kSync, {}, "account-a")[0];
  EXPECT_EQ(first.usage.cached_tokens, 0);
  EXPECT_EQ(run_all(*e, {b}, RequestClass::kSync, {}, "account-b")[0].usage.cached_tokens, 8)
      << "another account's prompt with the public prefix shares its blocks";
  const auto same = run_all(*e, {a}, RequestClass::kSync, {}, "account-b")[0];
  EXPECT_EQ(same.usage.cached_tokens, 8) << "and nothing of what account-a sent after it";
  EXPECT_EQ(same.tokens, first.tokens);
  const auto again = run_all(*e, {a}, RequestClass::kSync, {}, "account-a")[0];
  EXPECT_EQ(again.usage.cached_tokens, (static_cast<int>(a.size()) - 1) / 4 * 4)
      << "the account's own blocks after the public ones";
  EXPECT_EQ(again.tokens, first.tokens);
  // A prompt that only starts like the public prefix shares the blocks made of it alone.
  std::vector<int32_t> half(pub.begin(), pub.begin() + 6);
  const auto tail = prompts(1, 11)[0];
  half.insert(half.end(), tail.begin(), tail.end());
  EXPECT_EQ(run_all(*e, {half}, RequestClass::kSync, {}, "account-c")[0].usage.cached_tokens, 4);
}

TEST(EngineTest, PrefixCacheHitEqualsMissAndReportsCachedTokens) {
  auto& f = Fixture::get();
  auto e = f.engine({8, 512, 512}, /*block_size=*/4);
  auto first = run_all(*e, prompts(1, 7));
  EXPECT_EQ(first[0].usage.cached_tokens, 0);
  auto second = run_all(*e, prompts(1, 7));
  EXPECT_EQ(second[0].tokens, first[0].tokens);
  int prompt_len = static_cast<int>(prompts(1, 7)[0].size());
  EXPECT_EQ(second[0].usage.cached_tokens, (prompt_len - 1) / 4 * 4);
  EXPECT_GT(second[0].usage.cached_tokens, 0);
  EXPECT_GT(e->blocks().num_prefix_hit_blocks(), 0);
}

void expect_preempted_requests_equal_undisturbed_ones(bool pipelined) {
  auto& f = Fixture::get();
  // A KV cache of 32 blocks of 4 tokens: not enough for everything at once.
  const ModelConfig& c = f.weights->config;
  size_t block_bytes = 2ull * c.num_layers * 4 * c.kv_size() * sizeof(float);
  auto e = f.engine({16, 64, 64}, 4, 32 * block_bytes, pipelined);
  std::vector<Outcome> async_out(4), sync_out(4);
  auto add = [&](std::vector<Outcome>& out, int i, int case_index, RequestClass cls) {
    GenerationRequest r;
    r.prompt = prompts(1, case_index)[0];
    r.params.max_tokens = 40;
    r.cls = cls;
    r.on_event = [&out, i](const TokenEvent& ev) {
      if (ev.token >= 0) out[static_cast<size_t>(i)].tokens.push_back(ev.token);
      if (ev.finished) out[static_cast<size_t>(i)].reason = ev.finish_reason;
    };
    ASSERT_TRUE(e->add(std::move(r)).is_ok());
  };
  for (int i = 0; i < 4; ++i) add(async_out, i, 100 + i, RequestClass::kAsync);
  for (int s = 0; s < 6; ++s) ASSERT_TRUE(e->step().is_ok());
  EXPECT_GE(e->headroom().running_async, 2);
  int preempted = 0;
  for (int i = 0; i < 4; ++i) add(sync_out, i, 110 + i, RequestClass::kSync);
  auto st = e->step();
  ASSERT_TRUE(st.is_ok());
  preempted += st->num_preempted;
  EXPECT_GT(preempted, 0) << "sync arrivals should have preempted async work";
  EXPECT_GE(e->headroom().running_sync, 1);
  for (int guard = 0; e->has_work() && guard < 10000; ++guard) ASSERT_TRUE(e->step().is_ok());
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(async_out[static_cast<size_t>(i)].tokens, expected(100 + i)) << i;
    EXPECT_EQ(sync_out[static_cast<size_t>(i)].tokens, expected(110 + i)) << i;
  }
}

TEST(EngineTest, PreemptedAsyncRequestsEqualUndisturbedOnes) {
  expect_preempted_requests_equal_undisturbed_ones(false);
}

TEST(EngineTest, PreemptedAsyncRequestsEqualUndisturbedOnesWhenPipelined) {
  expect_preempted_requests_equal_undisturbed_ones(true);
}

TEST(EngineTest, SamplingIsReproducibleWithASeedAndStopsWork) {
  auto& f = Fixture::get();
  SamplingParams p;
  p.temperature = 1.5f;
  p.top_k = 20;
  p.top_p = 0.9f;
  p.seed = 42;
  auto a = run_all(*f.engine({8, 512, 512}), prompts(3, 20), RequestClass::kSync, p);
  auto b = run_all(*f.engine({8, 512, 512}), prompts(3, 20), RequestClass::kSync, p);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(a[static_cast<size_t>(i)].tokens, b[static_cast<size_t>(i)].tokens);

  int long_case = 0;
  while (f.cases[static_cast<size_t>(long_case)]["text"].get<std::string>().size() < 8) ++long_case;
  SamplingParams len;
  len.max_tokens = 3;
  auto l = run_all(*f.engine({8, 512, 512}), prompts(1, long_case), RequestClass::kSync, len);
  EXPECT_EQ(l[0].tokens.size(), 3u);
  EXPECT_EQ(l[0].reason, FinishReason::kLength);

  // Stop at the third character of the answer: the text ends before it.
  std::string text = f.cases[static_cast<size_t>(long_case)]["text"];
  std::string answer(text.rbegin(), text.rend());
  ASSERT_GE(answer.size(), 4u);
  SamplingParams stop;
  stop.stop = {answer.substr(2, 2)};
  auto s = run_all(*f.engine({8, 512, 512}), prompts(1, long_case), RequestClass::kSync, stop);
  EXPECT_EQ(s[0].reason, FinishReason::kStop);
  EXPECT_EQ(s[0].text, answer.substr(0, answer.find(answer.substr(2, 2))));
}

TEST(EngineTest, BadRequestsAreErrors) {
  auto e = Fixture::get().engine({8, 512, 512});
  GenerationRequest empty;
  EXPECT_EQ(e->add(std::move(empty)).status().field(), "prompt");
  GenerationRequest too_long;
  too_long.prompt.assign(200, 65);
  EXPECT_EQ(e->add(std::move(too_long)).status().field(), "messages");
  GenerationRequest bad_token;
  bad_token.prompt = {1, 99999};
  EXPECT_FALSE(e->add(std::move(bad_token)).is_ok());
}

void expect_same_outcomes(const std::vector<Outcome>& a, const std::vector<Outcome>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].tokens, b[i].tokens) << i;
    EXPECT_EQ(a[i].text, b[i].text) << i;
    EXPECT_EQ(a[i].reason, b[i].reason) << i;
    EXPECT_EQ(a[i].usage.prompt_tokens, b[i].usage.prompt_tokens) << i;
    EXPECT_EQ(a[i].usage.completion_tokens, b[i].usage.completion_tokens) << i;
    EXPECT_EQ(a[i].usage.cached_tokens, b[i].usage.cached_tokens) << i;
  }
}

// Sampled with a seed: the same tokens whenever the logits are the same.
SamplingParams seeded_sampling() {
  SamplingParams p;
  p.temperature = 1.2f;
  p.top_k = 20;
  p.top_p = 0.95f;
  p.seed = 7;
  return p;
}

// Pipelined steps (step N+1 planned and submitted before step N's tokens are collected, its
// decode tokens fed from step N's rows) give exactly what plain steps give: greedy answers,
// chunked prefill, seeded sampling, length limits and stop strings, with requests finishing at
// different steps so that finished sequences' extra tokens are dropped.
TEST(EngineTest, PipelinedStepsEqualPlainSteps) {
  auto& f = Fixture::get();
  auto piped = f.engine({64, 512, 512}, 16, 8 << 20, true);
  ASSERT_TRUE(piped->pipelined());
  auto together = run_all(*piped, prompts(32));
  for (int i = 0; i < 32; ++i) EXPECT_EQ(together[static_cast<size_t>(i)].tokens, expected(i)) << i;
  expect_same_outcomes(together, run_all(*f.engine({64, 512, 512}), prompts(32)));

  expect_same_outcomes(run_all(*f.engine({8, 8, 3}, 16, 8 << 20, true), prompts(12, 40)),
                       run_all(*f.engine({8, 8, 3}), prompts(12, 40)));

  const SamplingParams seeded = seeded_sampling();
  expect_same_outcomes(
      run_all(*f.engine({8, 512, 512}, 16, 8 << 20, true), prompts(6, 60), RequestClass::kAsync,
              seeded),
      run_all(*f.engine({8, 512, 512}), prompts(6, 60), RequestClass::kAsync, seeded));

  SamplingParams limits;
  limits.max_tokens = 3;
  limits.stop = {"e", "a"};
  expect_same_outcomes(
      run_all(*f.engine({4, 64, 16}, 16, 8 << 20, true), prompts(10, 80), RequestClass::kSync,
              limits),
      run_all(*f.engine({4, 64, 16}), prompts(10, 80), RequestClass::kSync, limits));
}

// A backend passing every call on to another (the test backends below change a few).
class WrappingBackend : public Backend {
 public:
  explicit WrappingBackend(std::shared_ptr<Backend> b) : b_(std::move(b)) {}
  const char* name() const override { return b_->name(); }
  int vocab_size() const override { return b_->vocab_size(); }
  int block_size() const override { return b_->block_size(); }
  int num_kv_blocks() const override { return b_->num_kv_blocks(); }
  size_t weight_bytes() const override { return b_->weight_bytes(); }
  size_t kv_cache_bytes() const override { return b_->kv_cache_bytes(); }
  Status forward(const StepInput& in, float* logits) override { return b_->forward(in, logits); }
  Status submit(const StepInput& in, const SampleSpec* specs) override {
    return b_->submit(in, specs);
  }
  Status collect(int32_t* tokens, TokenLogprobs* logprobs) override {
    return b_->collect(tokens, logprobs);
  }
  void discard() override { b_->discard(); }
  bool pipelined() const override { return b_->pipelined(); }
  int step_groups() const override { return b_->step_groups(); }

 protected:
  std::shared_ptr<Backend> b_;
};

// The CPU backend, counting the steps submitted whole and in halves (forward, then sampling).
class CountingBackend final : public WrappingBackend {
 public:
  using WrappingBackend::WrappingBackend;
  Status submit(const StepInput& in, const SampleSpec* specs) override {
    ++whole;
    return b_->submit(in, specs);
  }
  Status collect(int32_t* tokens, TokenLogprobs* logprobs) override {
    if (forwarded) ++collected_between;  // the step before collected while this one ran
    return b_->collect(tokens, logprobs);
  }
  bool splits_sampling() const override { return b_->splits_sampling(); }
  Status submit_forward(const StepInput& in) override {
    ++halves;
    forwarded = true;
    return b_->submit_forward(in);
  }
  Status submit_sampling(const SampleSpec* specs) override {
    forwarded = false;
    return b_->submit_sampling(specs);
  }
  int whole = 0, halves = 0, collected_between = 0;
  bool forwarded = false;
};

// Constrained answers with pipelined steps: each step's forward pass is submitted before the
// step in flight is collected, and its sampling after, with masks from the tokens collected; the
// answers equal plain steps' (sampled, seeded), and are valid documents.
TEST(EngineTest, PipelinedConstrainedStepsSampleAfterTheStepBeforeIsCollected) {
  auto& f = Fixture::get();
  const int n = 12;
  auto counted = std::make_shared<CountingBackend>(f.backend(16, 8 << 20, true));
  const auto piped =
      constrained_answers(nlohmann::json{{"cases", f.cases}}, counted, true, n, false);
  const auto plain = constrained_answers(nlohmann::json{{"cases", f.cases}},
                                         f.backend(16, 8 << 20, false), false, n, false);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(piped.tokens[i], plain.tokens[i]) << "answer " << i;
    expect_valid_document(piped.text[i], "answer " + std::to_string(i));
  }
  // Every decode step of the constrained batch after the first went in halves, the step before
  // collected between them.
  EXPECT_GT(counted->halves, 10);
  EXPECT_EQ(counted->collected_between, counted->halves);
}

// A backend that runs steps of disjoint sequences at once (as pipeline stages do), made of the
// CPU backend: each step is computed when submitted and its tokens are held until collected.
// It refuses what the engine must not do with it (fed rows, more steps than groups, a sequence
// sampled by two steps in flight: the block its sampled token's row is written to is in both)
// and counts how many steps were in flight.
class GroupedBackend final : public WrappingBackend {
 public:
  GroupedBackend(std::shared_ptr<Backend> b, int groups)
      : WrappingBackend(std::move(b)), groups_(groups) {}
  int step_groups() const override { return groups_; }
  Status submit(const StepInput& in, const SampleSpec* specs) override {
    if (in.fed_rows) return internal_error("a step fed from another");
    if (static_cast<int>(held_.size()) >= groups_) return internal_error("too many steps");
    // The blocks of the rows this step samples: none may be a step in flight's.
    std::set<int32_t> writes;
    for (int r = 0; r < in.num_logits; ++r) {
      const int t = in.logits_rows[r];
      int s = 0;
      while (in.seq_start[s + 1] <= t) ++s;
      writes.insert(in.block_table[s * in.max_blocks_per_seq + in.positions[t] / block_size()]);
    }
    for (const Held& h : held_) {
      for (int32_t blk : writes) {
        if (h.writes.count(blk)) return internal_error("two steps in flight sample one sequence");
      }
    }
    Held h;
    h.writes = std::move(writes);
    h.tokens.resize(static_cast<size_t>(in.num_logits));
    h.logprobs.resize(static_cast<size_t>(in.num_logits));
    HR_RETURN_IF_ERROR(b_->submit(in, specs));
    HR_RETURN_IF_ERROR(b_->collect(h.tokens.data(), h.logprobs.data()));
    held_.push_back(std::move(h));
    most_in_flight = std::max(most_in_flight, static_cast<int>(held_.size()));
    rows.push_back(in.num_logits);
    tokens.push_back(in.num_tokens);
    return Status::ok();
  }
  Status collect(int32_t* tokens, TokenLogprobs* logprobs) override {
    if (held_.empty()) return internal_error("no step to collect");
    const Held& h = held_.front();
    std::copy(h.tokens.begin(), h.tokens.end(), tokens);
    if (logprobs) std::copy(h.logprobs.begin(), h.logprobs.end(), logprobs);
    held_.pop_front();
    return Status::ok();
  }
  void discard() override { held_.clear(); }
  int most_in_flight = 0;
  std::vector<int> rows;    // each step's logits rows
  std::vector<int> tokens;  // and tokens

 private:
  struct Held {
    std::set<int32_t> writes;
    std::vector<int32_t> tokens;
    std::vector<TokenLogprobs> logprobs;
  };
  int groups_;
  std::deque<Held> held_;
};

// Steps of disjoint sequences in flight (as many as the backend's groups, none fed from another)
// give exactly what plain steps give: greedy answers, chunked prefill, seeded sampling with log
// probabilities, length limits and stop strings; the groups fill (as many steps in flight as
// groups) and share the tokens out evenly.
TEST(EngineTest, StepsOfDisjointSequencesInFlightEqualPlainSteps) {
  auto& f = Fixture::get();
  for (int groups : {2, 3}) {
    auto grouped = std::make_shared<GroupedBackend>(f.backend(16, 8 << 20, false), groups);
    auto e = f.engine(grouped, {64, 512, 512});
    ASSERT_EQ(e->step_groups(), groups);
    auto together = run_all(*e, prompts(32));
    for (int i = 0; i < 32; ++i)
      EXPECT_EQ(together[static_cast<size_t>(i)].tokens, expected(i)) << groups << " " << i;
    EXPECT_EQ(grouped->most_in_flight, groups);
    // The prompts go out in the first `groups` steps, each about its share of their tokens (a
    // prompt cut where a step's share ends), and every step samples at most its share of the 32.
    int prompt_tokens = 0, first_steps = 0;
    for (const auto& p : prompts(32)) prompt_tokens += static_cast<int>(p.size());
    for (int k = 0; k < groups; ++k) {
      const int t = grouped->tokens[static_cast<size_t>(k)];
      first_steps += t;
      EXPECT_NEAR(t, prompt_tokens / groups, prompt_tokens / groups / 20) << groups << " " << k;
    }
    EXPECT_EQ(first_steps, prompt_tokens);
    EXPECT_LE(*std::max_element(grouped->rows.begin(), grouped->rows.end()),
              (32 + groups - 1) / groups);
    EXPECT_EQ(e->blocks().num_available(), e->blocks().num_blocks());

    auto chunked = std::make_shared<GroupedBackend>(f.backend(16, 8 << 20, false), groups);
    expect_same_outcomes(run_all(*f.engine(chunked, {8, 8, 3}), prompts(12, 40)),
                         run_all(*f.engine({8, 8, 3}), prompts(12, 40)));

    SamplingParams seeded = seeded_sampling();
    seeded.logprobs = 2;
    seeded.penalties.frequency = 0.5f;
    auto sampled = std::make_shared<GroupedBackend>(f.backend(16, 8 << 20, false), groups);
    const auto a =
        run_all(*f.engine(sampled, {8, 512, 512}), prompts(6, 60), RequestClass::kAsync, seeded);
    const auto b = run_all(*f.engine({8, 512, 512}), prompts(6, 60), RequestClass::kAsync, seeded);
    expect_same_outcomes(a, b);
    for (size_t i = 0; i < a.size(); ++i) {
      ASSERT_EQ(a[i].logprobs.size(), b[i].logprobs.size());
      for (size_t t = 0; t < a[i].logprobs.size(); ++t)
        EXPECT_EQ(a[i].logprobs[t].logprob, b[i].logprobs[t].logprob) << i << " " << t;
    }

    SamplingParams limits;
    limits.max_tokens = 3;
    limits.stop = {"e", "a"};
    auto limited = std::make_shared<GroupedBackend>(f.backend(16, 8 << 20, false), groups);
    expect_same_outcomes(
        run_all(*f.engine(limited, {4, 64, 16}), prompts(10, 80), RequestClass::kSync, limits),
        run_all(*f.engine({4, 64, 16}), prompts(10, 80), RequestClass::kSync, limits));
  }
}

// Constrained answers with steps of disjoint sequences in flight: a sequence is planned only
// once its token is known, so its mask is filled before its step is submitted (never in halves);
// the answers equal plain steps' and are valid documents.
TEST(EngineTest, ConstrainedStepsInGroupsEqualPlainSteps) {
  auto& f = Fixture::get();
  const int n = 12;
  auto grouped = std::make_shared<GroupedBackend>(f.backend(16, 8 << 20, false), 2);
  const auto in_groups =
      constrained_answers(nlohmann::json{{"cases", f.cases}}, grouped, true, n, true);
  const auto plain = constrained_answers(nlohmann::json{{"cases", f.cases}},
                                         f.backend(16, 8 << 20, false), false, n, true);
  for (int i = 0; i < n; ++i) {
    EXPECT_EQ(in_groups.tokens[i], plain.tokens[i]) << "answer " << i;
    if (i % 2) expect_valid_document(in_groups.text[i], "answer " + std::to_string(i));
  }
  EXPECT_EQ(grouped->most_in_flight, 2);
}

TEST(EngineTest, PipelinedPrefixCacheHitEqualsMiss) {
  auto& f = Fixture::get();
  auto e = f.engine({8, 512, 512}, /*block_size=*/4, 8 << 20, true);
  auto first = run_all(*e, prompts(1, 9));
  auto second = run_all(*e, prompts(1, 9));
  EXPECT_EQ(first[0].tokens, expected(9));
  EXPECT_EQ(second[0].tokens, expected(9));
  int prompt_len = static_cast<int>(prompts(1, 9)[0].size());
  EXPECT_EQ(second[0].usage.cached_tokens, (prompt_len - 1) / 4 * 4);
  // Every block went back: nothing leaked by the dropped extra steps.
  EXPECT_EQ(e->blocks().num_available(), e->blocks().num_blocks());
}

TEST(EngineTest, PipelinedCancelWhileATokenIsOnTheWay) {
  auto& f = Fixture::get();
  auto e = f.engine({8, 512, 512}, 16, 8 << 20, true);
  std::vector<Outcome> out(3);
  std::vector<int> events_after_final(3, 0);
  std::vector<int64_t> ids;
  for (int i = 0; i < 3; ++i) {
    GenerationRequest r;
    r.prompt = prompts(1, 30 + i)[0];
    r.params.max_tokens = 40;
    r.on_event = [&, i](const TokenEvent& ev) {
      if (out[static_cast<size_t>(i)].reason != FinishReason::kNone)
        ++events_after_final[static_cast<size_t>(i)];
      if (ev.token >= 0) out[static_cast<size_t>(i)].tokens.push_back(ev.token);
      if (ev.finished) out[static_cast<size_t>(i)].reason = ev.finish_reason;
    };
    ids.push_back(e->add(std::move(r)).value());
  }
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(e->step().is_ok());
  // Request 1 is in the step on its way and in the one planned next.
  e->cancel(ids[1]);
  EXPECT_EQ(out[1].reason, FinishReason::kCancelled);
  for (int guard = 0; e->has_work() && guard < 10000; ++guard) ASSERT_TRUE(e->step().is_ok());
  EXPECT_EQ(out[0].tokens, expected(30));
  EXPECT_EQ(out[2].tokens, expected(32));
  std::vector<int32_t> want = expected(31);
  ASSERT_LT(out[1].tokens.size(), want.size());
  EXPECT_TRUE(std::equal(out[1].tokens.begin(), out[1].tokens.end(), want.begin()));
  EXPECT_EQ(events_after_final, std::vector<int>(3, 0));
  EXPECT_EQ(e->blocks().num_available(), e->blocks().num_blocks());
}

// A backend whose collect() fails once, after the wrapped step ran (its tokens are lost), or whose
// submit() fails once (nothing queued).
class FailingBackend final : public WrappingBackend {
 public:
  FailingBackend(std::shared_ptr<Backend> inner, int fail_collect_at, int fail_submit_at = 0)
      : WrappingBackend(std::move(inner)),
        fail_at_(fail_collect_at),
        fail_submit_at_(fail_submit_at) {}
  const char* name() const override { return "failing"; }
  Status submit(const StepInput& in, const SampleSpec* specs) override {
    table_widths_.push_back(in.max_blocks_per_seq);
    if (++submits_ == fail_submit_at_) return internal_error("could not queue the step");
    return b_->submit(in, specs);
  }
  Status collect(int32_t* tokens, TokenLogprobs* logprobs) override {
    HR_RETURN_IF_ERROR(b_->collect(tokens, logprobs));
    if (++collects_ == fail_at_) return internal_error("lost the step's tokens");
    if (auto it = injected_.find(collects_); it != injected_.end())
      tokens[it->second.first] = it->second.second;
    return Status::ok();
  }
  // Collect `at` returns `token` in row `row`: not a vocabulary id, as a device sampler does for a
  // row of NaN logits, or a token of the test's choosing.
  void return_invalid_token(int at, int row, int32_t token) { injected_[at] = {row, token}; }
  int submits() const { return submits_; }
  // The block-table width of each step submitted.
  const std::vector<int>& table_widths() const { return table_widths_; }

 private:
  std::vector<int> table_widths_;
  int fail_at_;
  int fail_submit_at_;
  int collects_ = 0;
  int submits_ = 0;
  std::map<int, std::pair<int, int32_t>> injected_;  // collect → (row, token)
};

// Four requests through an engine on `failing`, whose one failure (a collect or a submit) the
// engine recovers from: every answer is whole and right, and every block went back.
void expect_a_failure_loses_nothing(std::shared_ptr<FailingBackend> failing,
                                    const std::string& what) {
  auto e = Fixture::get().engine(std::move(failing), {8, 512, 512});
  std::vector<Outcome> out(4);
  for (int i = 0; i < 4; ++i) {
    GenerationRequest r;
    r.prompt = prompts(1, 50 + i)[0];
    r.params.max_tokens = 40;
    r.on_event = [&out, i](const TokenEvent& ev) {
      if (ev.token >= 0) out[static_cast<size_t>(i)].tokens.push_back(ev.token);
      if (ev.finished) out[static_cast<size_t>(i)].reason = ev.finish_reason;
    };
    ASSERT_TRUE(e->add(std::move(r)).is_ok());
  }
  int failures = 0;
  for (int guard = 0; e->has_work() && guard < 10000; ++guard)
    failures += e->step().is_ok() ? 0 : 1;
  EXPECT_EQ(failures, 1) << what;
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(out[static_cast<size_t>(i)].tokens, expected(50 + i)) << what << " " << i;
    EXPECT_EQ(out[static_cast<size_t>(i)].reason, FinishReason::kStop) << what << " " << i;
  }
  EXPECT_EQ(e->blocks().num_available(), e->blocks().num_blocks()) << what;
}

// fail_at > 0: collect fail_at fails; else submit -fail_at does.
std::shared_ptr<FailingBackend> failing_at(std::shared_ptr<Backend> inner, int fail_at) {
  return fail_at > 0 ? std::make_shared<FailingBackend>(std::move(inner), fail_at)
                     : std::make_shared<FailingBackend>(std::move(inner), 0, -fail_at);
}

TEST(EngineTest, AFailedStepLosesNoTokens) {
  auto& f = Fixture::get();
  for (bool pipelined : {false, true}) {
    // Collects 1, 3 and 6 fail, then submits 1, 2 and 5 (the second one while a step is in flight).
    for (int fail_at : {1, 3, 6, -1, -2, -5}) {
      expect_a_failure_loses_nothing(failing_at(f.backend(16, 8 << 20, pipelined), fail_at),
                                     std::to_string(pipelined) + " " + std::to_string(fail_at));
    }
  }
}

// A failed collect or submit with steps of disjoint sequences in flight drops every one of them
// and plans their sequences again: no token is lost, and no block.
TEST(EngineTest, AFailedStepInGroupsLosesNoTokens) {
  auto& f = Fixture::get();
  for (int fail_at : {1, 3, 6, -2, -5}) {
    auto failing =
        failing_at(std::make_shared<GroupedBackend>(f.backend(16, 8 << 20, false), 2), fail_at);
    EXPECT_EQ(failing->step_groups(), 2);
    expect_a_failure_loses_nothing(failing, "groups " + std::to_string(fail_at));
  }
}

// A step that returns no valid token for one sequence (the device sampler's -1 for a row of NaN
// logits, or an id past the vocabulary) ends that sequence with kError and a message; the others
// finish with their own answers, and no KV block is left behind.
TEST(EngineTest, AnInvalidTokenEndsItsSequenceInAnError) {
  auto& f = Fixture::get();
  for (bool pipelined : {false, true}) {
    for (int32_t bad : {-1, 1 << 30}) {
      auto backend = std::make_shared<FailingBackend>(f.backend(16, 8 << 20, pipelined), 0);
      // The third collect: every prompt is in by then and each sequence has a row.
      backend->return_invalid_token(3, 1, bad);
      auto e = f.engine(backend, {8, 512, 512});
      std::vector<Outcome> out(3);
      std::vector<std::string> errors(3);
      std::vector<int> events_after_final(3, 0);
      for (int i = 0; i < 3; ++i) {
        GenerationRequest r;
        r.prompt = prompts(1, 60 + i)[0];
        r.params.max_tokens = 40;
        r.on_event = [&, i](const TokenEvent& ev) {
          const auto k = static_cast<size_t>(i);
          if (out[k].reason != FinishReason::kNone) ++events_after_final[k];
          if (ev.token >= 0) out[k].tokens.push_back(ev.token);
          if (ev.finished) {
            out[k].reason = ev.finish_reason;
            errors[k] = ev.error;
          }
        };
        ASSERT_TRUE(e->add(std::move(r)).is_ok());
      }
      for (int guard = 0; e->has_work() && guard < 10000; ++guard) ASSERT_TRUE(e->step().is_ok());
      const std::string label =
          "pipelined " + std::to_string(pipelined) + " token " + std::to_string(bad);
      int failed = 0;
      for (int i = 0; i < 3; ++i) {
        const auto k = static_cast<size_t>(i);
        const std::vector<int32_t> want = expected(60 + i);
        if (out[k].reason != FinishReason::kError) {
          EXPECT_EQ(out[k].tokens, want) << label << " " << i;
          EXPECT_EQ(out[k].reason, FinishReason::kStop) << label << " " << i;
          EXPECT_EQ(errors[k], "") << label << " " << i;
          continue;
        }
        ++failed;
        EXPECT_NE(errors[k].find("no valid token (" + std::to_string(bad) + ")"), std::string::npos)
            << errors[k];
        // What it had before the bad row is its own answer's start.
        ASSERT_LT(out[k].tokens.size(), want.size()) << label;
        EXPECT_TRUE(std::equal(out[k].tokens.begin(), out[k].tokens.end(), want.begin())) << label;
      }
      EXPECT_EQ(failed, 1) << label;
      EXPECT_EQ(events_after_final, std::vector<int>(3, 0)) << label;
      EXPECT_EQ(e->num_active(), 0);
      EXPECT_EQ(e->blocks().num_available(), e->blocks().num_blocks()) << label;
    }
  }
}

// fail_all ends every request, running, waiting or with a step under way, in kError with the
// reason, once; the KV cache is empty after it and the engine takes new work.
// An answer that ends (EOS) inside a character ends with U+FFFD for its bytes, as at max_tokens
// and as Hugging Face's decode does, not with the bytes silently dropped; the log-probability
// entry of the character's first byte goes out with it.
TEST(EngineTest, AnUnfinishedCharacterAtEosEndsAsAReplacementCharacter) {
  auto& f = Fixture::get();
  const std::vector<int32_t> euro = f.tokenizer->encode("\xe2\x82\xac");
  ASSERT_EQ(euro.size(), 3u);  // one token per byte
  ASSERT_FALSE(f.tokenizer->eos_ids().empty());
  auto backend = std::make_shared<FailingBackend>(f.backend(16, 8 << 20, false), 0);
  backend->return_invalid_token(1, 0, euro[0]);  // the prefill samples a lead byte
  backend->return_invalid_token(2, 0, f.tokenizer->eos_ids()[0]);  // then EOS
  auto e = f.engine(backend, {4, 512, 512});
  SamplingParams params;
  params.logprobs = 0;
  auto out = run_all(*e, prompts(1), RequestClass::kSync, params);
  EXPECT_EQ(out[0].reason, FinishReason::kStop);
  EXPECT_EQ(out[0].text, "\xef\xbf\xbd");
  EXPECT_EQ(out[0].logprobs.size(), 1u);  // the lead byte's; none for EOS
}

TEST(EngineTest, FailAllEndsEveryRequestWithTheReason) {
  auto& f = Fixture::get();
  for (bool pipelined : {false, true}) {
    auto e = f.engine(f.backend(16, 8 << 20, pipelined), {2, 512, 512});  // two run, two wait
    std::vector<int> cases;  // answers long enough to be under way after three steps
    for (int c = 0; cases.size() < 5; ++c) {
      if (f.cases[static_cast<size_t>(c)]["text"].get<std::string>().size() >= 10)
        cases.push_back(c);
    }
    std::vector<Outcome> out(4);
    std::vector<std::string> errors(4);
    std::vector<int> finals(4, 0);
    for (int i = 0; i < 4; ++i) {
      GenerationRequest r;
      r.prompt = prompts(1, cases[static_cast<size_t>(i)])[0];
      r.params.max_tokens = 40;
      r.on_event = [&, i](const TokenEvent& ev) {
        const auto k = static_cast<size_t>(i);
        if (ev.token >= 0) out[k].tokens.push_back(ev.token);
        if (!ev.finished) return;
        ++finals[k];
        out[k].reason = ev.finish_reason;
        errors[k] = ev.error;
      };
      ASSERT_TRUE(e->add(std::move(r)).is_ok());
    }
    for (int s = 0; s < 3; ++s) ASSERT_TRUE(e->step().is_ok());
    EXPECT_GT(e->blocks().num_available(), 0);
    EXPECT_LT(e->blocks().num_available(), e->blocks().num_blocks());
    e->fail_all("the device stopped answering");
    EXPECT_FALSE(e->has_work()) << pipelined;
    EXPECT_EQ(e->num_active(), 0);
    EXPECT_EQ(e->blocks().num_available(), e->blocks().num_blocks()) << pipelined;
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(out[static_cast<size_t>(i)].reason, FinishReason::kError) << i;
      EXPECT_EQ(errors[static_cast<size_t>(i)], "the device stopped answering") << i;
      EXPECT_EQ(finals[static_cast<size_t>(i)], 1) << i;
    }
    EXPECT_GT(out[0].tokens.size(), 0u);  // it was running
    EXPECT_EQ(out[3].tokens.size(), 0u);  // it was waiting
    // Still usable afterwards.
    auto again = run_all(*e, prompts(1, cases[4]));
    EXPECT_EQ(again[0].tokens, expected(cases[4]));
  }
}

// After fail_all nothing is found in the prefix cache: the steps that failed may have left cached
// blocks without their K/V.
TEST(EngineTest, FailAllEmptiesThePrefixCache) {
  auto& f = Fixture::get();
  auto e = f.engine(f.backend(4, 8 << 20, false), SchedulerConfig{});
  const std::vector<int32_t> p = prompts(1)[0];
  ASSERT_GE(p.size(), 8u);
  const std::vector<Outcome> first = run_all(*e, {p});
  EXPECT_GT(run_all(*e, {p})[0].usage.cached_tokens, 0);  // cached, as it should be
  GenerationRequest r;
  r.prompt = p;
  r.params.max_tokens = 40;
  r.on_event = [](const TokenEvent&) {};
  ASSERT_TRUE(e->add(std::move(r)).is_ok());
  ASSERT_TRUE(e->step().is_ok());
  e->fail_all("the device stopped answering");
  EXPECT_EQ(e->blocks().num_cached(), 0);
  EXPECT_EQ(e->blocks().num_available(), e->blocks().num_blocks());
  const std::vector<Outcome> after = run_all(*e, {p});
  EXPECT_EQ(after[0].usage.cached_tokens, 0);
  EXPECT_EQ(after[0].tokens, first[0].tokens);
}

// A sequence whose pending token reaches max_tokens is not planned again: a pipelined engine
// submits as many steps as a plain one for a request that ends by length.
TEST(EngineTest, PipelinedEngineSubmitsNoStepPastMaxTokens) {
  auto& f = Fixture::get();
  int long_case = 0;
  while (f.cases[static_cast<size_t>(long_case)]["text"].get<std::string>().size() < 8) ++long_case;
  for (bool pipelined : {false, true}) {
    auto counting = std::make_shared<FailingBackend>(f.backend(16, 8 << 20, pipelined), 0);
    auto e = f.engine(counting, {8, 512, 512});
    SamplingParams p;
    p.max_tokens = 3;
    auto out = run_all(*e, prompts(1, long_case), RequestClass::kSync, p);
    EXPECT_EQ(out[0].tokens.size(), 3u);
    EXPECT_EQ(out[0].reason, FinishReason::kLength);
    EXPECT_EQ(counting->submits(), 3) << "pipelined " << pipelined;
  }
}

// A step's block tables are as wide as its longest sequence needs, not as the model's context
// allows (33 blocks of 4 here): they grow as the sequences do, and the answers are unchanged.
// No sequence can need more KV than the whole cache: the context is capped at the cache's size, so
// a long answer ends there with kLength instead of waiting for a block forever (which held up
// every request behind it).
TEST(EngineTest, ContextIsCappedAtTheKvCache) {
  auto& f = Fixture::get();
  auto probe = f.backend(16, 8 << 20, false);
  const size_t per_block = probe->kv_cache_bytes() / static_cast<size_t>(probe->num_kv_blocks());
  auto e = f.engine(f.backend(16, 4 * per_block, false), SchedulerConfig{});
  ASSERT_LT(4 * 16, f.weights->config.max_position_embeddings);
  EXPECT_EQ(e->context_length(), 4 * 16);
  SamplingParams p;
  p.max_tokens = 1000;
  p.ignore_eos = true;
  const std::vector<int32_t> prompt = prompts(1)[0];
  std::vector<Outcome> out = run_all(*e, {prompt, prompt}, RequestClass::kAsync, p);
  for (const Outcome& o : out) {
    EXPECT_EQ(o.reason, FinishReason::kLength);
    EXPECT_EQ(o.usage.prompt_tokens + o.usage.completion_tokens, 4 * 16);
  }
  EXPECT_FALSE(e->has_work());
}

TEST(EngineTest, BlockTablesAreAsWideAsTheStepNeeds) {
  auto& f = Fixture::get();
  for (bool pipelined : {false, true}) {
    auto recording = std::make_shared<FailingBackend>(f.backend(4, 8 << 20, pipelined), 0);
    auto e = f.engine(recording, {8, 512, 512});
    auto out = run_all(*e, prompts(4, 60));
    size_t longest = 0;
    for (int i = 0; i < 4; ++i) {
      EXPECT_EQ(out[static_cast<size_t>(i)].tokens, expected(60 + i)) << i;
      longest = std::max(longest,
                         prompts(1, 60 + i)[0].size() + out[static_cast<size_t>(i)].tokens.size());
    }
    const auto& widths = recording->table_widths();
    ASSERT_FALSE(widths.empty());
    const int widest = *std::max_element(widths.begin(), widths.end());
    EXPECT_LE(widest, static_cast<int>(longest + 3) / 4) << "pipelined " << pipelined;
    EXPECT_LT(widths.back(), 33);
    EXPECT_LT(*std::min_element(widths.begin(), widths.end()), widest) << "the tables never grew";
  }
}

// Steps that would read or write outside the backend's memory are refused before anything runs,
// and a good step still runs afterwards. The CUDA backend makes the same check (check_step).
TEST(CpuBackendTest, RefusesStepsOutsideItsMemory) {
  auto& f = Fixture::get();
  auto b = f.backend(16, 8 << 20, false);
  const int nb = b->num_kv_blocks();
  struct Step {
    std::vector<int32_t> ids = {5, 6, 7}, positions = {0, 1, 40}, seq_start = {0, 2, 3};
    std::vector<int32_t> table = {0, 1, 2, 3, 4, 5, 6, 7}, rows = {1, 2};
    StepInput input() const {
      StepInput in;
      in.num_tokens = static_cast<int>(ids.size());
      in.num_seqs = static_cast<int>(seq_start.size()) - 1;
      in.token_ids = ids.data();
      in.positions = positions.data();
      in.seq_start = seq_start.data();
      in.block_table = table.data();
      in.max_blocks_per_seq = 4;
      in.logits_rows = rows.data();
      in.num_logits = static_cast<int>(rows.size());
      return in;
    }
  };
  std::vector<float> logits(static_cast<size_t>(2 * b->vocab_size()));
  ASSERT_TRUE(b->forward(Step{}.input(), logits.data()).is_ok());
  const std::vector<std::pair<const char*, std::function<void(Step&)>>> bad = {
      {"out of range", [](Step& s) { s.ids[1] = 1 << 20; }},
      {"out of range", [](Step& s) { s.ids[0] = -1; }},
      {"outside the block table", [](Step& s) { s.positions[2] = 4 * 16; }},
      {"outside the block table", [](Step& s) { s.positions[0] = -1; }},
      {"outside the KV cache", [&](Step& s) { s.table[0] = nb; }},
      {"outside the KV cache",
       [](Step& s) { s.table[5] = -1; }},  // read, not written: before position 40's block
      {"do not cover",
       [](Step& s) {
         s.seq_start = {0, 2, 2};
       }},
      {"do not cover",
       [](Step& s) {
         s.seq_start = {1, 2, 3};
       }},
      {"ends before it starts",
       [](Step& s) {
         s.seq_start = {0, 3, 1, 3};
         s.table.resize(12, 0);
       }},
      {"logits row out of range", [](Step& s) { s.rows[1] = 3; }},
  };
  for (const auto& [what, spoil] : bad) {
    Step st;
    spoil(st);
    Status r = b->forward(st.input(), logits.data());
    EXPECT_EQ(r.code(), StatusCode::kInvalidArgument) << what << ": " << r.to_string();
    EXPECT_NE(r.to_string().find(what), std::string::npos) << r.to_string();
  }
  ASSERT_TRUE(b->forward(Step{}.input(), logits.data()).is_ok());
}

// A step that runs one whole sequence, positions 0 to n-1, through `table` (its width the step's)
// and takes the logits of its last row.
struct WholeSequenceStep {
  std::vector<int32_t> positions, seq_start, rows;
  StepInput in;
  WholeSequenceStep(const std::vector<int32_t>& tokens, const std::vector<int32_t>& table) {
    const int n = static_cast<int>(tokens.size());
    for (int i = 0; i < n; ++i) positions.push_back(i);
    seq_start = {0, n};
    rows = {n - 1};
    in.num_tokens = n;
    in.num_seqs = 1;
    in.token_ids = tokens.data();
    in.positions = positions.data();
    in.seq_start = seq_start.data();
    in.block_table = table.data();
    in.max_blocks_per_seq = static_cast<int>(table.size());
    in.logits_rows = rows.data();
    in.num_logits = 1;
  }
  WholeSequenceStep(const WholeSequenceStep&) = delete;  // `in` points into it
  WholeSequenceStep& operator=(const WholeSequenceStep&) = delete;
};

// The backend side of pipelining: a token fed from the previous step's sampled row gives the same
// step as that token given outright; fed rows outside that step, and a third outstanding step,
// are refused.
TEST(CpuBackendTest, FedTokensEqualKnownTokens) {
  auto& f = Fixture::get();
  const std::vector<int32_t> prompt = prompts(1, 3)[0];
  const int n = static_cast<int>(prompt.size());
  auto run = [&](bool feed, std::vector<int32_t>* first, std::vector<int32_t>* second) {
    auto b = f.backend(16, 8 << 20, true);
    const std::vector<int32_t> block_table = {0, 1, 2, 3};
    const WholeSequenceStep whole(prompt, block_table);
    const StepInput& in = whole.in;
    SampleSpec greedy;
    first->assign(1, -1);
    ASSERT_TRUE(b->forward_sample(in, &greedy, first->data()).is_ok());
    // The next step: the token just sampled, fed or given.
    std::vector<int32_t> ids = {feed ? 0 : (*first)[0]}, pos = {n}, start = {0, 1}, fed = {0},
                         row0 = {0};
    StepInput next = in;
    next.num_tokens = 1;
    next.token_ids = ids.data();
    next.positions = pos.data();
    next.seq_start = start.data();
    next.logits_rows = row0.data();
    if (feed) next.fed_rows = fed.data();
    second->assign(1, -1);
    ASSERT_TRUE(b->submit(next, &greedy).is_ok());
    ASSERT_TRUE(b->collect(second->data(), nullptr).is_ok());
    if (feed) {
      std::vector<int32_t> bad = {1};
      next.fed_rows = bad.data();
      EXPECT_EQ(b->submit(next, &greedy).code(), StatusCode::kInvalidArgument);
      next.fed_rows = nullptr;
      ASSERT_TRUE(b->submit(next, &greedy).is_ok());
      ASSERT_TRUE(b->submit(next, &greedy).is_ok());
      EXPECT_FALSE(b->submit(next, &greedy).is_ok());
      std::vector<float> logits(static_cast<size_t>(b->vocab_size()));
      next.fed_rows = fed.data();
      EXPECT_EQ(b->forward(next, logits.data()).code(), StatusCode::kInvalidArgument);
    }
  };
  std::vector<int32_t> a1, a2, b1, b2;
  run(false, &a1, &a2);
  run(true, &b1, &b2);
  EXPECT_EQ(a1, b1);
  EXPECT_EQ(a2, b2);
  const std::vector<int32_t> want = expected(3);
  ASSERT_GE(want.size(), 2u);
  EXPECT_EQ(std::vector<int32_t>({a1[0], a2[0]}),
            std::vector<int32_t>(want.begin(), want.begin() + 2));
}

std::vector<SimdLevel> simd_levels() {
  std::vector<SimdLevel> levels = {SimdLevel::kScalar};
  if (cpu_simd_level() >= SimdLevel::kAvx2) levels.push_back(SimdLevel::kAvx2);
  if (cpu_simd_level() >= SimdLevel::kAvx512) levels.push_back(SimdLevel::kAvx512);
  return levels;
}

// Packs w, runs the product over two adjacent panel ranges (as the pool splits them; panel 0 stays
// out when there are several) and checks every output against a double-precision reference.
void expect_product_matches(int m, int n, int k, bool accumulate, SimdLevel level,
                            std::mt19937& rng) {
  std::uniform_real_distribution<float> uniform(-1.0f, 1.0f);
  auto fill = [&](std::vector<float>& v) {
    for (float& f : v) f = uniform(rng);
  };
  std::vector<float> x(static_cast<size_t>(m) * k), w(static_cast<size_t>(n) * k);
  std::vector<float> y0(static_cast<size_t>(m) * n);
  fill(x);
  fill(w);
  fill(y0);
  // Poison the padding: packing must zero it.
  std::vector<float> packed(packed_size(n, k), std::nanf(""));
  pack_panels(w.data(), n, k, packed.data());
  for (int r = 0; r < n; r += std::max(1, n / 5)) {
    std::vector<float> row(static_cast<size_t>(k));
    unpack_row(packed.data(), k, r, row.data());
    ASSERT_TRUE(std::equal(row.begin(), row.end(), w.begin() + static_cast<ptrdiff_t>(r) * k))
        << "unpack_row n=" << n << " k=" << k << " r=" << r;
  }
  std::vector<float> y = y0;
  PanelProduct p{x.data(), packed.data(), y.data(), m, n, k, accumulate};
  const int panels = num_panels(n);
  const int first = panels > 1 ? 1 : 0;
  const int mid = std::max(first, (panels + 1) / 2);
  multiply_panels(p, first, mid, level);
  multiply_panels(p, mid, panels, level);
  for (int i = 0; i < m; ++i) {
    for (int r = 0; r < n; ++r) {
      size_t at = static_cast<size_t>(i) * n + r;
      if (r < first * kPanelRows) {
        EXPECT_EQ(y[at], y0[at]) << "a column outside the panels was written";
        continue;
      }
      double ref = accumulate ? y0[at] : 0.0;
      double magnitude = std::abs(ref);
      for (int j = 0; j < k; ++j) {
        double t = static_cast<double>(w[static_cast<size_t>(r) * k + j]) *
                   x[static_cast<size_t>(i) * k + j];
        ref += t;
        magnitude += std::abs(t);
      }
      ASSERT_NEAR(y[at], ref, 1e-5 * magnitude + 1e-30)
          << simd_level_name(level) << " m=" << m << " n=" << n << " k=" << k
          << " accumulate=" << accumulate << " i=" << i << " r=" << r;
    }
  }
}

// n past whole panels, k odd, m across the tile heights (8, 6, 4) and their remainders.
const std::pair<int, int> kOddSizes[] = {{1, 1},   {3, 5},    {7, 13},  {17, 31},   {37, 67},
                                         {5, 129}, {29, 300}, {50, 96}, {11, 1031}, {64, 768}};

// NaN is never drawn (a row of nothing but NaN gives -1, which ends the sequence in an error),
// -inf never either, and +inf always: as on the GPU.
TEST(SamplerTest, NaNAndInfiniteLogits) {
  const int V = 64;
  std::vector<float> logits(V);
  for (int i = 0; i < V; ++i)
    logits[static_cast<size_t>(i)] = std::sin(static_cast<float>(i)) * 3.0f;
  for (int i = 0; i < V; i += 3) logits[static_cast<size_t>(i)] = NAN;
  for (int i = 1; i < V; i += 3) logits[static_cast<size_t>(i)] = -INFINITY;
  auto spec = [](float t, float top_p, int top_k, uint64_t random) {
    SampleSpec s;
    s.temperature = t;
    s.top_p = top_p;
    s.top_k = top_k;
    s.random = random;
    return s;
  };
  std::vector<int> finite;
  for (int i = 2; i < V; i += 3) finite.push_back(i);
  std::sort(finite.begin(), finite.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  const std::set<int32_t> top3(finite.begin(), finite.begin() + 3);
  EXPECT_EQ(sample_token(logits.data(), V, spec(0.0f, 1.0f, 0, 1)), finite[0]);
  std::set<int32_t> seen;
  for (uint64_t r = 1; r <= 300; ++r) {
    for (const SampleSpec& sp :
         {spec(1.0f, 1.0f, 0, r), spec(1.0f, 0.5f, 0, r), spec(2.0f, 1.0f, 3, r)}) {
      int32_t t = sample_token(logits.data(), V, sp);
      ASSERT_TRUE(t >= 0 && t < V) << t;
      EXPECT_TRUE(std::isfinite(logits[static_cast<size_t>(t)])) << t;
      if (sp.top_k == 3) {
        EXPECT_TRUE(top3.count(t)) << t;
      }
      seen.insert(t);
    }
  }
  EXPECT_GT(seen.size(), 3u);
  std::vector<float> with_inf = logits;
  with_inf[20] = INFINITY;
  for (const SampleSpec& sp :
       {spec(0.0f, 1.0f, 0, 1), spec(1.0f, 1.0f, 0, 7), spec(1.0f, 0.5f, 5, 9)}) {
    EXPECT_EQ(sample_token(with_inf.data(), V, sp), 20);
  }
  const std::vector<float> all_nan(V, NAN);
  for (const SampleSpec& sp : {spec(0.0f, 1.0f, 0, 1), spec(1.0f, 0.9f, 5, 3)}) {
    EXPECT_EQ(sample_token(all_nan.data(), V, sp), -1);
  }
  // Every token banned (NaN aside): the lowest -inf id, as greedy, at any temperature.
  std::vector<float> banned = logits;
  for (int i = 2; i < V; i += 3) banned[static_cast<size_t>(i)] = -INFINITY;
  for (const SampleSpec& sp :
       {spec(0.0f, 1.0f, 0, 1), spec(1.0f, 1.0f, 0, 5), spec(1.0f, 0.5f, 4, 6)}) {
    EXPECT_EQ(sample_token(banned.data(), V, sp), 1);
  }
  // A NaN temperature samples greedily.
  EXPECT_EQ(sample_token(logits.data(), V, spec(NAN, 1.0f, 0, 8)), finite[0]);
}

// Penalties by hand: repetition divides positive logits and multiplies negative ones for every
// listed token (prompt-only ones too); frequency and presence then subtract for generated ones.
// The row's input token counts once more when penalize_input, listed or not.
// Drawn at temperature with no top-k or top-p (every token kept, no sort), with top-k, or with
// top-p (the kept set found among the best first), tokens come as often as their softmax over the
// kept set says, and a -inf token never does.
TEST(SamplerTest, DrawsFollowTheSoftmax) {
  const std::vector<float> logits = {1.0f, -INFINITY, 0.0f, 2.0f, -1.0f, 0.5f};
  const int V = static_cast<int>(logits.size());
  struct Setting {
    float t;
    int top_k;
    float top_p;
  };
  for (const auto& [t, top_k, top_p] :
       {Setting{1.0f, 0, 1.0f}, Setting{0.7f, 0, 1.0f}, Setting{1.0f, 4, 1.0f},
        Setting{1.0f, 0, 0.8f}, Setting{1.0f, 0, 0.3f}}) {
    std::vector<double> want(logits.size(), 0.0);
    std::vector<int> kept;
    for (int i = 0; i < V; ++i)
      if (std::isfinite(logits[i])) kept.push_back(i);
    std::sort(kept.begin(), kept.end(), [&](int a, int b) { return logits[a] > logits[b]; });
    if (top_k > 0) kept.resize(static_cast<size_t>(top_k));
    if (top_p < 1.0f) {  // the smallest highest-probability set reaching top_p
      double all = 0, acc = 0;
      for (int i : kept) all += std::exp(logits[static_cast<size_t>(i)] / t);
      size_t keep = 0;
      while (keep < kept.size() && acc < top_p)
        acc += std::exp(logits[static_cast<size_t>(kept[keep++])] / t) / all;
      kept.resize(keep);
    }
    double z = 0;
    for (int i : kept) z += std::exp(logits[static_cast<size_t>(i)] / t);
    for (int i : kept)
      want[static_cast<size_t>(i)] = std::exp(logits[static_cast<size_t>(i)] / t) / z;
    std::vector<int> count(logits.size(), 0);
    const int draws = 40000;
    for (int d = 0; d < draws; ++d) {
      SampleSpec spec;
      spec.temperature = t;
      spec.top_k = top_k;
      spec.top_p = top_p;
      spec.random = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(d + 1);
      ++count[static_cast<size_t>(sample_token(logits.data(), V, spec))];
    }
    EXPECT_EQ(count[1], 0);
    for (int i = 0; i < V; ++i) {
      EXPECT_NEAR(count[static_cast<size_t>(i)] / static_cast<double>(draws),
                  want[static_cast<size_t>(i)], 0.01)
          << "token " << i << " at temperature " << t << " top_k " << top_k << " top_p " << top_p;
    }
  }
}

// Top-p over a flat distribution keeps more than the few hundred best: the kept set is found by
// sorting everything, and holds the top_p share of the tokens (ties in id order).
TEST(SamplerTest, TopPBeyondTheFirstFewHundred) {
  const std::vector<float> flat(1000, 0.0f);
  std::set<int32_t> seen;
  int32_t highest = 0;
  for (int d = 0; d < 20000; ++d) {
    SampleSpec spec;
    spec.temperature = 1.0f;
    spec.top_p = 0.9f;
    spec.random = 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(d + 1);
    const int32_t t = sample_token(flat.data(), 1000, spec);
    seen.insert(t);
    highest = std::max(highest, t);
  }
  EXPECT_LE(highest, 900);
  EXPECT_GT(seen.size(), 850u);
}

TEST(SamplerTest, PenaltiesFollowOpenAiAndTransformers) {
  const std::vector<float> logits = {2.0f, -1.0f, 0.5f, 3.0f, 1.0f};
  const std::vector<PenaltyToken> seen = {{0, 2}, {1, 0}, {3, 1}};
  SampleSpec s;
  s.penalties = {0.5f, 0.25f, 2.0f};
  s.penalty_tokens = seen.data();
  s.num_penalty_tokens = 3;
  auto penalized = [&](const SampleSpec& spec, int32_t input) {
    std::vector<float> l = logits;
    apply_penalties(l.data(), 5, spec, input);
    return l;
  };
  EXPECT_EQ(penalized(s, 3), (std::vector<float>{-0.25f, -2.0f, 0.5f, 0.75f, 1.0f}));
  s.penalize_input = true;  // the input token 3 (listed) counts twice, 4 (not listed) once
  EXPECT_EQ(penalized(s, 3), (std::vector<float>{-0.25f, -2.0f, 0.5f, 0.25f, 1.0f}));
  EXPECT_EQ(penalized(s, 4), (std::vector<float>{-0.25f, -2.0f, 0.5f, 0.75f, -0.25f}));
  EXPECT_EQ(penalized(s, 99), penalized(s, -1));  // an input outside the vocabulary is no token
  SampleSpec none = s;
  none.penalties = Penalties{};
  EXPECT_EQ(penalized(none, 4), logits);
  // A logit bias is added after the penalties, to the tokens it names.
  SampleSpec biased = s;
  const std::vector<LogitBias> bias = {
      {2, 10.0f}, {4, -1.0f}, {77, 5.0f}};  // 77: past the vocabulary
  biased.logit_bias = bias.data();
  biased.num_logit_bias = 3;
  EXPECT_EQ(penalized(biased, 3), (std::vector<float>{-0.25f, -2.0f, 10.5f, 0.25f, 0.0f}));
  // Greedy sampling picks the penalized argmax: 4 where 3 was.
  std::vector<float> l = penalized(s, 3);
  EXPECT_EQ(sample_token(l.data(), 5, s), 4);
}

// Greedy decoding that recomputes the whole sequence each step, counts the tokens itself and
// applies the penalties by hand; the log-softmax of each step's penalized logits (in double) goes
// to `log_softmax` when given.
std::vector<int32_t> recompute(const std::vector<int32_t>& prompt, const SamplingParams& params,
                               std::vector<std::vector<double>>* log_softmax = nullptr) {
  auto& f = Fixture::get();
  auto b = f.backend(16, 8 << 20, false);
  const int V = b->vocab_size();
  std::vector<int32_t> tokens = prompt, out;
  std::vector<float> logits(static_cast<size_t>(V));
  std::vector<int32_t> table(64);
  for (int i = 0; i < 64; ++i) table[static_cast<size_t>(i)] = i;
  for (int step = 0; step < params.max_tokens; ++step) {
    const WholeSequenceStep whole(tokens, table);
    EXPECT_TRUE(b->forward(whole.in, logits.data()).is_ok());
    if (params.penalties.any()) {
      std::map<int32_t, int> generated;
      for (int32_t t : out) generated[t]++;
      const std::set<int32_t> all(tokens.begin(), tokens.end());
      for (int32_t t : all) {
        float& x = logits[static_cast<size_t>(t)];
        const Penalties& pen = params.penalties;
        x = x > 0 ? x / pen.repetition : x * pen.repetition;
        if (generated.count(t))
          x -= pen.frequency * static_cast<float>(generated[t]) + pen.presence;
      }
    }
    if (log_softmax) {
      const double mx = *std::max_element(logits.begin(), logits.end());
      double sum = 0;
      for (float x : logits) sum += std::exp(x - mx);
      std::vector<double> row(static_cast<size_t>(V));
      for (int i = 0; i < V; ++i)
        row[static_cast<size_t>(i)] = logits[static_cast<size_t>(i)] - mx - std::log(sum);
      log_softmax->push_back(std::move(row));
    }
    const int32_t next =
        static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(next);
    tokens.push_back(next);
    if (std::find(f.tokenizer->eos_ids().begin(), f.tokenizer->eos_ids().end(), next) !=
        f.tokenizer->eos_ids().end())
      break;
  }
  return out;
}

// Log probabilities by hand, also where the logits hold +inf (the tokens with it share certainty)
// or nothing but -inf (every token alike), so that no answer shows NaN.
TEST(SamplerTest, LogprobsOfFiniteAndInfiniteLogits) {
  const std::vector<float> logits = {1.0f, 2.0f, NAN, 0.0f};
  TokenLogprobs lp;
  token_logprobs(logits.data(), 4, 1, 2, &lp);
  const double lse = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(0.0));
  EXPECT_NEAR(lp.logprob, 2.0 - lse, 1e-6);
  ASSERT_EQ(lp.num_top, 2);
  EXPECT_EQ(lp.top_ids[0], 1);
  EXPECT_EQ(lp.top_ids[1], 0);
  EXPECT_NEAR(lp.top_logprobs[1], 1.0 - lse, 1e-6);
  const std::vector<float> with_inf = {INFINITY, 3.0f, INFINITY, -INFINITY};
  token_logprobs(with_inf.data(), 4, 2, 4, &lp);
  EXPECT_FLOAT_EQ(lp.logprob, -std::log(2.0f));
  ASSERT_EQ(lp.num_top, 4);
  EXPECT_EQ(std::vector<int32_t>(lp.top_ids, lp.top_ids + 4), (std::vector<int32_t>{0, 2, 1, 3}));
  EXPECT_EQ(lp.top_logprobs[2], -INFINITY);
  const std::vector<float> all_minus_inf(4, -INFINITY);
  token_logprobs(all_minus_inf.data(), 4, 0, 1, &lp);
  EXPECT_FLOAT_EQ(lp.logprob, -std::log(4.0f));
  token_logprobs(logits.data(), 4, -1, 0, &lp);  // no token: -inf, no alternatives asked
  EXPECT_EQ(lp.logprob, -INFINITY);
  EXPECT_EQ(lp.num_top, 0);
}

// The engine's penalties equal the recomputing loop, also when pipelined (the input token of each
// decode step is then fed on the backend and counted there); and they change the answers.
TEST(EngineTest, PenaltiesEqualARecomputingLoop) {
  auto& f = Fixture::get();
  SamplingParams params;
  params.max_tokens = 24;
  params.penalties = {1.5f, 1.0f, 1.4f};
  const auto ps = prompts(6, 6);  // 7 and 11 repeat letters: "unnnqu", "bb", "hh"
  std::vector<std::vector<int32_t>> want;
  for (const auto& p : ps) want.push_back(recompute(p, params));
  for (bool pipelined : {false, true}) {
    auto e = f.engine({8, 512, 512}, 16, 8 << 20, pipelined);
    auto got = run_all(*e, ps, RequestClass::kSync, params);
    for (size_t i = 0; i < ps.size(); ++i)
      EXPECT_EQ(got[i].tokens, want[i]) << "pipelined " << pipelined << " " << i;
  }
  auto plain = f.engine({8, 512, 512});
  SamplingParams no_penalties;
  no_penalties.max_tokens = 24;
  auto unpenalized = run_all(*plain, ps, RequestClass::kSync, no_penalties);
  int differ = 0;
  for (size_t i = 0; i < ps.size(); ++i) differ += unpenalized[i].tokens != want[i];
  EXPECT_GT(differ, 0);
}

// A logit bias of +100 all but forces its token; -100 on the answer's first token turns it away.
TEST(EngineTest, LogitBiasForcesAndBansTokens) {
  auto& f = Fixture::get();
  const auto ps = prompts(2, 30);
  for (bool pipelined : {false, true}) {
    auto e = f.engine({8, 512, 512}, 16, 8 << 20, pipelined);
    SamplingParams plain;
    plain.max_tokens = 6;
    const auto base = run_all(*e, ps, RequestClass::kSync, plain);
    const int32_t forced = f.tokenizer->encode("z")[0];
    SamplingParams force = plain;
    force.logit_bias = {{forced, 100.0f}};
    SamplingParams ban = plain;
    ban.logit_bias = {{base[0].tokens[0], -100.0f}};
    const auto forced_out = run_all(*e, ps, RequestClass::kSync, force);
    for (const auto& o : forced_out)
      EXPECT_EQ(o.tokens, std::vector<int32_t>(6, forced)) << pipelined;
    const auto banned = run_all(*e, {ps[0]}, RequestClass::kSync, ban);
    ASSERT_FALSE(banned[0].tokens.empty());
    EXPECT_NE(banned[0].tokens[0], base[0].tokens[0]) << pipelined;
  }
}

// Log probabilities: one per answer token (none for the EOS that ends it), each the log-softmax of
// that step's penalized logits, with the most likely tokens highest first; plain and pipelined.
TEST(EngineTest, LogprobsAreThoseOfTheRecomputedSteps) {
  auto& f = Fixture::get();
  SamplingParams params;
  params.max_tokens = 24;
  params.penalties.presence = 0.5f;
  params.logprobs = 5;
  const auto ps = prompts(4, 20);
  for (bool pipelined : {false, true}) {
    auto e = f.engine({8, 512, 512}, 16, 8 << 20, pipelined);
    auto got = run_all(*e, ps, RequestClass::kSync, params);
    for (size_t i = 0; i < ps.size(); ++i) {
      std::vector<std::vector<double>> ref;
      const std::vector<int32_t> want = recompute(ps[i], params, &ref);
      ASSERT_EQ(got[i].tokens, want) << i;
      const auto& eos = f.tokenizer->eos_ids();
      const bool ended_by_eos = std::find(eos.begin(), eos.end(), want.back()) != eos.end();
      ASSERT_EQ(got[i].logprobs.size(), want.size() - (ended_by_eos ? 1 : 0)) << i;
      for (size_t j = 0; j < got[i].logprobs.size(); ++j) {
        const TokenLogprobs& lp = got[i].logprobs[j];
        const std::vector<double>& row = ref[j];
        EXPECT_NEAR(lp.logprob, row[static_cast<size_t>(want[j])], 1e-4) << i << " " << j;
        std::vector<int32_t> order(row.size());
        std::iota(order.begin(), order.end(), 0);
        std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                          [&](int32_t a, int32_t b) { return row[a] > row[b]; });
        ASSERT_EQ(lp.num_top, 5);
        for (int k = 0; k < 5; ++k) {
          EXPECT_EQ(lp.top_ids[k], order[static_cast<size_t>(k)]) << i << " " << j << " " << k;
          EXPECT_NEAR(lp.top_logprobs[k], row[static_cast<size_t>(order[static_cast<size_t>(k)])],
                      1e-4);
        }
        EXPECT_EQ(lp.top_ids[0], want[j]);  // greedy
      }
    }
  }
}

TEST(CpuGemmTest, PanelProductsMatchDoublePrecisionOnOddSizes) {
  std::mt19937 rng(3);
  for (SimdLevel level : simd_levels()) {
    for (int m : {1, 2, 3, 4, 5, 6, 7, 8, 9, 13, 16, 17, 24, 33}) {
      for (auto [n, k] : kOddSizes) {
        for (bool accumulate : {false, true}) {
          expect_product_matches(m, n, k, accumulate, level, rng);
        }
      }
    }
  }
}

TEST(CpuGemmTest, SumFloatsMatchesDoublePrecision) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  for (SimdLevel level : simd_levels()) {
    for (size_t n : {0, 1, 7, 63, 65, 1000, 100003}) {
      std::vector<float> v(n);
      double ref = 0;
      for (float& f : v) {
        f = uniform(rng);
        ref += f;
      }
      EXPECT_NEAR(sum_floats(v.data(), n, level), ref, 1e-5 * ref + 1e-30)
          << simd_level_name(level) << " n=" << n;
    }
  }
}

TEST(ThreadPoolTest, RunsEveryIndexOnceForManyJobs) {
  for (int threads : {1, 2, 3, 4}) {
    ThreadPool pool(threads);
    std::mt19937 rng(11);
    for (int job = 0; job < 3000; ++job) {
      int n = job % 7 == 0 ? 0 : static_cast<int>(rng() % 300);
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      pool.parallel_for(n, job % 5, [&](int begin, int end) {
        ASSERT_LE(0, begin);
        ASSERT_LT(begin, end);
        ASSERT_LE(end, n);
        for (int i = begin; i < end; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
      });
      for (int i = 0; i < n; ++i) {
        ASSERT_EQ(hits[static_cast<size_t>(i)].load(), 1) << threads << " " << job << " " << i;
      }
      // Now and then the workers go to sleep between jobs.
      if (job % 500 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

}  // namespace
}  // namespace hr::engine
