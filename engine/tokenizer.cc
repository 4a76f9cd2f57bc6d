// Encoding (added tokens, normalizers, pre-tokenizers, BPE) and decoding; loading is in
// tokenizer_load.cc.
#include "engine/tokenizer.h"

#include <algorithm>
#include <queue>

#include "engine/internal/unicode.h"

namespace hr::engine {

namespace {

size_t whitespace_prefix(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    int len;
    if (!internal::is_whitespace(internal::decode_utf8(s, i, &len))) break;
    i += static_cast<size_t>(len);
  }
  return i;
}

size_t whitespace_suffix(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t i = end - 1;
    while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
    int len;
    if (!internal::is_whitespace(internal::decode_utf8(s, i, &len))) break;
    end = i;
  }
  return s.size() - end;
}

// Whether s starts (ends) with a word character, as single_word added tokens see it.
bool starts_with_word(std::string_view s) {
  int len;
  return !s.empty() && internal::is_word_char(internal::decode_utf8(s, 0, &len));
}

bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  int len;
  return internal::is_word_char(internal::decode_utf8(s, i, &len));
}

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> out;
  if (add_special_tokens) out = template_prefix_;
  for (const Span& s : split_added(text, added_raw_)) {
    if (s.id >= 0) {
      out.push_back(s.id);
    } else {
      encode_section(text.substr(s.begin, s.end - s.begin), s.begin == 0, &out);
    }
  }
  if (add_special_tokens) out.insert(out.end(), template_suffix_.begin(), template_suffix_.end());
  return out;
}

std::vector<Tokenizer::Span> Tokenizer::split_added(std::string_view text,
                                                    const AddedTokens& set) const {
  std::vector<Span> out;
  size_t start = 0;  // of the text not yet in a span
  size_t i = 0;
  while (i < text.size()) {
    const AddedToken* hit = nullptr;
    if (set.first_byte[static_cast<unsigned char>(text[i])]) {
      for (const AddedToken& a : set.tokens) {  // longest first
        if (text.compare(i, a.text.size(), a.text) == 0) {
          hit = &a;
          break;
        }
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    size_t begin = i, end = i + hit->text.size();
    // A single_word token inside a word is no match, and the search goes on after it (not inside
    // it), as it does in Hugging Face tokenizers.
    i = end;
    if (hit->single_word &&
        (ends_with_word(text.substr(0, begin)) || starts_with_word(text.substr(end)))) {
      continue;
    }
    if (hit->lstrip) begin -= whitespace_suffix(text.substr(start, begin - start));
    if (hit->rstrip) end += whitespace_prefix(text.substr(end));
    if (start < begin) out.push_back({start, begin, -1});
    out.push_back({begin, end, hit->id});
    start = i = end;
  }
  if (start < text.size()) out.push_back({start, text.size(), -1});
  return out;
}

std::string Tokenizer::normalize(std::string_view text) const {
  std::string norm(text);
  for (const NormalizerStep& step : normalizers_) {
    switch (step.op) {
      case Normalizer::kNfc:
        norm = internal::nfc(norm);
        break;
      case Normalizer::kPrepend:
        norm.insert(0, step.to);
        break;
      case Normalizer::kReplace:
        internal::replace_all(norm, step.from, step.to);
        break;
    }
  }
  return norm;
}

void Tokenizer::encode_section(std::string_view text, bool first, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  const std::string norm = normalize(text);
  const std::string_view view = norm;
  for (const Span& s : split_added(view, added_normalized_)) {
    if (s.id >= 0) {
      out->push_back(s.id);
    } else {
      encode_normalized(view.substr(s.begin, s.end - s.begin), first && s.begin == 0, out);
    }
  }
}

void Tokenizer::encode_normalized(std::string_view piece, bool first,
                                  std::vector<int32_t>* out) const {
  if (kind_ == Kind::kByteLevel) {
    std::string spaced;
    if (byte_level_prefix_space_ && piece[0] != ' ') {
      spaced.assign(1, ' ').append(piece);
      piece = spaced;
    }
    if (!split_) {
      encode_word(piece, out);
      return;
    }
    for (std::string_view word : pre_tokenize(piece, *split_)) encode_word(word, out);
    return;
  }
  if (!metaspace_) {
    encode_word(piece, out);
    return;
  }
  // An older SentencePiece file's Metaspace pre-tokenizer: spaces become "▁", one may go in front,
  // and each "▁" may start a new word.
  std::string norm(piece);
  internal::replace_all(norm, " ", kSpaceMark);
  bool prepend =
      metaspace_prepend_ == Prepend::kAlways || (metaspace_prepend_ == Prepend::kFirst && first);
  if (prepend && norm.compare(0, kSpaceMark.size(), kSpaceMark) != 0) {
    norm.insert(0, std::string(kSpaceMark));
  }
  if (!metaspace_split_) {
    encode_word(norm, out);
    return;
  }
  std::string_view rest = norm;
  while (!rest.empty()) {
    size_t cut = rest.find(kSpaceMark, 1);
    if (cut == std::string_view::npos) cut = rest.size();
    encode_word(rest.substr(0, cut), out);
    rest.remove_prefix(cut);
  }
}

void Tokenizer::encode_word(std::string_view word, std::vector<int32_t>* out) const {
  std::vector<int32_t> symbols;
  if (kind_ == Kind::kByteLevel) {
    if (ignore_merges_) {
      std::string text;
      for (unsigned char c : word) text += byte_to_unicode_[c];
      if (auto it = vocab_.find(text); it != vocab_.end()) {
        out->push_back(it->second);
        return;
      }
    }
    for (unsigned char c : word) {
      if (byte_ids_[c] >= 0) symbols.push_back(byte_ids_[c]);
    }
  } else {
    if (ignore_merges_) {
      if (auto it = vocab_.find(std::string(word)); it != vocab_.end()) {
        out->push_back(it->second);
        return;
      }
    }
    bool after_unk = false;
    for (size_t i = 0; i < word.size();) {
      int len;
      internal::decode_utf8(word, i, &len);
      std::string_view ch = word.substr(i, static_cast<size_t>(len));
      i += static_cast<size_t>(len);
      if (auto it = vocab_.find(std::string(ch)); it != vocab_.end()) {
        symbols.push_back(it->second);
        after_unk = false;
        continue;
      }
      bool bytes_known = byte_fallback_;
      for (unsigned char c : ch) bytes_known = bytes_known && byte_ids_[c] >= 0;
      if (bytes_known) {  // byte fallback: the character's UTF-8 bytes as <0xNN> tokens
        for (unsigned char c : ch) symbols.push_back(byte_ids_[c]);
        after_unk = false;
      } else if (unk_ && !(fuse_unk_ && after_unk)) {
        symbols.push_back(*unk_);
        after_unk = true;
      }
    }
  }
  merge(&symbols);
  out->insert(out->end(), symbols.begin(), symbols.end());
}

void Tokenizer::merge(std::vector<int32_t>* symbols) const {
  std::vector<int32_t>& s = *symbols;  // merged-away symbols become -1
  const int n = static_cast<int>(s.size());
  if (n < 2 || merges_.empty()) return;
  std::vector<int> prev(static_cast<size_t>(n)), next(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    prev[i] = i - 1;
    next[i] = i + 1 < n ? i + 1 : -1;
  }
  struct Candidate {
    int rank;
    int pos;     // of the left symbol
    int32_t id;  // merged
  };
  auto later = [](const Candidate& a, const Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  std::priority_queue<Candidate, std::vector<Candidate>, decltype(later)> queue(later);
  auto find = [&](int left) -> const Merge* {
    int right = next[left];
    if (right < 0) return nullptr;
    uint64_t key = static_cast<uint64_t>(s[left]) << 32 | static_cast<uint32_t>(s[right]);
    auto it = merges_.find(key);
    return it == merges_.end() ? nullptr : &it->second;
  };
  auto offer = [&](int left) {
    if (const Merge* m = find(left)) queue.push({m->rank, left, m->id});
  };
  for (int i = 0; i + 1 < n; ++i) offer(i);
  while (!queue.empty()) {
    Candidate c = queue.top();
    queue.pop();
    if (s[c.pos] < 0) continue;
    const Merge* m = find(c.pos);
    if (!m || m->rank != c.rank) continue;  // the pair changed since it was offered
    int right = next[c.pos];
    s[c.pos] = c.id;
    s[right] = -1;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    if (prev[c.pos] >= 0) offer(prev[c.pos]);
    offer(c.pos);
  }
  s.erase(std::remove(s.begin(), s.end(), -1), s.end());
}

std::optional<int32_t> Tokenizer::token_id(const std::string& text) const {
  if (text.empty()) return std::nullopt;
  if (auto it = added_ids_.find(text); it != added_ids_.end()) return it->second;
  std::string key;
  if (kind_ == Kind::kByteLevel) {
    for (unsigned char c : text) key += byte_to_unicode_[c];
  } else {
    key = text;
    internal::replace_all(key, " ", kSpaceMark);
  }
  auto it = vocab_.find(key);
  if (it != vocab_.end()) return it->second;
  return std::nullopt;
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && static_cast<size_t>(id) < special_.size() && special_[static_cast<size_t>(id)];
}

std::string Tokenizer::token_bytes(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= id_to_bytes_.size()) return "";
  return id_to_bytes_[static_cast<size_t>(id)];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    bytes += token_bytes(id);
  }
  std::string_view v = bytes;
  if (strip_leading_space_ && !v.empty() && v[0] == ' ') v.remove_prefix(1);
  std::string out;
  internal::append_valid_utf8(v, /*final=*/true, &out);
  return out;
}

std::string StreamDecoder::push(int32_t id) {
  if (tok_.is_special(id)) return "";
  pending_ += tok_.token_bytes(id);
  if (!started_ && !pending_.empty()) {
    started_ = true;
    if (tok_.strips_leading_space() && pending_[0] == ' ') pending_.erase(0, 1);
  }
  std::string ready;
  pending_.erase(0, internal::append_valid_utf8(pending_, /*final=*/false, &ready));
  return ready;
}

std::string StreamDecoder::flush() {
  std::string rest;
  internal::append_valid_utf8(pending_, /*final=*/true, &rest);
  pending_.clear();
  return rest;
}

}  // namespace hr::engine
