// Each regex is tried as the regex engine would: its alternatives in order at each position, the
// first that matches wins, quantifiers greedy with the backtracking the patterns need.
#include "engine/pre_tokenizer.h"

#include "engine/internal/unicode.h"

namespace hr::engine {

namespace {

constexpr std::string_view kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// kSpace is \s without \r and \n; kOther is [^\s\p{L}\p{N}].
enum class Cls { kLetter, kNumber, kSpace, kNewline, kOther };

struct Char {
  uint32_t cp;
  size_t pos;  // byte offset in the text
  Cls cls;
};

Cls classify(uint32_t cp) {
  if (cp == '\n' || cp == '\r') return Cls::kNewline;
  if (internal::is_whitespace(cp)) return Cls::kSpace;
  if (internal::is_letter(cp)) return Cls::kLetter;
  if (internal::is_number(cp)) return Cls::kNumber;
  return Cls::kOther;
}

// Length of the contraction ('s 't 're 've 'm 'll 'd) at i, or 0.
size_t contraction(const std::vector<Char>& c, size_t i, bool ignore_case) {
  size_t n = c.size();
  if (c[i].cp != '\'' || i + 1 >= n) return 0;
  auto at = [&](size_t k) -> uint32_t {
    if (k >= n) return 0;
    uint32_t cp = c[k].cp;
    return ignore_case && cp >= 'A' && cp <= 'Z' ? cp + 32 : cp;
  };
  uint32_t a = at(i + 1), b = at(i + 2);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// End of the run of characters of class `cls` (or, with `also`, of that class too) from i.
size_t run(const std::vector<Char>& c, size_t i, Cls cls, Cls also) {
  while (i < c.size() && (c[i].cls == cls || c[i].cls == also)) ++i;
  return i;
}

// The end of the match at i (always > i).
size_t match(const std::vector<Char>& c, size_t i, SplitRule rule) {
  size_t n = c.size();
  bool gpt2 = rule == SplitRule::kGpt2;
  if (size_t len = contraction(c, i, !gpt2)) return i + len;
  // A space (or, for Llama 3 and Qwen2, any one character but \r, \n, letters and numbers) may
  // lead a run of letters.
  bool lead = gpt2 ? c[i].cp == ' ' : c[i].cls == Cls::kSpace || c[i].cls == Cls::kOther;
  if (c[i].cls == Cls::kLetter) return run(c, i, Cls::kLetter, Cls::kLetter);
  if (lead && i + 1 < n && c[i + 1].cls == Cls::kLetter) {
    return run(c, i + 1, Cls::kLetter, Cls::kLetter);
  }
  if (gpt2) {  // ' ?\p{N}+'
    if (c[i].cls == Cls::kNumber) return run(c, i, Cls::kNumber, Cls::kNumber);
    if (c[i].cp == ' ' && i + 1 < n && c[i + 1].cls == Cls::kNumber) {
      return run(c, i + 1, Cls::kNumber, Cls::kNumber);
    }
  } else if (c[i].cls == Cls::kNumber) {  // \p{N}{1,3} or \p{N}
    size_t limit = rule == SplitRule::kLlama3 ? 3 : 1;
    size_t j = i;
    while (j < n && j < i + limit && c[j].cls == Cls::kNumber) ++j;
    return j;
  }
  // ' ?[^\s\p{L}\p{N}]+', followed by [\r\n]* for Llama 3 and Qwen2.
  size_t k = c[i].cp == ' ' && i + 1 < n ? i + 1 : i;
  if (c[k].cls == Cls::kOther) {
    size_t j = run(c, k, Cls::kOther, Cls::kOther);
    return gpt2 ? j : run(c, j, Cls::kNewline, Cls::kNewline);
  }
  // Whitespace: '\s*[\r\n]+' (not GPT-2) up to the run's last newline, then '\s+(?!\S)', which
  // leaves the run's last character to lead what follows, then '\s+'.
  size_t j = run(c, i, Cls::kSpace, Cls::kNewline);
  if (!gpt2) {
    for (size_t m = j; m > i; --m) {
      if (c[m - 1].cls == Cls::kNewline) return m;
    }
  }
  if (j < n && j - i > 1) return j - 1;
  return j;
}

}  // namespace

std::optional<SplitRule> split_rule_from_regex(std::string_view regex) {
  if (regex == kGpt2Regex) return SplitRule::kGpt2;
  if (regex == kLlama3Regex) return SplitRule::kLlama3;
  if (regex == kQwen2Regex) return SplitRule::kQwen2;
  return std::nullopt;
}

std::vector<std::string_view> pre_tokenize(std::string_view text, SplitRule rule) {
  std::vector<Char> c;
  for (size_t i = 0; i < text.size();) {
    int len;
    uint32_t cp = internal::decode_utf8(text, i, &len);
    c.push_back({cp, i, classify(cp)});
    i += static_cast<size_t>(len);
  }
  std::vector<std::string_view> out;
  for (size_t i = 0; i < c.size();) {
    size_t j = match(c, i, rule);
    size_t end = j < c.size() ? c[j].pos : text.size();
    out.push_back(text.substr(c[i].pos, end - c[i].pos));
    i = j;
  }
  return out;
}

}  // namespace hr::engine
