// The engine's request from the chat request.
#include "workers/generation_request.h"

#include <algorithm>
#include <string>
#include <vector>

#include "base/ids.h"
#include "engine/tool_call_grammar.h"
#include "grammar/json_schema.h"

namespace hr::workers {

const std::string& TokenBytes::of(int32_t id) {
  const size_t i = static_cast<size_t>(id);
  if (i >= bytes_.size()) {
    bytes_.resize(i + 1);
    known_.resize(i + 1, false);
  }
  if (!known_[i]) {
    bytes_[i] = tok_->token_bytes(id);
    known_[i] = true;
  }
  return bytes_[i];
}

namespace {

// The conversation as Hugging Face passes it to a template: tool calls with their arguments as
// objects, tool results with the call they answer.
nlohmann::ordered_json template_messages(const wire::ChatRequest& req) {
  using ojson = nlohmann::ordered_json;
  ojson out = ojson::array();
  if (req.prompt) {
    out.push_back({{"role", "user"}, {"content", *req.prompt}});
    return out;
  }
  for (const wire::ChatMessage& m : req.messages) {
    ojson msg = {{"role", m.role}, {"content", m.content}};
    if (!m.tool_calls.empty()) {
      ojson calls = ojson::array();
      for (const wire::ToolCall& c : m.tool_calls) {
        ojson args = ojson::parse(c.arguments, nullptr, false);
        calls.push_back(
            {{"id", c.id},
             {"type", "function"},
             {"function",
              {{"name", c.name}, {"arguments", args.is_discarded() ? ojson::object() : args}}}});
      }
      msg["tool_calls"] = std::move(calls);
    }
    if (m.tool_call_id) msg["tool_call_id"] = *m.tool_call_id;
    out.push_back(std::move(msg));
  }
  return out;
}

// The tools as OpenAI lists them, or null when none are offered.
nlohmann::ordered_json template_tools(const wire::ChatRequest& req) {
  using ojson = nlohmann::ordered_json;
  if (req.tools.empty() || req.tool_choice == "none") return nullptr;
  ojson tools = ojson::array();
  for (const wire::Tool& t : req.tools) {
    ojson fn = {{"name", t.name}};
    if (!t.description.empty()) fn["description"] = t.description;
    if (!t.parameters.empty()) fn["parameters"] = ojson::parse(t.parameters, nullptr, false);
    tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
  }
  return tools;
}

// The answer's constraint: calls to the tools (tool_choice required or a function), a JSON object
// or a document of the response_format's schema; null for free text.
Result<std::shared_ptr<grammar::CompiledGrammar>> constraint_of(const wire::ChatRequest& req,
                                                                const LoadedModel& m) {
  if (!m.grammars) return std::shared_ptr<grammar::CompiledGrammar>();
  if (req.tool_choice == "required" || req.tool_choice == "function") {
    std::vector<engine::ToolSchema> tools;
    for (const wire::Tool& t : req.tools) {
      if (req.tool_choice == "required" || t.name == req.tool_choice_function)
        tools.push_back({t.name, t.parameters});
    }
    const engine::ToolCallFormat format = m.chat_template.tool_call_format();
    const bool parallel = req.tool_choice == "required" && req.parallel_tool_calls;
    std::string key = std::string("tools\x1f") + engine::tool_call_format_name(format) +
                      (parallel ? "\x1fparallel" : "\x1fone");
    for (const engine::ToolSchema& t : tools) key += "\x1f" + t.name + "\x1f" + t.parameters;
    return m.grammars->get(key, [&] { return engine::tool_call_grammar(format, tools, parallel); });
  }
  using Type = wire::ResponseFormat::Type;
  if (req.response_format.type == Type::kJsonObject) {
    return m.grammars->get("json_object", []() -> Result<std::shared_ptr<const grammar::Nfa>> {
      return grammar::compile_json_object();
    });
  }
  if (req.response_format.type == Type::kJsonSchema) {
    const std::string& text = req.response_format.schema;
    return m.grammars->get(
        "json_schema\x1f" + text, [&]() -> Result<std::shared_ptr<const grammar::Nfa>> {
          auto schema = nlohmann::ordered_json::parse(text, nullptr, false);
          if (schema.is_discarded())
            return invalid_argument("the schema is not valid JSON",
                                    "response_format.json_schema.schema");
          return grammar::compile_json_schema(schema, "response_format.json_schema.schema");
        });
  }
  return std::shared_ptr<grammar::CompiledGrammar>();
}

}  // namespace

std::shared_ptr<const grammar::Vocabulary> constraint_vocabulary(const engine::Tokenizer& tok,
                                                                 int logits_width) {
  std::vector<std::string> bytes(static_cast<size_t>(tok.vocab_size()));
  std::vector<bool> usable(bytes.size());
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    bytes[static_cast<size_t>(id)] = tok.token_bytes(id);
    usable[static_cast<size_t>(id)] = !tok.is_special(id);
  }
  return std::make_shared<grammar::Vocabulary>(std::move(bytes), usable, tok.eos_ids(),
                                               logits_width);
}

Result<engine::GenerationRequest> to_generation(const wire::ChatRequest& req, const LoadedModel& m,
                                                engine::RequestClass cls) {
  HR_ASSIGN_OR_RETURN(std::string text,
                      m.chat_template.render(template_messages(req), template_tools(req),
                                             m.tokenizer->bos_text(), m.tokenizer->eos_text()));
  engine::GenerationRequest r;
  r.prompt = m.tokenizer->encode(text);
  r.cls = cls;
  r.params.max_tokens = req.max_tokens;
  r.params.temperature = static_cast<float>(req.temperature.value_or(0.6));
  r.params.top_p = static_cast<float>(req.top_p.value_or(1.0));
  r.params.top_k = req.top_k.value_or(0);
  r.params.penalties = {static_cast<float>(req.frequency_penalty.value_or(0.0)),
                        static_cast<float>(req.presence_penalty.value_or(0.0)),
                        static_cast<float>(req.repetition_penalty.value_or(1.0))};
  if (req.logprobs) r.params.logprobs = req.top_logprobs;
  for (const auto& [id, bias] : req.logit_bias) {
    if (id < 0 || id >= m.config.vocab_size) {
      const std::string key = std::to_string(id);
      return invalid_argument("logit_bias names token " + key + "; the model's vocabulary has " +
                                  std::to_string(m.config.vocab_size) + " tokens",
                              "logit_bias." + key);
    }
    r.params.logit_bias.push_back({static_cast<int32_t>(id), static_cast<float>(bias)});
  }
  if (req.seed) r.params.seed = *req.seed;
  if (req.stop) r.params.stop = *req.stop;
  HR_ASSIGN_OR_RETURN(r.constraint, constraint_of(req, m));
  return r;
}

std::optional<wire::TokenLogprob> token_logprob(TokenBytes& bytes, const engine::TokenEvent& ev) {
  if (!ev.logprobs || ev.token < 0) return std::nullopt;
  wire::TokenLogprob t;
  t.bytes = bytes.of(ev.token);
  t.logprob = ev.logprobs->logprob;
  t.top.reserve(static_cast<size_t>(ev.logprobs->num_top));
  for (int i = 0; i < ev.logprobs->num_top; ++i) {
    t.top.push_back({bytes.of(ev.logprobs->top_ids[i]), ev.logprobs->top_logprobs[i]});
  }
  return t;
}

engine::ToolCallFormat offered_tool_calls(const wire::ChatRequest& req, const LoadedModel& m) {
  if (req.tools.empty() || req.tool_choice == "none") return engine::ToolCallFormat::kNone;
  if (req.tool_choice == "required" || req.tool_choice == "function")
    return engine::constrained_call_format(m.chat_template.tool_call_format());
  return m.chat_template.tool_call_format();
}

std::string new_call_id() {
  std::string id = new_uuid_v4().to_string();
  id.erase(std::remove(id.begin(), id.end(), '-'), id.end());
  return "call_" + id.substr(0, 24);
}

void extract_tool_calls(engine::ToolCallFormat format, wire::Answer* answer) {
  if (format == engine::ToolCallFormat::kNone) return;
  engine::ParsedAnswer parsed = engine::parse_tool_calls(format, answer->text);
  if (parsed.calls.empty()) return;
  answer->text = std::move(parsed.text);
  for (engine::ParsedCall& c : parsed.calls)
    answer->tool_calls.push_back({new_call_id(), std::move(c.name), std::move(c.arguments)});
  answer->finish_reason = "tool_calls";
}

}  // namespace hr::workers
