// Parsing JSON text from outside.
#include "wire/json_text.h"

namespace hr::wire {

nlohmann::json parse_client_json(std::string_view text, std::string* why) {
  auto refuse = [&](const char* reason) {
    if (why) *why = reason;
    return nlohmann::json(nlohmann::json::value_t::discarded);
  };
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '"') {
        in_string = false;
      } else if (c == '\\') {
        if (text.substr(i + 1, 5) == "u0000") return refuse("holds a NUL character (\\u0000)");
        ++i;  // the escaped character
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return refuse("nests deeper than 64 levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return refuse("is not valid JSON");
  return j;
}

}  // namespace hr::wire
