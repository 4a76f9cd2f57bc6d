// Constrained answers (structured output) through the engine, for the backend tests: n of the
// bundled model's reference prompts (ref: its reference.json), each answering a small JSON schema
// ({"name": a string of at most 6, "n": 0 to 999}) over the byte-level vocabulary, sampled with a
// seed per request; and the check that an answer is such a document.
#pragma once

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "engine/backend.h"
#include "engine/engine.h"
#include "grammar/compiled_grammar.h"
#include "grammar/json_schema.h"
#include "grammar/vocabulary.h"

namespace hr::engine {

struct ConstrainedRun {
  std::vector<std::string> text;
  std::vector<std::vector<int32_t>> tokens;
};

inline ConstrainedRun constrained_answers(const nlohmann::json& ref,
                                          std::shared_ptr<Backend> backend, bool pipeline, int n,
                                          bool constrain_odd_only, bool constrain_none = false,
                                          float temperature = 0.7f, int max_num_seqs = 64) {
  std::vector<std::string> bytes;
  for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
  for (const char* special : {"<s>", "</s>", "<|user|>", "<|assistant|>"}) bytes.push_back(special);
  std::vector<bool> usable(bytes.size(), true);
  for (int id = 256; id < 260; ++id) usable[static_cast<size_t>(id)] = false;
  auto vocab = std::make_shared<grammar::Vocabulary>(bytes, usable, std::vector<int32_t>{257},
                                                     backend->vocab_size());
  auto nfa = grammar::compile_json_schema(
      nlohmann::ordered_json::parse(
          R"({"type":"object","properties":{"name":{"type":"string","maxLength":6},)"
          R"("n":{"type":"integer","minimum":0,"maximum":999}},"required":["name","n"],)"
          R"("additionalProperties":false})"),
      "schema");
  EXPECT_TRUE(nfa.is_ok());
  auto grammar = std::make_shared<grammar::CompiledGrammar>(nfa.value(), vocab);
  EngineOptions eo;
  eo.pipeline = pipeline;
  eo.scheduler.max_num_seqs = max_num_seqs;
  auto engine = Engine::create(std::move(backend), nullptr, 512, eo);
  EXPECT_TRUE(engine.is_ok());
  ConstrainedRun out;
  out.text.resize(static_cast<size_t>(n));
  out.tokens.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    GenerationRequest r;
    r.prompt = ref["cases"][i]["prompt_ids"].get<std::vector<int32_t>>();
    r.params.temperature = temperature;
    r.params.seed = static_cast<uint64_t>(i) + 1;
    r.params.max_tokens = 40;
    if (!constrain_none && (!constrain_odd_only || i % 2 == 1))
      r.constraint = grammar;  // (ends at its stop token once the document is complete)
    else
      r.params.ignore_eos = true;
    r.on_event = [&out, i](const TokenEvent& ev) {
      if (ev.token < 0) return;
      out.tokens[static_cast<size_t>(i)].push_back(ev.token);
      if (ev.token < 256) out.text[static_cast<size_t>(i)] += static_cast<char>(ev.token);
    };
    EXPECT_TRUE((*engine)->add(std::move(r)).is_ok());
  }
  while ((*engine)->has_work()) EXPECT_TRUE((*engine)->step().is_ok());
  return out;
}

inline void expect_valid_document(const std::string& text, const std::string& what) {
  auto doc = nlohmann::json::parse(text, nullptr, false);
  ASSERT_FALSE(doc.is_discarded()) << what << ": " << text;
  ASSERT_TRUE(doc.is_object()) << what << ": " << text;
  EXPECT_EQ(doc.size(), 2u) << what << ": " << text;
  ASSERT_TRUE(doc.contains("name") && doc["name"].is_string()) << what << ": " << text;
  EXPECT_LE(doc["name"].get<std::string>().size(), 6u) << what << ": " << text;
  ASSERT_TRUE(doc.contains("n") && doc["n"].is_number_integer()) << what << ": " << text;
  EXPECT_LE(doc["n"].get<int>(), 999) << what << ": " << text;
}

}  // namespace hr::engine
