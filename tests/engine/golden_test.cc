// The engine against PyTorch: the bundled model's greedy tokens for every reference prompt and its
// top logits within 1e-4, through the CPU backend's paged KV cache (prefill, then one decode step
// at a time).
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "engine/chat_template.h"
#include "engine/cpu_backend.h"
#include "engine/tokenizer.h"
#include "engine/weights.h"

namespace hr::engine {
namespace {

const std::string kModelDir = std::string(HEADROOM_SOURCE_DIR) + "/models/tiny-reverse";

nlohmann::json load_reference() {
  std::ifstream in(kModelDir + "/reference.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

TEST(GoldenTest, GreedyTokensAndLogitsMatchPyTorch) {
  auto weights = load_weights(kModelDir);
  ASSERT_TRUE(weights.is_ok()) << weights.status().to_string();
  auto shared = std::make_shared<const ModelWeights>(std::move(weights).value());
  auto backend = CpuBackend::create(shared, {16, 8 << 20});
  ASSERT_TRUE(backend.is_ok()) << backend.status().to_string();
  CpuBackend& b = **backend;
  const int V = b.vocab_size();
  auto ref = load_reference();
  ASSERT_GE(ref["cases"].size(), 200u);
  int mismatched = 0;
  double max_diff = 0;
  for (const auto& c : ref["cases"]) {
    std::vector<int32_t> tokens = c["prompt_ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> expected = c["output_ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> block_table(16);
    for (int i = 0; i < 16; ++i) block_table[i] = 15 - i;  // scattered blocks, not 0..n
    std::vector<int32_t> out;
    std::vector<float> logits(V);
    int computed = 0;
    for (size_t step = 0; step < expected.size(); ++step) {
      int n = static_cast<int>(tokens.size()) - computed;
      std::vector<int32_t> ids(tokens.begin() + computed, tokens.end());
      std::vector<int32_t> pos(n);
      for (int i = 0; i < n; ++i) pos[i] = computed + i;
      int32_t seq_start[2] = {0, n};
      int32_t last = n - 1;
      StepInput in;
      in.num_tokens = n;
      in.num_seqs = 1;
      in.token_ids = ids.data();
      in.positions = pos.data();
      in.seq_start = seq_start;
      in.block_table = block_table.data();
      in.max_blocks_per_seq = 16;
      in.logits_rows = &last;
      in.num_logits = 1;
      ASSERT_TRUE(b.forward(in, logits.data()).is_ok());
      computed = static_cast<int>(tokens.size());
      for (const auto& tl : c["top_logits"][step]) {
        double d = std::abs(logits[tl[0].get<int>()] - tl[1].get<double>());
        max_diff = std::max(max_diff, d);
        EXPECT_LT(d, 1e-4) << "case " << c["text"] << " step " << step;
      }
      int32_t next =
          static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      out.push_back(next);
      tokens.push_back(next);
    }
    if (out != expected) ++mismatched;
  }
  EXPECT_EQ(mismatched, 0);
  std::printf("golden: %zu cases, max |logit diff| = %.3g\n", ref["cases"].size(), max_diff);
}

TEST(GoldenTest, TokenizerAndTemplateReproduceTheTrainingFormat) {
  auto tok = Tokenizer::load(kModelDir);
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  auto fmt = load_chat_format(kModelDir);
  ASSERT_TRUE(fmt.is_ok()) << fmt.status().to_string();
  EXPECT_EQ(*fmt, ChatFormat::kHeadroom);
  auto ref = load_reference();
  for (const auto& c : ref["cases"]) {
    auto text = render_chat(*fmt, {{"user", "reverse: " + c["text"].get<std::string>()}},
                            (*tok)->bos_text(), (*tok)->eos_text());
    ASSERT_TRUE(text.is_ok());
    EXPECT_EQ((*tok)->encode(*text), c["prompt_ids"].get<std::vector<int32_t>>()) << *text;
  }
  EXPECT_EQ((*tok)->eos_ids(), std::vector<int32_t>{257});
  auto first = ref["cases"][0];
  std::string answer = (*tok)->decode(first["output_ids"].get<std::vector<int32_t>>());
  std::string expected = first["text"].get<std::string>();
  std::reverse(expected.begin(), expected.end());
  EXPECT_EQ(answer, expected);
}

}  // namespace
}  // namespace hr::engine
