#include "tests/testing/random_model.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>
#include <utility>
#include <vector>

#include "engine/safetensors.h"

namespace hr::testing {
namespace {

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// About N(0, 0.02) from a hash of (tensor, index): the sum of four uniforms of 16 bits, centred
// and scaled to the deviation (Irwin-Hall).
float hashed_normal(uint64_t tensor, uint64_t index) {
  const uint64_t h = splitmix64((tensor << 40) ^ index);
  float sum = 0;
  for (int k = 0; k < 4; ++k) sum += static_cast<float>((h >> (16 * k)) & 0xffff) / 65536.0f;
  return (sum - 2.0f) * (0.02f / 0.57735f);  // a uniform's deviation: sqrt(1/12); four: 0.577
}

// One tensor of `shape` written in bf16 or f32 (`width` bytes), its values made in pieces on
// every core; norms are one, and with `printable_rows` every row of `row_width` but the printable
// ASCII bytes' is zero.
void write_hashed(const std::pair<std::string, std::vector<int64_t>>& tensor, size_t t,
                  size_t width, bool printable_rows, int row_width, std::ofstream& out) {
  const auto& [name, shape] = tensor;
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  const bool norm = name.find("norm") != std::string::npos;
  const size_t piece = size_t{1} << 24;
  const size_t threads = std::max(1u, std::thread::hardware_concurrency());
  std::vector<char> bytes;
  for (size_t p0 = 0; p0 < n; p0 += piece) {
    const size_t p1 = std::min(n, p0 + piece), share = (p1 - p0 + threads - 1) / threads;
    bytes.resize((p1 - p0) * width);
    std::vector<std::thread> pool;
    for (size_t k = 0; k < threads; ++k) {
      pool.emplace_back([&, k] {
        for (size_t i = p0 + k * share; i < std::min(p1, p0 + (k + 1) * share); ++i) {
          const size_t row = i / static_cast<size_t>(row_width);
          float v = norm ? 1.0f : hashed_normal(t, i);
          if (printable_rows && (row < 32 || row > 126)) v = 0.0f;
          if (width == 2) {
            const uint16_t h = engine::f32_to_bf16(v);
            std::memcpy(bytes.data() + (i - p0) * 2, &h, 2);
          } else {
            std::memcpy(bytes.data() + (i - p0) * 4, &v, 4);
          }
        }
      });
    }
    for (std::thread& th : pool) th.join();
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  }
}

}  // namespace

size_t write_random_llama(const std::string& dir, const std::string& tokenizer_dir,
                          const RandomLlama& s) {
  namespace fs = std::filesystem;
  using nlohmann::json;
  fs::create_directories(dir);
  const int V = s.vocab, D = s.hidden, F = s.intermediate, hd = s.head_dim;
  json config = {{"model_type", "llama"},
                 {"architectures", {"LlamaForCausalLM"}},
                 {"vocab_size", V},
                 {"hidden_size", D},
                 {"intermediate_size", F},
                 {"num_hidden_layers", s.layers},
                 {"num_attention_heads", s.heads},
                 {"num_key_value_heads", s.kv_heads},
                 {"head_dim", hd},
                 {"max_position_embeddings", s.context},
                 {"rms_norm_eps", 1e-5},
                 {"rope_theta", s.rope_theta},
                 {"tie_word_embeddings", s.tie},
                 {"hidden_act", "silu"},
                 {"torch_dtype", s.bf16 ? "bfloat16" : "float32"},
                 {"bos_token_id", 256},
                 {"eos_token_id", 257}};
  const bool moe = s.experts > 0;
  const int E = s.experts, FE = s.expert_intermediate;
  if (moe) {
    config["model_type"] = "qwen3_moe";
    config["architectures"] = {"Qwen3MoeForCausalLM"};
    config["num_experts"] = E;
    config["num_experts_per_tok"] = s.top_k;
    config["moe_intermediate_size"] = FE;
    config["norm_topk_prob"] = true;
    config["decoder_sparse_step"] = 1;
    config["mlp_only_layers"] = json::array();
  }
  std::ofstream(dir + "/config.json") << config.dump(2);
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"}) {
    fs::copy_file(tokenizer_dir + "/" + f, dir + "/" + f, fs::copy_options::overwrite_existing);
  }
  std::vector<std::pair<std::string, std::vector<int64_t>>> tensors = {
      {"model.embed_tokens.weight", {V, D}}, {"model.norm.weight", {D}}};
  if (!s.tie) tensors.push_back({"lm_head.weight", {V, D}});
  for (int l = 0; l < s.layers; ++l) {
    std::string p = "model.layers." + std::to_string(l) + ".";
    tensors.push_back({p + "input_layernorm.weight", {D}});
    tensors.push_back({p + "post_attention_layernorm.weight", {D}});
    tensors.push_back({p + "self_attn.q_proj.weight", {s.heads * hd, D}});
    tensors.push_back({p + "self_attn.k_proj.weight", {s.kv_heads * hd, D}});
    tensors.push_back({p + "self_attn.v_proj.weight", {s.kv_heads * hd, D}});
    tensors.push_back({p + "self_attn.o_proj.weight", {D, s.heads * hd}});
    if (moe) {
      tensors.push_back({p + "self_attn.q_norm.weight", {hd}});
      tensors.push_back({p + "self_attn.k_norm.weight", {hd}});
      tensors.push_back({p + "mlp.gate.weight", {E, D}});
      tensors.push_back({p + "mlp.experts.gate_up_proj", {E, 2 * FE, D}});
      tensors.push_back({p + "mlp.experts.down_proj", {E, D, FE}});
      continue;
    }
    tensors.push_back({p + "mlp.gate_proj.weight", {F, D}});
    tensors.push_back({p + "mlp.up_proj.weight", {F, D}});
    tensors.push_back({p + "mlp.down_proj.weight", {D, F}});
  }
  const size_t width = s.bf16 ? 2 : 4;
  json header = json::object();
  size_t offset = 0;
  for (const auto& [name, shape] : tensors) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    header[name] = {{"dtype", s.bf16 ? "BF16" : "F32"},
                    {"shape", shape},
                    {"data_offsets", {offset, offset + width * n}}};
    offset += width * n;
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::ofstream out(dir + "/model.safetensors", std::ios::binary);
  uint64_t len = h.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << h;
  // With printable_output, the embedding's and the LM head's rows but the printable bytes' are
  // zero.
  for (size_t t = 0; t < tensors.size(); ++t) {
    const std::string& name = tensors[t].first;
    const bool printable_rows =
        s.printable_output && (name == "model.embed_tokens.weight" || name == "lm_head.weight");
    write_hashed(tensors[t], t, width, printable_rows, D, out);
  }
  return offset;
}

}  // namespace hr::testing
