// Reading tokenizer.json: which kind of BPE it is, its normalizer, pre-tokenizer, decoder and
// post-processor, the vocabulary, merges and added tokens. Anything it cannot honour is an error
// naming what was found.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/internal/unicode.h"
#include "engine/tokenizer.h"

namespace hr::engine {

using nlohmann::json;

namespace {

constexpr std::string_view kSpaceMark = Tokenizer::kSpaceMark;

std::string str(const json& j, const char* key) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_string()) return "";
  return j[key].get<std::string>();
}

bool flag(const json& j, const char* key, bool fallback) {
  if (!j.is_object() || !j.contains(key) || !j[key].is_boolean()) return fallback;
  return j[key].get<bool>();
}

// The components of a normalizer / pre-tokenizer / decoder / post-processor, with Sequences
// flattened.
void components(const json& j, std::vector<const json*>* out) {
  if (!j.is_object()) return;
  for (const char* list : {"normalizers", "pretokenizers", "decoders", "processors"}) {
    if (str(j, "type") == "Sequence" && j.contains(list) && j[list].is_array()) {
      for (const json& k : j[list]) components(k, out);
      return;
    }
  }
  out->push_back(&j);
}

bool has_type(const std::vector<const json*>& parts, const std::string& type) {
  for (const json* p : parts) {
    if (str(*p, "type") == type) return true;
  }
  return false;
}

// "<0xNN>" → NN.
std::optional<unsigned char> byte_token(const std::string& tok) {
  if (tok.size() != 6 || tok.compare(0, 3, "<0x") != 0 || tok[5] != '>') return std::nullopt;
  unsigned value = 0;
  for (char c : tok.substr(3, 2)) {
    value <<= 4;
    if (c >= '0' && c <= '9') {
      value |= static_cast<unsigned>(c - '0');
    } else if ((c | 0x20) >= 'a' && (c | 0x20) <= 'f') {
      value |= static_cast<unsigned>((c | 0x20) - 'a' + 10);
    } else {
      return std::nullopt;
    }
  }
  return static_cast<unsigned char>(value);
}

// A token id in tokenizer.json: a non-negative integer that fits int32_t.
bool is_id(const json& j) {
  return j.is_number_integer() && j.get<int64_t>() >= 0 && j.get<int64_t>() <= INT32_MAX;
}

}  // namespace

class TokenizerLoader {
 public:
  static Result<std::unique_ptr<Tokenizer>> load(const json& j, const std::string& config_json);

 private:
  static Status normalizer(const json& j, Tokenizer* t);
  static Status pre_tokenizer(const json& j, Tokenizer* t);
  static Status vocabulary(const json& model, const json& added, Tokenizer* t);
  static Status merges(const json& model, Tokenizer* t);
  static Status post_processor(const json& j, Tokenizer* t);
};

Status TokenizerLoader::normalizer(const json& j, Tokenizer* t) {
  std::vector<const json*> parts;
  components(j, &parts);
  for (const json* p : parts) {
    std::string type = str(*p, "type");
    if (type == "NFC") {
      t->normalizers_.push_back({Tokenizer::Normalizer::kNfc, "", ""});
    } else if (type == "Prepend") {
      t->normalizers_.push_back({Tokenizer::Normalizer::kPrepend, "", str(*p, "prepend")});
    } else if (type == "Replace" && p->contains("pattern") &&
               !str((*p)["pattern"], "String").empty()) {
      std::string from = str((*p)["pattern"], "String");
      t->normalizers_.push_back({Tokenizer::Normalizer::kReplace, from, str(*p, "content")});
    } else {
      return invalid_argument(
          "unsupported tokenizer normalizer \"" + type + "\" (supported: NFC, Prepend, Replace)",
          "normalizer");
    }
  }
  return Status::ok();
}

Status TokenizerLoader::pre_tokenizer(const json& j, Tokenizer* t) {
  std::vector<const json*> parts;
  components(j, &parts);
  for (const json* p : parts) {
    std::string type = str(*p, "type");
    if (type == "ByteLevel") {
      if (flag(*p, "use_regex", true) && !t->split_) t->split_ = SplitRule::kGpt2;
      t->byte_level_prefix_space_ = flag(*p, "add_prefix_space", false);
    } else if (type == "Split") {
      const json pattern = p->contains("pattern") ? (*p)["pattern"] : json();
      auto rule = split_rule_from_regex(str(pattern, "Regex"));
      if (!rule || str(*p, "behavior") != "Isolated" || flag(*p, "invert", false)) {
        return invalid_argument(
            "unsupported Split pre-tokenizer (pattern " + pattern.dump() + ", behavior " +
                str(*p, "behavior") +
                "): only the GPT-2, Llama 3 and Qwen2 regexes, Isolated, are supported",
            "pre_tokenizer");
      }
      t->split_ = rule;
    } else if (type == "Metaspace") {
      if (str(*p, "replacement") != kSpaceMark) {
        return invalid_argument(
            "unsupported Metaspace replacement \"" + str(*p, "replacement") + "\"",
            "pre_tokenizer");
      }
      t->metaspace_ = true;
      t->metaspace_split_ = flag(*p, "split", true);
      std::string scheme = str(*p, "prepend_scheme");
      if (scheme.empty()) scheme = flag(*p, "add_prefix_space", true) ? "always" : "never";
      t->metaspace_prepend_ = scheme == "first"   ? Tokenizer::Prepend::kFirst
                              : scheme == "never" ? Tokenizer::Prepend::kNever
                                                  : Tokenizer::Prepend::kAlways;
    } else {
      return invalid_argument("unsupported tokenizer pre-tokenizer \"" + type +
                                  "\" (supported: ByteLevel, Split, Metaspace)",
                              "pre_tokenizer");
    }
  }
  return Status::ok();
}

Status TokenizerLoader::vocabulary(const json& model, const json& added, Tokenizer* t) {
  if (!model.contains("vocab") || !model["vocab"].is_object()) {
    return invalid_argument("tokenizer.json: model.vocab missing", "model.vocab");
  }
  int32_t max_id = -1;
  for (const auto& [tok, id] : model["vocab"].items()) {
    if (!is_id(id)) {
      return invalid_argument("tokenizer.json: vocab ids must be non-negative integers",
                              "model.vocab");
    }
    t->vocab_[tok] = id.get<int32_t>();
    max_id = std::max(max_id, id.get<int32_t>());
  }
  for (const auto& a : added) {
    if (!a.is_object() || !a.contains("id") || !is_id(a["id"]) || str(a, "content").empty()) {
      return invalid_argument("tokenizer.json: bad added token " + a.dump(), "added_tokens");
    }
    max_id = std::max(max_id, a["id"].get<int32_t>());
  }
  t->id_to_bytes_.assign(static_cast<size_t>(max_id + 1), "");
  t->special_.assign(static_cast<size_t>(max_id + 1), false);
  std::fill(std::begin(t->byte_ids_), std::end(t->byte_ids_), -1);
  if (t->kind_ == Tokenizer::Kind::kByteLevel) {
    // GPT-2's byte ↔ unicode map: printable bytes stand for themselves, the rest for U+0100 on.
    std::string* byte_to_unicode = t->byte_to_unicode_;
    for (int c = 0, extra = 0; c < 256; ++c) {
      bool printable =
          (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE && c <= 0xFF);
      internal::append_utf8(byte_to_unicode[c],
                            static_cast<uint32_t>(printable ? c : 256 + extra++));
    }
    std::unordered_map<std::string, unsigned char> unicode_to_byte;
    for (int c = 0; c < 256; ++c) {
      unicode_to_byte[byte_to_unicode[c]] = static_cast<unsigned char>(c);
      auto it = t->vocab_.find(byte_to_unicode[c]);
      if (it != t->vocab_.end()) t->byte_ids_[c] = it->second;
    }
    for (const auto& [tok, id] : t->vocab_) {
      std::string bytes;
      for (size_t i = 0; i < tok.size();) {
        int len;
        internal::decode_utf8(tok, i, &len);
        std::string ch = tok.substr(i, static_cast<size_t>(len));
        auto it = unicode_to_byte.find(ch);
        if (it == unicode_to_byte.end()) {
          bytes += ch;  // not in the byte-level alphabet: keep as is
        } else {
          bytes += static_cast<char>(it->second);
        }
        i += static_cast<size_t>(len);
      }
      t->id_to_bytes_[static_cast<size_t>(id)] = bytes;
    }
  } else {
    for (const auto& [tok, id] : t->vocab_) {
      auto byte = byte_token(tok);
      if (byte) t->byte_ids_[*byte] = id;
      std::string bytes = byte ? std::string(1, static_cast<char>(*byte)) : tok;
      if (!byte) internal::replace_all(bytes, kSpaceMark, " ");
      t->id_to_bytes_[static_cast<size_t>(id)] = bytes;
    }
  }
  for (const auto& a : added) {
    int32_t id = a["id"].get<int32_t>();
    std::string content = str(a, "content");
    bool special = flag(a, "special", false);
    t->id_to_bytes_[static_cast<size_t>(id)] = content;
    t->special_[static_cast<size_t>(id)] = special;
    t->added_ids_.emplace(content, id);
    // A normalized token is looked for, in its normalized form, in the normalized text. Without
    // the flag, special tokens are not normalized and others are (Hugging Face's default).
    bool normalized = flag(a, "normalized", !special);
    Tokenizer::AddedTokens& set = normalized ? t->added_normalized_ : t->added_raw_;
    std::string text = normalized ? t->normalize(content) : content;
    if (text.empty()) continue;  // normalized away: nothing to look for
    set.tokens.push_back({text, id, flag(a, "lstrip", false), flag(a, "rstrip", false),
                          flag(a, "single_word", false)});
    set.first_byte[static_cast<unsigned char>(text[0])] = true;
  }
  for (Tokenizer::AddedTokens* set : {&t->added_raw_, &t->added_normalized_}) {
    std::stable_sort(set->tokens.begin(), set->tokens.end(),
                     [](const auto& x, const auto& y) { return x.text.size() > y.text.size(); });
  }
  std::string unk = str(model, "unk_token");
  if (auto it = t->vocab_.find(unk); !unk.empty() && it != t->vocab_.end()) t->unk_ = it->second;
  return Status::ok();
}

Status TokenizerLoader::merges(const json& model, Tokenizer* t) {
  if (!model.contains("merges") || !model["merges"].is_array()) return Status::ok();
  int rank = 0;
  for (const auto& m : model["merges"]) {
    std::string a, b;
    if (m.is_string()) {  // "a b"
      std::string s = m.get<std::string>();
      size_t space = s.find(' ');
      if (space == std::string::npos) {
        return invalid_argument("tokenizer.json: bad merge \"" + s + "\"", "model.merges");
      }
      a = s.substr(0, space);
      b = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() &&
               m[1].is_string()) {  // ["a", "b"]
      a = m[0].get<std::string>();
      b = m[1].get<std::string>();
    } else {
      return invalid_argument("tokenizer.json: bad merge " + m.dump(), "model.merges");
    }
    auto left = t->vocab_.find(a), right = t->vocab_.find(b), merged = t->vocab_.find(a + b);
    if (left == t->vocab_.end() || right == t->vocab_.end() || merged == t->vocab_.end()) {
      return invalid_argument("tokenizer.json: merge " + std::to_string(rank) + " (" + m.dump() +
                                  ") names a token that is not in the vocabulary",
                              "model.merges");
    }
    uint64_t key = static_cast<uint64_t>(left->second) << 32 | static_cast<uint32_t>(right->second);
    t->merges_.emplace(key, Tokenizer::Merge{rank++, merged->second});
  }
  return Status::ok();
}

// The ids the single-sequence template puts before and after the text. ByteLevel only adjusts
// offsets; in a Sequence, each later template goes around what the earlier ones made.
Status TokenizerLoader::post_processor(const json& j, Tokenizer* t) {
  auto bad = [&](const std::string& what) {
    return invalid_argument("tokenizer.json post_processor: " + what, "post_processor");
  };
  std::vector<const json*> parts;
  components(j, &parts);
  for (const json* p : parts) {
    std::string type = str(*p, "type");
    std::vector<int32_t> before, after;
    if (type == "ByteLevel") {
      continue;
    } else if (type == "BertProcessing" || type == "RobertaProcessing") {  // cls $A sep
      for (const char* key : {"cls", "sep"}) {
        const json v = p->value(key, json());  // [token, id]
        if (!v.is_array() || v.size() != 2 || !is_id(v[1])) {
          return bad(type + " needs " + key + " as [token, id], got " + v.dump());
        }
        (std::string_view(key) == "cls" ? before : after).push_back(v[1].get<int32_t>());
      }
    } else if (type == "TemplateProcessing") {
      const json single = p->value("single", json());
      const json specials = p->value("special_tokens", json::object());
      if (!single.is_array() || !specials.is_object()) {
        return bad("TemplateProcessing needs a single template and special_tokens");
      }
      bool seen_a = false;
      for (const json& piece : single) {
        if (piece.is_object() && piece.contains("Sequence") && !seen_a &&
            str(piece["Sequence"], "id") == "A") {
          seen_a = true;
        } else if (piece.is_object() && piece.contains("SpecialToken")) {
          std::string name = str(piece["SpecialToken"], "id");
          const json entry = specials.value(name, json());
          const json ids = entry.is_object() ? entry.value("ids", json()) : json();
          if (!ids.is_array()) {
            return bad("the single template's special token \"" + name +
                       "\" has no ids in special_tokens");
          }
          for (const json& id : ids) {
            if (!is_id(id)) return bad("special token \"" + name + "\" has a bad id " + id.dump());
            (seen_a ? after : before).push_back(id.get<int32_t>());
          }
        } else {
          return bad("unsupported piece " + piece.dump() + " in the single template");
        }
      }
      if (!seen_a) return bad("the single template " + single.dump() + " has no $A");
    } else {
      return invalid_argument("unsupported tokenizer post-processor \"" + type +
                                  "\" (supported: TemplateProcessing, BertProcessing, "
                                  "RobertaProcessing, ByteLevel)",
                              "post_processor");
    }
    t->template_prefix_.insert(t->template_prefix_.begin(), before.begin(), before.end());
    t->template_suffix_.insert(t->template_suffix_.end(), after.begin(), after.end());
  }
  return Status::ok();
}

Result<std::unique_ptr<Tokenizer>> TokenizerLoader::load(const json& j,
                                                         const std::string& config_json) {
  const json none;
  const json& model = j.contains("model") ? j["model"] : none;
  std::string type = str(model, "type");
  if (type.empty() && model.is_object() && model.contains("merges")) type = "BPE";
  if (type != "BPE") {
    return invalid_argument(
        "unsupported tokenizer model \"" + type +
            "\": only BPE is supported (byte-level as in GPT-2 / Llama 3 / Qwen2, or "
            "SentencePiece-style as in Llama 2 / Mistral)",
        "model.type");
  }
  const json& norm = j.contains("normalizer") ? j["normalizer"] : none;
  const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : none;
  const json& dec = j.contains("decoder") ? j["decoder"] : none;
  std::vector<const json*> norm_parts, pre_parts, dec_parts;
  components(norm, &norm_parts);
  components(pre, &pre_parts);
  components(dec, &dec_parts);
  auto t = std::unique_ptr<Tokenizer>(new Tokenizer());
  t->byte_fallback_ = flag(model, "byte_fallback", false);
  t->fuse_unk_ = flag(model, "fuse_unk", false);
  t->ignore_merges_ = flag(model, "ignore_merges", false);
  bool byte_level = has_type(pre_parts, "ByteLevel") || has_type(dec_parts, "ByteLevel");
  bool sentencepiece = t->byte_fallback_ || has_type(pre_parts, "Metaspace") ||
                       has_type(dec_parts, "Metaspace") || has_type(dec_parts, "ByteFallback") ||
                       norm.dump().find(kSpaceMark) != std::string::npos;
  if (byte_level == sentencepiece) {
    return invalid_argument(
        std::string("cannot tell the kind of BPE tokenizer: ") +
            (byte_level ? "both ByteLevel and SentencePiece (▁, byte fallback) parts"
                        : "neither a ByteLevel pre-tokenizer/decoder nor SentencePiece's "
                          "▁ / byte fallback"),
        "pre_tokenizer");
  }
  t->kind_ = byte_level ? Tokenizer::Kind::kByteLevel : Tokenizer::Kind::kSentencePiece;
  HR_RETURN_IF_ERROR(normalizer(norm, t.get()));
  HR_RETURN_IF_ERROR(pre_tokenizer(pre, t.get()));
  if (sentencepiece && t->split_) {
    return invalid_argument(
        "a SentencePiece-style tokenizer with a ByteLevel or Split pre-tokenizer", "pre_tokenizer");
  }
  // Decoding drops the leading space: Strip(" ", start 1) or a prepending Metaspace decoder.
  for (const json* d : dec_parts) {
    std::string type = str(*d, "type");
    if ((type == "Strip" && str(*d, "content") == " " && d->contains("start") &&
         (*d)["start"].is_number_integer() && (*d)["start"].get<int64_t>() >= 1) ||
        (type == "Metaspace" && str(*d, "prepend_scheme") != "never" &&
         flag(*d, "add_prefix_space", true))) {
      t->strip_leading_space_ = true;
    }
  }
  const json no_tokens = json::array();
  const json& added =
      j.contains("added_tokens") && j["added_tokens"].is_array() ? j["added_tokens"] : no_tokens;
  HR_RETURN_IF_ERROR(vocabulary(model, added, t.get()));
  HR_RETURN_IF_ERROR(merges(model, t.get()));
  HR_RETURN_IF_ERROR(
      post_processor(j.contains("post_processor") ? j["post_processor"] : none, t.get()));
  json cfg = config_json.empty() ? json::object() : json::parse(config_json, nullptr, false);
  auto token_text = [](const json& v) -> std::string {
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object()) return str(v, "content");
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
  if (j.is_discarded() || !j.is_object()) {
    return invalid_argument("tokenizer.json is not a JSON object");
  }
  return TokenizerLoader::load(j, config_json);
}

}  // namespace hr::engine
