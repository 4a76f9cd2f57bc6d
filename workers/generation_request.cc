// The engine's request from the chat request.
#include "workers/generation_request.h"

#include <algorithm>
#include <string>
#include <vector>

#include "base/ids.h"

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

}  // namespace

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
  return m.chat_template.tool_call_format();
}

void extract_tool_calls(engine::ToolCallFormat format, wire::Answer* answer) {
  if (format == engine::ToolCallFormat::kNone) return;
  engine::ParsedAnswer parsed = engine::parse_tool_calls(format, answer->text);
  if (parsed.calls.empty()) return;
  answer->text = std::move(parsed.text);
  for (engine::ParsedCall& c : parsed.calls) {
    std::string id = new_uuid_v4().to_string();
    id.erase(std::remove(id.begin(), id.end(), '-'), id.end());
    answer->tool_calls.push_back(
        {"call_" + id.substr(0, 24), std::move(c.name), std::move(c.arguments)});
  }
  answer->finish_reason = "tool_calls";
}

}  // namespace hr::workers
