// Loader, config and tokenizer errors are clear Status values naming the culprit, never crashes.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "engine/backend_factory.h"
#include "engine/chat_template.h"
#include "engine/model_config.h"
#include "engine/safetensors.h"
#include "engine/tokenizer.h"
#include "engine/weights.h"

namespace hr::engine {
namespace {

namespace fs = std::filesystem;
const std::string kModelDir = std::string(HEADROOM_SOURCE_DIR) + "/models/tiny-reverse";

class LoaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("hr-loader-" + std::to_string(::getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    for (const char* f :
         {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"}) {
      fs::copy_file(kModelDir + "/" + f, dir_ / f, fs::copy_options::overwrite_existing);
    }
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string read(const std::string& f) {
    std::ifstream in(dir_ / f, std::ios::binary);
    return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  void write(const std::string& f, const std::string& data) {
    std::ofstream out(dir_ / f, std::ios::binary | std::ios::trunc);
    out << data;
  }
  fs::path dir_;
};

TEST_F(LoaderTest, TheBundledModelLoads) {
  auto w = load_weights(dir_.string());
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_EQ(w->config.num_kv_heads, 2);
  EXPECT_GT(w->num_parameters(), 900000u);
}

// However many threads convert and however far the loader reads ahead, the weights are the
// ones a serial load gives, bitwise; and an error names the tensor a serial load would name.
TEST_F(LoaderTest, ThreadsAndReadAheadChangeNothing) {
  auto st = SafetensorsModel::open_dir(dir_.string());
  auto config = load_model_config(dir_.string());
  ASSERT_TRUE(st.is_ok() && config.is_ok());
  const WeightPart all{0, config->num_layers, true, true};
  LoadOptions serial;
  serial.threads = 1;
  serial.read_ahead_bytes = 0;
  auto want = load_weights_part(**st, *config, all, serial);
  ASSERT_TRUE(want.is_ok()) << want.status().to_string();
  for (int threads : {2, 4, 8}) {
    for (size_t ahead : {size_t{1}, size_t{4096}, size_t{64} << 20}) {
      LoadOptions o;
      o.threads = threads;
      o.read_ahead_bytes = ahead;
      auto got = load_weights_part(**st, *config, all, o);
      ASSERT_TRUE(got.is_ok()) << got.status().to_string();
      EXPECT_EQ(got->embed, want->embed);
      EXPECT_EQ(got->final_norm, want->final_norm);
      ASSERT_EQ(got->layers.size(), want->layers.size());
      for (size_t i = 0; i < got->layers.size(); ++i) {
        const LayerWeights &g = got->layers[i], &w = want->layers[i];
        EXPECT_TRUE(g.wqkv == w.wqkv && g.wo == w.wo && g.w_gate_up == w.w_gate_up &&
                    g.w_down == w.w_down && g.input_norm == w.input_norm &&
                    g.post_norm == w.post_norm)
            << threads << " threads, " << ahead << " bytes ahead, layer " << i;
      }
    }
  }
  // Every layer's MLP misshapen: the first (layer 0's gate) is named, whichever thread ran it.
  std::string cfg = read("config.json");
  cfg.replace(cfg.find("\"intermediate_size\": 512"), 24, "\"intermediate_size\": 640");
  write("config.json", cfg);
  auto wider = load_model_config(dir_.string());
  ASSERT_TRUE(wider.is_ok());
  for (int round = 0; round < 20; ++round) {
    LoadOptions o;
    o.threads = 8;
    auto bad = load_weights_part(**st, *wider, all, o);
    ASSERT_FALSE(bad.is_ok());
    EXPECT_NE(bad.status().message().find("model.layers.0.mlp.gate_proj.weight"), std::string::npos)
        << bad.status().message();
  }
}

TEST_F(LoaderTest, CorruptHeaderLength) {
  std::string data = read("model.safetensors");
  uint64_t huge = 1ull << 40;
  std::memcpy(data.data(), &huge, 8);
  write("model.safetensors", data);
  auto w = load_weights(dir_.string());
  ASSERT_FALSE(w.is_ok());
  EXPECT_NE(w.status().message().find("header length"), std::string::npos) << w.status().message();
}

TEST_F(LoaderTest, TruncatedFileNamesTheTensor) {
  std::string data = read("model.safetensors");
  write("model.safetensors", data.substr(0, data.size() - 1000));
  auto w = load_weights(dir_.string());
  ASSERT_FALSE(w.is_ok());
  // The message names the first tensor (in header order) that runs past the end.
  EXPECT_NE(w.status().message().find("tensor model."), std::string::npos) << w.status().message();
  EXPECT_NE(w.status().message().find("truncated"), std::string::npos) << w.status().message();
}

TEST_F(LoaderTest, GarbageHeader) {
  std::string data = read("model.safetensors");
  data[10] = '{';
  data[11] = '{';
  write("model.safetensors", data);
  EXPECT_FALSE(load_weights(dir_.string()).is_ok());
  write("model.safetensors", "abc");
  EXPECT_FALSE(load_weights(dir_.string()).is_ok());
}

TEST_F(LoaderTest, MissingTensorAndWrongShapeAreNamed) {
  std::string cfg = read("config.json");
  // One more layer than the file has: layer 4's tensors are missing.
  std::string more = cfg;
  more.replace(more.find("\"num_hidden_layers\": 4"), 22, "\"num_hidden_layers\": 5");
  write("config.json", more);
  auto w = load_weights(dir_.string());
  ASSERT_FALSE(w.is_ok());
  EXPECT_NE(w.status().message().find("model.layers.4.input_layernorm.weight"), std::string::npos)
      << w.status().message();
  std::string wider = cfg;
  wider.replace(wider.find("\"intermediate_size\": 512"), 24, "\"intermediate_size\": 640");
  write("config.json", wider);
  w = load_weights(dir_.string());
  ASSERT_FALSE(w.is_ok());
  EXPECT_NE(
      w.status().message().find("mlp.gate_proj.weight has shape [512, 128], expected [640, 128]"),
      std::string::npos)
      << w.status().message();
}

TEST(ModelConfigTest, BadConfigsAreClear) {
  EXPECT_EQ(parse_model_config("[]").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(parse_model_config(R"({"model_type": "gpt2"})").status().field(), "model_type");
  EXPECT_EQ(parse_model_config(R"({"model_type": "llama", "vocab_size": 10})").status().field(),
            "hidden_size");
  auto c = parse_model_config(R"({"model_type": "llama", "vocab_size": 10, "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
      "num_key_value_heads": 3})");
  EXPECT_EQ(c.status().field(), "num_key_value_heads");
  auto q = parse_model_config(R"({"model_type": "qwen2", "vocab_size": 10, "hidden_size": 64,
      "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
      "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
      "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})");
  ASSERT_TRUE(q.is_ok()) << q.status().to_string();
  EXPECT_TRUE(q->qkv_bias);
  EXPECT_EQ(q->head_dim, 16);
  auto inv = q->rope_inv_freq();
  ASSERT_EQ(inv.size(), 8u);
  EXPECT_FLOAT_EQ(inv[0], 1.0f);  // high frequencies are not scaled
}

// Qwen3-MoE as transformers 4 writes it (rope_theta, num_experts) and as 5 does (RoPE settings in
// rope_parameters, num_local_experts): the same architecture; Mixtral's head_dim null means
// hidden_size / heads; what is not supported is refused by field.
TEST(ModelConfigTest, ArchitecturesInBothTransformersForms) {
  const std::string shape = R"("vocab_size": 10, "hidden_size": 64, "intermediate_size": 96,
      "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 32,)";
  auto v4 = parse_model_config(R"({"model_type": "qwen3_moe", )" + shape +
                               R"("rope_theta": 1000000.0, "num_experts": 8,
      "num_experts_per_tok": 2, "moe_intermediate_size": 24, "norm_topk_prob": true,
      "decoder_sparse_step": 1, "mlp_only_layers": [2]})");
  auto v5 =
      parse_model_config(R"({"model_type": "qwen3_moe", )" + shape +
                         R"("rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0},
      "num_local_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 24,
      "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": [2]})");
  for (const auto* c : {&v4, &v5}) {
    ASSERT_TRUE(c->is_ok()) << c->status().to_string();
    const ModelConfig& m = c->value();
    EXPECT_TRUE(m.qk_norm);
    EXPECT_DOUBLE_EQ(m.rope_theta, 1e6);
    EXPECT_EQ(m.moe.num_experts, 8);
    EXPECT_EQ(m.moe.top_k, 2);
    EXPECT_EQ(m.moe.expert_intermediate_size, 24);
    EXPECT_TRUE(m.moe.renormalize);
    EXPECT_EQ(m.moe.sparse_layers, (std::vector<bool>{true, true, false, true}));
    EXPECT_EQ(m.q_size(), 128);
  }
  auto step2 = parse_model_config(R"({"model_type": "qwen3_moe", )" + shape +
                                  R"("num_experts": 4, "num_experts_per_tok": 1,
      "moe_intermediate_size": 24, "decoder_sparse_step": 2})");
  ASSERT_TRUE(step2.is_ok()) << step2.status().to_string();
  EXPECT_EQ(step2->moe.sparse_layers, (std::vector<bool>{false, true, false, true}));
  EXPECT_FALSE(step2->moe.renormalize);
  auto mixtral = parse_model_config(R"({"model_type": "mixtral", "vocab_size": 10,
      "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2, "num_attention_heads": 4,
      "head_dim": null, "num_local_experts": 8, "num_experts_per_tok": 2,
      "rope_parameters": {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}})");
  ASSERT_TRUE(mixtral.is_ok()) << mixtral.status().to_string();
  EXPECT_EQ(mixtral->head_dim, 16);
  EXPECT_FALSE(mixtral->qk_norm);
  EXPECT_EQ(mixtral->moe.expert_intermediate_size, 96);
  EXPECT_TRUE(mixtral->moe.renormalize);
  EXPECT_TRUE(mixtral->rope_scaling.llama3);
  EXPECT_DOUBLE_EQ(mixtral->rope_theta, 5e5);
  auto field = [&](const std::string& type, const std::string& extra) {
    return parse_model_config(R"({"model_type": ")" + type + R"(", )" + shape + extra + "}")
        .status()
        .field();
  };
  EXPECT_EQ(field("qwen3_moe", R"("num_experts": 4, "num_experts_per_tok": 5,
      "moe_intermediate_size": 24)"),
            "num_experts_per_tok");
  EXPECT_EQ(field("qwen3_moe", R"("num_experts": 4, "num_experts_per_tok": 2)"),
            "moe_intermediate_size");
  EXPECT_EQ(field("qwen3_moe", R"("num_experts": 4, "num_experts_per_tok": 2,
      "moe_intermediate_size": 24, "mlp_only_layers": [4])"),
            "mlp_only_layers");
  EXPECT_EQ(field("mixtral", R"("num_experts_per_tok": 2)"), "num_local_experts");
  EXPECT_EQ(field("qwen3", R"("use_sliding_window": true)"), "use_sliding_window");
  EXPECT_EQ(field("qwen3", R"("rope_parameters": {"rope_type": "yarn", "factor": 4.0})"),
            "rope_parameters");
  EXPECT_EQ(field("deepseek_v3", R"("n_routed_experts": 8)"), "model_type");
}

// --cuda-options: known names and values only, a bare name meaning on (or the setting's first
// value), and an error that names the flag and the setting.
TEST(BackendSpecTest, CudaOptionsParseAndRefuseClearly) {
  auto empty = parse_cuda_options("");
  ASSERT_TRUE(empty.is_ok());
  EXPECT_TRUE(empty->empty());
  auto ok = parse_cuda_options(
      "fused_rope,fused_combine=off,decode_attention=cuda_core,programmatic_launch=auto");
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  const CudaSettings want = {{"fused_rope", "on"},
                             {"fused_combine", "off"},
                             {"decode_attention", "cuda_core"},
                             {"programmatic_launch", "auto"}};
  EXPECT_EQ(*ok, want);
  auto bare = parse_cuda_options("decode_attention,prefetch_weights");
  ASSERT_TRUE(bare.is_ok());
  EXPECT_EQ((*bare)[0].second, "tensor_core");
  EXPECT_EQ((*bare)[1].second, "8mb");
  for (const char* bad : {"fused_ropes", "graphs=yes", "decode_attention=fast", "graphs,", "=on"}) {
    auto r = parse_cuda_options(bad);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_EQ(r.status().field(), "cuda-options") << bad;
  }
  EXPECT_NE(parse_cuda_options("graphs=yes").status().message().find("on or off"),
            std::string::npos);
  EXPECT_NE(parse_cuda_options("fused_ropes").status().message().find("fused_rope"),
            std::string::npos);
#ifdef HEADROOM_HAVE_CUDA
  // Every setting and value reaches its option field: the backend's settings read it back.
  auto defaults = describe_cuda_options("");
  ASSERT_TRUE(defaults.is_ok());
  EXPECT_EQ(*defaults,
            "graphs=on,small_batch_gemv=on,fused_small_batch=on,fused_rope=on,fused_combine=on,"
            "fused_all_reduce=on,rank_collectives=nccl,decode_attention=tensor_core,"
            "programmatic_launch=auto,prefetch_weights=off,moe_experts=auto,"
            "moe_gemm_warps=auto,moe_router_tiles=on,moe_combine=on");
  ASSERT_EQ(cuda_settings().size(), 14u);
  for (const auto& [name, values] : cuda_settings()) {
    for (const auto& value : values) {
      auto d = describe_cuda_options(name + "=" + value);
      ASSERT_TRUE(d.is_ok()) << d.status().to_string();
      EXPECT_NE(("," + *d + ",").find("," + name + "=" + value + ","), std::string::npos)
          << name << "=" << value;
    }
  }
#endif
  // On the CPU backend the settings are an error, before anything is loaded.
  BackendSpec spec;
  spec.cuda_options = "graphs=off";
  auto backend = make_backend("/nonexistent", spec);
  ASSERT_FALSE(backend.is_ok());
  EXPECT_EQ(backend.status().field(), "cuda-options");
}

TEST(TokenizerTest, ErrorsAndUtf8Streaming) {
  EXPECT_FALSE(Tokenizer::from_json("not json", "").is_ok());
  EXPECT_EQ(Tokenizer::from_json(R"({"model": {"type": "WordPiece"}})", "").status().field(),
            "model.type");
  auto tok = Tokenizer::load(kModelDir);
  ASSERT_TRUE(tok.is_ok());
  // "é" is two bytes: the first alone must not be emitted.
  std::string s = "é€x";
  auto ids = (*tok)->encode(s);
  ASSERT_EQ(ids.size(), 6u);
  StreamDecoder d(**tok);
  std::string out;
  std::vector<std::string> deltas;
  for (int32_t id : ids) deltas.push_back(d.push(id));
  EXPECT_EQ(deltas[0], "");
  EXPECT_EQ(deltas[1], "é");
  EXPECT_EQ(deltas[2], "");
  EXPECT_EQ(deltas[3], "");
  EXPECT_EQ(deltas[4], "€");
  EXPECT_EQ(deltas[5], "x");
  EXPECT_EQ((*tok)->decode(ids), s);
}

TEST(TokenizerTest, PreTokenizerSplitsLikeGpt2AndLlama3) {
  using Pieces = std::vector<std::string_view>;
  EXPECT_EQ(pre_tokenize("Hello world's 123  x", SplitRule::kGpt2),
            (Pieces{"Hello", " world", "'s", " 123", " ", " x"}));
  EXPECT_EQ(pre_tokenize("Hello 12345!\n\nok", SplitRule::kLlama3),
            (Pieces{"Hello", " ", "123", "45", "!\n\n", "ok"}));
}

TEST(ChatTemplateTest, FormatsAndUnknownTemplates) {
  EXPECT_EQ(*detect_chat_format("{{ '<|im_start|>' }}"), ChatFormat::kChatMl);
  EXPECT_EQ(*detect_chat_format("<|start_header_id|>"), ChatFormat::kLlama3);
  EXPECT_EQ(*detect_chat_format("[INST]"), ChatFormat::kMistral);
  auto unknown = detect_chat_format("{{ messages }}");
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_EQ(unknown.status().field(), "chat-template");
  EXPECT_NE(unknown.status().message().find("--chat-template"), std::string::npos);
  EXPECT_EQ(*render_chat(ChatFormat::kChatMl, {{"system", "be brief"}, {"user", "hi"}}, "", ""),
            "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n"
            "<|im_start|>assistant\n");
  EXPECT_EQ(*render_chat(ChatFormat::kLlama3, {{"user", "hi"}}, "", ""),
            "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
  EXPECT_EQ(*render_chat(ChatFormat::kMistral,
                         {{"user", "hi"}, {"assistant", "yo"}, {"user", "go"}}, "<s>", "</s>"),
            "<s>[INST] hi [/INST]yo</s>[INST] go [/INST]");
  EXPECT_EQ(render_chat(ChatFormat::kHeadroom, {{"system", "x"}, {"user", "y"}}, "<s>", "</s>")
                .status()
                .field(),
            "messages[0].role");
}

}  // namespace
}  // namespace hr::engine
