// The CUDA backend as a whole, on the bundled model: logits within bf16 tolerance of the CPU
// backend (prefill and decode steps over scattered blocks), greedy answers equal to PyTorch's on at
// least 99% of the reference prompts through the engine (any that differ are listed with their
// reference margin), with steps pipelined or not; tokens fed on the device equal to tokens given;
// seeded sampling reproducible; and bad steps refused. Skips without a device. Also built against
// the CPU stand-in for the CUDA runtime (simt/, HEADROOM_SIMT), cuBLASLt included.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "engine/cpu_backend.h"
#include "engine/cuda_backend.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "engine/weights.h"
#include "grammar/compiled_grammar.h"
#include "grammar/json_schema.h"
#include "grammar/vocabulary.h"
#include "tests/engine/constrained_util.h"
#include "tests/engine/cuda_test_util.h"
#ifndef HEADROOM_SIMT
#include "engine/device.h"
#endif

namespace hr::engine {
namespace {

// The source tree: HEADROOM_SOURCE_DIR in the environment (binaries run from another checkout),
// else where this test was built from.
std::string source_dir() {
  const char* env = std::getenv("HEADROOM_SOURCE_DIR");
  return env && *env ? env : HEADROOM_SOURCE_DIR;
}
const std::string kModelDir = source_dir() + "/models/tiny-reverse";

std::shared_ptr<const ModelWeights> tiny_weights() {
  static std::shared_ptr<const ModelWeights> w = [] {
    auto r = load_weights(kModelDir);
    EXPECT_TRUE(r.is_ok()) << r.status().to_string();
    return std::make_shared<const ModelWeights>(std::move(r).value());
  }();
  return w;
}

// Sequences per step. The CPU stand-in runs a step's kernels thread by thread (a sampled row costs
// about a millisecond): there, fewer sequences at once, and so fewer decode graphs to warm up.
constexpr int kMaxSeqs = kOnSimt ? 32 : 256;

CudaBackendOptions small_options() {
  CudaBackendOptions o;
  o.kv_cache_bytes = 16 << 20;
  o.max_num_tokens = 4096;
  o.max_num_seqs = kMaxSeqs;
  return o;
}

nlohmann::json load_reference() {
  std::ifstream in(kModelDir + "/reference.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

// One step over several sequences: each gets `new_tokens[s]` tokens after `cached[s]` positions.
struct Step {
  std::vector<int32_t> ids, positions, seq_start{0}, table, rows;
  int max_blocks = 8;
  StepInput input(int num_seqs) const {
    StepInput in;
    in.num_tokens = static_cast<int>(ids.size());
    in.num_seqs = num_seqs;
    in.token_ids = ids.data();
    in.positions = positions.data();
    in.seq_start = seq_start.data();
    in.block_table = table.data();
    in.max_blocks_per_seq = max_blocks;
    in.logits_rows = rows.data();
    in.num_logits = static_cast<int>(rows.size());
    return in;
  }
};

// Batches of 1 and 2 decode through the fused small-batch path, 6 through the general one.
// fewer_kernels: RoPE folded into the q/k/v GEMV and decode splits merged by the attention kernel;
// prefetch_mb: the GEMVs pull the next weights into L2.
void check_logits_against_cpu(int S, bool fewer_kernels = false,
                              DecodeAttention decode = DecodeAttention::kPrefillTiles,
                              int prefetch_mb = 0) {
  auto w = tiny_weights();
  auto cpu = CpuBackend::create(w, {16, 16 << 20});
  CudaBackendOptions o = small_options();
  o.fused_rope = fewer_kernels;
  o.fused_combine = fewer_kernels;
  o.decode_attention = decode;
  o.prefetch_weights_mb = prefetch_mb;
  auto gpu = CudaBackend::create(*w, o);
  ASSERT_TRUE(cpu.is_ok() && gpu.is_ok()) << gpu.status().to_string();
  const int V = (*gpu)->vocab_size();
  auto ref = load_reference();
  std::vector<std::vector<int32_t>> prompts;
  for (int s = 0; s < S; ++s)
    prompts.push_back(ref["cases"][s]["prompt_ids"].get<std::vector<int32_t>>());
  std::vector<int> done(S, 0);
  // Three steps: whole prompts (prefill), then two decode steps with the greedy token of each.
  for (int step = 0; step < 3; ++step) {
    Step st;
    st.table.resize(S * st.max_blocks);
    for (int s = 0; s < S; ++s) {
      for (int b = 0; b < st.max_blocks; ++b)
        st.table[s * st.max_blocks + b] = (S - s) * st.max_blocks - 1 - b;
      int n = static_cast<int>(prompts[s].size()) - done[s];
      for (int i = 0; i < n; ++i) {
        st.ids.push_back(prompts[s][done[s] + i]);
        st.positions.push_back(done[s] + i);
      }
      st.seq_start.push_back(static_cast<int32_t>(st.ids.size()));
      st.rows.push_back(static_cast<int32_t>(st.ids.size()) - 1);
    }
    StepInput in = st.input(S);
    std::vector<float> a(static_cast<size_t>(S) * V), b(a.size());
    ASSERT_TRUE((*cpu)->forward(in, a.data()).is_ok());
    Status status = (*gpu)->forward(in, b.data());
    ASSERT_TRUE(status.is_ok()) << status.to_string();
    for (int s = 0; s < S; ++s) {
      std::vector<float> ga(a.begin() + s * V, a.begin() + (s + 1) * V),
          gb(b.begin() + s * V, b.begin() + (s + 1) * V);
      double num = 0, den = 0;
      for (int i = 0; i < V; ++i) {
        num += (gb[i] - ga[i]) * static_cast<double>(gb[i] - ga[i]);
        den += static_cast<double>(ga[i]) * ga[i];
      }
      EXPECT_LT(std::sqrt(num / den), 2e-2) << "batch " << S << " step " << step << " seq " << s;
      done[s] = static_cast<int>(prompts[s].size());
      prompts[s].push_back(
          static_cast<int32_t>(std::max_element(ga.begin(), ga.end()) - ga.begin()));
    }
  }
}

TEST(CudaBackendTest, LogitsMatchCpuBackend) {
  SKIP_WITHOUT_GPU();
  for (int S : {1, 2, 6}) check_logits_against_cpu(S);
  for (int S : {1, 2}) check_logits_against_cpu(S, /*fewer_kernels=*/true);
  for (int S : {1, 6}) check_logits_against_cpu(S, false, DecodeAttention::kTensorCore);
  for (int S : {1, 2}) check_logits_against_cpu(S, false, DecodeAttention::kPrefillTiles, 8);
}

// Uploading straight from the safetensors files gives the same weights as converting the host's
// fp32 copy: the same logits, bit for bit.
TEST(CudaBackendTest, UploadFromFilesEqualsUploadFromHostWeights) {
  SKIP_WITHOUT_GPU();
  auto a = CudaBackend::create(*tiny_weights(), small_options());
  auto b = CudaBackend::create_from_dir(kModelDir, small_options());
  ASSERT_TRUE(a.is_ok() && b.is_ok()) << b.status().to_string();
  EXPECT_EQ((*a)->weight_bytes(), (*b)->weight_bytes());
  Step st;
  st.ids = {256, 258, 114, 101, 118, 101, 114, 115, 101, 58, 32, 104, 105, 259};
  for (int i = 0; i < static_cast<int>(st.ids.size()); ++i) st.positions.push_back(i);
  st.seq_start = {0, static_cast<int32_t>(st.ids.size())};
  st.table.assign(st.max_blocks, 0);
  for (int i = 0; i < st.max_blocks; ++i) st.table[i] = i;
  st.rows = {static_cast<int32_t>(st.ids.size()) - 1};
  std::vector<float> la((*a)->vocab_size()), lb(la.size());
  ASSERT_TRUE((*a)->forward(st.input(1), la.data()).is_ok());
  ASSERT_TRUE((*b)->forward(st.input(1), lb.data()).is_ok());
  EXPECT_EQ(la, lb);
  auto missing =
      CudaBackend::create_from_dir(source_dir() + "/models/no-such-model", small_options());
  EXPECT_FALSE(missing.is_ok());
}

// Greedy generation of every reference prompt, all submitted at once to an engine on the GPU.
// Decode steps replay CUDA graphs by default; the same run without them must agree as well, and so
// must plain steps (each step's tokens collected before the next is planned) against the default
// pipelined ones (decode tokens fed on the device from the step before), and steps with fewer
// kernels (RoPE in the q/k/v GEMV, decode splits merged in the attention kernel), and decode
// attention on another kernel, and the next weights prefetched into L2.
void check_greedy_against_pytorch(bool cuda_graphs, bool pipeline, bool fewer_kernels = false,
                                  DecodeAttention decode = DecodeAttention::kPrefillTiles,
                                  int prefetch_mb = 0) {
  CudaBackendOptions o = small_options();
  o.prefetch_weights_mb = prefetch_mb;
  o.cuda_graphs = cuda_graphs;
  o.fused_rope = fewer_kernels;
  o.fused_combine = fewer_kernels;
  o.decode_attention = decode;
  auto gpu = CudaBackend::create(*tiny_weights(), o);
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
  EngineOptions eo;
  eo.scheduler.max_num_seqs = kMaxSeqs;
  eo.scheduler.max_batched_tokens = 4096;
  eo.pipeline = pipeline;
  std::shared_ptr<CudaBackend> backend = std::move(gpu).value();
  auto engine = Engine::create(backend, nullptr, 512, eo);
  ASSERT_TRUE(engine.is_ok());
  EXPECT_EQ((*engine)->pipelined(), pipeline);
  // Every decode graph up front: 1, 2, 4, 8, 16, ..., kMaxSeqs sequences, in both staging slots,
  // for block tables 33 wide. The steps below pad their batches up to those sizes and replay them;
  // their tables (as wide as their sequences need: 1 to 8 blocks) are copied into the graphs'
  // pitch.
  const size_t graphs = 2u * (3 + kMaxSeqs / 8);
  ASSERT_TRUE((*engine)->warm_up().is_ok());
  EXPECT_EQ(backend->num_graphs(), cuda_graphs ? graphs : 0u);
  EXPECT_EQ(backend->graph_batch_size(3), 4);
  EXPECT_EQ(backend->graph_batch_size(9), 16);
  EXPECT_EQ(backend->graph_batch_size(kMaxSeqs - 1), kMaxSeqs);
  auto ref = load_reference();
  // Every reference prompt; on the CPU stand-in, as many as run at once.
  const size_t n =
      kOnSimt ? std::min(static_cast<size_t>(kMaxSeqs), ref["cases"].size()) : ref["cases"].size();
  std::vector<std::vector<int32_t>> out(n);
  for (size_t i = 0; i < n; ++i) {
    GenerationRequest r;
    r.prompt = ref["cases"][i]["prompt_ids"].get<std::vector<int32_t>>();
    r.params.max_tokens = static_cast<int>(ref["cases"][i]["output_ids"].size());
    r.params.ignore_eos = true;
    r.on_event = [&out, i](const TokenEvent& ev) {
      if (ev.token >= 0) out[i].push_back(ev.token);
    };
    ASSERT_TRUE((*engine)->add(std::move(r)).is_ok());
  }
  while ((*engine)->has_work()) ASSERT_TRUE((*engine)->step().is_ok());
  size_t same = 0;
  for (size_t i = 0; i < n; ++i) {
    auto expected = ref["cases"][i]["output_ids"].get<std::vector<int32_t>>();
    if (out[i] == expected) {
      ++same;
      continue;
    }
    size_t at = 0;
    while (at < expected.size() && at < out[i].size() && out[i][at] == expected[at]) ++at;
    const auto& top = ref["cases"][i]["top_logits"][at];
    double margin = top[0][1].get<double>() - top[1][1].get<double>();
    std::printf(
        "differs: case %zu (%s) at step %zu: got %d, PyTorch %d; PyTorch's top-2 margin %.4f\n", i,
        ref["cases"][i]["text"].get<std::string>().c_str(), at,
        at < out[i].size() ? out[i][at] : -1, expected[at], margin);
  }
  std::printf(
      "greedy on GPU (graphs %s, pipelined %s, fewer kernels %s, decode attention %d, prefetch %d "
      "MiB): "
      "%zu of %zu reference prompts equal to PyTorch\n",
      cuda_graphs ? "on" : "off", pipeline ? "on" : "off", fewer_kernels ? "on" : "off",
      static_cast<int>(decode), prefetch_mb, same, n);
  EXPECT_EQ(backend->num_graphs(), cuda_graphs ? graphs : 0u)
      << "a decode step captured a new graph";
  EXPECT_GE(static_cast<double>(same), 0.99 * static_cast<double>(n));
}

TEST(CudaBackendTest, GreedyAnswersMatchPyTorchOnAtLeast99Percent) {
  SKIP_WITHOUT_GPU();
  check_greedy_against_pytorch(true, true);
  check_greedy_against_pytorch(false, true);
  check_greedy_against_pytorch(true, false);
  check_greedy_against_pytorch(true, true, /*fewer_kernels=*/true);
  check_greedy_against_pytorch(true, true, /*fewer_kernels=*/true, DecodeAttention::kTensorCore);
  check_greedy_against_pytorch(true, true, false, DecodeAttention::kCudaCore);
  check_greedy_against_pytorch(true, true, /*fewer_kernels=*/true, DecodeAttention::kPrefillTiles,
                               8);
}

TEST(CudaBackendTest, SeededSamplingIsReproducible) {
  SKIP_WITHOUT_GPU();
  auto run = [](uint64_t seed, bool pipeline = true) {
    auto gpu = CudaBackend::create(*tiny_weights(), small_options());
    EXPECT_TRUE(gpu.is_ok());
    EngineOptions eo;
    eo.pipeline = pipeline;
    auto engine =
        Engine::create(std::shared_ptr<Backend>(std::move(gpu).value()), nullptr, 512, eo);
    std::vector<int32_t> out;
    GenerationRequest r;
    r.prompt = {256, 258, 114, 101, 118, 101, 114, 115, 101, 58, 32, 97, 98, 99, 259};
    r.params.temperature = 1.5f;
    r.params.top_k = 50;
    r.params.top_p = 0.95f;
    r.params.seed = seed;
    r.params.max_tokens = 24;
    r.params.ignore_eos = true;
    r.on_event = [&out](const TokenEvent& ev) {
      if (ev.token >= 0) out.push_back(ev.token);
    };
    EXPECT_TRUE((*engine)->add(std::move(r)).is_ok());
    while ((*engine)->has_work()) EXPECT_TRUE((*engine)->step().is_ok());
    return out;
  };
  auto a = run(42), b = run(42), c = run(7), plain = run(42, false);
  EXPECT_EQ(a.size(), 24u);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  EXPECT_EQ(a, plain);
}

// One engine's answers, with each token's log probabilities when asked for.
struct Answer {
  std::vector<int32_t> tokens;
  std::vector<TokenLogprobs> logprobs;
};

// Greedy answers to the first `prompts` reference prompts, `max_tokens` each past EOS, with the
// given penalties and `logprobs` alternatives per token (-1: no log probabilities).
std::vector<Answer> greedy_answers(std::shared_ptr<Backend> backend, bool pipeline, size_t prompts,
                                   int max_tokens, const Penalties& penalties, int logprobs,
                                   bool warm_up = false) {
  const auto ref = load_reference();
  EngineOptions eo;
  eo.pipeline = pipeline;
  eo.scheduler.max_num_seqs = std::min(64, kMaxSeqs);
  eo.scheduler.max_batched_tokens = 4096;
  auto engine = Engine::create(std::move(backend), nullptr, 512, eo);
  EXPECT_TRUE(engine.is_ok());
  if (!engine.is_ok()) return {};
  if (warm_up) {
    EXPECT_TRUE((*engine)->warm_up().is_ok());
  }
  std::vector<Answer> out(prompts);
  for (size_t i = 0; i < prompts; ++i) {
    GenerationRequest r;
    r.prompt = ref["cases"][i]["prompt_ids"].get<std::vector<int32_t>>();
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = true;
    r.params.penalties = penalties;
    r.params.logprobs = logprobs;
    r.on_event = [&out, i](const TokenEvent& ev) {
      if (ev.token >= 0) out[i].tokens.push_back(ev.token);
      if (ev.logprobs) out[i].logprobs.push_back(*ev.logprobs);
    };
    EXPECT_TRUE((*engine)->add(std::move(r)).is_ok());
  }
  while ((*engine)->has_work()) EXPECT_TRUE((*engine)->step().is_ok());
  return out;
}

std::shared_ptr<Backend> cpu_backend() {
  CpuBackendOptions co;
  co.kv_cache_bytes = 16 << 20;
  co.pipelined = true;
  auto cpu = CpuBackend::create(tiny_weights(), co);
  EXPECT_TRUE(cpu.is_ok());
  return cpu.is_ok() ? std::shared_ptr<Backend>(std::move(cpu).value()) : nullptr;
}

// Where a GPU answer leaves the CPU's (same prompt, same settings, greedy), the CPU must have
// seen a near-tie there: after the same tokens, the GPU's token is among the CPU's alternatives,
// within `gap` of the CPU's choice in log probability (bf16 logits may order a near-tie either
// way; anything else is a wrong answer). Returns how many tokens the answers share before that.
size_t shared_prefix(const Answer& gpu, const Answer& cpu, float gap, const std::string& what) {
  size_t j = 0;
  while (j < gpu.tokens.size() && j < cpu.tokens.size() && gpu.tokens[j] == cpu.tokens[j]) ++j;
  if (j == gpu.tokens.size() || j >= cpu.logprobs.size()) return j;
  const TokenLogprobs& at = cpu.logprobs[j];
  float lp = -INFINITY;
  for (int t = 0; t < at.num_top; ++t) {
    if (at.top_ids[t] == gpu.tokens[j]) lp = at.top_logprobs[t];
  }
  EXPECT_GE(lp, at.logprob - gap) << what << ": token " << j << " is " << gpu.tokens[j]
                                  << " on the GPU, " << cpu.tokens[j]
                                  << " on the CPU (log probability " << at.logprob
                                  << "), not a near-tie";
  return j;
}

// Penalties sampled on the device: pipelined steps (whose decode rows read their input token fed
// on the device, which the sampler counts) give what plain steps give, the penalties change the
// answers, and the CPU engine (pipelined too) gives the same tokens up to near-ties (strong
// penalties keep knocking out the top token, so near-ties are common; a flip changes the rest of
// that answer).
TEST(CudaBackendTest, PenaltiesOnTheDeviceEqualPlainStepsAndTheCpu) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kPrompts = 32;
  constexpr int kTokens = 24;
  const Penalties strong{1.5f, 1.0f, 1.4f};
  auto gpu = [] {
    auto b = CudaBackend::create(*tiny_weights(), small_options());
    EXPECT_TRUE(b.is_ok()) << b.status().to_string();
    return std::shared_ptr<Backend>(std::move(b).value());
  };
  const auto piped = greedy_answers(gpu(), true, kPrompts, kTokens, strong, -1);
  const auto plain = greedy_answers(gpu(), false, kPrompts, kTokens, strong, -1);
  const auto unpenalized = greedy_answers(gpu(), true, kPrompts, kTokens, Penalties{}, -1);
  const auto on_cpu =
      greedy_answers(cpu_backend(), true, kPrompts, kTokens, strong, kMaxTopLogprobs);
  ASSERT_EQ(piped.size(), kPrompts);
  ASSERT_EQ(on_cpu.size(), kPrompts);
  size_t differ = 0, shared = 0;
  for (size_t i = 0; i < kPrompts; ++i) {
    ASSERT_EQ(on_cpu[i].tokens.size(), static_cast<size_t>(kTokens)) << i;
    ASSERT_EQ(on_cpu[i].logprobs.size(), on_cpu[i].tokens.size()) << i;
    EXPECT_EQ(piped[i].tokens, plain[i].tokens) << i;
    EXPECT_EQ(piped[i].tokens.size(), static_cast<size_t>(kTokens)) << i;
    differ += piped[i].tokens != unpenalized[i].tokens;
    shared += shared_prefix(piped[i], on_cpu[i], 0.25f, "prompt " + std::to_string(i));
  }
  std::printf(
      "penalties: %zu of %zu answers changed; %zu of %zu tokens as on the CPU before a near-tie\n",
      differ, kPrompts, shared, kPrompts * kTokens);
  EXPECT_GT(differ, 0u);
}

// Log probabilities through the CUDA engine (pipelined, decode graphs) against the CPU engine's:
// one per token, the sampled token first among its alternatives (greedy), values within bf16
// tolerance wherever the answers agree, answers that part only at near-ties.
TEST(CudaBackendTest, LogprobsOnTheDeviceMatchTheCpu) {
  SKIP_WITHOUT_GPU();
  constexpr size_t kPrompts = 16;
  constexpr int kTokens = 16;
  auto gpu = CudaBackend::create(*tiny_weights(), small_options());
  ASSERT_TRUE(gpu.is_ok()) << gpu.status().to_string();
  const auto on_gpu = greedy_answers(std::shared_ptr<Backend>(std::move(gpu).value()), true,
                                     kPrompts, kTokens, Penalties{}, 3, true);
  const auto on_cpu =
      greedy_answers(cpu_backend(), true, kPrompts, kTokens, Penalties{}, kMaxTopLogprobs, true);
  ASSERT_EQ(on_gpu.size(), kPrompts);
  ASSERT_EQ(on_cpu.size(), kPrompts);
  size_t compared = 0;
  for (size_t i = 0; i < kPrompts; ++i) {
    const Answer& g = on_gpu[i];
    ASSERT_EQ(g.tokens.size(), static_cast<size_t>(kTokens)) << i;
    ASSERT_EQ(on_cpu[i].tokens.size(), static_cast<size_t>(kTokens)) << i;
    ASSERT_EQ(on_cpu[i].logprobs.size(), on_cpu[i].tokens.size()) << i;
    ASSERT_EQ(g.logprobs.size(), g.tokens.size()) << i;
    for (size_t j = 0; j < g.tokens.size(); ++j) {
      ASSERT_EQ(g.logprobs[j].num_top, 3);
      EXPECT_EQ(g.logprobs[j].top_ids[0], g.tokens[j]) << i << " " << j;
      EXPECT_LE(g.logprobs[j].logprob, 1e-6f);
      EXPECT_GE(g.logprobs[j].top_logprobs[0], g.logprobs[j].top_logprobs[1]) << i << " " << j;
      EXPECT_GE(g.logprobs[j].top_logprobs[1], g.logprobs[j].top_logprobs[2]) << i << " " << j;
    }
    const size_t same = shared_prefix(g, on_cpu[i], 0.25f, "prompt " + std::to_string(i));
    for (size_t j = 0; j < same; ++j) {
      EXPECT_NEAR(g.logprobs[j].logprob, on_cpu[i].logprobs[j].logprob, 0.1) << i << " " << j;
    }
    compared += same;
  }
  std::printf("logprobs: %zu of %zu tokens compared with the CPU's\n", compared,
              kPrompts * kTokens);
  EXPECT_GT(compared, 0u);
}

// S sequences prefilled in one step, then `steps` decode steps. Fed: each decode step is submitted
// before the step it follows is collected, its tokens fed on the device from that step's rows (the
// two staging slots alternate); else each step is collected first and given its tokens.
std::vector<std::vector<int32_t>> decode_tokens(int S, int steps, bool fed) {
  auto created = CudaBackend::create(*tiny_weights(), small_options());
  EXPECT_TRUE(created.is_ok());
  auto& gpu = *created;
  auto ref = load_reference();
  Step pre;
  std::vector<int> len(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) {
    auto prompt = ref["cases"][static_cast<size_t>(s)]["prompt_ids"].get<std::vector<int32_t>>();
    len[static_cast<size_t>(s)] = static_cast<int>(prompt.size());
    for (size_t i = 0; i < prompt.size(); ++i) {
      pre.ids.push_back(prompt[i]);
      pre.positions.push_back(static_cast<int32_t>(i));
    }
    pre.seq_start.push_back(static_cast<int32_t>(pre.ids.size()));
    pre.rows.push_back(static_cast<int32_t>(pre.ids.size()) - 1);
    for (int b = 0; b < pre.max_blocks; ++b) pre.table.push_back(s * pre.max_blocks + b);
  }
  std::vector<SampleSpec> greedy(static_cast<size_t>(S));
  std::vector<std::vector<int32_t>> out;
  std::vector<int32_t> tokens(static_cast<size_t>(S));
  EXPECT_TRUE(gpu->submit(pre.input(S), greedy.data()).is_ok());
  if (!fed) {
    EXPECT_TRUE(gpu->collect(tokens.data(), nullptr).is_ok());
    out.push_back(tokens);
  }
  std::vector<int32_t> fed_rows(static_cast<size_t>(S));
  for (int s = 0; s < S; ++s) fed_rows[static_cast<size_t>(s)] = s;
  for (int k = 0; k < steps; ++k) {
    Step d;
    d.table = pre.table;
    for (int s = 0; s < S; ++s) {
      d.ids.push_back(fed ? 0 : tokens[static_cast<size_t>(s)]);
      d.positions.push_back(len[static_cast<size_t>(s)] + k);
      d.seq_start.push_back(s + 1);
      d.rows.push_back(s);
    }
    StepInput in = d.input(S);
    if (fed) in.fed_rows = fed_rows.data();
    EXPECT_TRUE(gpu->submit(in, greedy.data()).is_ok());
    EXPECT_TRUE(gpu->collect(tokens.data(), nullptr).is_ok());  // fed: the step before this one
    out.push_back(tokens);
  }
  if (fed) {
    EXPECT_TRUE(gpu->collect(tokens.data(), nullptr).is_ok());
    out.push_back(tokens);
  }
  return out;
}

// Constrained answers (structured output) on the CUDA engine: each step's token masks are staged
// with the sampling lists, so decode graphs replay them and pipelined steps (where a constrained
// sequence waits for its token before the next step is planned) must give what plain steps give.
// In one batch, constrained rows are valid documents and the free rows beside them are the answers
// a batch without constraints gives (no mask leaks into another row); the CPU engine's constrained
// answers are valid too, and equal the GPU's up to near-ties.
TEST(CudaBackendTest, ConstrainedAnswersUnderGraphsAndPipelining) {
  SKIP_WITHOUT_GPU();
  const int n = kOnSimt ? 8 : 24;
  auto gpu = [] {
    auto b = CudaBackend::create(*tiny_weights(), small_options());
    EXPECT_TRUE(b.is_ok()) << b.status().to_string();
    return std::shared_ptr<Backend>(std::move(b).value());
  };
  const auto piped = constrained_answers(load_reference(), gpu(), true, n, false);
  const auto plain = constrained_answers(load_reference(), gpu(), false, n, false);
  const auto mixed = constrained_answers(load_reference(), gpu(), true, n, true);
  const auto free_only = constrained_answers(load_reference(), gpu(), true, n, false, true);
  // (the host's and the device's samplers draw differently: greedy, to compare the two)
  const auto greedy = constrained_answers(load_reference(), gpu(), true, n, false, false, 0.0f);
  const auto on_cpu =
      constrained_answers(load_reference(), cpu_backend(), true, n, false, false, 0.0f);
  int same_as_cpu = 0;
  for (int i = 0; i < n; ++i) {
    const std::string what = "answer " + std::to_string(i);
    expect_valid_document(piped.text[i], what + " (GPU, pipelined)");
    expect_valid_document(on_cpu.text[i], what + " (CPU)");
    EXPECT_EQ(piped.tokens[i], plain.tokens[i]) << what;
    if (i % 2 == 1) {
      EXPECT_EQ(mixed.tokens[i], piped.tokens[i]) << what << " (constrained, beside free rows)";
    } else {
      EXPECT_EQ(mixed.tokens[i], free_only.tokens[i]) << what << " (free, beside constrained rows)";
    }
    expect_valid_document(greedy.text[i], what + " (GPU, greedy)");
    same_as_cpu += greedy.tokens[i] == on_cpu.tokens[i];
  }
  // Greedy over bf16 logits: most answers, not all (near-ties), are the CPU's.
  std::printf("constrained: %d of %d answers as on the CPU\n", same_as_cpu, n);
  EXPECT_GE(same_as_cpu, n / 2);
}

TEST(CudaBackendTest, FedTokensEqualKnownTokens) {
  SKIP_WITHOUT_GPU();
  for (int S : {1, 2, 5}) {  // the fused small-batch path and the general one, as graphs
    auto known = decode_tokens(S, 6, false);
    auto fed = decode_tokens(S, 6, true);
    EXPECT_EQ(known, fed) << S;
    EXPECT_EQ(known.size(), 7u);
  }
}

// Graph-replayed decode steps take block tables narrower than the graphs' pitch (their columns
// copied into it) and wider (a pitch of their own): the tokens equal those of steps run without
// graphs, and only the wider tables capture a graph.
TEST(CudaBackendTest, GraphStepsTakeBlockTablesOfAnyWidth) {
  SKIP_WITHOUT_GPU();
  CudaBackendOptions plain = small_options();
  plain.cuda_graphs = false;
  auto graphs = CudaBackend::create(*tiny_weights(), small_options());
  auto direct = CudaBackend::create(*tiny_weights(), plain);
  ASSERT_TRUE(graphs.is_ok() && direct.is_ok());
  ASSERT_TRUE((*graphs)->warm_up(4).is_ok());
  const size_t warmed = (*graphs)->num_graphs();
  // Two prompts short enough for two blocks of 16 with the decode steps below.
  auto ref = load_reference();
  std::vector<std::vector<int32_t>> prompts;
  for (const auto& c : ref["cases"]) {
    auto p = c["prompt_ids"].get<std::vector<int32_t>>();
    if (p.size() <= 24 && prompts.size() < 2) prompts.push_back(p);
  }
  ASSERT_EQ(prompts.size(), 2u);
  const int S = 2;
  auto table = [](int width) {  // sequence s owns blocks 16 s, 16 s + 1, ...
    std::vector<int32_t> t;
    for (int s = 0; s < S; ++s) {
      for (int b = 0; b < width; ++b) t.push_back(16 * s + b);
    }
    return t;
  };
  Step pre;
  pre.max_blocks = 2;
  pre.table = table(2);
  for (int s = 0; s < S; ++s) {
    for (size_t i = 0; i < prompts[s].size(); ++i) {
      pre.ids.push_back(prompts[s][i]);
      pre.positions.push_back(static_cast<int32_t>(i));
    }
    pre.seq_start.push_back(static_cast<int32_t>(pre.ids.size()));
    pre.rows.push_back(static_cast<int32_t>(pre.ids.size()) - 1);
  }
  std::vector<SampleSpec> greedy(S);
  std::vector<int32_t> a(S), b(S);
  ASSERT_TRUE((*graphs)->forward_sample(pre.input(S), greedy.data(), a.data()).is_ok());
  ASSERT_TRUE((*direct)->forward_sample(pre.input(S), greedy.data(), b.data()).is_ok());
  ASSERT_EQ(a, b);
  int k = 0;
  for (int width : {2, 8, 3, 5, 2}) {
    Step d;
    d.max_blocks = width;
    d.table = table(width);
    for (int s = 0; s < S; ++s) {
      d.ids.push_back(a[s]);
      d.positions.push_back(static_cast<int32_t>(prompts[s].size()) + k);
      d.seq_start.push_back(s + 1);
      d.rows.push_back(s);
    }
    ++k;
    Status ga = (*graphs)->forward_sample(d.input(S), greedy.data(), a.data());
    Status gb = (*direct)->forward_sample(d.input(S), greedy.data(), b.data());
    ASSERT_TRUE(ga.is_ok() && gb.is_ok()) << ga.to_string() << " " << gb.to_string();
    EXPECT_EQ(a, b) << "block tables " << width << " wide";
  }
  // Pitch 4 served widths 2 and 3; width 8 captured the one new graph, which width 5 replayed.
  EXPECT_EQ((*graphs)->num_graphs(), warmed + 1);
}

TEST(CudaBackendTest, RefusesBadSteps) {
  SKIP_WITHOUT_GPU();
  auto gpu = CudaBackend::create(*tiny_weights(), small_options());
  ASSERT_TRUE(gpu.is_ok());
  Step st;
  st.ids = {5, 999999};
  st.positions = {0, 1};
  st.seq_start = {0, 2};
  st.table.assign(st.max_blocks, 0);
  st.rows = {1};
  std::vector<float> logits((*gpu)->vocab_size());
  Status s = (*gpu)->forward(st.input(1), logits.data());
  EXPECT_FALSE(s.is_ok());
  EXPECT_NE(s.to_string().find("out of range"), std::string::npos) << s.to_string();
  st.ids = {5, 6};
  st.table.assign(st.max_blocks, (*gpu)->num_kv_blocks());  // a block past the cache
  s = (*gpu)->forward(st.input(1), logits.data());
  EXPECT_FALSE(s.is_ok());
  // Attention reads the columns before the one a token writes: they are checked too.
  const int bs = CudaBackendOptions{}.block_size;
  st.positions = {3 * bs, 3 * bs + 1};
  st.table.assign(st.max_blocks, 0);
  st.table[1] = -1;
  s = (*gpu)->forward(st.input(1), logits.data());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << s.to_string();
  EXPECT_NE(s.to_string().find("outside the KV cache"), std::string::npos) << s.to_string();
  st.positions = {0, 1};
  // Fed rows must name a row of the step submitted before; at most two steps are outstanding.
  st.table.assign(st.max_blocks, 0);
  SampleSpec greedy;
  ASSERT_TRUE((*gpu)->submit(st.input(1), &greedy).is_ok());
  std::vector<int32_t> fed = {-1, 1};
  StepInput in = st.input(1);
  in.fed_rows = fed.data();
  EXPECT_EQ((*gpu)->submit(in, &greedy).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ((*gpu)->forward(in, logits.data()).code(), StatusCode::kInvalidArgument);
  fed = {-1, 0};
  ASSERT_TRUE((*gpu)->submit(in, &greedy).is_ok());
  EXPECT_FALSE((*gpu)->submit(st.input(1), &greedy).is_ok());
  int32_t token = -1;
  EXPECT_TRUE((*gpu)->collect(&token, nullptr).is_ok());
  EXPECT_TRUE((*gpu)->collect(&token, nullptr).is_ok());
  EXPECT_FALSE((*gpu)->collect(&token, nullptr).is_ok());
  CudaBackendOptions o = small_options();
  o.kv_cache_bytes = 1;
  auto tiny = CudaBackend::create(*tiny_weights(), o);
  ASSERT_FALSE(tiny.is_ok());
  EXPECT_EQ(tiny.status().field(), "kv-cache-bytes");
}

// The memory plan (engine/memory_plan.h), made from config.json alone, equals what the backend
// allocates for the models it runs: weights, the step's buffers and the KV blocks a budget buys.
TEST(CudaBackendTest, TheMemoryPlanEqualsWhatTheBackendAllocates) {
  SKIP_WITHOUT_GPU();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  for (const std::string& dir : {kModelDir, source_dir() + "/models/fixtures/qwen3",
                                 source_dir() + "/models/fixtures/mixtral",
                                 source_dir() + "/models/fixtures/qwen3-moe-fused"}) {
    SCOPED_TRACE(dir);
    CudaBackendOptions o = small_options();
    auto backend = CudaBackend::create_from_dir(dir, o);
    ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
    auto shape = load_model_shape(dir);
    ASSERT_TRUE(shape.is_ok()) << shape.status().to_string();
    PlanOptions p;
    p.max_num_tokens = o.max_num_tokens;
    p.max_num_seqs = o.max_num_seqs;
    p.block_size = o.block_size;
    p.num_sms = sms;
    auto plan = plan_memory(*shape, p);
    ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
    const RankPlan& r = plan->ranks.at(0);
    EXPECT_EQ(r.weight_bytes, static_cast<int64_t>((*backend)->weight_bytes()));
    EXPECT_EQ(r.activation_bytes, static_cast<int64_t>((*backend)->buffer_bytes()));
    EXPECT_EQ(static_cast<int64_t>(o.kv_cache_bytes) / r.kv_block_bytes - 1,
              (*backend)->num_kv_blocks());
  }
}

// Without a device (or with a wrong index) the backend is refused with a clear error, no crash.
TEST(CudaBackendTest, MissingDeviceIsAClearError) {
  CudaBackendOptions o = small_options();
#ifdef HEADROOM_SIMT
  o.device = 64;  // the CPU stand-in always has device 0
#else
  o.device = list_gpus().empty() ? 0 : 64;
#endif
  auto b = CudaBackend::create(*tiny_weights(), o);
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(b.status().message().find("no CUDA device"), std::string::npos)
      << b.status().to_string();
}

}  // namespace
}  // namespace hr::engine
