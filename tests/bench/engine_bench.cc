// Engine benchmark driver (run by scripts/bench_engine.sh). Modes:
//   --make-random-model DIR   writes a ~100M-parameter random-weight Llama in the Hugging Face
//                             layout (config.json, model.safetensors in bf16, the bundled
//                             model's tokenizer files); with --output-vocab printable, the
//                             embedding rows (also the tied LM head) of every token but the
//                             printable ASCII bytes are zero, so greedy decoding writes text
//                             and never ends early (the bundled tokenizer knows 260 of the
//                             32,000 tokens; the others decode to nothing)
//   --model DIR               measures decode tokens/s at batch 1, 8, 32, prefill tokens/s,
//                             memory bandwidth (a streaming read in the same run), the batch-1
//                             bandwidth fraction and RSS; prints one JSON object.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include "engine/cpu_backend.h"
#include "engine/engine.h"
#include "engine/safetensors.h"
#include "engine/weights.h"

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
                      bool printable_output) {
  namespace fs = std::filesystem;
  fs::create_directories(dir);
  const int V = 32000, D = 768, F = 2048, L = 12, H = 12, KVH = 4, hd = 64;
  json config = {{"model_type", "llama"}, {"architectures", {"LlamaForCausalLM"}},
                 {"vocab_size", V}, {"hidden_size", D}, {"intermediate_size", F},
                 {"num_hidden_layers", L}, {"num_attention_heads", H},
                 {"num_key_value_heads", KVH}, {"head_dim", hd}, {"max_position_embeddings", 2048},
                 {"rms_norm_eps", 1e-5}, {"rope_theta", 500000.0}, {"tie_word_embeddings", true},
                 {"hidden_act", "silu"}, {"torch_dtype", "bfloat16"}, {"bos_token_id", 256},
                 {"eos_token_id", 257}};
  std::ofstream(dir + "/config.json") << config.dump(2);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(tokenizer_dir + "/" + f, dir + "/" + f, fs::copy_options::overwrite_existing);
  }
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors = {
      {"model.embed_tokens.weight", {V, D}}, {"model.norm.weight", {D}}};
  for (int l = 0; l < L; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    tensors.push_back({p + "input_layernorm.weight", {D}});
    tensors.push_back({p + "post_attention_layernorm.weight", {D}});
    tensors.push_back({p + "self_attn.q_proj.weight", {H * hd, D}});
    tensors.push_back({p + "self_attn.k_proj.weight", {KVH * hd, D}});
    tensors.push_back({p + "self_attn.v_proj.weight", {KVH * hd, D}});
    tensors.push_back({p + "self_attn.o_proj.weight", {D, H * hd}});
    tensors.push_back({p + "mlp.gate_proj.weight", {F, D}});
    tensors.push_back({p + "mlp.up_proj.weight", {F, D}});
    tensors.push_back({p + "mlp.down_proj.weight", {D, F}});
  }
  json header = json::object();
  size_t offset = 0;
  for (const auto& [name, shape] : tensors) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    header[name] = {{"dtype", "BF16"}, {"shape", shape}, {"data_offsets", {offset, offset + 2 * n}}};
    offset += 2 * n;
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::ofstream out(dir + "/model.safetensors", std::ios::binary);
  uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << h;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<uint16_t> buf;
  for (const auto& [name, shape] : tensors) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    buf.resize(n);
    bool norm = name.find("norm") != std::string::npos;
    for (size_t i = 0; i < n; ++i) buf[i] = f32_to_bf16(norm ? 1.0f : normal(rng));
    if (printable_output && name == "model.embed_tokens.weight") {
      for (size_t row = 0; row < static_cast<size_t>(V); ++row) {
        if (row < 32 || row > 126) std::fill_n(buf.begin() + row * D, D, uint16_t{0});
      }
    }
    out.write(reinterpret_cast<const char*>(buf.data()), static_cast<std::streamsize>(2 * n));
  }
  std::printf("wrote %s (%zu bytes of weights)\n", dir.c_str(), offset);
  return 0;
}

// Streaming read bandwidth over `bytes`, with `threads` readers, best of 3.
double read_bandwidth_gbs(size_t bytes, int threads) {
  std::vector<float> data(bytes / sizeof(float), 1.0f);
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<double> sums(static_cast<size_t>(threads));
    auto t0 = Clock::now();
    std::vector<std::thread> ts;
    size_t per = data.size() / static_cast<size_t>(threads);
    for (int t = 0; t < threads; ++t) {
      ts.emplace_back([&, t] {
        const float* p = data.data() + per * static_cast<size_t>(t);
        float acc[8] = {0};
        for (size_t i = 0; i + 8 <= per; i += 8) {
          for (int k = 0; k < 8; ++k) acc[k] += p[i + k];
        }
        sums[static_cast<size_t>(t)] = acc[0] + acc[1] + acc[2] + acc[3] + acc[4] + acc[5] + acc[6] + acc[7];
      });
    }
    for (auto& t : ts) t.join();
    double s = secs(t0);
    best = std::max(best, static_cast<double>(bytes) / s / 1e9);
    if (sums[0] < 0) std::printf("impossible\n");
  }
  return best;
}

struct DecodeResult {
  double decode_tok_s = 0;
  double prefill_tok_s = 0;
};

DecodeResult run_batch(std::shared_ptr<const ModelWeights> weights, int batch, int prompt_len,
                       int gen_len) {
  auto backend = CpuBackend::create(weights, {16, 512ull << 20, 0}).value();
  EngineOptions o;
  o.scheduler = {std::max(batch, 1), std::max(2048, batch * prompt_len), 2048};
  auto engine = Engine::create(std::shared_ptr<Backend>(std::move(backend)), nullptr,
                               weights->config.max_position_embeddings, o)
                    .value();
  std::mt19937 rng(1);
  for (int b = 0; b < batch; ++b) {
    GenerationRequest r;
    for (int i = 0; i < prompt_len; ++i) {
      r.prompt.push_back(static_cast<int32_t>(rng() % 250));
    }
    r.params.max_tokens = gen_len;
    r.params.ignore_eos = true;
    if (!engine->add(std::move(r)).is_ok()) std::abort();
  }
  double prefill_s = 0, decode_s = 0;
  long prefill_tokens = 0, decode_tokens = 0;
  while (engine->has_work()) {
    auto t0 = Clock::now();
    auto st = engine->step().value();
    double s = secs(t0);
    if (st.num_prefill_tokens > 0) {
      prefill_s += s;
      prefill_tokens += st.num_prefill_tokens;
    } else {
      decode_s += s;
      decode_tokens += st.num_decode_tokens;
    }
  }
  return {decode_tokens / decode_s, prefill_tokens / prefill_s};
}

}  // namespace

int main(int argc, char** argv) {
  std::string model, make, tokenizer_dir, output_vocab = "all";
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i];
    if (k == "--model") model = argv[i + 1];
    if (k == "--make-random-model") make = argv[i + 1];
    if (k == "--tokenizer-from") tokenizer_dir = argv[i + 1];
    if (k == "--output-vocab") output_vocab = argv[i + 1];
  }
  if (!make.empty()) return make_random_model(make, tokenizer_dir, output_vocab == "printable");
  auto t0 = Clock::now();
  auto w = load_weights(model);
  if (!w.is_ok()) {
    std::fprintf(stderr, "%s\n", w.status().to_string().c_str());
    return 1;
  }
  double load_s = secs(t0);
  auto weights = std::make_shared<const ModelWeights>(std::move(w).value());
  int threads = static_cast<int>(std::thread::hardware_concurrency());
  json out = {{"model", model}, {"parameters", weights->num_parameters()},
              {"weight_bytes_fp32", weights->num_bytes()}, {"load_seconds", load_s},
              {"threads", threads}};
  double bw = read_bandwidth_gbs(std::min<size_t>(1ull << 30, 2 * weights->num_bytes() + (64 << 20)), threads);
  out["read_bandwidth_gbs"] = bw;
  int prompt_len = std::min(32, weights->config.max_position_embeddings / 4);
  int gen_len = std::min(64, weights->config.max_position_embeddings / 2);
  for (int batch : {1, 8, 32}) {
    DecodeResult r = run_batch(weights, batch, prompt_len, gen_len);
    out["decode_tok_s_batch" + std::to_string(batch)] = r.decode_tok_s;
    if (batch == 32) out["prefill_tok_s"] = r.prefill_tok_s;
    std::printf("{\"batch\":%d,\"decode_tok_s\":%.1f}\n", batch, r.decode_tok_s);
    std::fflush(stdout);
  }
  out["batch32_over_batch1"] = out["decode_tok_s_batch32"].get<double>() / out["decode_tok_s_batch1"].get<double>();
  // Batch-1 decode reads every weight once per token (the tied embedding as the LM head).
  double bytes_per_token = static_cast<double>(weights->num_bytes());
  out["batch1_weight_read_gbs"] = bytes_per_token * out["decode_tok_s_batch1"].get<double>() / 1e9;
  out["batch1_bandwidth_fraction"] = out["batch1_weight_read_gbs"].get<double>() / bw;
  out["rss_mb"] = rss_mb();
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
