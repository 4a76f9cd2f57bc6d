// Incremental reading of tool calls.
#include "engine/tool_call_stream.h"

#include <nlohmann/json.hpp>

#include <optional>

namespace hr::engine {

namespace {

size_t skip_ws(const std::string& s, size_t i) {
  while (i < s.size() && (s[i] == ' ' || s[i] == '\n' || s[i] == '\t' || s[i] == '\r')) ++i;
  return i;
}

// The end of the JSON string starting at s[i] == '"' (past its closing quote), or npos when it
// is not complete yet.
size_t string_end(const std::string& s, size_t i) {
  for (size_t k = i + 1; k < s.size(); ++k) {
    if (s[k] == '\\') {
      ++k;
    } else if (s[k] == '"') {
      return k + 1;
    }
  }
  return std::string::npos;
}

// The end of the JSON value starting at s[i] (past it), or npos when it is not complete yet. A
// scalar ends where a delimiter follows it.
size_t value_end(const std::string& s, size_t i) {
  if (i >= s.size()) return std::string::npos;
  if (s[i] == '"') return string_end(s, i);
  if (s[i] == '{' || s[i] == '[') {
    int depth = 0;
    for (size_t k = i; k < s.size(); ++k) {
      const char c = s[k];
      if (c == '"') {
        const size_t e = string_end(s, k);
        if (e == std::string::npos) return std::string::npos;
        k = e - 1;
      } else if (c == '{' || c == '[') {
        ++depth;
      } else if (c == '}' || c == ']') {
        if (--depth == 0) return k + 1;
      }
    }
    return std::string::npos;
  }
  for (size_t k = i; k < s.size(); ++k) {
    const char c = s[k];
    if (c == ',' || c == '}' || c == ']' || c == ' ' || c == '\n' || c == '\t' || c == '\r')
      return k;
  }
  return std::string::npos;
}

struct ObjectHead {
  std::optional<std::string> name;
  std::optional<size_t> args;  // where the arguments' value begins (after the name)
  bool args_first = false;     // the arguments came before the name: not streamed
  bool broken = false;         // not a call object
};

// Reads a call object's members from s[i] == '{' up to its arguments' value.
ObjectHead object_head(const std::string& s, size_t i, const char* args_key) {
  ObjectHead h;
  size_t k = skip_ws(s, i + 1);
  while (k < s.size()) {
    if (s[k] != '"') {
      h.broken = s[k] != '}';
      return h;
    }
    const size_t key_end = string_end(s, k);
    if (key_end == std::string::npos) return h;
    const auto parsed_key = nlohmann::json::parse(s.substr(k, key_end - k), nullptr, false);
    if (!parsed_key.is_string()) {  // a bad escape: not a call this stream can read
      h.broken = true;
      return h;
    }
    const std::string key = parsed_key.get<std::string>();
    k = skip_ws(s, key_end);
    if (k >= s.size()) return h;
    if (s[k] != ':') {
      h.broken = true;
      return h;
    }
    k = skip_ws(s, k + 1);
    if (k >= s.size()) return h;
    if (key == args_key) {
      if (!h.name) h.args_first = true;
      h.args = k;
      return h;
    }
    const size_t end = value_end(s, k);
    if (end == std::string::npos) return h;
    if (key == "name") {
      auto v = nlohmann::json::parse(s.substr(k, end - k), nullptr, false);
      if (!v.is_string()) {
        h.broken = true;
        return h;
      }
      h.name = v.get<std::string>();
    }
    k = skip_ws(s, end);
    if (k < s.size() && s[k] == ',') k = skip_ws(s, k + 1);
  }
  return h;
}

// How much of `s` from `from` may go out as arguments ending at `marker`: up to the marker when
// it is there (and then `done`), else all but what could be the marker's start.
size_t raw_safe_end(const std::string& s, size_t from, const std::string& marker, bool* done) {
  const size_t at = s.find(marker, from);
  if (at != std::string::npos) {
    *done = true;
    return at;
  }
  size_t keep = 0;
  for (size_t k = std::min(marker.size() - 1, s.size() - from); k > 0; --k) {
    if (s.compare(s.size() - k, k, marker, 0, k) == 0) {
      keep = k;
      break;
    }
  }
  return s.size() - keep;
}

}  // namespace

bool ToolCallStream::start_next(const std::string& text, std::vector<CallPiece>* out) {
  const int index = static_cast<int>(calls_.size());
  auto begin_call = [&](const std::string& name, size_t args_begin, std::string end_marker,
                        size_t object_begin = std::string::npos) {
    Call c;
    c.object_begin = object_begin;
    c.args_begin = args_begin;
    c.sent = args_begin;
    c.end_marker = std::move(end_marker);
    calls_.push_back(c);
    out->push_back({index, true, name, ""});
    return true;
  };
  // Raw sections: a name in a header, arguments up to an end marker.
  if (format_ == ToolCallFormat::kDeepSeek || format_ == ToolCallFormat::kKimi) {
    const bool ds = format_ == ToolCallFormat::kDeepSeek;
    const std::string open = ds ? "<｜tool▁call▁begin｜>" : "<|tool_call_begin|>";
    const size_t o = text.find(open, pos_);
    if (o == std::string::npos) return false;
    size_t h = o + open.size();
    std::string name;
    size_t args = std::string::npos;
    if (ds) {
      const std::string sep = "<｜tool▁sep｜>";
      const size_t s = text.find(sep, h);
      if (s == std::string::npos) return false;
      const size_t nl = text.find('\n', s + sep.size());
      if (nl == std::string::npos) return false;
      name = text.substr(s + sep.size(), nl - s - sep.size());
      const std::string fence = "```json\n";
      size_t f = skip_ws(text, nl + 1);
      if (text.size() < f + fence.size()) return false;
      args = text.compare(f, fence.size(), fence) == 0 ? f + fence.size() : nl + 1;
      return begin_call(name, args, "```");
    }
    const std::string arg_marker = "<|tool_call_argument_begin|>";
    const size_t a = text.find(arg_marker, h);
    if (a == std::string::npos) return false;
    std::string id = text.substr(h, a - h);  // functions.NAME:INDEX
    if (id.rfind("functions.", 0) == 0) id = id.substr(10);
    const size_t colon = id.rfind(':');
    name = colon == std::string::npos ? id : id.substr(0, colon);
    return begin_call(name, a + arg_marker.size(), "<|tool_call_end|>");
  }
  // JSON objects: find where the next one starts.
  const char* args_key = format_ == ToolCallFormat::kLlama3 ? "parameters" : "arguments";
  size_t at = std::string::npos;
  if (format_ == ToolCallFormat::kHermes) {
    const size_t o = text.find("<tool_call>", pos_);
    if (o == std::string::npos) return false;
    at = skip_ws(text, o + 11);
  } else if (format_ == ToolCallFormat::kMistral || format_ == ToolCallFormat::kLlama3) {
    // After a call, the next one starts past the end of its object.
    if (!calls_.empty()) {
      const size_t e = value_end(text, calls_.back().object_begin);
      if (e == std::string::npos) return false;
      pos_ = e;
    }
    const bool mistral = format_ == ToolCallFormat::kMistral;
    if (mistral && !opened_) {
      const size_t o = text.find("[TOOL_CALLS]", pos_);
      if (o == std::string::npos) return false;
      const size_t k = skip_ws(text, o + 12);
      if (k >= text.size()) return false;
      pos_ = text[k] == '[' ? k + 1 : k;
      opened_ = true;
    }
    size_t k = skip_ws(text, pos_);
    if (!mistral && calls_.empty() && text.compare(k, 14, "<|python_tag|>") == 0)
      k = skip_ws(text, k + 14);
    if (k < text.size() && text[k] == (mistral ? ',' : ';')) k = skip_ws(text, k + 1);
    at = k;
  } else {
    return false;
  }
  if (at >= text.size() || text[at] != '{') return false;
  const ObjectHead head = object_head(text, at, args_key);
  if (head.broken || head.args_first) {
    pos_ = text.size() + 1;  // not streamable: the rest is read at the end
    return false;
  }
  if (!head.name || !head.args || text[*head.args] != '{') {
    if (head.args && text[*head.args] != '{') pos_ = text.size() + 1;
    return false;
  }
  return begin_call(*head.name, *head.args, "", at);
}

std::vector<CallPiece> ToolCallStream::update(const std::string& text) {
  std::vector<CallPiece> out;
  for (;;) {
    if (!calls_.empty() && !calls_.back().done) {
      Call& c = calls_.back();
      const int index = static_cast<int>(calls_.size()) - 1;
      size_t end;
      if (c.end_marker.empty()) {
        const size_t e = value_end(text, c.args_begin);
        c.done = e != std::string::npos;
        end = c.done ? e : text.size();
        // Inside an unfinished value, hold back nothing: every byte up to here is arguments.
      } else {
        end = raw_safe_end(text, c.sent, c.end_marker, &c.done);
        // Whitespace may be what precedes the end marker (DeepSeek's "\n```"): it goes out only
        // once more arguments follow it, and never at the end.
        while (end > c.sent && (text[end - 1] == '\n' || text[end - 1] == ' ' ||
                                text[end - 1] == '\t' || text[end - 1] == '\r'))
          --end;
      }
      if (end > c.sent) {
        out.push_back({index, false, "", text.substr(c.sent, end - c.sent)});
        c.sent = end;
      }
      if (!c.done) return out;
      pos_ = c.end_marker.empty() ? end : text.find(c.end_marker, end) + c.end_marker.size();
    }
    if (!start_next(text, &out)) return out;
  }
}

}  // namespace hr::engine
