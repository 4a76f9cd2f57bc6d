// UTF-8, character classes and NFC over the generated tables in unicode_tables.cc.
#include "engine/internal/unicode.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "engine/internal/unicode_tables.h"

namespace hr::engine::internal {

namespace {

// Hangul syllables compose and decompose by arithmetic.
constexpr uint32_t kSBase = 0xAC00, kLBase = 0x1100, kVBase = 0x1161, kTBase = 0x11A7;
constexpr uint32_t kLCount = 19, kVCount = 21, kTCount = 28, kSCount = kLCount * kVCount * kTCount;

bool in_ranges(uint32_t cp, const CodePointRange* ranges, size_t n) {
  const CodePointRange* end = ranges + n;
  auto it = std::upper_bound(ranges, end, cp,
                             [](uint32_t c, const CodePointRange& r) { return c < r.first; });
  return it != ranges && cp <= (it - 1)->last;
}

uint8_t combining_order(uint32_t cp) {
  if (cp < 0x300) return 0;
  const CombiningRange* end = kCombiningRanges + kNumCombiningRanges;
  auto it = std::upper_bound(kCombiningRanges, end, cp,
                             [](uint32_t c, const CombiningRange& r) { return c < r.first; });
  return it != kCombiningRanges && cp <= (it - 1)->last ? (it - 1)->order : 0;
}

void decompose(uint32_t cp, std::vector<uint32_t>* out) {
  if (cp >= kSBase && cp < kSBase + kSCount) {
    uint32_t s = cp - kSBase;
    out->push_back(kLBase + s / (kVCount * kTCount));
    out->push_back(kVBase + (s % (kVCount * kTCount)) / kTCount);
    if (s % kTCount) out->push_back(kTBase + s % kTCount);
    return;
  }
  const Decomposition* end = kDecompositions + kNumDecompositions;
  auto it = std::lower_bound(kDecompositions, end, cp,
                             [](const Decomposition& d, uint32_t c) { return d.code_point < c; });
  if (it == end || it->code_point != cp) {
    out->push_back(cp);
    return;
  }
  out->insert(out->end(), kDecompositionParts + it->offset,
              kDecompositionParts + it->offset + it->length);
}

// The primary composite of `first` and `second`, or 0.
uint32_t compose(uint32_t first, uint32_t second) {
  if (first >= kLBase && first < kLBase + kLCount && second >= kVBase &&
      second < kVBase + kVCount) {
    return kSBase + ((first - kLBase) * kVCount + (second - kVBase)) * kTCount;
  }
  if (first >= kSBase && first < kSBase + kSCount && (first - kSBase) % kTCount == 0 &&
      second > kTBase && second < kTBase + kTCount) {
    return first + (second - kTBase);
  }
  const Composition* end = kCompositions + kNumCompositions;
  auto it = std::lower_bound(kCompositions, end, std::make_pair(first, second),
                             [](const Composition& c, const std::pair<uint32_t, uint32_t>& key) {
                               return std::make_pair(c.first, c.second) < key;
                             });
  return it != end && it->first == first && it->second == second ? it->composite : 0;
}

}  // namespace

void append_utf8(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

namespace {

// Reads the UTF-8 sequence at s[i] with the bounds of the Unicode standard's table 3-7 (no
// overlongs, surrogates or code points past U+10FFFF). Returns its length when it is well-formed;
// otherwise -k, k >= 1 being the length of its maximal ill-formed subpart, with *cut set when it is
// ill-formed only because s ends.
int read_sequence(std::string_view s, size_t i, bool* cut) {
  *cut = false;
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) return 1;
  int n;
  unsigned char lo = 0x80, hi = 0xBF;  // bounds of the second byte
  if (c >= 0xC2 && c <= 0xDF) {
    n = 2;
  } else if (c >= 0xE0 && c <= 0xEF) {
    n = 3;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    n = 4;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return -1;
  }
  for (int k = 1; k < n; ++k) {
    if (i + k >= s.size()) {
      *cut = true;
      return -k;
    }
    unsigned char b = static_cast<unsigned char>(s[i + k]);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return -k;
  }
  return n;
}

}  // namespace

uint32_t decode_utf8(std::string_view s, size_t i, int* len) {
  bool cut;
  int n = read_sequence(s, i, &cut);
  if (n < 0) {
    *len = -n;
    return kReplacementChar;
  }
  *len = n;
  unsigned char c = static_cast<unsigned char>(s[i]);
  if (n == 1) return c;
  uint32_t cp = c & (0xFF >> (n + 1));
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

size_t append_valid_utf8(std::string_view bytes, bool final, std::string* out) {
  size_t i = 0;
  while (i < bytes.size()) {
    bool cut;
    int n = read_sequence(bytes, i, &cut);
    if (n > 0) {
      out->append(bytes.substr(i, static_cast<size_t>(n)));
      i += static_cast<size_t>(n);
    } else if (cut && !final) {
      break;  // wait for the rest of the character
    } else {
      append_utf8(*out, kReplacementChar);
      i += static_cast<size_t>(-n);
    }
  }
  return i;
}

bool is_letter(uint32_t cp) {
  if (cp < 0x80) return (cp | 0x20) >= 'a' && (cp | 0x20) <= 'z';
  return in_ranges(cp, kLetterRanges, kNumLetterRanges);
}

bool is_number(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return in_ranges(cp, kNumberRanges, kNumNumberRanges);
}

bool is_word_char(uint32_t cp) {
  if (cp < 0x80) return is_letter(cp) || is_number(cp) || cp == '_';
  return in_ranges(cp, kWordRanges, kNumWordRanges);
}

bool is_whitespace(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= '\t' && cp <= '\r');
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) ||
         cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

void replace_all(std::string& s, std::string_view from, std::string_view to) {
  size_t hit = s.find(from);
  if (from.empty() || hit == std::string::npos) return;
  std::string out;
  out.reserve(s.size());
  size_t at = 0;
  for (; hit != std::string::npos; hit = s.find(from, at)) {
    out.append(s, at, hit - at);
    out.append(to);
    at = hit + from.size();
  }
  out.append(s, at);
  s = std::move(out);
}

std::string nfc(std::string_view text) {
  // Below U+0300 (lead bytes below 0xCC) nothing decomposes or combines.
  if (std::none_of(text.begin(), text.end(),
                   [](char c) { return static_cast<unsigned char>(c) >= 0xCC; })) {
    return std::string(text);
  }
  std::vector<uint32_t> cps;
  for (size_t i = 0; i < text.size();) {
    bool cut;
    if (read_sequence(text, i, &cut) < 0) return std::string(text);
    int len;
    decompose(decode_utf8(text, i, &len), &cps);
    i += static_cast<size_t>(len);
  }
  // Canonical order: a stable sort of each run of marks by combining class.
  for (size_t i = 1; i < cps.size(); ++i) {
    uint32_t c = cps[i];
    uint8_t order = combining_order(c);
    if (order == 0) continue;
    size_t j = i;
    while (j > 0 && combining_order(cps[j - 1]) > order) {
      cps[j] = cps[j - 1];
      --j;
    }
    cps[j] = c;
  }
  // Canonical composition: a mark (or starter) joins the last starter unless a code point between
  // them blocks it (one of class 0, or of a class at least its own).
  std::string out;
  std::vector<uint32_t> composed;
  composed.reserve(cps.size());
  size_t starter = SIZE_MAX;
  uint8_t last = 0;
  for (uint32_t c : cps) {
    uint8_t order = combining_order(c);
    if (starter != SIZE_MAX && (composed.size() - 1 == starter || (last != 0 && last < order))) {
      if (uint32_t joined = compose(composed[starter], c)) {
        composed[starter] = joined;
        continue;
      }
    }
    if (order == 0) {
      starter = composed.size();
      last = 0;
    } else {
      last = order;
    }
    composed.push_back(c);
  }
  out.reserve(text.size());
  for (uint32_t c : composed) append_utf8(out, c);
  return out;
}

}  // namespace hr::engine::internal
