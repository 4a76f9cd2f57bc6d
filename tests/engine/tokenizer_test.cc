// The SentencePiece-style BPE path on small hand-written tokenizer.json files (merges in both
// formats, byte fallback, unk, the leading space, Metaspace, streaming across byte tokens), added
// tokens' lstrip, rstrip, single_word and normalized, the post-processor's template, the refusal of
// what is not supported, the pre-tokenizer's Unicode classes and NFC.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>

#include "engine/internal/unicode.h"
#include "engine/tokenizer.h"

namespace hr::engine {
namespace {

using nlohmann::json;

// ids: <unk> 0, <s> 1, </s> 2, <0x00>..<0xFF> 3..258, then the pieces below.
constexpr int32_t kByte0 = 3;
const std::vector<std::string> kPieces = {"▁", "h",  "e",  "l",   "o",   "w",      "r",
                                          "d", "he", "ll", "▁he", "llo", "▁hello", "▁w"};
int32_t piece(const std::string& p) {
  return 259 + static_cast<int32_t>(std::find(kPieces.begin(), kPieces.end(), p) - kPieces.begin());
}

// A Llama 2 style tokenizer.json; `pair_merges` writes merges as ["a", "b"] instead of "a b".
json sentencepiece_json(bool pair_merges = false) {
  json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab[name] = kByte0 + b;
  }
  for (const auto& p : kPieces) vocab[p] = piece(p);
  json merges = json::array();
  for (auto [a, b] : std::vector<std::pair<std::string, std::string>>{
           {"h", "e"}, {"l", "l"}, {"▁", "he"}, {"ll", "o"}, {"▁he", "llo"}, {"▁", "w"}}) {
    merges.push_back(pair_merges ? json::array({a, b}) : json(a + " " + b));
  }
  json added = json::array();
  for (auto [id, text] :
       std::vector<std::pair<int, std::string>>{{0, "<unk>"}, {1, "<s>"}, {2, "</s>"}}) {
    added.push_back({{"id", id},
                     {"content", text},
                     {"special", true},
                     {"normalized", false},
                     {"lstrip", false},
                     {"rstrip", false},
                     {"single_word", false}});
  }
  return {{"added_tokens", added},
          {"normalizer",
           {{"type", "Sequence"},
            {"normalizers",
             {{{"type", "Prepend"}, {"prepend", "▁"}},
              {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", "▁"}}}}}},
          {"pre_tokenizer", nullptr},
          {"decoder",
           {{"type", "Sequence"},
            {"decoders",
             {{{"type", "Replace"}, {"pattern", {{"String", "▁"}}}, {"content", " "}},
              {{"type", "ByteFallback"}},
              {{"type", "Fuse"}},
              {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}}}}},
          {"model",
           {{"type", "BPE"},
            {"byte_fallback", true},
            {"fuse_unk", true},
            {"unk_token", "<unk>"},
            {"vocab", vocab},
            {"merges", merges}}}};
}

std::unique_ptr<Tokenizer> make(const json& j) {
  auto t = Tokenizer::from_json(j.dump(), R"({"bos_token": "<s>", "eos_token": "</s>"})");
  EXPECT_TRUE(t.is_ok()) << t.status().to_string();
  return t.is_ok() ? std::move(t).value() : nullptr;
}

TEST(TokenizerTest, SentencePieceMergesByRankInBothFormats) {
  for (bool pairs : {false, true}) {
    auto t = make(sentencepiece_json(pairs));
    ASSERT_TRUE(t);
    std::vector<int32_t> ids = t->encode("hello world");
    EXPECT_EQ(ids, (std::vector<int32_t>{piece("▁hello"), piece("▁w"), piece("o"), piece("r"),
                                         piece("l"), piece("d")}));
    EXPECT_EQ(t->decode(ids), "hello world");  // the prepended space is dropped
    EXPECT_EQ(t->bos_id(), 1);
    EXPECT_EQ(t->eos_ids(), std::vector<int32_t>{2});
  }
}

TEST(TokenizerTest, SentencePieceByteFallbackUnkAndSpaces) {
  auto t = make(sentencepiece_json());
  ASSERT_TRUE(t);
  // "é" is not in the vocabulary: its two UTF-8 bytes.
  std::vector<int32_t> ids = t->encode("hé");
  EXPECT_EQ(ids, (std::vector<int32_t>{piece("▁"), piece("h"), kByte0 + 0xC3, kByte0 + 0xA9}));
  EXPECT_EQ(t->decode(ids), "hé");
  EXPECT_EQ(t->token_bytes(kByte0 + 0xC3), "\xC3");
  // Only one leading space goes: the one the normalizer put there.
  EXPECT_EQ(t->decode(t->encode(" hello")), " hello");
  EXPECT_EQ(t->decode({piece("▁hello"), piece("▁w")}), "hello w");
  // Special tokens split the text; each piece gets its "▁" (as Llama 2's legacy tokenizer does).
  ids = t->encode("he<s>hello");
  EXPECT_EQ(ids, (std::vector<int32_t>{piece("▁he"), 1, piece("▁hello")}));
  EXPECT_EQ(t->decode(ids), "he hello");
  EXPECT_EQ(t->decode(ids, /*skip_special=*/false), "he<s> hello");
  EXPECT_EQ(t->decode({1, piece("▁hello")}, /*skip_special=*/false), "<s> hello");
  EXPECT_EQ(t->token_id(" hello"), piece("▁hello"));

  // Without byte fallback: unk, consecutive unknown characters fused into one unless fuse_unk is
  // off.
  json j = sentencepiece_json();
  j["model"]["byte_fallback"] = false;
  t = make(j);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("hé€"), (std::vector<int32_t>{piece("▁"), piece("h"), 0}));
  j["model"]["fuse_unk"] = false;
  t = make(j);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("hé€"), (std::vector<int32_t>{piece("▁"), piece("h"), 0, 0}));
}

TEST(TokenizerTest, AddedTokensCanSwallowNeighbouringWhitespace) {
  json j = sentencepiece_json();
  j["added_tokens"].push_back({{"id", 273},
                               {"content", "<x>"},
                               {"special", false},
                               {"normalized", false},
                               {"lstrip", true},
                               {"rstrip", true}});
  auto t = make(j);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("he <x> he"), (std::vector<int32_t>{piece("▁he"), 273, piece("▁he")}));
  j["added_tokens"].back()["lstrip"] = false;
  j["added_tokens"].back()["rstrip"] = false;
  t = make(j);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("he <x> he"),
            (std::vector<int32_t>{piece("▁he"), piece("▁"), 273, piece("▁"), piece("▁he")}));
}

bool contains(const std::vector<int32_t>& ids, int32_t id) {
  return std::find(ids.begin(), ids.end(), id) != ids.end();
}

TEST(TokenizerTest, SingleWordAddedTokensOnlyMatchOutsideWords) {
  json j = sentencepiece_json();
  j["added_tokens"].push_back({{"id", 273},
                               {"content", "hel"},
                               {"special", false},
                               {"normalized", false},
                               {"single_word", true}});
  j["added_tokens"].push_back(
      {{"id", 274}, {"content", "el"}, {"special", false}, {"normalized", false}});
  auto t = make(j);
  auto plain = make(sentencepiece_json());
  ASSERT_TRUE(t && plain);
  // A word character (\w: letters, digits, "_", marks, CJK) on either side: no match, and the
  // search goes on after it, so "el" inside the refused "hel" is not found either.
  for (std::string text :
       {"hello", "xhel", "_hel", "hel9", "e\u0301hel", "\u4E2Dhel", "hel\u0301"}) {
    EXPECT_EQ(t->encode(text), plain->encode(text)) << text;
  }
  EXPECT_TRUE(contains(t->encode("xel"), 274));
  // Spaces, punctuation, other added tokens and the ends of the text are no word characters.
  EXPECT_EQ(t->encode("hel"), std::vector<int32_t>{273});
  EXPECT_EQ(t->encode("hel he"), (std::vector<int32_t>{273, piece("▁"), piece("▁he")}));
  for (std::string text : {"(hel)", "\u2013hel\u2013", "<s>hel</s>", "he\u00A0hel"}) {
    EXPECT_TRUE(contains(t->encode(text), 273)) << text;
  }
  // Without single_word the token is found inside words too.
  j["added_tokens"][3]["single_word"] = false;
  t = make(j);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("hello"), (std::vector<int32_t>{273, piece("▁"), piece("l"), piece("o")}));
}

TEST(TokenizerTest, NormalizedAddedTokensMatchTheNormalizedText) {
  json j = sentencepiece_json();
  j["added_tokens"].push_back({{"id", 273}, {"content", "<x>"}, {"special", false}});
  auto by_default = make(j);  // a token that is not special is normalized unless it says not
  j["added_tokens"].back()["normalized"] = true;
  auto normalized = make(j);
  j["added_tokens"].back()["normalized"] = false;
  auto raw = make(j);
  auto plain = make(sentencepiece_json());
  ASSERT_TRUE(by_default && normalized && raw && plain);
  // normalized: false: found in the raw text; the text on each side is normalized on its own.
  EXPECT_EQ(raw->encode("he<x>he"), (std::vector<int32_t>{piece("▁he"), 273, piece("▁he")}));
  EXPECT_EQ(raw->encode("he <x> he"),
            (std::vector<int32_t>{piece("▁he"), piece("▁"), 273, piece("▁"), piece("▁he")}));
  // normalized: true: its normalized form "▁<x>" is looked for in the normalized text: in
  // "▁he▁<x>▁he" it takes the space before it along, and the text after it is not normalized
  // again; "▁he<x>he" has no "▁<x>".
  for (const Tokenizer* t : {normalized.get(), by_default.get()}) {
    EXPECT_EQ(t->encode("he <x> he"), (std::vector<int32_t>{piece("▁he"), 273, piece("▁he")}));
    EXPECT_EQ(t->encode("<x>he"), (std::vector<int32_t>{273, piece("he")}));
    EXPECT_EQ(t->encode("he<x>he"), plain->encode("he<x>he"));
    EXPECT_FALSE(contains(t->encode("he<x>he"), 273));
  }
}

TEST(TokenizerTest, PostProcessorTemplateOnRequest) {
  json j = sentencepiece_json();
  auto special = [](const char* name) {
    return json{{"SpecialToken", {{"id", name}, {"type_id", 0}}}};
  };
  const json a = {{"Sequence", {{"id", "A"}, {"type_id", 0}}}};
  json specials = {{"<s>", {{"id", "<s>"}, {"ids", {1}}, {"tokens", {"<s>"}}}},
                   {"</s>", {{"id", "</s>"}, {"ids", {2, 0}}, {"tokens", {"</s>", "<unk>"}}}}};
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", {special("<s>"), a}},
                         {"special_tokens", specials}};
  auto t = make(j);
  ASSERT_TRUE(t);
  const int32_t hello = piece("▁hello");
  EXPECT_EQ(t->encode("hello"), std::vector<int32_t>{hello});  // by default nothing is added
  EXPECT_EQ(t->encode("hello", /*add_special_tokens=*/true), (std::vector<int32_t>{1, hello}));
  EXPECT_EQ(t->encode("", /*add_special_tokens=*/true), std::vector<int32_t>{1});
  EXPECT_EQ(t->decode(t->encode("hello", /*add_special_tokens=*/true)), "hello");
  // In a Sequence after ByteLevel, with tokens after the text too (a name may stand for several).
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", false}},
        {{"type", "TemplateProcessing"},
         {"single", {special("<s>"), a, special("</s>")}},
         {"special_tokens", specials}}}}};
  t = make(j);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("hello", true), (std::vector<int32_t>{1, hello, 2, 0}));
  j["post_processor"] = {{"type", "RobertaProcessing"},
                         {"sep", {"</s>", 2}},
                         {"cls", {"<s>", 1}},
                         {"trim_offsets", true},
                         {"add_prefix_space", false}};
  t = make(j);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("hello", true), (std::vector<int32_t>{1, hello, 2}));
  j["post_processor"] = nullptr;
  t = make(j);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("hello", true), std::vector<int32_t>{hello});

  // What cannot be honoured is an error naming the field.
  auto status = [&](const json& post) {
    j["post_processor"] = post;
    return Tokenizer::from_json(j.dump(), "").status();
  };
  Status s = status({{"type", "Foo"}});
  EXPECT_EQ(s.field(), "post_processor");
  EXPECT_NE(s.message().find("Foo"), std::string::npos) << s.message();
  s = status({{"type", "TemplateProcessing"},
              {"single", {special("<bos>"), a}},
              {"special_tokens", specials}});
  EXPECT_EQ(s.field(), "post_processor");
  EXPECT_NE(s.message().find("<bos>"), std::string::npos) << s.message();
  s = status(
      {{"type", "TemplateProcessing"}, {"single", {special("<s>")}}, {"special_tokens", specials}});
  EXPECT_EQ(s.field(), "post_processor");
  EXPECT_NE(s.message().find("$A"), std::string::npos) << s.message();
}

TEST(TokenizerTest, SentencePieceStreamsWholeCharactersAcrossByteTokens) {
  auto t = make(sentencepiece_json());
  ASSERT_TRUE(t);
  std::vector<int32_t> ids = t->encode("€h");  // ▁ <0xE2> <0x82> <0xAC> h
  ASSERT_EQ(ids.size(), 5u);
  StreamDecoder d(*t);
  std::vector<std::string> deltas;
  for (int32_t id : ids) deltas.push_back(d.push(id));
  EXPECT_EQ(deltas, (std::vector<std::string>{"", "", "", "€", "h"}));
  EXPECT_EQ(d.flush(), "");
  // A later space is kept; special tokens are skipped.
  StreamDecoder d2(*t);
  EXPECT_EQ(d2.push(1), "");
  EXPECT_EQ(d2.push(piece("▁hello")), "hello");
  EXPECT_EQ(d2.push(piece("▁w")), " w");
  // A character cut off at the end, and bytes that are no UTF-8 at all, become U+FFFD.
  StreamDecoder d3(*t);
  EXPECT_EQ(d3.push(kByte0 + 0xE2), "");
  EXPECT_EQ(d3.push(kByte0 + 0x82), "");
  EXPECT_EQ(d3.flush(), "\xEF\xBF\xBD");
  StreamDecoder d4(*t);
  EXPECT_EQ(d4.push(kByte0 + 0xFF), "\xEF\xBF\xBD");
  EXPECT_EQ(d4.push(kByte0 + 0xC3), "");
  EXPECT_EQ(d4.push(kByte0 + 'A'),
            "\xEF\xBF\xBD"
            "A");
  EXPECT_EQ(t->decode({kByte0 + 0xE2, kByte0 + 0x82, piece("h")}),
            "\xEF\xBF\xBD"
            "h");
}

TEST(TokenizerTest, OlderMetaspacePreTokenizer) {
  json j = sentencepiece_json();
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"add_prefix_space", true}};
  j["decoder"] = {{"type", "Metaspace"}, {"replacement", "▁"}, {"add_prefix_space", true}};
  auto t = make(j);
  ASSERT_TRUE(t);
  std::vector<int32_t> ids = t->encode("hello world");
  EXPECT_EQ(ids, make(sentencepiece_json())->encode("hello world"));
  EXPECT_EQ(t->decode(ids), "hello world");
  // "first": only the text at the very start gets a "▁".
  j["pre_tokenizer"]["prepend_scheme"] = "first";
  t = make(j);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->encode("he<s>he"), (std::vector<int32_t>{piece("▁he"), 1, piece("he")}));
}

TEST(TokenizerTest, UnsupportedKindsAreNamed) {
  auto status = [](const json& j) { return Tokenizer::from_json(j.dump(), "").status(); };
  for (const char* type : {"Unigram", "WordPiece", "WordLevel"}) {
    Status s = status({{"model", {{"type", type}, {"vocab", json::array()}}}});
    EXPECT_EQ(s.field(), "model.type");
    EXPECT_NE(s.message().find(type), std::string::npos) << s.message();
  }
  json j = sentencepiece_json();
  j["normalizer"] = {{"type", "NFKC"}};
  EXPECT_EQ(status(j).field(), "normalizer");
  EXPECT_NE(status(j).message().find("NFKC"), std::string::npos) << status(j).message();
  j = sentencepiece_json();
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  EXPECT_NE(status(j).message().find("Whitespace"), std::string::npos) << status(j).message();
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "\\w+"}}}, {"behavior", "Isolated"}};
  j["decoder"] = {{"type", "ByteLevel"}};
  j["model"]["byte_fallback"] = false;
  j["normalizer"] = nullptr;
  EXPECT_NE(status(j).message().find("\\\\w+"), std::string::npos) << status(j).message();
  j = sentencepiece_json();
  j["model"]["merges"].push_back("he zz");
  EXPECT_EQ(status(j).field(), "model.merges");
}

TEST(TokenizerTest, PreTokenizerUsesUnicodeClasses) {
  using Pieces = std::vector<std::string_view>;
  EXPECT_EQ(pre_tokenize("Price: 1234 ①②", SplitRule::kQwen2),
            (Pieces{"Price", ":", " ", "1", "2", "3", "4", " ", "①", "②"}));
  EXPECT_EQ(pre_tokenize("WE'RE naïve\u3000東京 e\u0301x", SplitRule::kLlama3),
            (Pieces{"WE", "'RE", " naïve", "\u3000東京", " e", "\u0301x"}));
  EXPECT_EQ(pre_tokenize("e\u0301x ｶﾀｶﾅ Ⅻ 12", SplitRule::kGpt2),
            (Pieces{"e", "\u0301", "x", " ｶﾀｶﾅ", " Ⅻ", " 12"}));
  EXPECT_EQ(pre_tokenize("a \t\n  b  ", SplitRule::kLlama3),
            (Pieces{"a", " \t\n", " ", " b", "  "}));
  EXPECT_EQ(pre_tokenize("a \t\n  b  ", SplitRule::kGpt2), (Pieces{"a", " \t\n ", " b", "  "}));
}

TEST(TokenizerTest, Nfc) {
  EXPECT_EQ(internal::nfc("e\u0301"), "é");
  EXPECT_EQ(internal::nfc("\u1100\u1161\u11A8"), "각");  // Hangul jamo
  EXPECT_EQ(internal::nfc("a\u0301\u0327"), "á\u0327");  // reordered, then composed
  EXPECT_EQ(internal::nfc("\u212B"), "Å");               // a singleton
  EXPECT_EQ(internal::nfc("\u0958"), "\u0915\u093C");    // excluded from composition
  EXPECT_EQ(internal::nfc("u\u0308\u0304"), "ǖ");        // two levels
  EXPECT_EQ(internal::nfc("plain ASCII"), "plain ASCII");
  EXPECT_EQ(internal::nfc("bad \xC3 utf-8 \u0301"), "bad \xC3 utf-8 \u0301");  // left alone
}

}  // namespace
}  // namespace hr::engine
