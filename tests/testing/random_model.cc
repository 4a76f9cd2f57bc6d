#include "tests/testing/random_model.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <utility>
#include <vector>

#include "engine/safetensors.h"

namespace hr::testing {

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
                 {"tie_word_embeddings", true},
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
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> values;
  std::vector<uint16_t> halves;
  for (const auto& [name, shape] : tensors) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    values.resize(n);
    bool norm = name.find("norm") != std::string::npos;
    for (float& v : values) v = norm ? 1.0f : normal(rng);
    if (s.printable_output && name == "model.embed_tokens.weight") {
      for (size_t row = 0; row < static_cast<size_t>(V); ++row) {
        if (row < 32 || row > 126) {
          std::fill_n(values.begin() + static_cast<std::ptrdiff_t>(row * D), D, 0.0f);
        }
      }
    }
    if (s.bf16) {
      halves.resize(n);
      for (size_t i = 0; i < n; ++i) halves[i] = engine::f32_to_bf16(values[i]);
      out.write(reinterpret_cast<const char*>(halves.data()), static_cast<std::streamsize>(2 * n));
    } else {
      out.write(reinterpret_cast<const char*>(values.data()), static_cast<std::streamsize>(4 * n));
    }
  }
  return offset;
}

}  // namespace hr::testing
