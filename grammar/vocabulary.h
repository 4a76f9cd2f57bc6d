// A tokenizer's vocabulary as constraints see it: each token's bytes, sorted so that tokens with a
// common prefix are walked once (token_mask.h), which tokens a constraint may choose (not the
// special ones: their text is not written into the answer), and the tokens that end an answer.
// Immutable once built; shared by every constraint of one model.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hr::grammar {

class Vocabulary {
 public:
  // bytes[id]: what token id writes; usable[id]: whether a constraint may choose it; stop_ids:
  // the tokens that end the answer (allowed where the constraint is complete); mask_size: the width
  // of a logits row (at least bytes.size()); ids past the tokenizer's are never allowed.
  Vocabulary(std::vector<std::string> bytes, const std::vector<bool>& usable,
             std::vector<int32_t> stop_ids, int mask_size);

  int mask_size() const { return mask_size_; }
  int mask_words() const { return (mask_size_ + 31) / 32; }
  const std::string& bytes(int32_t id) const { return bytes_[static_cast<size_t>(id)]; }
  int num_tokens() const { return static_cast<int>(bytes_.size()); }
  const std::vector<int32_t>& stop_ids() const { return stop_ids_; }
  bool is_stop(int32_t id) const;
  // The usable tokens in byte order, and each one's common prefix length with the one before.
  const std::vector<int32_t>& sorted() const { return sorted_; }
  const std::vector<uint16_t>& common_prefix() const { return lcp_; }

  // Plain text: a usable token that is whole UTF-8 characters, none of them a quote, a backslash
  // or a control character (what JSON writes raw inside a string). Its character count, or -1.
  int plain_chars(int32_t id) const { return plain_chars_[static_cast<size_t>(id)]; }
  int max_plain_chars() const { return static_cast<int>(plain_masks_.size()) - 1; }
  // The plain tokens of exactly n characters, as a mask (empty when there are none).
  const std::vector<uint32_t>& plain_mask(int n) const {
    return plain_masks_[static_cast<size_t>(n)];
  }

 private:
  std::vector<std::string> bytes_;
  std::vector<int32_t> stop_ids_;
  int mask_size_;
  std::vector<int32_t> sorted_;
  std::vector<uint16_t> lcp_;
  std::vector<int16_t> plain_chars_;
  std::vector<std::vector<uint32_t>> plain_masks_;  // by character count
};

}  // namespace hr::grammar
