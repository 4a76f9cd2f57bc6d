// Byte-level BPE.
#include "engine/tokenizer.h"

#include <algorithm>
#include <climits>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>

namespace hr::engine {

using nlohmann::json;

namespace {

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

// Length of the UTF-8 sequence starting with byte c (1 for invalid lead bytes).
int utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c >> 5) == 0x6) return 2;
  if ((c >> 4) == 0xE) return 3;
  if ((c >> 3) == 0x1E) return 4;
  return 1;
}

uint32_t decode_cp(std::string_view s, size_t i, int* len) {
  unsigned char c = static_cast<unsigned char>(s[i]);
  int n = utf8_len(c);
  if (i + n > s.size()) n = 1;
  *len = n;
  if (n == 1) return c;
  uint32_t cp = c & (0xFF >> (n + 1));
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

// Coarse Unicode classes for the pre-tokenizer: ASCII exactly; other code points are letters
// except common space and punctuation blocks.
enum class Cls { kLetter, kNumber, kSpace, kNewline, kOther };
Cls classify(uint32_t cp) {
  if (cp == '\n' || cp == '\r') return Cls::kNewline;
  if (cp == ' ' || cp == '\t' || cp == '\f' || cp == '\v' || cp == 0xA0 || cp == 0x3000 ||
      (cp >= 0x2000 && cp <= 0x200A)) {
    return Cls::kSpace;
  }
  if (cp < 0x80) {
    if ((cp >= 'a' && cp <= 'z') || (cp >= 'A' && cp <= 'Z')) return Cls::kLetter;
    if (cp >= '0' && cp <= '9') return Cls::kNumber;
    return Cls::kOther;
  }
  if ((cp >= 0x2010 && cp <= 0x2BFF) || (cp >= 0x3001 && cp <= 0x303F) || (cp >= 0xFF01 && cp <= 0xFF0F) ||
      (cp >= 0x1F000 && cp <= 0x1FAFF) || (cp >= 0x80 && cp <= 0xBF)) {
    return Cls::kOther;
  }
  if (cp >= 0xFF10 && cp <= 0xFF19) return Cls::kNumber;
  return Cls::kLetter;
}

}  // namespace

std::vector<std::string> pre_tokenize(std::string_view text, int kind) {
  struct Cp {
    uint32_t cp;
    size_t pos;
    int len;
    Cls cls;
  };
  std::vector<Cp> cps;
  for (size_t i = 0; i < text.size();) {
    int len;
    uint32_t cp = decode_cp(text, i, &len);
    cps.push_back({cp, i, len, classify(cp)});
    i += static_cast<size_t>(len);
  }
  std::vector<std::string> out;
  size_t n = cps.size();
  auto piece = [&](size_t a, size_t b) {
    size_t begin = cps[a].pos;
    size_t end = b < n ? cps[b].pos : text.size();
    out.emplace_back(text.substr(begin, end - begin));
  };
  auto is_space = [&](size_t k) { return cps[k].cls == Cls::kSpace || cps[k].cls == Cls::kNewline; };
  size_t i = 0;
  while (i < n) {
    // Contractions: 's 't 're 've 'm 'll 'd (case-insensitive for Llama 3).
    if (cps[i].cp == '\'' && i + 1 < n) {
      auto lower = [&](size_t k) {
        uint32_t c = cps[k].cp;
        return kind == 1 && c >= 'A' && c <= 'Z' ? c + 32 : c;
      };
      uint32_t a = lower(i + 1);
      uint32_t b = i + 2 < n ? lower(i + 2) : 0;
      size_t len = 0;
      if (a == 's' || a == 't' || a == 'm' || a == 'd') len = 2;
      if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) len = 3;
      if (len) {
        piece(i, i + len);
        i += len;
        continue;
      }
    }
    size_t j = i;
    if (kind == 1) {
      // [^\r\n\p{L}\p{N}]?\p{L}+
      size_t k = i;
      if (cps[k].cls != Cls::kLetter && cps[k].cls != Cls::kNumber && cps[k].cls != Cls::kNewline &&
          k + 1 < n && cps[k + 1].cls == Cls::kLetter) {
        ++k;
      }
      if (cps[k].cls == Cls::kLetter) {
        j = k;
        while (j < n && cps[j].cls == Cls::kLetter) ++j;
        piece(i, j);
        i = j;
        continue;
      }
      if (cps[i].cls == Cls::kNumber) {  // \p{N}{1,3}
        while (j < n && j < i + 3 && cps[j].cls == Cls::kNumber) ++j;
        piece(i, j);
        i = j;
        continue;
      }
    } else {
      // ' ?\p{L}+' and ' ?\p{N}+'
      size_t k = cps[i].cp == ' ' && i + 1 < n ? i + 1 : i;
      if (cps[k].cls == Cls::kLetter || cps[k].cls == Cls::kNumber) {
        Cls c = cps[k].cls;
        j = k;
        while (j < n && cps[j].cls == c) ++j;
        piece(i, j);
        i = j;
        continue;
      }
    }
    // ' ?[^\s\p{L}\p{N}]+' (Llama 3 adds trailing [\r\n]*)
    {
      size_t k = cps[i].cp == ' ' && i + 1 < n ? i + 1 : i;
      if (cps[k].cls == Cls::kOther) {
        j = k;
        while (j < n && cps[j].cls == Cls::kOther) ++j;
        if (kind == 1) {
          while (j < n && cps[j].cls == Cls::kNewline) ++j;
        }
        piece(i, j);
        i = j;
        continue;
      }
    }
    // Whitespace runs: Llama 3's '\s*[\r\n]+' first, then '\s+(?!\S)' and '\s+'.
    j = i;
    while (j < n && is_space(j)) ++j;
    if (kind == 1) {
      size_t last_nl = SIZE_MAX;
      for (size_t k = i; k < j; ++k) {
        if (cps[k].cls == Cls::kNewline) last_nl = k;
      }
      if (last_nl != SIZE_MAX) {
        piece(i, last_nl + 1);
        i = last_nl + 1;
        continue;
      }
    }
    if (j < n && j - i > 1) --j;  // leave one space to prefix the next word
    piece(i, j);
    i = j;
  }
  return out;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::load(const std::string& dir) {
  std::ifstream tj(dir + "/tokenizer.json");
  if (!tj) return invalid_argument("cannot read " + dir + "/tokenizer.json", "model");
  std::stringstream a;
  a << tj.rdbuf();
  std::stringstream b;
  std::ifstream tc(dir + "/tokenizer_config.json");
  if (tc) b << tc.rdbuf();
  auto t = from_json(a.str(), b.str());
  if (!t.is_ok()) return t.status().with_context(dir + "/tokenizer.json");
  return t;
}

Result<std::unique_ptr<Tokenizer>> Tokenizer::from_json(const std::string& tokenizer_json,
                                                        const std::string& config_json) {
  json j = json::parse(tokenizer_json, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return invalid_argument("tokenizer.json is not a JSON object");
  const json& model = j["model"];
  if (!model.is_object() || model.value("type", "") != "BPE") {
    return invalid_argument("unsupported tokenizer model (only BPE is supported)", "model.type");
  }
  if (model.value("byte_fallback", false)) {
    return invalid_argument("SentencePiece-style byte-fallback BPE is not supported yet",
                            "model.byte_fallback");
  }
  auto t = std::unique_ptr<Tokenizer>(new Tokenizer());
  // GPT-2's byte ↔ unicode map.
  {
    std::vector<int> bs;
    for (int c = '!'; c <= '~'; ++c) bs.push_back(c);
    for (int c = 0xA1; c <= 0xAC; ++c) bs.push_back(c);
    for (int c = 0xAE; c <= 0xFF; ++c) bs.push_back(c);
    std::vector<int> cs = bs;
    int extra = 0;
    for (int c = 0; c < 256; ++c) {
      if (std::find(bs.begin(), bs.end(), c) == bs.end()) {
        bs.push_back(c);
        cs.push_back(256 + extra++);
      }
    }
    for (size_t k = 0; k < bs.size(); ++k) append_utf8(t->byte_to_unicode_[bs[k]], static_cast<uint32_t>(cs[k]));
  }
  std::unordered_map<std::string, unsigned char> unicode_to_byte;
  for (int c = 0; c < 256; ++c) unicode_to_byte[t->byte_to_unicode_[c]] = static_cast<unsigned char>(c);
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return invalid_argument("tokenizer.json: model.vocab missing", "model.vocab");
  }
  int32_t max_id = -1;
  for (const auto& [tok, id] : model["vocab"].items()) {
    if (!id.is_number_integer()) return invalid_argument("tokenizer.json: vocab ids must be integers", "model.vocab");
    t->vocab_[tok] = id.get<int32_t>();
    max_id = std::max(max_id, id.get<int32_t>());
  }
  const json& added = j.contains("added_tokens") && j["added_tokens"].is_array() ? j["added_tokens"] : json::array();
  for (const auto& a : added) max_id = std::max(max_id, a.value("id", -1));
  t->id_to_bytes_.assign(static_cast<size_t>(max_id + 1), "");
  t->special_.assign(static_cast<size_t>(max_id + 1), false);
  for (const auto& [tok, id] : t->vocab_) {
    std::string bytes;
    for (size_t i = 0; i < tok.size();) {
      int len = utf8_len(static_cast<unsigned char>(tok[i]));
      auto it = unicode_to_byte.find(tok.substr(i, static_cast<size_t>(len)));
      if (it == unicode_to_byte.end()) {
        bytes += tok.substr(i, static_cast<size_t>(len));  // not byte-level: keep as is
      } else {
        bytes += static_cast<char>(it->second);
      }
      i += static_cast<size_t>(len);
    }
    t->id_to_bytes_[static_cast<size_t>(id)] = bytes;
  }
  if (model.contains("merges") && model["merges"].is_array()) {
    int rank = 0;
    for (const auto& m : model["merges"]) {
      std::string key;
      if (m.is_string()) {
        key = m.get<std::string>();
      } else if (m.is_array() && m.size() == 2) {
        key = m[0].get<std::string>() + " " + m[1].get<std::string>();
      } else {
        return invalid_argument("tokenizer.json: bad merge entry", "model.merges");
      }
      t->merge_rank_.emplace(key, rank++);
    }
  }
  for (const auto& a : added) {
    int32_t id = a.value("id", -1);
    std::string content = a.value("content", "");
    if (id < 0 || content.empty()) return invalid_argument("tokenizer.json: bad added token", "added_tokens");
    t->id_to_bytes_[static_cast<size_t>(id)] = content;
    t->special_[static_cast<size_t>(id)] = a.value("special", false);
    t->added_.emplace_back(content, id);
  }
  std::sort(t->added_.begin(), t->added_.end(),
            [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  // Pre-tokenizer: ByteLevel with use_regex, or a Split with a GPT-2 / Llama 3 style pattern.
  std::function<void(const json&)> scan = [&](const json& p) {
    if (!p.is_object()) return;
    std::string type = p.value("type", "");
    if (type == "Sequence" && p.contains("pretokenizers")) {
      for (const auto& q : p["pretokenizers"]) scan(q);
    } else if (type == "ByteLevel" && p.value("use_regex", true) && t->split_ == Split::kNone) {
      t->split_ = Split::kGpt2;
    } else if (type == "Split" && p.contains("pattern")) {
      std::string re = p["pattern"].value("Regex", "");
      t->split_ = re.find("\\p{N}{1,3}") != std::string::npos || re.find("(?i:") != std::string::npos
                      ? Split::kLlama3
                      : Split::kGpt2;
    }
  };
  scan(j["pre_tokenizer"]);
  json cfg = config_json.empty() ? json::object() : json::parse(config_json, nullptr, false);
  auto token_text = [](const json& v) -> std::string {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object()) return v.value("content", "");
    return "";
  };
  if (cfg.is_object()) {
    t->bos_text_ = token_text(cfg.value("bos_token", json()));
    t->eos_text_ = token_text(cfg.value("eos_token", json()));
  }
  if (auto id = t->token_id(t->bos_text_)) t->bos_ = *id;
  if (auto id = t->token_id(t->eos_text_)) t->eos_.push_back(*id);
  return t;
}

std::optional<int32_t> Tokenizer::token_id(const std::string& text) const {
  if (text.empty()) return std::nullopt;
  for (const auto& [content, id] : added_) {
    if (content == text) return id;
  }
  std::string u;
  for (unsigned char c : text) u += byte_to_unicode_[c];
  auto it = vocab_.find(u);
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

void Tokenizer::bpe(const std::string& word, std::vector<int32_t>* out) const {
  // Symbols start as single bytes (in the byte-level alphabet) and merge by rank.
  std::vector<std::string> sym;
  for (unsigned char c : word) sym.push_back(byte_to_unicode_[c]);
  if (!merge_rank_.empty()) {
    while (sym.size() > 1) {
      int best = INT_MAX;
      size_t at = 0;
      for (size_t i = 0; i + 1 < sym.size(); ++i) {
        auto it = merge_rank_.find(sym[i] + " " + sym[i + 1]);
        if (it != merge_rank_.end() && it->second < best) {
          best = it->second;
          at = i;
        }
      }
      if (best == INT_MAX) break;
      sym[at] += sym[at + 1];
      sym.erase(sym.begin() + static_cast<long>(at) + 1);
    }
  }
  for (const std::string& s : sym) {
    auto it = vocab_.find(s);
    if (it != vocab_.end()) {
      out->push_back(it->second);
      continue;
    }
    // Not in the vocabulary: fall back to its single bytes.
    for (size_t i = 0; i < s.size();) {
      int len = utf8_len(static_cast<unsigned char>(s[i]));
      auto b = vocab_.find(s.substr(i, static_cast<size_t>(len)));
      if (b != vocab_.end()) out->push_back(b->second);
      i += static_cast<size_t>(len);
    }
  }
}

void Tokenizer::encode_plain(std::string_view text, std::vector<int32_t>* out) const {
  if (text.empty()) return;
  if (split_ == Split::kNone) {
    bpe(std::string(text), out);
    return;
  }
  for (const std::string& piece : pre_tokenize(text, split_ == Split::kLlama3 ? 1 : 0)) bpe(piece, out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view text) const {
  std::vector<int32_t> out;
  size_t start = 0;
  size_t i = 0;
  while (i < text.size()) {
    bool matched = false;
    for (const auto& [content, id] : added_) {
      if (text.compare(i, content.size(), content) == 0) {
        encode_plain(text.substr(start, i - start), &out);
        out.push_back(id);
        i += content.size();
        start = i;
        matched = true;
        break;
      }
    }
    if (!matched) ++i;
  }
  encode_plain(text.substr(start), &out);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    out += token_bytes(id);
  }
  return out;
}

std::string StreamDecoder::push(int32_t id) {
  if (tok_.is_special(id)) return "";
  pending_ += tok_.token_bytes(id);
  // Emit everything up to the last complete UTF-8 character.
  size_t cut = pending_.size();
  size_t k = pending_.size();
  int back = 0;
  while (k > 0 && back < 4) {
    --k;
    ++back;
    unsigned char c = static_cast<unsigned char>(pending_[k]);
    if ((c & 0xC0) != 0x80) {  // a lead byte (or ASCII)
      if (utf8_len(c) > back) cut = k;
      break;
    }
  }
  std::string ready = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return ready;
}

std::string StreamDecoder::flush() {
  std::string rest;
  if (!pending_.empty()) rest = "\xEF\xBF\xBD";
  pending_.clear();
  return rest;
}

}  // namespace hr::engine
