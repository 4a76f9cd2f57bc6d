// The pre-tokenizer split rules of byte-level BPE tokenizers: the GPT-2, Llama 3 and Qwen2
// regexes, matched by hand (no regex engine) with Unicode's letter and number classes. Stateless;
// thread-safe.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

namespace hr::engine {

// The regexes are spelled out in pre_tokenizer.cc.
enum class SplitRule {
  kGpt2,    // contractions, words, numbers, other symbols, each with one leading space
  kLlama3,  // case-insensitive contractions, numbers of up to 3 digits, newlines apart
  kQwen2,   // Llama 3's, with numbers one digit at a time
};

// The rule a tokenizer.json Split pattern spells out, if it is one of the three above.
std::optional<SplitRule> split_rule_from_regex(std::string_view regex);

// The pieces (views into `text`) that the rule's regex matches, in order; they cover `text`.
std::vector<std::string_view> pre_tokenize(std::string_view text, SplitRule rule);

}  // namespace hr::engine
