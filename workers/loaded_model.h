// What a worker loads once at start: the model's config, tokenizer and chat template, the engine
// built on them, and the bytes of each token as log probabilities show them. Owned by the Worker;
// the step loop alone uses the engine.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/chat_template.h"
#include "engine/engine.h"
#include "engine/model_config.h"
#include "engine/tokenizer.h"
#include "grammar/grammar_cache.h"

namespace hr::workers {

// Each token's raw bytes, looked up once per id. Step loop only.
class TokenBytes {
 public:
  explicit TokenBytes(std::shared_ptr<const engine::Tokenizer> tok) : tok_(std::move(tok)) {}
  const std::string& of(int32_t id);

 private:
  std::shared_ptr<const engine::Tokenizer> tok_;
  std::vector<std::string> bytes_;
  std::vector<bool> known_;
};

struct LoadedModel {
  engine::ModelConfig config;
  std::shared_ptr<const engine::Tokenizer> tokenizer;
  engine::ChatTemplate chat_template;  // the model's own, or a built-in format
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<TokenBytes> token_bytes;  // created with the tokenizer
  // Compiled structured-output constraints over this model's vocabulary (thread-safe).
  std::unique_ptr<grammar::GrammarCache> grammars;
};

// The constraints' view of the model's vocabulary: special tokens unusable, EOS ends an answer.
std::shared_ptr<const grammar::Vocabulary> constraint_vocabulary(const engine::Tokenizer& tok,
                                                                 int logits_width);

}  // namespace hr::workers
