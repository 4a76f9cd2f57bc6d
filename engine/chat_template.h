// Chat templates: built-in renderers for the common families, chosen from the chat_template in
// tokenizer_config.json (or by name with an override): Llama 3, ChatML (Qwen), Mistral, and the
// bundled model's own format. Pure functions; thread-safe.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"

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

}  // namespace hr::engine
