// Engine benchmark driver (run by scripts/bench_engine.sh). Modes:
//   --make-random-model DIR   writes a ~100M-parameter random-weight Llama (with --experts on, a
//                             ~0.5B Qwen3-MoE of 32 experts, top 4: ~0.1B read per token) in the
//                             Hugging Face layout (config.json, model.safetensors in bf16, the
//                             bundled model's tokenizer files); with --output-vocab printable, the
//                             embedding rows (also the tied LM head) of every token but the
//                             printable ASCII bytes are zero, so greedy decoding writes text
//                             and never ends early (the bundled tokenizer knows 260 of the
//                             32,000 tokens; the others decode to nothing)
//                             (with --shape small, a ~2M-parameter Llama of 2 layers of 64 and
//                             a context of 2,048: the cache-aware dispatch benchmark's; with
//                             --shape wide-vocab, ~110M parameters in 24 layers of 512 and a
//                             vocabulary of 64,000, whose LM head costs ~10 layers as Qwen3-0.6B's
//                             does: the pipeline benchmark's; with --shape llama3-8b, Llama 3
//                             8B's shape, 16 GB of bf16 written in seconds: the GPU flex
//                             benchmark's)
//   --model DIR               measures decode tokens/s at batch 1, 8, 32, prefill tokens/s,
//                             the batch-1 bandwidth fraction and RSS; prints one JSON object.
//   --model DIR --only-batch N  three decode runs at batch N only (for profiling).
// The batch-1 bandwidth fraction is measured in five short batch-1 decode runs interleaved with
// streaming-read bandwidth measurements (before, during and after each run), one fraction per
// run; the median is reported (with min, max and the raw lists), so drift in the machine's speed
// during a benchmark cancels.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <thread>

#include "engine/cpu_backend.h"
#include "engine/cpu_gemm.h"
#include "engine/engine.h"
#include "engine/thread_pool.h"
#include "engine/weights.h"
#include "tests/bench/engine_run.h"
#include "tests/testing/random_model.h"

using namespace hr::engine;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double secs(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

long rss_mb() {
  std::ifstream in("/proc/self/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stol(line.substr(6)) / 1024;
  }
  return -1;
}

int make_random_model(const std::string& dir, const std::string& tokenizer_dir,
                      bool printable_output, bool moe, const std::string& shape) {
  hr::testing::RandomLlama spec;
  spec.printable_output = printable_output;
  if (shape == "wide-vocab") {
    spec.vocab = 64000;
    spec.hidden = 512;
    spec.intermediate = 1536;
    spec.layers = 24;
    spec.heads = 8;
    spec.kv_heads = 4;
  }
  if (shape ==
      "small") {  // ~2M parameters (mostly the embedding), a context of 2,048: cheap long prompts
    spec.hidden = 64;
    spec.intermediate = 128;
    spec.layers = 2;
    spec.heads = 4;
    spec.kv_heads = 2;
    spec.head_dim = 16;
  }
  if (shape == "llama3-8b") {  // Llama 3 8B's shape (8.0B parameters, an LM head of its own),
                               // written as fast as the disk takes it: the GPU flex benchmark's
    spec.vocab = 128256;
    spec.hidden = 4096;
    spec.intermediate = 14336;
    spec.layers = 32;
    spec.heads = 32;
    spec.kv_heads = 8;
    spec.head_dim = 128;
    spec.context = 8192;
    spec.tie = false;
  }
  if (moe) {  // ~0.5B parameters, ~0.1B of them read per token: 32 experts of 512, top 4
    spec.experts = 32;
    spec.top_k = 4;
    spec.expert_intermediate = 512;
  }
  size_t bytes = hr::testing::write_random_llama(dir, tokenizer_dir, spec);
  std::printf("wrote %s (%zu bytes of weights)\n", dir.c_str(), bytes);
  return 0;
}

// A buffer for the bandwidth reference on transparent huge pages, as the loader puts the weights.
std::vector<float> read_buffer(size_t bytes) {
  std::vector<float> data;
  allocate_weight(&data, bytes / sizeof(float));
  std::fill(data.begin(), data.end(), 1.0f);
  return data;
}

// The machine's streaming-read bandwidth: the best of 4 passes over `data` (much larger than the
// caches, on huge pages), each a pure read (sum_floats: vector loads and enough accumulators that
// no add limits it) by every thread of the pool, which claim 4 MiB pieces in turn so a thread that
// runs late costs nothing (the GEMV splits its rows the same way). The passes alternate between
// the SIMD levels the CPU has, AVX-512 and AVX2 loads (on the Zen 4 here AVX2 loads stream ~10%
// faster). It is the rate at which this machine, as loaded at the moment, reads memory: an upper
// bound for any kernel that reads memory, the GEMV included.
double read_bandwidth_gbs(const std::vector<float>& data, ThreadPool& pool) {
  const size_t piece = (4u << 20) / sizeof(float);
  const int num_pieces = static_cast<int>(data.size() / piece);
  std::vector<float> sums(static_cast<size_t>(num_pieces));
  std::vector<SimdLevel> levels = {cpu_simd_level()};
  if (cpu_simd_level() == SimdLevel::kAvx512) levels.push_back(SimdLevel::kAvx2);
  auto pass = [&](SimdLevel level) {
    pool.parallel_for(num_pieces, 1, [&](int p0, int p1) {
      for (int p = p0; p < p1; ++p) {
        sums[static_cast<size_t>(p)] = sum_floats(data.data() + piece * p, piece, level);
      }
    });
  };
  pass(levels[0]);  // wakes the pool's workers; they spin between the timed passes
  double best = 0;
  for (int rep = 0; rep < 4; ++rep) {
    auto t0 = Clock::now();
    pass(levels[static_cast<size_t>(rep) % levels.size()]);
    double s = secs(t0);
    best = std::max(best, static_cast<double>(num_pieces * piece * sizeof(float)) / s / 1e9);
  }
  if (sums[0] < 0) std::printf("impossible\n");
  return best;
}

constexpr int kNumRuns = 5;          // batch-1 decode runs for the bandwidth fraction
constexpr int kStepsPerSample = 16;  // decode steps between bandwidth samples during a run

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

using hr::bench::DecodeResult;

// Runs `batch` requests to completion on a CPU backend over `weights`. `between_steps`, when set,
// runs after every kStepsPerSample decode steps, outside the timed steps.
DecodeResult run_batch(std::shared_ptr<const ModelWeights> weights, int batch, int prompt_len,
                       int gen_len, const std::function<void()>& between_steps = nullptr) {
  auto backend = CpuBackend::create(weights, {16, 512ull << 20, 0}).value();
  return hr::bench::run_requests(std::shared_ptr<Backend>(std::move(backend)),
                                 weights->config.max_position_embeddings, batch, prompt_len,
                                 gen_len, between_steps, kStepsPerSample);
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, make, tokenizer_dir, output_vocab = "all";
  int only_batch = 0;
  bool moe = false;
  std::string shape;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--model") model = argv[i + 1];
    if (k == "--make-random-model") make = argv[i + 1];
    if (k == "--tokenizer-from") tokenizer_dir = argv[i + 1];
    if (k == "--output-vocab") output_vocab = argv[i + 1];
    if (k == "--only-batch") only_batch = std::atoi(argv[i + 1]);
    if (k == "--experts") moe = std::string(argv[i + 1]) == "on";
    if (k == "--shape") shape = argv[i + 1];
  }
  if (!shape.empty() && shape != "small" && shape != "wide-vocab" && shape != "llama3-8b") {
    std::fprintf(stderr, "--shape is small, wide-vocab or llama3-8b\n");
    return 2;
  }
  if (!make.empty())
    return make_random_model(make, tokenizer_dir, output_vocab == "printable", moe, shape);
  auto t0 = Clock::now();
  auto w = load_weights(model);
  if (!w.is_ok()) {
    std::fprintf(stderr, "%s\n", w.status().to_string().c_str());
    return 1;
  }
  ModelWeights loaded = std::move(w).value();
  pack_for_cpu(&loaded);
  double load_s = secs(t0);
  auto weights = std::make_shared<const ModelWeights>(std::move(loaded));
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  json out = {{"model", model},
              {"parameters", weights->num_parameters()},
              {"weight_bytes_fp32", weights->num_bytes()},
              {"load_seconds", load_s},
              {"threads", threads},
              {"simd", simd_level_name(cpu_simd_level())}};
  int prompt_len = std::min(32, weights->config.max_position_embeddings / 4);
  int gen_len = std::min(64, weights->config.max_position_embeddings / 2);
  if (only_batch > 0) {
    // Three decode runs at one batch size, for profiling and quick comparisons.
    for (int run = 0; run < 3; ++run) {
      DecodeResult r = run_batch(weights, only_batch, prompt_len, gen_len);
      std::printf(
          "{\"batch\":%d,\"decode_tok_s\":%.1f,\"prefill_tok_s\":%.1f,\"load_seconds\":%.2f}\n",
          only_batch, r.decode_tok_s, r.prefill_tok_s, load_s);
      std::fflush(stdout);
    }
    return 0;
  }
  // Batch-1 decode reads every weight once per token (the tied embedding as the LM head), of a
  // mixture of experts only the top k experts of each layer.
  double bytes_per_token = static_cast<double>(weights->num_bytes());
  if (weights->config.is_moe()) {
    const MoeConfig& m = weights->config.moe;
    double experts = 0;
    for (int l = 0; l < weights->config.num_layers; ++l) {
      if (weights->config.is_moe_layer(l)) {
        experts += 4.0 * (weights->layers[static_cast<size_t>(l)].experts_gate_up.size() +
                          weights->layers[static_cast<size_t>(l)].experts_down.size());
      }
    }
    bytes_per_token -= experts * (1.0 - static_cast<double>(m.top_k) / m.num_experts);
  }
  // Batch-1 decode runs with bandwidth samples before, during (every kStepsPerSample steps, outside
  // the timed steps) and after each; a run's fraction is over the mean of its samples, the
  // bandwidth the machine offered while the run ran.
  std::vector<double> ref_list, tok_s_list, fraction_list;
  json samples_list = json::array();
  {
    ThreadPool pool(threads);
    size_t read_bytes = std::min<size_t>(1ull << 30, 2 * weights->num_bytes() + (64 << 20));
    std::vector<float> data = read_buffer(read_bytes);
    double last = read_bandwidth_gbs(data, pool);
    for (int run = 0; run < kNumRuns; ++run) {
      std::vector<double> samples = {last};
      double tok_s = run_batch(weights, 1, prompt_len, gen_len, [&] {
                       samples.push_back(read_bandwidth_gbs(data, pool));
                     }).decode_tok_s;
      last = read_bandwidth_gbs(data, pool);
      samples.push_back(last);
      double ref = mean(samples);
      ref_list.push_back(ref);
      tok_s_list.push_back(tok_s);
      fraction_list.push_back(bytes_per_token * tok_s / 1e9 / ref);
      samples_list.push_back(samples);
      std::printf("{\"run\":%d,\"read_gbs\":%.1f,\"batch1_tok_s\":%.1f,\"fraction\":%.3f}\n", run,
                  ref, tok_s, fraction_list.back());
      std::fflush(stdout);
    }
  }
  out["read_bandwidth_gbs"] = median(ref_list);
  out["read_bandwidth_gbs_list"] = ref_list;
  out["read_bandwidth_samples_gbs"] = samples_list;
  out["decode_tok_s_batch1"] = median(tok_s_list);
  out["decode_tok_s_batch1_list"] = tok_s_list;
  out["batch1_weight_read_gbs"] = bytes_per_token * median(tok_s_list) / 1e9;
  out["batch1_bandwidth_fraction"] = median(fraction_list);
  auto [lowest, highest] = std::minmax_element(fraction_list.begin(), fraction_list.end());
  out["batch1_bandwidth_fraction_min"] = *lowest;
  out["batch1_bandwidth_fraction_max"] = *highest;
  out["batch1_bandwidth_fraction_list"] = fraction_list;
  for (int batch : {8, 32}) {
    DecodeResult r = run_batch(weights, batch, prompt_len, gen_len);
    out["decode_tok_s_batch" + std::to_string(batch)] = r.decode_tok_s;
    if (batch == 32) out["prefill_tok_s"] = r.prefill_tok_s;
    std::printf("{\"batch\":%d,\"decode_tok_s\":%.1f}\n", batch, r.decode_tok_s);
    std::fflush(stdout);
  }
  out["batch32_over_batch1"] = out["decode_tok_s_batch32"].get<double>() / median(tok_s_list);
  out["rss_mb"] = rss_mb();
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
