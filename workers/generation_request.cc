// The engine's request from the chat request.
#include "workers/generation_request.h"

#include <string>
#include <vector>

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

Result<engine::GenerationRequest> to_generation(const wire::ChatRequest& req, const LoadedModel& m,
                                                engine::RequestClass cls) {
  std::vector<engine::ChatMessage> messages;
  if (req.prompt) {
    messages.push_back({"user", *req.prompt});
  } else {
    for (const wire::ChatMessage& msg : req.messages) messages.push_back({msg.role, msg.content});
  }
  HR_ASSIGN_OR_RETURN(std::string text, m.chat_template.render(messages, m.tokenizer->bos_text(),
                                                               m.tokenizer->eos_text()));
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

}  // namespace hr::workers
