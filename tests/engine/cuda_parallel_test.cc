// Tensor, expert and pipeline parallelism on the CUDA backend (engine/parallel_cuda_backend.h):
// 2, 4 and 8 virtual ranks on one device against one rank of the same backend, on the bundled
// model, the Qwen3, Mixtral and Qwen3-MoE fixtures (experts sliced over the ranks, or held whole,
// a share on each) and a random model with 8 query heads; pipeline stages alone and with tensor
// parallelism (TP2 x PP2), evenly and unevenly split. Each case runs a prefill of three sequences
// and decode steps after it, every logit row within bf16 tolerance of one rank's and the same
// argmax wherever one rank's top two are apart; then greedy answers through the engine,
// pipelined (the first stage's fed rows read the tokens the last stage sampled), their decode
// steps replayed as CUDA graphs that hold every rank's kernels and the collectives between them:
// equal to one rank's; steps cut into micro-batches, each part its own step on every rank, equal
// too. One GPU a rank over peer pointers (simulated devices on the stand-in, their ranks' threads
// running at once), whole and in micro-batches, against the virtual ranks. Also: degrees that do
// not fit refused naming the option, and the KV cache split over the ranks. Skips without a device;
// also built against the CPU stand-in for the CUDA runtime (simt/).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>

#include <unistd.h>

#include "engine/backend_factory.h"
#include "engine/cuda_backend.h"
#include "engine/engine.h"
#include "engine/memory_plan.h"
#include "engine/model_shape.h"
#include "engine/parallel_cuda_backend.h"
#include "engine/peer_communicator.h"
#include "engine/stage_calibration.h"
#include "engine/weight_shard.h"
#include "engine/weights.h"
#include "tests/engine/cuda_test_util.h"
#include "tests/engine/step_util.h"
#include "tests/testing/random_model.h"

namespace hr::engine {
namespace {

std::string source_dir() {
  const char* env = std::getenv("HEADROOM_SOURCE_DIR");
  return env && *env ? env : HEADROOM_SOURCE_DIR;
}

std::string model_dir(const std::string& name) {
  const std::string models = source_dir() + "/models/";
  return name == "tiny-reverse" ? models + name : models + "fixtures/" + name;
}

// A random Llama of `layers` layers of `hidden` (a vocabulary of `vocab`) with `heads` query
// heads of `head_dim` over 2 KV heads, written to a folder named `name`.
std::string random_model_dir(const std::string& name, int vocab, int hidden, int layers, int heads,
                             int head_dim) {
  const std::string d = (std::filesystem::temp_directory_path() /
                         ("headroom-cuda-" + name + "-" + std::to_string(::getpid())))
                            .string();
  hr::testing::RandomLlama spec;
  spec.vocab = vocab;
  spec.hidden = hidden;
  spec.intermediate = 512;
  spec.layers = layers;
  spec.heads = heads;
  spec.kv_heads = 2;
  spec.head_dim = head_dim;
  spec.context = 256;
  hr::testing::write_random_llama(d, model_dir("tiny-reverse"), spec);
  return d;
}

// 8 query heads over 2 KV heads (replicated past 2 ranks), written once.
std::string wide_model_dir() {
  static const std::string dir = random_model_dir("parallel", 300, 128, 2, 8, 32);
  return dir;
}

CudaBackendOptions options() {
  CudaBackendOptions o;
  o.kv_cache_bytes = 8 << 20;
  o.max_num_tokens = 256;
  o.max_num_seqs = 32;  // a prefill's logits rows: one a token
  return o;
}

// Each row within bf16 tolerance of one rank's (relative RMS difference; the ranks add partial
// sums in another order and round other activations to bf16), and the same argmax where one
// rank's top two are more than 0.05 apart. The worst row's figure goes to the test's XML.
void expect_close(const std::vector<std::vector<float>>& want,
                  const std::vector<std::vector<float>>& got, int vocab) {
  ASSERT_EQ(want.size(), got.size());
  double worst = 0;
  int rows = 0, argmax_checked = 0;
  for (size_t s = 0; s < want.size(); ++s) {
    ASSERT_EQ(want[s].size(), got[s].size());
    for (size_t r = 0; r * vocab < want[s].size(); ++r, ++rows) {
      const float* a = &want[s][r * vocab];
      const float* b = &got[s][r * vocab];
      double num = 0, den = 0;
      for (int i = 0; i < vocab; ++i) {
        num += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]);
        den += static_cast<double>(a[i]) * a[i];
      }
      const double rel = std::sqrt(num / std::max(den, 1e-30));
      worst = std::max(worst, rel);
      EXPECT_LT(rel, 1e-2) << "step " << s << " row " << r;
      const int top = static_cast<int>(std::max_element(a, a + vocab) - a);
      float second = -INFINITY;
      for (int i = 0; i < vocab; ++i) {
        if (i != top) second = std::max(second, a[i]);
      }
      if (a[top] - second > 0.05f) {
        ++argmax_checked;
        EXPECT_EQ(std::max_element(b, b + vocab) - b, top) << "step " << s << " row " << r;
      }
    }
  }
  char text[96];
  std::snprintf(text, sizeof text, "%.3g over %d rows (%d argmax checked)", worst, rows,
                argmax_checked);
  ::testing::Test::RecordProperty("worst_relative_rms", text);
  std::printf("worst relative RMS difference %s\n", text);
}

// Greedy answers through a pipelined engine: a chunked 40-token prompt among short ones.
std::vector<std::vector<int32_t>> greedy(std::shared_ptr<Backend> b, int max_tokens, bool warm_up) {
  const int vocab = b->vocab_size();
  EngineOptions eo;
  eo.scheduler.max_num_seqs = 8;
  eo.scheduler.max_batched_tokens = 24;
  std::vector<std::vector<int32_t>> prompts = {{3, 5, 7, 9}, {1}, {}};
  for (int i = 0; i < 40; ++i) prompts[2].push_back((i * 37 + 11) % vocab);
  if (warm_up) {
    const Status st = b->warm_up(128 / b->block_size());
    EXPECT_TRUE(st.is_ok()) << st.to_string();
  }
  return greedy_answers(std::move(b), prompts, max_tokens, eo, 128);
}

// Options cutting every step of `micro` tokens or more into `micro` micro-batches (0: the
// defaults, which leave the tests' small steps whole).
CudaBackendOptions options(int micro) {
  CudaBackendOptions o = options();
  if (micro > 0) {
    o.micro_batches = micro;
    o.micro_batch_tokens = 1;
  }
  return o;
}

std::shared_ptr<ParallelCudaBackend> parallel(const ModelWeights& w, int tp, int ep = 1, int pp = 1,
                                              std::vector<int> stage_layers = {}, int micro = 0) {
  auto b = ParallelCudaBackend::create(w, std::vector<int>(tp * pp, 0), options(micro),
                                       ParallelDegrees(tp, pp, ep, std::move(stage_layers)));
  EXPECT_TRUE(b.is_ok()) << b.status().to_string();
  return b.is_ok() ? std::shared_ptr<ParallelCudaBackend>(std::move(b).value()) : nullptr;
}

std::shared_ptr<Backend> one_rank(const ModelWeights& w) {
  auto b = CudaBackend::create(w, options());
  EXPECT_TRUE(b.is_ok()) << b.status().to_string();
  return b.is_ok() ? std::shared_ptr<Backend>(std::move(b).value()) : nullptr;
}

struct Case {
  std::string model;
  int tp;
  int ep = 1;  // experts sliced (1) or held whole, a share on each rank (tp)
  int pp = 1;
  std::vector<int> stage_layers = {};  // empty: even
  int micro = 0;   // micro-batches every step of as many tokens is cut into (0: steps whole)
  int groups = 0;  // steps in flight (0: the default, one per stage with a GPU a rank)
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.model << " over " << c.tp << " ranks" << (c.ep > 1 ? ", experts whole" : "");
  if (c.pp > 1) *os << " x " << c.pp << " stages";
  for (int n : c.stage_layers) *os << " " << n;
  if (c.micro > 0) *os << ", " << c.micro << " micro-batches";
}

std::string case_name(const Case& c) {
  std::string m = c.model;
  std::replace(m.begin(), m.end(), '-', '_');
  std::string name = m + "_tp" + std::to_string(c.tp) +
                     (c.ep > 1 ? "_ep" + std::to_string(c.ep) : "") +
                     (c.pp > 1 ? "_pp" + std::to_string(c.pp) : "");
  for (int n : c.stage_layers) name += "_" + std::to_string(n);
  if (c.micro > 0) name += "_micro" + std::to_string(c.micro);
  if (c.groups > 0) name += "_groups" + std::to_string(c.groups);
  return name;
}

// The greedy answers of `got` (warmed up: its decode graphs captured first) equal `want`'s, with
// graphs replayed; with a GPU a rank and stages the engine kept a step of other sequences in
// flight for each stage (unless c.groups says otherwise), and with c.micro steps were cut (in
// groups, those submitted alone).
void expect_same_greedy(std::shared_ptr<Backend> want_backend, bool warm_want,
                        std::shared_ptr<ParallelCudaBackend> got_backend, const Case& c) {
  auto want = greedy(want_backend, 10, warm_want);
  auto got = greedy(got_backend, 10, true);
  EXPECT_GT(got_backend->num_graphs(), 0u);
  EXPECT_EQ(got, want);
  ASSERT_EQ(got.size(), 3u);
  EXPECT_EQ(got[2].size(), 10u);
  const int groups = c.groups > 0 ? c.groups : c.pp > 1 && !got_backend->virtual_ranks() ? c.pp : 1;
  EXPECT_EQ(got_backend->step_groups(), groups);
  if (c.micro > 0) {
    EXPECT_GT(got_backend->steps_cut(), 0);
  } else {
    EXPECT_EQ(got_backend->steps_cut(), 0);
  }
}

class CudaParallelTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaParallelTest, VirtualRanksEqualOneRank) {
  SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const std::string dir = c.model == "wide" ? wide_model_dir() : model_dir(c.model);
  const ModelWeights& w = loaded_weights(dir);
  ASSERT_GT(w.layers.size(), 0u);
  auto many = parallel(w, c.tp, c.ep, c.pp, c.stage_layers, c.micro);
  ASSERT_TRUE(many);
  EXPECT_EQ(many->num_ranks(), c.tp * c.pp);
  EXPECT_EQ(many->num_stages(), c.pp);
  auto one = one_rank(w);
  ASSERT_TRUE(one);
  expect_close(three_sequences(*one, 3), three_sequences(*many, 3), w.config.vocab_size);
  // Greedy through the engine: decode graphs captured as the steps come (one rank) and at
  // warm-up (the ranks), each replaying every rank's step with its collectives.
  expect_same_greedy(one, false, many, c);
}

INSTANTIATE_TEST_SUITE_P(
    Models, CudaParallelTest,
    ::testing::Values(Case{"tiny-reverse", 2}, Case{"tiny-reverse", 4},  // KV heads replicated
                      Case{"wide", 2}, Case{"wide", 4}, Case{"wide", 8}, Case{"qwen3", 2},
                      Case{"qwen3-moe", 2}, Case{"qwen3-moe", 4}, Case{"qwen3-moe", 2, 2},
                      Case{"qwen3-moe", 4, 4}, Case{"mixtral", 2}, Case{"mixtral", 2, 2},
                      // Pipeline stages: alone, uneven, three of them, with tensor parallelism.
                      Case{"tiny-reverse", 1, 1, 2}, Case{"tiny-reverse", 1, 1, 2, {3, 1}},
                      Case{"qwen3", 1, 1, 3}, Case{"tiny-reverse", 2, 1, 2},
                      Case{"qwen3-moe", 2, 2, 2, {1, 3}}, Case{"mixtral", 1, 1, 2},
                      // Steps cut into micro-batches (more of them than stages, too).
                      Case{"tiny-reverse", 1, 1, 2, {}, 2}, Case{"qwen3", 1, 1, 2, {}, 3},
                      Case{"tiny-reverse", 2, 1, 2, {}, 2}),
    [](const ::testing::TestParamInfo<Case>& info) { return case_name(info.param); });

// One GPU a rank over peer pointers (--cuda-options rank_collectives=peer,
// engine/peer_communicator.h): every rank on a device of its own, its thread running at once with
// the others', its own stream and decode graphs, the stages' hand-offs through mailboxes. Every
// logits row bitwise equal to the virtual ranks' on one device (the same kernels, the sums in the
// same rank order, the layer boundary one launch either way), and the greedy answers through the
// pipelined engine equal. On the CPU stand-in the devices are simulated; a GPU machine needs as
// many GPUs with peer access.
class CudaPeerRanksTest : public ::testing::TestWithParam<Case> {};

TEST_P(CudaPeerRanksTest, OneGpuARankOverPeersEqualsVirtualRanks) {
  SKIP_WITHOUT_GPU();
  const Case& c = GetParam();
  const int world = c.tp * c.pp;
#ifdef HEADROOM_SIMT
  hr::simt::set_device_count(world);
  struct Restore {
    ~Restore() { hr::simt::set_device_count(1); }
  } restore;
#endif
  std::vector<int> devices;
  for (int r = 0; r < world; ++r) devices.push_back(r);
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count < world ||
      !PeerCommunicator::all_peers(devices)) {
    GTEST_SKIP() << world << " GPUs that reach each other's memory are needed";
  }
  const std::string dir = c.model == "wide" ? wide_model_dir() : model_dir(c.model);
  const ModelWeights& w = loaded_weights(dir);
  CudaBackendOptions o = options(c.micro);
  o.rank_collectives = RankCollectives::kPeer;
  o.step_groups = c.groups;
  const ParallelDegrees degrees(c.tp, c.pp, c.ep, c.stage_layers);
  auto built = ParallelCudaBackend::create(w, devices, o, degrees);
  ASSERT_TRUE(built.is_ok()) << built.status().to_string();
  std::shared_ptr<ParallelCudaBackend> peers(std::move(built).value());
  EXPECT_FALSE(peers->virtual_ranks());
  auto virtual_ranks = parallel(w, c.tp, c.ep, c.pp, c.stage_layers);  // (steps whole)
  ASSERT_TRUE(virtual_ranks);
  EXPECT_EQ(three_sequences(*peers, 3), three_sequences(*virtual_ranks, 3));
  expect_same_greedy(virtual_ranks, true, peers, c);
}

INSTANTIATE_TEST_SUITE_P(
    Models, CudaPeerRanksTest,
    ::testing::Values(Case{"tiny-reverse", 2}, Case{"wide", 4}, Case{"qwen3-moe", 2, 2},
                      Case{"tiny-reverse", 1, 1, 2}, Case{"tiny-reverse", 2, 1, 2},
                      Case{"qwen3", 1, 1, 3}, Case{"qwen3-moe", 2, 2, 2, {1, 3}},
                      // Micro-batches in flight: stage s runs one while stage s - 1 runs the next
                      // (in groups, of the steps submitted alone; one group: every step, the
                      // tokens handed back to the first stage).
                      Case{"tiny-reverse", 1, 1, 2, {}, 2}, Case{"qwen3", 1, 1, 3, {}, 4},
                      Case{"qwen3-moe", 2, 2, 2, {1, 3}, 2},
                      Case{"tiny-reverse", 1, 1, 2, {}, 2, 1}, Case{"qwen3", 1, 1, 3, {}, 3, 1}),
    [](const ::testing::TestParamInfo<Case>& info) { return case_name(info.param); });

TEST(CudaParallelBackendTest, ShardsLoadedFromTheCheckpointEqualShardsOfTheWholeModel) {
  SKIP_WITHOUT_GPU();
  const std::string dir = model_dir("qwen3-moe");
  auto from_dir = ParallelCudaBackend::create_from_dir(dir, {0, 0}, options());
  ASSERT_TRUE(from_dir.is_ok()) << from_dir.status().to_string();
  auto from_weights = parallel(loaded_weights(dir), 2);
  ASSERT_TRUE(from_weights);
  const auto a = three_sequences(*from_weights, 1), b = three_sequences(**from_dir, 1);
  EXPECT_EQ(a, b);
}

TEST(CudaParallelBackendTest, TheWorkersBackendSpecBuildsTheRanks) {
  SKIP_WITHOUT_GPU();
  const std::string dir = model_dir("tiny-reverse");
  BackendSpec spec;
  spec.device = "cuda";
  spec.kv_cache_bytes = 8 << 20;
  spec.max_num_tokens = 256;
  spec.max_num_seqs = 32;
  spec.tensor_parallel = 2;
  spec.devices = {0, 0};
  auto made = make_backend(dir, spec);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  auto direct = parallel(loaded_weights(dir), 2);
  ASSERT_TRUE(direct);
  EXPECT_EQ(three_sequences(**made, 1), three_sequences(*direct, 1));
  // Stages as the worker names them (--pipeline-parallel 2 --stage-layers 3,1).
  BackendSpec staged = spec;
  staged.tensor_parallel = 1;
  staged.pipeline_parallel = 2;
  staged.stage_layers.layers = {3, 1};
  auto made_staged = make_backend(dir, staged);
  ASSERT_TRUE(made_staged.is_ok()) << made_staged.status().to_string();
  auto direct_staged = parallel(loaded_weights(dir), 1, 1, 2, {3, 1});
  ASSERT_TRUE(direct_staged);
  EXPECT_EQ(three_sequences(**made_staged, 1), three_sequences(*direct_staged, 1));
  // --stage-layers auto: balanced on the GPUs before serving.
  staged.stage_layers = {{}, true};
  auto balanced = make_backend(dir, staged);
  ASSERT_TRUE(balanced.is_ok()) << balanced.status().to_string();
  auto* measured = dynamic_cast<ParallelCudaBackend*>(balanced->get());
  ASSERT_NE(measured, nullptr);
  EXPECT_TRUE(measured->stage_balance().ran);
  auto direct_balanced = parallel(loaded_weights(dir), 1, 1, 2, measured->stage_layers());
  ASSERT_TRUE(direct_balanced);
  EXPECT_EQ(three_sequences(**balanced, 1), three_sequences(*direct_balanced, 1));
  // Without --devices the ranks take the device and the ones after it.
  int count = 0;
  ASSERT_EQ(cudaGetDeviceCount(&count), cudaSuccess);
  if (count == 1) {
    spec.devices.clear();
    auto missing = make_backend(dir, spec);
    ASSERT_FALSE(missing.is_ok());
    EXPECT_NE(missing.status().to_string().find("no CUDA device 1"), std::string::npos)
        << missing.status().to_string();
  }
}

// The grouped GEMM on warpgroups (Hopper's wgmma) is refused by name before anything loads on a
// GPU of another generation (on the CPU stand-in, made to report compute capability 8), and
// taken on Hopper's.
TEST(CudaParallelBackendTest, TheWarpgroupGemmNeedsAHopperGpu) {
  SKIP_WITHOUT_GPU();
  BackendSpec spec;
  spec.device = "cuda";
  spec.kv_cache_bytes = 8 << 20;
  spec.max_num_tokens = 256;
  spec.max_num_seqs = 8;
  spec.cuda_options = "moe_gemm_warps=warpgroup";
  const std::string dir = model_dir("qwen3-moe");
  int major = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
#ifdef HEADROOM_SIMT
  hr::simt::set_compute_major(8);
  struct Restore {
    ~Restore() { hr::simt::set_compute_major(9); }
  } restore;
  auto refused = make_backend(dir, spec);
  ASSERT_FALSE(refused.is_ok());
  EXPECT_EQ(refused.status().field(), "cuda-options");
  EXPECT_NE(refused.status().message().find("moe_gemm_warps=warpgroup needs a Hopper GPU"),
            std::string::npos)
      << refused.status().to_string();
  hr::simt::set_compute_major(9);
#else
  if (major != 9) {
    auto refused = make_backend(dir, spec);
    ASSERT_FALSE(refused.is_ok());
    EXPECT_EQ(refused.status().field(), "cuda-options");
    return;
  }
#endif
  auto taken = make_backend(dir, spec);
  ASSERT_TRUE(taken.is_ok()) << taken.status().to_string();
}

// A step cut into micro-batches samples as the whole step does: the same tokens, greedy and
// seeded, with penalties, and the log probabilities its rows asked for in the step's rows (a row
// that asked for none left as it was); then a decode step fed from it on the device, cut too.
TEST(CudaParallelBackendTest, ACutStepSamplesAsTheWholeStep) {
  SKIP_WITHOUT_GPU();
  const ModelWeights& w = loaded_weights(model_dir("qwen3"));
  auto whole = parallel(w, 1, 1, 2);
  auto cut = parallel(w, 1, 1, 2, {}, 3);
  ASSERT_TRUE(whole && cut);
  const int vocab = w.config.vocab_size;
  const std::vector<int> lengths = {7, 1, 19};
  const int S = 3, width = 8;
  std::vector<int32_t> ids, positions, starts{0}, rows, table, fed;
  for (int q = 0; q < S; ++q) {
    for (int i = 0; i < lengths[static_cast<size_t>(q)]; ++i) {
      ids.push_back((q * 31 + i * 7 + 3) % vocab);
      positions.push_back(i);
    }
    starts.push_back(static_cast<int32_t>(ids.size()));
    rows.push_back(static_cast<int32_t>(ids.size()) - 1);
    for (int j = 0; j < width; ++j) table.push_back(q * width + j);
  }
  const PenaltyToken seen[] = {{5, 2}, {9, 1}};
  std::vector<SampleSpec> specs(S);
  specs[0].logprobs = 3;
  specs[1].temperature = 0.8f;
  specs[1].random = 7;
  specs[2].temperature = 1.0f;
  specs[2].top_k = 5;
  specs[2].random = 9;
  specs[2].logprobs = 2;
  specs[2].penalties.frequency = 0.5f;
  specs[2].penalty_tokens = seen;
  specs[2].num_penalty_tokens = 2;
  auto run = [&](Backend& b, bool fed_step, std::vector<TokenLogprobs>* lp) {
    StepInput in;
    in.num_seqs = S;
    in.seq_start = starts.data();
    in.block_table = table.data();
    in.max_blocks_per_seq = width;
    in.num_logits = S;
    std::vector<int32_t> decode_ids(S, 0), decode_pos(S), decode_starts{0, 1, 2, 3},
        decode_rows{0, 1, 2}, decode_fed{0, 1, 2};
    if (fed_step) {
      for (int q = 0; q < S; ++q)
        decode_pos[static_cast<size_t>(q)] = lengths[static_cast<size_t>(q)];
      in.num_tokens = S;
      in.token_ids = decode_ids.data();
      in.positions = decode_pos.data();
      in.seq_start = decode_starts.data();
      in.logits_rows = decode_rows.data();
      in.fed_rows = decode_fed.data();
    } else {
      in.num_tokens = static_cast<int>(ids.size());
      in.token_ids = ids.data();
      in.positions = positions.data();
      in.logits_rows = rows.data();
    }
    std::vector<int32_t> tokens(S, -1);
    lp->assign(S, TokenLogprobs{});
    for (TokenLogprobs& l : *lp) l.logprob = 42.0f;  // (a row that asks for none keeps it)
    Status st = b.submit(in, specs.data());
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    st = b.collect(tokens.data(), lp->data());
    EXPECT_TRUE(st.is_ok()) << st.to_string();
    return tokens;
  };
  for (bool fed_step : {false, true}) {
    std::vector<TokenLogprobs> want_lp, got_lp;
    const auto want = run(*whole, fed_step, &want_lp);
    const auto got = run(*cut, fed_step, &got_lp);
    EXPECT_EQ(got, want) << (fed_step ? "decode" : "prefill");
    for (int q = 0; q < S; ++q) {
      const TokenLogprobs &a = want_lp[static_cast<size_t>(q)], &b = got_lp[static_cast<size_t>(q)];
      EXPECT_EQ(b.num_top, a.num_top) << "row " << q;
      EXPECT_NEAR(b.logprob, a.logprob, 1e-4) << "row " << q;
      for (int k = 0; k < a.num_top; ++k) EXPECT_EQ(b.top_ids[k], a.top_ids[k]) << "row " << q;
    }
    EXPECT_EQ(got_lp[1].logprob, 42.0f);
    EXPECT_EQ(got_lp[0].num_top, 3);
  }
  EXPECT_EQ(cut->steps_cut(), 2);
  EXPECT_EQ(whole->steps_cut(), 0);
}

// Stages balanced by measured time on the GPUs (--stage-layers auto): a model whose LM head
// (16,000 rows of 256) costs several of its small layers on the stand-in moves layers off the
// last stage; the backend built again over the new split equals one rank; explicit layers are
// taken as they are.
TEST(CudaParallelBackendTest, BalancingMovesLayersOffTheStageThatHoldsALargeLmHead) {
  SKIP_WITHOUT_GPU();
  const std::string dir = random_model_dir("balance", 16000, 256, 8, 4, 64);
  const ModelWeights& w = loaded_weights(dir);
  StageCalibration calibration;
  auto made =
      ParallelCudaBackend::create(w, {0, 0}, options(), ParallelDegrees(1, 2, 1), &calibration);
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  std::shared_ptr<ParallelCudaBackend> many(std::move(made).value());
  const StageBalance& b = many->stage_balance();
  ASSERT_TRUE(b.ran);
  EXPECT_EQ(b.layers_before, (std::vector<int>{4, 4}));
  ASSERT_EQ(b.layers_after.size(), 2u);
  EXPECT_EQ(b.layers_after[0] + b.layers_after[1], 8);
  EXPECT_EQ(many->stage_layers(), b.layers_after);
  std::printf("stage ms before %.3f, %.3f; layers after %d, %d\n", b.seconds_before[0] * 1e3,
              b.seconds_before[1] * 1e3, b.layers_after[0], b.layers_after[1]);
  // On the stand-in a step's time is the host's arithmetic, where the head outweighs several
  // layers; a GPU's small layers are bound by their launches, and the split it chooses is its own.
  if (kOnSimt) {
    EXPECT_GT(b.layers_after[0], 4);
    EXPECT_LT(std::max(b.predicted_after[0], b.predicted_after[1]),
              std::max(b.seconds_before[0], b.seconds_before[1]));
  }
  auto one = one_rank(w);
  ASSERT_TRUE(one);
  expect_close(three_sequences(*one, 2), three_sequences(*many, 2), w.config.vocab_size);
  EXPECT_EQ(greedy(many, 6, true), greedy(one, 6, false));
  // Explicit layers are taken as they are.
  auto fixed = ParallelCudaBackend::create(w, {0, 0}, options(), ParallelDegrees(1, 2, 1, {4, 4}),
                                           &calibration);
  ASSERT_TRUE(fixed.is_ok());
  EXPECT_FALSE((*fixed)->stage_balance().ran);
  EXPECT_EQ((*fixed)->stage_layers(), (std::vector<int>{4, 4}));
  std::filesystem::remove_all(dir);
}

TEST(CudaParallelBackendTest, DegreesThatDoNotFitAreRefusedNamingTheOption) {
  SKIP_WITHOUT_GPU();
  const ModelWeights& w = loaded_weights(model_dir("tiny-reverse"));
  auto three = ParallelCudaBackend::create(w, {0, 0, 0}, options());  // 4 heads
  ASSERT_FALSE(three.is_ok());
  EXPECT_EQ(three.status().field(), "tensor-parallel") << three.status().to_string();
  auto mixed = ParallelCudaBackend::create(w, {0, 0, 1, 1}, options());
  ASSERT_FALSE(mixed.is_ok());
  EXPECT_NE(mixed.status().to_string().find("device"), std::string::npos)
      << mixed.status().to_string();
  // Devices for other than tp x pp ranks; more stages than layers; uneven stages that do not
  // add up.
  auto short_of = ParallelCudaBackend::create(w, {0, 0}, options(), ParallelDegrees(2, 2, 1));
  ASSERT_FALSE(short_of.is_ok());
  EXPECT_EQ(short_of.status().field(), "devices") << short_of.status().to_string();
  auto five =
      ParallelCudaBackend::create(w, std::vector<int>(5, 0), options(), ParallelDegrees(1, 5, 1));
  ASSERT_FALSE(five.is_ok());
  EXPECT_EQ(five.status().field(), "pipeline-parallel") << five.status().to_string();
  auto uneven = ParallelCudaBackend::create(w, {0, 0}, options(), ParallelDegrees(1, 2, 1, {3, 2}));
  ASSERT_FALSE(uneven.is_ok());
  EXPECT_EQ(uneven.status().field(), "stage-layers") << uneven.status().to_string();
  // Experts held whole by other than every rank; a shard without its communicator (refused by
  // the rank itself).
  const ModelWeights& moe = loaded_weights(model_dir("qwen3-moe"));
  auto ep3 = ParallelCudaBackend::create(moe, {0, 0}, options(), 4);
  ASSERT_FALSE(ep3.is_ok());
  EXPECT_EQ(ep3.status().field(), "expert-parallel");
  auto half = shard_weights(w, {2, 1, 1}, 0, 1);
  ASSERT_TRUE(half.is_ok());
  auto alone = CudaBackend::create(*half, options());
  ASSERT_FALSE(alone.is_ok());
  EXPECT_EQ(alone.status().field(), "tensor-parallel");
}

TEST(CudaParallelBackendTest, TheKvCacheIsSplitOverTheRanks) {
  SKIP_WITHOUT_GPU();
  const ModelWeights& w = loaded_weights(model_dir("tiny-reverse"));
  auto one = one_rank(w);
  auto two = parallel(w, 2);
  ASSERT_TRUE(one && two);
  // Two ranks of one KV head each: each rank's half of the budget holds as many blocks as the
  // whole budget does for both heads on one rank.
  EXPECT_EQ(two->num_kv_blocks(), one->num_kv_blocks());
  EXPECT_LE(two->kv_cache_bytes(), size_t{8} << 20);
  EXPECT_EQ(two->rank(0).num_kv_blocks(), two->rank(1).num_kv_blocks());
  EXPECT_LT(two->rank(0).weight_bytes(), one->weight_bytes());
  // Two stages: each holds its layers' cache and weights (the embedding on the first, the head
  // on the last).
  auto staged = parallel(w, 1, 1, 2);
  ASSERT_TRUE(staged);
  EXPECT_EQ(staged->num_kv_blocks(), one->num_kv_blocks());
  EXPECT_EQ(staged->rank(0).config().num_layers + staged->rank(1).config().num_layers,
            w.config.num_layers);
  EXPECT_LT(staged->rank(1).weight_bytes(), one->weight_bytes());
}

// A step no rank would take is refused before any rank enqueues anything (no stage left waiting
// for a hand-off, no step outstanding dropped), and the stages go on as before. The stages are
// uneven (1 + 3 layers): the later one holds fewer KV blocks, and the step's block is past its
// cache but not past the first stage's.
TEST(CudaParallelBackendTest, ABadStepIsRefusedBeforeAnyRankAndTheStagesGoOn) {
  SKIP_WITHOUT_GPU();
  const ModelWeights& w = loaded_weights(model_dir("tiny-reverse"));
  auto staged = parallel(w, 2, 1, 2, {1, 3});
  ASSERT_TRUE(staged);
  ASSERT_GT(staged->rank(0).num_kv_blocks(), staged->num_kv_blocks());
  std::vector<int32_t> ids = {5, 6}, positions = {0, 1}, starts = {0, 2}, rows = {1};
  std::vector<int32_t> good_table = {0};
  std::vector<int32_t> table = {staged->num_kv_blocks()};  // past the last stage's cache
  StepInput in;
  in.num_tokens = 2;
  in.num_seqs = 1;
  in.token_ids = ids.data();
  in.positions = positions.data();
  in.seq_start = starts.data();
  in.block_table = table.data();
  in.max_blocks_per_seq = 1;
  in.logits_rows = rows.data();
  in.num_logits = 1;
  std::vector<float> logits(static_cast<size_t>(staged->vocab_size()));
  // A good step outstanding while the bad ones are refused: still collected afterwards.
  StepInput good = in;
  good.block_table = good_table.data();
  const SampleSpec greedy;
  ASSERT_TRUE(staged->submit(good, &greedy).is_ok());
  EXPECT_EQ(staged->forward(in, logits.data()).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(staged->submit(in, &greedy).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(staged->submit(in, nullptr).code(), StatusCode::kInvalidArgument);  // no specs
  int32_t token = -1;
  const Status collected = staged->collect(&token, nullptr);
  ASSERT_TRUE(collected.is_ok()) << collected.to_string();
  EXPECT_GE(token, 0);
  // The same layout made afresh, bitwise (one rank's sums are in another order: on a GPU its
  // logits differ from two ranks' in the last bits).
  auto fresh = parallel(w, 2, 1, 2, {1, 3});
  ASSERT_TRUE(fresh);
  EXPECT_EQ(three_sequences(*staged, 2), three_sequences(*fresh, 2));
}

// A rank's layer boundaries as one call (all_reduce_add_rms_norm: on virtual ranks one launch
// of the fused kernel) give bitwise what the all-reduce and the add and norm apart give, through
// prefill, decode and stages.
TEST(CudaParallelBackendTest, TheFusedLayerBoundaryEqualsTheCollectivesApart) {
  SKIP_WITHOUT_GPU();
  for (const Case& c : {Case{"tiny-reverse", 4}, Case{"qwen3", 2}, Case{"qwen3-moe", 2, 2},
                        Case{"wide", 2, 1, 2}}) {
    SCOPED_TRACE(::testing::PrintToString(c));
    const ModelWeights& w =
        loaded_weights(c.model == "wide" ? wide_model_dir() : model_dir(c.model));
    std::vector<std::vector<std::vector<float>>> runs;
    for (bool fused : {true, false}) {
      CudaBackendOptions o = options();
      o.fused_all_reduce = fused;
      auto b = ParallelCudaBackend::create(w, std::vector<int>(c.tp * c.pp, 0), o,
                                           ParallelDegrees(c.tp, c.pp, c.ep));
      ASSERT_TRUE(b.is_ok()) << b.status().to_string();
      runs.push_back(three_sequences(**b, 3));
    }
    EXPECT_EQ(runs[0], runs[1]);
  }
}

// The memory plan (engine/memory_plan.h), from config.json alone, equals what each rank
// allocates: its weights (the embedding on the first stage, the head's vocabulary slice on the
// last, its layers' heads, rows and experts) and its step's buffers.
TEST(CudaParallelBackendTest, ThePlanEqualsWhatEachRankAllocates) {
  SKIP_WITHOUT_GPU();
  int sms = 0;
  ASSERT_EQ(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0), cudaSuccess);
  for (const Case& c : {Case{"tiny-reverse", 2, 1, 2}, Case{"qwen3-moe", 2, 2, 2, {1, 3}},
                        Case{"mixtral", 1, 1, 2}, Case{"qwen3", 2}}) {
    SCOPED_TRACE(::testing::PrintToString(c));
    const std::string dir = model_dir(c.model);
    auto many = parallel(loaded_weights(dir), c.tp, c.ep, c.pp, c.stage_layers);
    ASSERT_TRUE(many);
    auto shape = load_model_shape(dir);
    ASSERT_TRUE(shape.is_ok()) << shape.status().to_string();
    PlanOptions p;
    p.tp = c.tp;
    p.pp = c.pp;
    p.ep = c.ep;
    p.stage_layers = c.stage_layers;
    p.max_num_tokens = options().max_num_tokens;
    p.max_num_seqs = options().max_num_seqs;
    p.block_size = options().block_size;
    p.num_sms = sms;
    auto plan = plan_memory(*shape, p);
    ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
    ASSERT_EQ(plan->ranks.size(), static_cast<size_t>(many->num_ranks()));
    for (int r = 0; r < many->num_ranks(); ++r) {
      const RankPlan& want = plan->ranks[static_cast<size_t>(r)];
      EXPECT_EQ(want.weight_bytes, static_cast<int64_t>(many->rank(r).weight_bytes())) << r;
      EXPECT_EQ(want.activation_bytes, static_cast<int64_t>(many->rank(r).buffer_bytes())) << r;
      EXPECT_EQ(want.num_layers, many->rank(r).config().num_layers) << r;
    }
  }
}

}  // namespace
}  // namespace hr::engine
