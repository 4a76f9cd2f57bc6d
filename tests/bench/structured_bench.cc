// Structured-output benchmark. Two measurements, each printing one JSON line:
//   --masks TOKENIZER_DIR: compile time of typical schemas, and the time to fill one sequence's
//     token mask per step over that tokenizer's vocabulary (Llama 3's: 128,256 tokens), first
//     visits (the state's mask built) and steady state (cached), p50 and p99, while answers are
//     drawn uniformly from the allowed tokens (the widest walk through each schema).
//   --decode MODEL_DIR: decode tokens/s on the CPU backend at batch 1 and 32, free text and
//     constrained to a JSON Schema, and the constrained / free ratio.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cpu_backend.h"
#include "engine/engine.h"
#include "engine/tokenizer.h"
#include "engine/weights.h"
#include "grammar/json_schema.h"
#include "grammar/matcher.h"
#include "workers/loaded_model.h"

using Clock = std::chrono::steady_clock;
using ojson = nlohmann::ordered_json;
namespace g = hr::grammar;

namespace {

double us_since(Clock::time_point t) {
  return std::chrono::duration<double, std::micro>(Clock::now() - t).count();
}

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

const char* kSchemas[] = {
    R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
        "email": {"type": "string", "maxLength": 64}}, "required": ["name", "age"],
        "additionalProperties": false})",
    R"({"type": "object", "properties": {"order_id": {"type": "string", "pattern": "^[A-Z]{3}-\\d{6}$"},
        "items": {"type": "array", "minItems": 1, "maxItems": 20, "items": {"type": "object",
        "properties": {"sku": {"type": "string"}, "qty": {"type": "integer"}, "price": {"type": "number"}},
        "required": ["sku", "qty", "price"], "additionalProperties": false}},
        "status": {"enum": ["pending", "paid", "shipped", "cancelled"]}},
        "required": ["order_id", "items", "status"], "additionalProperties": false})",
    R"({"type": "object", "properties": {"title": {"type": "string"}, "date": {"type": "string"},
        "location": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "participants": {"type": "array", "items": {"type": "string"}},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 20}, "maxItems": 5}},
        "required": ["title", "date", "participants"], "additionalProperties": false})",
    R"({"$defs": {"node": {"type": "object", "properties": {"value": {"type": "integer"},
        "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["value"],
        "additionalProperties": false}}, "$ref": "#/$defs/node"})",
    R"({"type": "object", "properties": {"reasoning": {"type": "string"}, "answer":
        {"type": "number"}, "confidence": {"enum": ["low", "medium", "high"]}},
        "required": ["reasoning", "answer", "confidence"], "additionalProperties": false})",
};

int masks(const std::string& tokenizer_dir) {
  auto tok = hr::engine::Tokenizer::load(tokenizer_dir);
  if (!tok.is_ok()) {
    std::fprintf(stderr, "%s\n", tok.status().message().c_str());
    return 1;
  }
  auto vocab = hr::workers::constraint_vocabulary(*tok.value(), tok.value()->vocab_size());
  std::vector<double> compile_ms, cold, warm, limited;
  std::vector<uint32_t> mask(static_cast<size_t>(vocab->mask_words()));
  for (const char* text : kSchemas) {
    const ojson schema = ojson::parse(text);
    auto t0 = Clock::now();
    auto nfa = g::compile_json_schema(schema, "schema");
    compile_ms.push_back(us_since(t0) / 1000.0);
    if (!nfa.is_ok()) {
      std::fprintf(stderr, "%s\n", nfa.status().message().c_str());
      return 1;
    }
    auto compiled = std::make_shared<g::CompiledGrammar>(nfa.value(), vocab);
    // Pass 0 builds masks as states are first reached; pass 1 replays the same answers (cached).
    for (int pass = 0; pass < 2; ++pass) {
      for (int seq = 0; seq < 8; ++seq) {
        std::mt19937 rng(static_cast<unsigned>(seq));
        g::Matcher m(compiled);
        for (int step = 0; step < 256 && !m.ended(); ++step) {
          const g::CompiledGrammar::Stats before = compiled->stats();
          auto t = Clock::now();
          m.fill_mask(256 - step, mask.data());
          const double us = us_since(t);
          const g::CompiledGrammar::Stats after = compiled->stats();
          (after.masks_built != before.masks_built ? cold : warm).push_back(us);
          if (after.masks_built == before.masks_built &&
              after.masks_limited != before.masks_limited)
            limited.push_back(us);
          std::vector<int32_t> allowed;
          for (int32_t id = 0; id < vocab->mask_size(); ++id)
            if ((mask[static_cast<size_t>(id) >> 5] >> (id & 31)) & 1u) allowed.push_back(id);
          if (allowed.empty()) break;
          m.accept(allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)]);
        }
      }
    }
  }
  nlohmann::json out = {{"vocab", vocab->num_tokens()},
                        {"compile_ms_max", pct(compile_ms, 1.0)},
                        {"compile_ms_p50", pct(compile_ms, 0.5)},
                        {"mask_us_p50", pct(warm, 0.5)},
                        {"mask_us_p99", pct(warm, 0.99)},
                        {"mask_steps", warm.size()},
                        {"near_budget_mask_us_p50", pct(limited, 0.5)},
                        {"near_budget_mask_us_p99", pct(limited, 0.99)},
                        {"near_budget_steps", limited.size()},
                        {"first_visit_mask_us_p50", pct(cold, 0.5)},
                        {"first_visit_mask_us_p99", pct(cold, 0.99)},
                        {"first_visit_steps", cold.size()}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

// Tokens per second generating `batch` answers of up to `max_tokens`, constrained or not.
double decode_tps(const std::string& model_dir, int batch, bool constrained) {
  using namespace hr::engine;
  static std::shared_ptr<const ModelWeights> weights;
  static std::shared_ptr<const Tokenizer> tok;
  if (!weights) {
    ModelWeights w = load_weights(model_dir).value();
    pack_for_cpu(&w);
    weights = std::make_shared<const ModelWeights>(std::move(w));
    tok = std::shared_ptr<const Tokenizer>(Tokenizer::load(model_dir).value().release());
  }
  CpuBackendOptions bo;
  bo.kv_cache_bytes = 512ull << 20;
  auto backend = std::shared_ptr<Backend>(CpuBackend::create(weights, bo).value());
  EngineOptions eo;
  eo.scheduler.max_num_seqs = 64;
  auto eng = Engine::create(backend, tok, weights->config.max_position_embeddings, eo).value();
  auto vocab = hr::workers::constraint_vocabulary(*tok, weights->config.vocab_size);
  // One long string: with its length budget, every answer is constrained for all of max_tokens
  // and ends at it, as the free ones do.
  auto nfa = g::compile_json_schema(ojson::parse(R"({"type": "string"})"), "schema");
  auto compiled = std::make_shared<g::CompiledGrammar>(nfa.value(), vocab);
  const int max_tokens = 64;
  int generated = 0;
  for (int i = 0; i < batch; ++i) {
    GenerationRequest r;
    r.prompt = tok->encode("reverse: structured output");
    r.params.temperature = 1.0f;
    r.params.seed = static_cast<uint64_t>(i);
    r.params.max_tokens = max_tokens;
    r.params.ignore_eos = !constrained;
    if (constrained) r.constraint = compiled;
    r.on_event = [&](const TokenEvent& ev) { generated += ev.token >= 0 ? 1 : 0; };
    (void)eng->add(std::move(r)).value();
  }
  // Prefill first, then time the decode steps alone.
  while (eng->has_work() && generated < batch) (void)eng->step().value();
  const int start = generated;
  auto t0 = Clock::now();
  while (eng->has_work()) (void)eng->step().value();
  const double tps = (generated - start) / (us_since(t0) / 1e6);
  std::fprintf(stderr, "batch %d %s: %d decode tokens, %.1f tokens/s\n", batch,
               constrained ? "constrained" : "free", generated - start, tps);
  return tps;
}

int decode(const std::string& model_dir) {
  nlohmann::json out;
  for (int batch : {1, 32}) {
    // Alternating runs, the best of two each: the first run also warms the machine up.
    double free_tps = 0, json_tps = 0;
    for (int round = 0; round < 2; ++round) {
      free_tps = std::max(free_tps, decode_tps(model_dir, batch, false));
      json_tps = std::max(json_tps, decode_tps(model_dir, batch, true));
    }
    const std::string b = "batch" + std::to_string(batch);
    out[b + "_free_tps"] = free_tps;
    out[b + "_constrained_tps"] = json_tps;
    out[b + "_constrained_over_free"] = json_tps / free_tps;
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "--masks") return masks(argv[2]);
  if (argc == 3 && std::string(argv[1]) == "--decode") return decode(argv[2]);
  std::fprintf(stderr, "usage: %s --masks TOKENIZER_DIR | --decode MODEL_DIR\n", argv[0]);
  return 2;
}
