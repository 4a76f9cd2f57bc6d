// The grammar engine: schemas and patterns to automata, token masks, the length budget.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "grammar/compiled_grammar.h"
#include "grammar/grammar_cache.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "grammar/regex.h"

namespace hr::grammar {
namespace {

using ojson = nlohmann::ordered_json;

std::shared_ptr<const Nfa> schema_nfa(const std::string& schema) {
  auto r = compile_json_schema(ojson::parse(schema), "schema");
  EXPECT_TRUE(r.is_ok()) << r.status().message();
  return r.is_ok() ? r.value() : nullptr;
}

bool accepts(const std::shared_ptr<const Nfa>& nfa, const std::string& text) {
  Dfa dfa(nfa);
  int32_t s = dfa.start();
  for (char c : text) {
    s = dfa.next(s, static_cast<uint8_t>(c));
    if (s < 0) return false;
  }
  return dfa.accepting(s);
}

TEST(JsonSchemaTest, ObjectsInSchemaOrderWithOptionalProperties) {
  auto nfa = schema_nfa(R"({"type": "object", "properties": {"a": {"type": "integer"},
      "b": {"type": "string"}, "c": {"type": "boolean"}}, "required": ["b"]})");
  EXPECT_TRUE(accepts(nfa, R"({"b": "x"})"));
  EXPECT_TRUE(accepts(nfa, R"({"a": 1, "b": "x", "c": true})"));
  EXPECT_TRUE(accepts(nfa, R"({"a":-12,"b":"","c":false})"));
  EXPECT_TRUE(accepts(nfa, "{\n  \"b\": \"x\",\n  \"c\": true\n}"));
  EXPECT_FALSE(accepts(nfa, R"({"a": 1})"));              // b is required
  EXPECT_FALSE(accepts(nfa, R"({"b": "x", "a": 1})"));    // schema order
  EXPECT_FALSE(accepts(nfa, R"({"b": "x", "d": 1})"));    // unknown property
  EXPECT_FALSE(accepts(nfa, R"({"a": 1.5, "b": "x"})"));  // not an integer
  EXPECT_FALSE(accepts(nfa, R"({"b": "x",})"));           // trailing comma
  EXPECT_FALSE(accepts(nfa, R"( {"b": "x"})"));           // text before the document
  EXPECT_FALSE(accepts(nfa, R"({"b": "x"} )"));           // text after it
}

TEST(JsonSchemaTest, StringsNumbersArraysEnumsAnyOfRefs) {
  auto s = schema_nfa(R"({"type": "string", "minLength": 2, "maxLength": 3})");
  EXPECT_FALSE(accepts(s, R"("a")"));
  EXPECT_TRUE(accepts(s, R"("ab")"));
  EXPECT_TRUE(accepts(s, R"("a\"é")"));  // an escape and a two-byte character count once each
  EXPECT_FALSE(accepts(s, R"("abcd")"));
  EXPECT_FALSE(accepts(s, "\"a\nb\""));  // raw control character
  EXPECT_TRUE(accepts(s, R"("\u00e9x")"));
  EXPECT_FALSE(accepts(s, R"("\ud800x")"));  // lone surrogate
  auto n = schema_nfa(R"({"type": "number"})");
  for (const char* ok : {"0", "-0.5", "12e3", "1.25E-7", "3"}) EXPECT_TRUE(accepts(n, ok)) << ok;
  for (const char* no : {"01", "1.", ".5", "+1", "1e", "NaN", "1e123"})
    EXPECT_FALSE(accepts(n, no)) << no;
  auto a = schema_nfa(R"({"type": "array", "items": {"enum": ["x", 2, null]}, "minItems": 1,
                          "maxItems": 3})");
  EXPECT_FALSE(accepts(a, "[]"));
  EXPECT_TRUE(accepts(a, R"(["x"])"));
  EXPECT_TRUE(accepts(a, R"(["x", 2, null])"));
  EXPECT_FALSE(accepts(a, R"(["x", 2, null, "x"])"));
  EXPECT_FALSE(accepts(a, R"(["y"])"));
  auto u = schema_nfa(R"({"anyOf": [{"type": "null"}, {"$ref": "#/$defs/p"}],
      "$defs": {"p": {"type": "object", "properties": {"n": {"const": 1}}, "required": ["n"]}}})");
  EXPECT_TRUE(accepts(u, "null"));
  EXPECT_TRUE(accepts(u, R"({"n": 1})"));
  EXPECT_FALSE(accepts(u, R"({"n": 2})"));
  // A recursive $ref: trees of bounded depth.
  auto t = schema_nfa(R"({"type": "object", "properties": {"v": {"type": "integer"},
      "kids": {"type": "array", "items": {"$ref": "#"}}}, "required": ["v"]})");
  EXPECT_TRUE(accepts(t, R"({"v": 1, "kids": [{"v": 2}, {"v": 3, "kids": [{"v": 4}]}]})"));
  EXPECT_FALSE(accepts(t, R"({"v": 1, "kids": [{"w": 2}]})"));
  auto any = compile_json_object();
  EXPECT_TRUE(accepts(any, R"({"a": [1, {"b": null}], "c": "d"})"));
  EXPECT_FALSE(accepts(any, R"([1])"));
  EXPECT_FALSE(accepts(any, R"({"a": 1])"));
}

TEST(JsonSchemaTest, NumericBounds) {
  auto i = schema_nfa(R"({"type": "integer", "minimum": -12, "exclusiveMaximum": 107})");
  for (int v = -30; v <= 130; ++v)
    EXPECT_EQ(accepts(i, std::to_string(v)), v >= -12 && v < 107) << v;
  EXPECT_FALSE(accepts(i, "-0"));
  EXPECT_FALSE(accepts(i, "007"));
  auto safe = schema_nfa(R"({"type": "integer", "minimum": -9007199254740991,
                             "maximum": 9007199254740991})");  // zod's int()
  EXPECT_TRUE(accepts(safe, "9007199254740991"));
  EXPECT_TRUE(accepts(safe, "-9007199254740991"));
  EXPECT_FALSE(accepts(safe, "9007199254740992"));
  EXPECT_FALSE(accepts(safe, "-9007199254740992"));
  auto n = schema_nfa(R"({"type": "number", "exclusiveMinimum": 0, "maximum": 2.5})");
  for (const char* ok : {"1", "2", "0.5", "1.999", "0.0001"}) EXPECT_TRUE(accepts(n, ok)) << ok;
  for (const char* no : {"0", "3", "-0.5", "2.6", "2.5", "1e1"}) EXPECT_FALSE(accepts(n, no)) << no;
  auto neg = schema_nfa(R"({"type": "number", "minimum": -3, "maximum": -1})");
  for (const char* ok : {"-1", "-3", "-2.5", "-1.5"}) EXPECT_TRUE(accepts(neg, ok)) << ok;
  for (const char* no : {"0", "-0.5", "-3.5", "-4"}) EXPECT_FALSE(accepts(neg, no)) << no;
}

TEST(JsonSchemaTest, PatternsMatchTheWholeString) {
  auto p = schema_nfa(R"({"type": "string", "pattern": "^[A-Z]{2}-\\d{3}(x|yz)?$"})");
  EXPECT_TRUE(accepts(p, R"("AB-123")"));
  EXPECT_TRUE(accepts(p, R"("AB-123yz")"));
  EXPECT_FALSE(accepts(p, R"("AB-12")"));
  EXPECT_FALSE(accepts(p, R"("ab-123")"));
  auto q = schema_nfa(R"({"type": "string", "pattern": "a\"b\\\\c[^a-z]"})");
  EXPECT_TRUE(accepts(q, R"("a\"b\\c7")"));
  EXPECT_FALSE(accepts(q, R"("a\"b\\cq")"));
  auto dot = schema_nfa(R"({"type": "string", "pattern": "^.{1,2}$"})");
  EXPECT_TRUE(accepts(dot, R"("é€")"));
  EXPECT_FALSE(accepts(dot, R"("\n")"));
}

TEST(JsonSchemaTest, UnsupportedKeywordsAreRefusedByName) {
  struct Case {
    const char* schema;
    const char* field;
  } cases[] = {
      {R"({"type": "integer", "multipleOf": 3})", "schema.multipleOf"},
      {R"({"type": "integer", "minimum": 5, "maximum": 4})", "schema"},
      {R"({"properties": {"a": {"oneOf": [{"type": "null"}]}}})", "schema.properties.a.oneOf"},
      {R"({"type": "string", "format": "email"})", "schema.format"},
      {R"({"type": "object", "required": ["x"]})", "schema.required"},
      {R"({"$ref": "other.json#/a"})", "schema.$ref"},
      {R"({"$ref": "#/$defs/missing"})", "schema.$ref"},
      {R"({"type": "string", "pattern": "(a)\\1"})", "schema.pattern"},
      {R"j({"type": "string", "pattern": "(?=a)"})j", "schema.pattern"},
      {R"({"type": "strin"})", "schema.type"},
      {R"({"type": "array", "items": [{"type": "null"}]})", "schema.items"},
  };
  for (const Case& c : cases) {
    auto r = compile_json_schema(ojson::parse(c.schema), "schema");
    ASSERT_FALSE(r.is_ok()) << c.schema;
    EXPECT_EQ(r.status().field(), c.field) << c.schema << ": " << r.status().message();
  }
  // Nothing satisfies it: refused, not silently unconstrained.
  auto none = compile_json_schema(ojson::parse(R"({"anyOf": [false]})"), "schema");
  EXPECT_FALSE(none.is_ok());
}

// A small byte-level vocabulary: every byte, and some multi-byte tokens.
std::shared_ptr<const Vocabulary> test_vocabulary() {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  for (const char* t :
       {"{\"", "\":", "\": ", "\",", "\"}", "true",  "false", "null",  "12",   "ab",
        "abc", "  ",  ", \"", "}\n", "\"a", "\"b\"", "é",     "abcab", "éé x", "ca"})
    bytes.push_back(t);
  bytes.push_back("<eos>");
  std::vector<bool> usable(bytes.size(), true);
  usable.back() = false;  // the special token
  const int32_t eos = static_cast<int32_t>(bytes.size()) - 1;
  return std::make_shared<Vocabulary>(bytes, usable, std::vector<int32_t>{eos}, 300);
}

bool bit(const std::vector<uint32_t>& m, int32_t id) { return (m[id >> 5] >> (id & 31)) & 1; }

// The cached masks (plain-text tokens taken by character count where a state treats every plain
// character alike, the rest walked) agree with advancing token by token, inside bounded and
// unbounded strings, keys, numbers and literals.
TEST(TokenMaskTest, MaskAgreesWithAdvanceForEveryToken) {
  auto vocab = test_vocabulary();
  struct Case {
    const char* schema;
    std::string doc;
  } cases[] = {
      {R"({"type": "object", "properties": {"a": {"type": "string", "maxLength": 4},
          "b": {"type": "boolean"}}, "required": ["a", "b"]})",
       R"({"a": "abé", "b": true})"},
      {R"({"type": "object", "properties": {"s": {"type": "string"}, "n": {"type": "number"}},
          "required": ["s", "n"]})",
       R"({"s": "abcé\"x  ab", "n": 12.5})"},
      {R"({"type": "string", "pattern": "^[a-c]{2,5}$"})", R"("abca")"},
  };
  for (const Case& c : cases) {
    auto nfa = schema_nfa(c.schema);
    CompiledGrammar g(nfa, vocab);
    int32_t state = g.start();
    std::vector<uint32_t> mask(static_cast<size_t>(vocab->mask_words()));
    for (size_t i = 0; i <= c.doc.size(); ++i) {
      g.fill_mask(state, kNoLimit, mask.data());
      for (int32_t id = 0; id < vocab->mask_size(); ++id) {
        const bool allowed = id < vocab->num_tokens() && !vocab->is_stop(id) &&
                             id != vocab->num_tokens() - 1 && g.advance(state, id) != kDead;
        const bool stop = vocab->is_stop(id) && g.accepting(state);
        EXPECT_EQ(bit(mask, id), allowed || stop)
            << c.doc << " at " << i << " token '"
            << (id < vocab->num_tokens() ? vocab->bytes(id) : "") << "'";
      }
      if (i < c.doc.size()) state = g.advance(state, static_cast<unsigned char>(c.doc[i]));
      ASSERT_NE(state, kDead) << c.doc << " at " << i;
    }
    EXPECT_TRUE(g.accepting(state));
    EXPECT_FALSE(g.open(state));  // nothing may follow the document but the stop token
    EXPECT_GT(g.stats().masks_built, 0);
  }
}

// Sampling uniformly among allowed tokens (the worst a model can do) under a token budget: every
// answer is a complete document within the budget.
TEST(TokenMaskTest, LengthBudgetClosesEveryDocument) {
  auto vocab = test_vocabulary();
  auto nfa = schema_nfa(R"({"type": "object", "properties": {"s": {"type": "string"},
      "xs": {"type": "array", "items": {"type": "number"}}, "o": {"type": "object"}},
      "required": ["s", "xs", "o"]})");
  auto g = std::make_shared<CompiledGrammar>(nfa, vocab);
  std::mt19937 rng(7);
  std::vector<uint32_t> mask(static_cast<size_t>(vocab->mask_words()));
  for (int trial = 0; trial < 200; ++trial) {
    const int budget = 40 + trial % 60;
    Matcher m(g);
    std::string text;
    int used = 0;
    for (; used < budget && !m.ended(); ++used) {
      m.fill_mask(budget - used, mask.data());
      std::vector<int32_t> allowed;
      for (int32_t id = 0; id < vocab->mask_size(); ++id)
        if (bit(mask, id)) allowed.push_back(id);
      ASSERT_FALSE(allowed.empty()) << text;
      const int32_t t = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
      ASSERT_TRUE(m.accept(t));
      if (!vocab->is_stop(t)) text += vocab->bytes(t);
    }
    EXPECT_TRUE(m.ended()) << "budget " << budget << ": " << text;
    EXPECT_TRUE(accepts(nfa, text)) << text;
    auto parsed = nlohmann::json::parse(text, nullptr, false);
    EXPECT_FALSE(parsed.is_discarded()) << text;
  }
}

TEST(TokenMaskTest, ForbiddenContinuationsAreMasked) {
  auto vocab = test_vocabulary();
  auto nfa = schema_nfa(R"({"type": "object", "properties": {"n": {"type": "integer"}},
      "required": ["n"]})");
  auto g = std::make_shared<CompiledGrammar>(nfa, vocab);
  Matcher m(g);
  for (char c : std::string(R"({"n": 1)")) ASSERT_TRUE(m.accept(static_cast<unsigned char>(c)));
  std::vector<uint32_t> mask(static_cast<size_t>(vocab->mask_words()));
  m.fill_mask(kNoLimit, mask.data());
  EXPECT_TRUE(bit(mask, '2'));
  EXPECT_TRUE(bit(mask, '}'));
  EXPECT_FALSE(bit(mask, '.'));  // integers have no fraction
  EXPECT_FALSE(bit(mask, 'a'));
  EXPECT_FALSE(bit(mask, ','));                   // no second property
  EXPECT_FALSE(bit(mask, vocab->stop_ids()[0]));  // not complete yet
  EXPECT_FALSE(m.accept('a'));
  ASSERT_TRUE(m.accept('}'));
  m.fill_mask(kNoLimit, mask.data());
  int allowed = 0;
  for (int32_t id = 0; id < vocab->mask_size(); ++id) allowed += bit(mask, id);
  EXPECT_EQ(allowed, 1);  // the stop token alone
  EXPECT_TRUE(m.accept(vocab->stop_ids()[0]));
  EXPECT_TRUE(m.ended());
}

// Memory bounds: a DFA stops growing at its state limit (what would need a new state leads
// nowhere), and the cache keeps at most its capacity, least recently used out.
TEST(GrammarLimitsTest, StatesAndCacheAreBounded) {
  auto nfa = schema_nfa(R"({"type": "string", "maxLength": 50})");
  Dfa small(nfa, 4);
  int32_t s = small.start();
  int steps = 0;
  for (char c : std::string("\"abcdefgh")) {
    s = small.next(s, static_cast<uint8_t>(c));
    if (s < 0) break;
    ++steps;
  }
  EXPECT_EQ(s, kDead);
  EXPECT_LE(small.num_states(), 4u);
  EXPECT_LT(steps, 5);
  GrammarCache cache(test_vocabulary(), /*capacity=*/2);
  auto build = [&]() -> Result<std::shared_ptr<const Nfa>> { return nfa; };
  for (const char* key : {"a", "b", "a", "c", "a", "b"}) ASSERT_TRUE(cache.get(key, build).is_ok());
  // a, b: misses; a: hit; c: miss (b out); a: hit; b: miss.
  EXPECT_EQ(cache.misses(), 4);
  EXPECT_EQ(cache.hits(), 2);
}

}  // namespace
}  // namespace hr::grammar
