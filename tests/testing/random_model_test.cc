// The random-weight models that benchmarks and tests write (tests/testing/random_model.h), read
// back by the real loader: the hashed fill (a model of billions of parameters in seconds) with an
// LM head of its own, as the GPU flex benchmark's Llama 3 8B shape writes it.
#include "tests/testing/random_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>

#include <unistd.h>

#include "engine/cpu_backend.h"
#include "engine/weights.h"
#include "tests/engine/step_util.h"

namespace hr::engine {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Written twice (on every core) the same; loaded, its head apart from the embedding, the rows of
// every token but the printable bytes zero in both, the other values of about N(0, 0.02); and
// greedy answers through the engine to prompts of printable bytes are printable bytes only.
TEST(RandomModelTest, TheFillWithAHeadOfItsOwnLoadsAndWritesText) {
  const auto tmp = std::filesystem::temp_directory_path() /
                   ("headroom-random-model-" + std::to_string(::getpid()));
  hr::testing::RandomLlama spec;
  spec.vocab = 4096;
  spec.hidden = 128;
  spec.intermediate = 256;
  spec.layers = 2;
  spec.heads = 4;
  spec.kv_heads = 2;
  spec.head_dim = 32;
  spec.tie = false;
  spec.printable_output = true;
  const std::string a = (tmp / "a").string(), b = (tmp / "b").string();
  const size_t bytes = hr::testing::write_random_llama(
      a, std::string(HEADROOM_SOURCE_DIR) + "/models/tiny-reverse", spec);
  hr::testing::write_random_llama(b, std::string(HEADROOM_SOURCE_DIR) + "/models/tiny-reverse",
                                  spec);
  EXPECT_EQ(read_all(a + "/model.safetensors"), read_all(b + "/model.safetensors"));

  auto w = load_weights(a);
  ASSERT_TRUE(w.is_ok()) << w.status().to_string();
  EXPECT_FALSE(w->config.tie_word_embeddings);
  ASSERT_EQ(w->lm_head.size(), w->embed.size());
  EXPECT_GT(bytes, w->lm_head.size() * 2 * 2);  // both tables, in bf16
  const size_t D = 128;
  auto row_zero = [&](const std::vector<float>& m, size_t row) {
    for (size_t i = 0; i < D; ++i) {
      if (m[row * D + i] != 0.0f) return false;
    }
    return true;
  };
  for (size_t row : {0, 31, 127, 300, 4095}) {
    EXPECT_TRUE(row_zero(w->lm_head, row)) << row;
    EXPECT_TRUE(row_zero(w->embed, row)) << row;
  }
  EXPECT_FALSE(row_zero(w->lm_head, 65));
  EXPECT_NE(w->lm_head[65 * D], w->embed[65 * D]);  // (a head of its own, not the embedding)
  double sum = 0, sq = 0;
  const std::vector<float>& m = w->layers[1].w_down;
  for (float v : m) {
    sum += v;
    sq += static_cast<double>(v) * v;
  }
  const double mean = sum / static_cast<double>(m.size());
  EXPECT_NEAR(mean, 0.0, 0.002);
  EXPECT_NEAR(std::sqrt(sq / static_cast<double>(m.size()) - mean * mean), 0.02, 0.002);

  auto cpu = CpuBackend::create(std::make_shared<const ModelWeights>(std::move(w).value()),
                                {16, 8 << 20, 0});
  ASSERT_TRUE(cpu.is_ok()) << cpu.status().to_string();
  EngineOptions eo;
  const auto answers = greedy_answers(std::shared_ptr<Backend>(std::move(cpu).value()),
                                      {{72, 105}, {40, 50, 60}}, 12, eo);
  ASSERT_EQ(answers.size(), 2u);
  for (const auto& answer : answers) {
    ASSERT_EQ(answer.size(), 12u);
    for (int32_t t : answer) {
      EXPECT_GE(t, 32);
      EXPECT_LE(t, 126);
    }
  }
  std::filesystem::remove_all(tmp);
}

}  // namespace
}  // namespace hr::engine
