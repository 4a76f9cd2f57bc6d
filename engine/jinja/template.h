// A model's own chat template (Jinja, as in Hugging Face's tokenizer_config.json or
// chat_template.jinja), parsed once and rendered per request with `messages`, `tools`,
// `add_generation_prompt`, `bos_token`, `eos_token` and whatever else the caller passes. The
// language is that of @huggingface/jinja (lexer.h, parser.h, interpreter.h), against which
// renders are checked on real templates. Thread-safe: render() may run on many threads at once.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "engine/jinja/ast.h"

namespace hr::engine::jinja {

class Template {
 public:
  // kInvalidArgument (field chat_template) naming the line of a syntax error.
  [[nodiscard]] static Result<Template> parse(std::string_view source);

  // `context` is a JSON object of the template's variables. A template's own error
  // (raise_exception: "Conversation roles must alternate...", say) is kInvalidArgument with the
  // template's message (field messages); any other failure names the template line.
  [[nodiscard]] Result<std::string> render(const nlohmann::ordered_json& context) const;

 private:
  std::shared_ptr<const std::vector<NodePtr>> program_;
};

}  // namespace hr::engine::jinja
