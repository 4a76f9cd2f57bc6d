// Tool calls in a model's output.
#include "engine/tool_calls.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <vector>

#include "base/strings.h"

namespace hr::engine {
namespace {

using nlohmann::json;

std::string trim(const std::string& s) { return std::string(hr::trim(s)); }

// {"name": string, "<args_key>": object or JSON text of one} → a call.
bool call_of(const json& j, const char* args_key, ParsedCall* out) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return false;
  json args = j.contains(args_key) ? j[args_key] : json::object();
  if (args.is_string()) args = json::parse(args.get<std::string>(), nullptr, false);
  if (!args.is_object()) return false;
  out->name = j["name"].get<std::string>();
  out->arguments = args.dump();
  return true;
}

ParsedAnswer hermes(const std::string& answer) {
  ParsedAnswer out;
  std::string text;
  size_t pos = 0;
  while (true) {
    const size_t open = answer.find("<tool_call>", pos);
    if (open == std::string::npos) break;
    const size_t body = open + 11;
    const size_t close = answer.find("</tool_call>", body);
    const std::string inside =
        answer.substr(body, close == std::string::npos ? std::string::npos : close - body);
    ParsedCall call;
    if (!call_of(json::parse(trim(inside), nullptr, false), "arguments", &call)) break;
    text += answer.substr(pos, open - pos);
    out.calls.push_back(std::move(call));
    pos = close == std::string::npos ? answer.size() : close + 12;
  }
  if (out.calls.empty()) return {answer, {}};
  text += answer.substr(pos);
  out.text = trim(text);
  return out;
}

ParsedAnswer mistral(const std::string& answer) {
  const size_t at = answer.find("[TOOL_CALLS]");
  if (at == std::string::npos) return {answer, {}};
  json list = json::parse(trim(answer.substr(at + 12)), nullptr, false);
  if (list.is_object()) list = json::array({list});
  if (!list.is_array() || list.empty()) return {answer, {}};
  ParsedAnswer out;
  for (const json& j : list) {
    ParsedCall call;
    if (!call_of(j, "arguments", &call)) return {answer, {}};
    out.calls.push_back(std::move(call));
  }
  out.text = trim(answer.substr(0, at));
  return out;
}

ParsedAnswer llama3(const std::string& answer) {
  std::string body = trim(answer);
  if (body.rfind("<|python_tag|>", 0) == 0) body = trim(body.substr(14));
  if (body.empty() || body[0] != '{') return {answer, {}};
  ParsedAnswer out;
  // Calls separated by ';' (each a whole JSON object).
  size_t start = 0;
  while (start < body.size()) {
    size_t end = body.size();
    json j;
    // The shortest prefix that parses as an object and is followed by ';' or the end.
    for (size_t semi = body.find(';', start);; semi = body.find(';', semi + 1)) {
      const size_t stop = semi == std::string::npos ? body.size() : semi;
      j = json::parse(body.substr(start, stop - start), nullptr, false);
      if (!j.is_discarded()) {
        end = stop;
        break;
      }
      if (semi == std::string::npos) return {answer, {}};
    }
    ParsedCall call;
    if (!call_of(j, j.contains("parameters") ? "parameters" : "arguments", &call))
      return {answer, {}};
    out.calls.push_back(std::move(call));
    start = end + 1;
    while (start < body.size() && (body[start] == ' ' || body[start] == '\n')) ++start;
  }
  return out;
}

// The text between `open` and `close` markers, in turn: [start, end) pairs of each section.
struct Section {
  size_t open, body, end, after;  // open marker, its body, the close marker, past it
};

std::vector<Section> sections(const std::string& s, const std::string& open,
                              const std::string& close, size_t from = 0) {
  std::vector<Section> out;
  size_t pos = from;
  while (true) {
    const size_t o = s.find(open, pos);
    if (o == std::string::npos) break;
    const size_t body = o + open.size();
    const size_t e = s.find(close, body);
    if (e == std::string::npos) break;
    out.push_back({o, body, e, e + close.size()});
    pos = e + close.size();
  }
  return out;
}

// A call whose name and arguments (JSON text of an object) stand apart.
bool named_call(const std::string& name, const std::string& arguments, ParsedCall* out) {
  return call_of(json{{"name", name}, {"arguments", json::parse(trim(arguments), nullptr, false)}},
                 "arguments", out);
}

// The calls of a section that starts at `begin` and ends with `end_marker`, and the answer's text
// around that section; the whole answer when there are no calls.
ParsedAnswer outside_section(const std::string& answer, size_t begin, const std::string& end_marker,
                             std::vector<ParsedCall> calls) {
  if (calls.empty()) return {answer, {}};
  const size_t end = answer.find(end_marker, begin);
  ParsedAnswer out;
  out.text = trim(answer.substr(0, begin) +
                  (end == std::string::npos ? "" : answer.substr(end + end_marker.size())));
  out.calls = std::move(calls);
  return out;
}

ParsedAnswer deepseek(const std::string& answer) {
  static const std::string kBegin = "<｜tool▁calls▁begin｜>", kEnd = "<｜tool▁calls▁end｜>";
  static const std::string kCall = "<｜tool▁call▁begin｜>", kCallEnd = "<｜tool▁call▁end｜>";
  static const std::string kSep = "<｜tool▁sep｜>";
  const size_t begin = answer.find(kBegin);
  if (begin == std::string::npos) return {answer, {}};
  ParsedAnswer out;
  for (const Section& c : sections(answer, kCall, kCallEnd, begin)) {
    const std::string call = answer.substr(c.body, c.end - c.body);
    const size_t sep = call.find(kSep);
    if (sep == std::string::npos) return {answer, {}};
    std::string rest = call.substr(sep + kSep.size());
    const size_t nl = rest.find('\n');
    const std::string name = trim(rest.substr(0, nl));
    std::string args = nl == std::string::npos ? "{}" : rest.substr(nl + 1);
    args = trim(args);
    if (args.rfind("```json", 0) == 0) args = args.substr(7);
    if (args.size() >= 3 && args.compare(args.size() - 3, 3, "```") == 0)
      args.resize(args.size() - 3);
    ParsedCall parsed;
    if (!named_call(name, args, &parsed)) return {answer, {}};
    out.calls.push_back(std::move(parsed));
  }
  return outside_section(answer, begin, kEnd, std::move(out.calls));
}

ParsedAnswer kimi(const std::string& answer) {
  static const std::string kBegin = "<|tool_calls_section_begin|>";
  static const std::string kEnd = "<|tool_calls_section_end|>";
  static const std::string kArgs = "<|tool_call_argument_begin|>";
  const size_t begin = answer.find(kBegin);
  if (begin == std::string::npos) return {answer, {}};
  ParsedAnswer out;
  for (const Section& c : sections(answer, "<|tool_call_begin|>", "<|tool_call_end|>", begin)) {
    const std::string call = answer.substr(c.body, c.end - c.body);
    const size_t a = call.find(kArgs);
    if (a == std::string::npos) return {answer, {}};
    // The id is "functions.NAME:INDEX".
    std::string id = trim(call.substr(0, a));
    if (id.rfind("functions.", 0) == 0) id = id.substr(10);
    const size_t colon = id.rfind(':');
    if (colon != std::string::npos) id.resize(colon);
    ParsedCall parsed;
    if (!named_call(id, call.substr(a + kArgs.size()), &parsed)) return {answer, {}};
    out.calls.push_back(std::move(parsed));
  }
  return outside_section(answer, begin, kEnd, std::move(out.calls));
}

}  // namespace

ToolCallFormat detect_tool_call_format(const std::string& t) {
  if (t.find("<｜tool▁calls▁begin｜>") != std::string::npos) return ToolCallFormat::kDeepSeek;
  if (t.find("<|tool_calls_section_begin|>") != std::string::npos) return ToolCallFormat::kKimi;
  if (t.find("<tool_call>") != std::string::npos) return ToolCallFormat::kHermes;
  if (t.find("[TOOL_CALLS]") != std::string::npos) return ToolCallFormat::kMistral;
  if (t.find("<|python_tag|>") != std::string::npos ||
      (t.find("<|start_header_id|>") != std::string::npos &&
       t.find("ipython") != std::string::npos)) {
    return ToolCallFormat::kLlama3;
  }
  return ToolCallFormat::kNone;
}

const char* tool_call_format_name(ToolCallFormat format) {
  switch (format) {
    case ToolCallFormat::kNone:
      return "none";
    case ToolCallFormat::kHermes:
      return "hermes";
    case ToolCallFormat::kMistral:
      return "mistral";
    case ToolCallFormat::kLlama3:
      return "llama3";
    case ToolCallFormat::kDeepSeek:
      return "deepseek";
    case ToolCallFormat::kKimi:
      return "kimi";
  }
  return "none";
}

size_t streamable_prefix(ToolCallFormat format, const std::string& text) {
  std::string marker;
  switch (format) {
    case ToolCallFormat::kNone:
      return text.size();
    case ToolCallFormat::kHermes:
      marker = "<tool_call>";
      break;
    case ToolCallFormat::kMistral:
      marker = "[TOOL_CALLS]";
      break;
    case ToolCallFormat::kDeepSeek:
      marker = "<｜tool▁calls▁begin｜>";
      break;
    case ToolCallFormat::kKimi:
      marker = "<|tool_calls_section_begin|>";
      break;
    case ToolCallFormat::kLlama3: {
      const size_t first = text.find_first_not_of(" \t\r\n");
      if (first == std::string::npos) return 0;
      static const std::string kTag = "<|python_tag|>";
      const std::string rest = text.substr(first);
      const bool could_be_call =
          rest[0] == '{' || kTag.compare(0, std::min(rest.size(), kTag.size()), rest, 0,
                                         std::min(rest.size(), kTag.size())) == 0;
      return could_be_call ? 0 : text.size();
    }
  }
  const size_t at = text.find(marker);
  if (at != std::string::npos) return at;
  // Hold back an ending that could be the start of the marker.
  for (size_t k = std::min(marker.size() - 1, text.size()); k > 0; --k) {
    if (text.compare(text.size() - k, k, marker, 0, k) == 0) return text.size() - k;
  }
  return text.size();
}

ParsedAnswer parse_tool_calls(ToolCallFormat format, const std::string& answer) {
  switch (format) {
    case ToolCallFormat::kHermes:
      return hermes(answer);
    case ToolCallFormat::kMistral:
      return mistral(answer);
    case ToolCallFormat::kLlama3:
      return llama3(answer);
    case ToolCallFormat::kDeepSeek:
      return deepseek(answer);
    case ToolCallFormat::kKimi:
      return kimi(answer);
    case ToolCallFormat::kNone:
      break;
  }
  return {answer, {}};
}

}  // namespace hr::engine
