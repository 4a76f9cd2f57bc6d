// Tokenizers from a Hugging Face tokenizer.json: byte-level BPE (GPT-2 / Llama 3 / Qwen2 style,
// with their pre-tokenizer split rules) including vocabularies without merges (the bundled
// byte-level model), plus added and special tokens matched as literal text. Streaming
// detokenization (StreamDecoder) never splits a UTF-8 character. Immutable after load;
// encode/decode are thread-safe.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"

namespace hr::engine {

class Tokenizer {
 public:
  // Loads dir/tokenizer.json (and bos/eos names from dir/tokenizer_config.json when present).
  [[nodiscard]] static Result<std::unique_ptr<Tokenizer>> load(const std::string& dir);
  [[nodiscard]] static Result<std::unique_ptr<Tokenizer>> from_json(const std::string& tokenizer_json,
                                                                    const std::string& config_json);

  // Special/added tokens written literally in `text` become their ids.
  std::vector<int32_t> encode(std::string_view text) const;
  // The bytes a token stands for (special tokens: their text).
  std::string token_bytes(int32_t id) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = true) const;
  std::optional<int32_t> token_id(const std::string& text) const;
  bool is_special(int32_t id) const;
  int vocab_size() const { return static_cast<int>(id_to_bytes_.size()); }
  std::optional<int32_t> bos_id() const { return bos_; }
  const std::vector<int32_t>& eos_ids() const { return eos_; }
  const std::string& bos_text() const { return bos_text_; }
  const std::string& eos_text() const { return eos_text_; }

 private:
  Tokenizer() = default;
  void encode_plain(std::string_view text, std::vector<int32_t>* out) const;
  void bpe(const std::string& word, std::vector<int32_t>* out) const;

  enum class Split { kNone, kGpt2, kLlama3 };
  Split split_ = Split::kNone;
  std::unordered_map<std::string, int32_t> vocab_;       // byte-level unicode string → id
  std::unordered_map<std::string, int> merge_rank_;      // "a b" → rank
  std::vector<std::string> id_to_bytes_;                 // id → raw bytes
  std::vector<bool> special_;
  std::vector<std::pair<std::string, int32_t>> added_;   // longest first
  std::string byte_to_unicode_[256];
  std::optional<int32_t> bos_;
  std::vector<int32_t> eos_;
  std::string bos_text_, eos_text_;
};

// Turns generated token ids into text deltas, holding back bytes of an unfinished UTF-8 character.
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok) : tok_(tok) {}
  // Returns the text that became complete with this token (possibly empty).
  std::string push(int32_t id);
  // Whatever is left (an incomplete character becomes U+FFFD).
  std::string flush();

 private:
  const Tokenizer& tok_;
  std::string pending_;
};

// Splits text by the GPT-2 (kind 0) or Llama 3 (kind 1) pre-tokenizer rules; exposed for tests.
std::vector<std::string> pre_tokenize(std::string_view text, int kind);

}  // namespace hr::engine
