// Tokenizers from a Hugging Face tokenizer.json, of two BPE kinds:
//  - byte-level BPE (GPT-2 / Llama 3 / Qwen2): the ByteLevel pre-tokenizer or a Split with the
//    GPT-2, Llama 3 or Qwen2 regex (pre_tokenizer.h), an optional NFC normalizer, ignore_merges,
//    and vocabularies without merges (the bundled byte-level model);
//  - SentencePiece-style BPE (Llama 2 / Mistral): "▁" for spaces, put in by the normalizer
//    (Prepend "▁", Replace " " → "▁") or by an older file's Metaspace pre-tokenizer, characters
//    outside the vocabulary as <0xNN> byte tokens (byte_fallback) or unk (fuse_unk), and decoding
//    that drops the one leading space the normalizer added.
// Merges in either format ("a b" or ["a", "b"]). Added and special tokens are found as Hugging Face
// tokenizers finds them: leftmost-longest, those with `normalized: false` in the raw text and the
// others (in their normalized form) in the normalized text between those, honouring lstrip, rstrip
// and single_word. The post-processor's single-sequence template (TemplateProcessing, Bert- or
// RobertaProcessing) is applied on request. Other models (Unigram, WordPiece), normalizers,
// pre-tokenizers and post-processors are refused with an error naming them. Decoding gives valid
// UTF-8; StreamDecoder never splits a character. Immutable after load; encode/decode are
// thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "engine/pre_tokenizer.h"

namespace hr::engine {

class Tokenizer {
 public:
  static constexpr std::string_view kSpaceMark = "\xE2\x96\x81";  // "▁", SentencePiece's space

  // Loads dir/tokenizer.json (and bos/eos names from dir/tokenizer_config.json when present).
  [[nodiscard]] static Result<std::unique_ptr<Tokenizer>> load(const std::string& dir);
  [[nodiscard]] static Result<std::unique_ptr<Tokenizer>> from_json(
      const std::string& tokenizer_json, const std::string& config_json);

  // Special/added tokens written literally in `text` become their ids. With add_special_tokens the
  // post-processor's template goes around them (Llama 2: "<s> $A"), as in Hugging Face's
  // encode(text, add_special_tokens=True); without it (the default, for text that already spells
  // out its BOS, as chat templates do) nothing is added.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // The bytes a token stands for (special tokens: their text; "▁" as a space, <0xNN> as the byte).
  std::string token_bytes(int32_t id) const;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = true) const;
  std::optional<int32_t> token_id(const std::string& text) const;
  bool is_special(int32_t id) const;
  // Whether decoding drops one leading space (SentencePiece: the "▁" the normalizer prepended).
  bool strips_leading_space() const { return strip_leading_space_; }
  int vocab_size() const { return static_cast<int>(id_to_bytes_.size()); }
  std::optional<int32_t> bos_id() const { return bos_; }
  const std::vector<int32_t>& eos_ids() const { return eos_; }
  const std::string& bos_text() const { return bos_text_; }
  const std::string& eos_text() const { return eos_text_; }

 private:
  friend class TokenizerLoader;
  Tokenizer() = default;
  struct AddedToken {
    std::string text;  // what is matched: the content, normalized if the token is `normalized`
    int32_t id;
    bool lstrip, rstrip;  // swallow the whitespace on that side
    bool single_word;     // only where no word character touches it on either side
  };
  struct AddedTokens {
    std::vector<AddedToken> tokens;  // longest first
    bool first_byte[256] = {};
  };
  struct Span {
    size_t begin, end;
    int32_t id;  // of the added token, or -1 for text between added tokens
  };
  // `text` cut into added tokens and the text between them (non-empty spans, in order).
  std::vector<Span> split_added(std::string_view text, const AddedTokens& set) const;
  std::string normalize(std::string_view text) const;
  // One piece of raw text between added tokens; `first` when it starts the text.
  void encode_section(std::string_view text, bool first, std::vector<int32_t>* out) const;
  // One piece of normalized text between added tokens: pre-tokenized, then BPE.
  void encode_normalized(std::string_view norm, bool first, std::vector<int32_t>* out) const;
  void encode_word(std::string_view word, std::vector<int32_t>* out) const;
  // BPE: merges adjacent symbols by rank (lowest first, leftmost on ties) until none applies.
  void merge(std::vector<int32_t>* symbols) const;

  enum class Kind { kByteLevel, kSentencePiece };
  enum class Normalizer { kNfc, kPrepend, kReplace };
  struct NormalizerStep {
    Normalizer op;
    std::string from, to;  // kPrepend: `to` goes in front; kReplace: each `from` becomes `to`
  };
  enum class Prepend { kNever, kFirst, kAlways };  // Metaspace's prepend_scheme
  struct Merge {
    int rank;
    int32_t id;  // of the merged token
  };

  Kind kind_ = Kind::kByteLevel;
  std::vector<NormalizerStep> normalizers_;
  std::optional<SplitRule> split_;        // byte-level: the pre-tokenizer's regex
  bool byte_level_prefix_space_ = false;  // ByteLevel add_prefix_space
  bool metaspace_ = false;                // SentencePiece: an older file's Metaspace pre-tokenizer
  Prepend metaspace_prepend_ = Prepend::kAlways;
  bool metaspace_split_ = false;
  bool ignore_merges_ = false;  // a word that is in the vocabulary is one token
  bool byte_fallback_ = false;
  bool fuse_unk_ = false;
  bool strip_leading_space_ = false;
  std::optional<int32_t> unk_;
  std::string byte_to_unicode_[256];  // byte-level: GPT-2's printable stand-in for each byte
  int32_t byte_ids_[256];  // byte-level: each byte's token; SentencePiece: <0xNN>; -1 if none
  std::unordered_map<std::string, int32_t> vocab_;  // token text as in tokenizer.json → id
  std::unordered_map<uint64_t, Merge> merges_;      // (left id << 32 | right id) → merge
  std::vector<std::string> id_to_bytes_;            // id → raw bytes
  std::vector<bool> special_;
  AddedTokens added_raw_;         // normalized: false, matched in the raw text
  AddedTokens added_normalized_;  // normalized: true, matched in each normalized piece
  std::unordered_map<std::string, int32_t> added_ids_;      // content → id
  std::vector<int32_t> template_prefix_, template_suffix_;  // post-processor: ids around the text
  std::optional<int32_t> bos_;
  std::vector<int32_t> eos_;
  std::string bos_text_, eos_text_;
};

// Turns generated token ids into text deltas of whole UTF-8 characters, holding back the bytes of
// an unfinished one; drops the leading space at the start of the stream where decode() does.
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
  bool started_ = false;
};

}  // namespace hr::engine
