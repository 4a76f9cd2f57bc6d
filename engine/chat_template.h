// Chat templates: the model's own (Jinja, engine/jinja/) from its folder, and built-in renderers
// for the common families (Llama 3, ChatML (Qwen), Mistral, the bundled model's format), used
// when the folder has none or when one is named with an override. Thread-safe.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/jinja/template.h"
#include "engine/tool_calls.h"

namespace hr::engine {

enum class ChatFormat { kHeadroom, kLlama3, kChatMl, kMistral };

struct ChatMessage {
  std::string role;  // system, user, assistant
  std::string content;
};

// Picks the format from a Jinja chat_template's markers, or from `override_name` when given
// ("headroom", "llama3", "chatml", "mistral"). Unknown: an error naming the override option.
[[nodiscard]] Result<ChatFormat> detect_chat_format(const std::string& chat_template,
                                                    const std::string& override_name = "");
// Reads the chat_template from dir/tokenizer_config.json and detects its format.
[[nodiscard]] Result<ChatFormat> load_chat_format(const std::string& dir,
                                                  const std::string& override_name = "");

// Renders the conversation followed by the assistant's generation prompt. Special tokens are
// written as text; the tokenizer turns them into their ids.
[[nodiscard]] Result<std::string> render_chat(ChatFormat format,
                                              const std::vector<ChatMessage>& messages,
                                              const std::string& bos, const std::string& eos);

// A model's chat template: its own when its folder has one, else a built-in format.
class ChatTemplate {
 public:
  // dir/chat_template.jinja, else the chat_template of dir/tokenizer_config.json (a string, or
  // the entry named "default" of a list). With `override_name` ("headroom", "llama3", "chatml",
  // "mistral"), that built-in format instead. kInvalidArgument (field chat-template) for a folder
  // with no template and no override, or a template that does not parse (naming its line).
  [[nodiscard]] static Result<ChatTemplate> load(const std::string& dir,
                                                 const std::string& override_name = "");
  static ChatTemplate builtin(ChatFormat format);

  // The conversation and the assistant's generation prompt, as text (special tokens written as
  // text). The model's own template gets messages, add_generation_prompt, bos_token and
  // eos_token; what it refuses (raise_exception) is kInvalidArgument with its message.
  [[nodiscard]] Result<std::string> render(const std::vector<ChatMessage>& messages,
                                           const std::string& bos, const std::string& eos) const;
  // The same with messages as Hugging Face passes them ([{role, content, tool_calls?,
  // tool_call_id?}]) and `tools` (null, or OpenAI's function list). Only the model's own template
  // takes tools or tool messages: a built-in format refuses them (field tools).
  [[nodiscard]] Result<std::string> render(const nlohmann::ordered_json& messages,
                                           const nlohmann::ordered_json& tools,
                                           const std::string& bos, const std::string& eos) const;
  // Whether this is the model's own template (else a built-in format).
  bool is_models_own() const { return jinja_.has_value(); }
  // How the model writes tool calls (from its own template's markers; kNone for the built-ins).
  ToolCallFormat tool_call_format() const { return tool_calls_; }

 private:
  std::optional<jinja::Template> jinja_;
  ChatFormat format_ = ChatFormat::kHeadroom;
  ToolCallFormat tool_calls_ = ToolCallFormat::kNone;
};

}  // namespace hr::engine
