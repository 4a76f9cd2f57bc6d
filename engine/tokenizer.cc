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

}  // namespace

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  size_t start = 0;  // of the text not yet encoded
  size_t i = 0;
  while (i < text.size()) {
    const AddedToken* hit = nullptr;
    if (added_first_byte_[static_cast<unsigned char>(text[i])]) {
      for (const AddedToken& a : added_) {  // longest first
        if (text.compare(i, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    std::string_view before = text.substr(start, i - start);
    if (hit->lstrip) before.remove_suffix(whitespace_suffix(before));
    encode_section(before, start == 0, &out);
    out.push_back(hit->id);
    i += hit->content.size();
    if (hit->rstrip) i += whitespace_prefix(text.substr(i));
    start = i;
  }
  encode_section(text.substr(start), start == 0, &out);
  return out;
}

void Tokenizer::encode_section(std::string_view text, bool first, std::vector<int32_t>* out) const {
  if (text.empty()) return;
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
  if (kind_ == Kind::kByteLevel) {
    if (byte_level_prefix_space_ && norm[0] != ' ') norm.insert(0, " ");
    if (!split_) {
      encode_word(norm, out);
      return;
    }
    for (std::string_view piece : pre_tokenize(norm, *split_)) encode_word(piece, out);
    return;
  }
  if (!metaspace_) {
    encode_word(norm, out);
    return;
  }
  // An older SentencePiece file's Metaspace pre-tokenizer: spaces become "▁", one may go in front,
  // and each "▁" may start a new word.
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
  for (const AddedToken& a : added_) {
    if (a.content == text) return a.id;
  }
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
