// Tool-call constraints per model family.
#include "engine/tool_call_grammar.h"

#include <nlohmann/json.hpp>

namespace hr::engine {

namespace {

using ojson = nlohmann::ordered_json;
using grammar::Frag;
using grammar::Nfa;

std::string quoted(const std::string& s) { return ojson(s).dump(-1, ' ', false); }

// One call of `tool` in `format`.
Result<Frag> call(Nfa& nfa, ToolCallFormat format, const ToolSchema& tool, size_t index,
                  const grammar::JsonLimits& limits) {
  const std::string where = "tools[" + std::to_string(index) + "].function.parameters";
  ojson schema = tool.parameters.empty() ? ojson{{"type", "object"}}
                                         : ojson::parse(tool.parameters, nullptr, false);
  if (schema.is_discarded()) return invalid_argument("the parameters are not valid JSON", where);
  HR_ASSIGN_OR_RETURN(Frag args, grammar::add_json_schema(nfa, schema, where, limits));
  const std::string name = quoted(tool.name);
  switch (format) {
    case ToolCallFormat::kLlama3:
      return nfa.seq(nfa.seq(nfa.literal("{\"name\": " + name + ", \"parameters\": "), args),
                     nfa.literal("}"));
    case ToolCallFormat::kDeepSeek:
      return nfa.seq(nfa.seq(nfa.literal("<｜tool▁call▁begin｜>function<｜tool▁sep｜>" + tool.name +
                                         "\n```json\n"),
                             args),
                     nfa.literal("\n```<｜tool▁call▁end｜>"));
    case ToolCallFormat::kKimi: {
      Frag head = nfa.literal("<|tool_call_begin|>functions." + tool.name + ":");
      Frag idx = nfa.seq(nfa.byte_range('0', '9'), nfa.opt(nfa.byte_range('0', '9')));
      head = nfa.seq(nfa.seq(head, idx), nfa.literal("<|tool_call_argument_begin|>"));
      return nfa.seq(nfa.seq(head, args), nfa.literal("<|tool_call_end|>"));
    }
    case ToolCallFormat::kHermes:
    case ToolCallFormat::kMistral:
    case ToolCallFormat::kNone:
      break;
  }
  Frag obj = nfa.seq(nfa.seq(nfa.literal("{\"name\": " + name + ", \"arguments\": "), args),
                     nfa.literal("}"));
  if (format == ToolCallFormat::kMistral) return obj;
  return nfa.seq(nfa.seq(nfa.literal("<tool_call>\n"), obj), nfa.literal("\n</tool_call>"));
}

}  // namespace

ToolCallFormat constrained_call_format(ToolCallFormat model_format) {
  return model_format == ToolCallFormat::kNone ? ToolCallFormat::kHermes : model_format;
}

Result<std::shared_ptr<const Nfa>> tool_call_grammar(ToolCallFormat format,
                                                     const std::vector<ToolSchema>& tools,
                                                     bool parallel,
                                                     const grammar::JsonLimits& limits) {
  format = constrained_call_format(format);
  if (tools.empty()) return invalid_argument("no tools to call", "tools");
  auto nfa = std::make_shared<Nfa>(2'000'000);
  // Any one of the tools, built twice when calls may repeat (the first, and each later one).
  auto any_call = [&]() -> Result<Frag> {
    std::vector<Frag> options;
    for (size_t i = 0; i < tools.size(); ++i) {
      HR_ASSIGN_OR_RETURN(Frag f, call(*nfa, format, tools[i], i, limits));
      options.push_back(f);
    }
    return nfa->alt(options);
  };
  HR_ASSIGN_OR_RETURN(Frag first, any_call());
  Frag calls = first;
  if (parallel) {
    const char* sep = format == ToolCallFormat::kMistral  ? ", "
                      : format == ToolCallFormat::kLlama3 ? "; "
                      : format == ToolCallFormat::kHermes ? "\n"
                                                          : "";
    HR_ASSIGN_OR_RETURN(Frag more, any_call());
    calls = nfa->seq(first, nfa->star(nfa->seq(nfa->literal(sep), more)));
  }
  Frag whole = calls;
  if (format == ToolCallFormat::kMistral)
    whole = nfa->seq(nfa->seq(nfa->literal("[TOOL_CALLS]["), calls), nfa->literal("]"));
  if (format == ToolCallFormat::kDeepSeek)
    whole = nfa->seq(nfa->seq(nfa->literal("<｜tool▁calls▁begin｜>"), calls),
                     nfa->literal("<｜tool▁calls▁end｜>"));
  if (format == ToolCallFormat::kKimi)
    whole = nfa->seq(nfa->seq(nfa->literal("<|tool_calls_section_begin|>"), calls),
                     nfa->literal("<|tool_calls_section_end|>"));
  HR_RETURN_IF_ERROR(nfa->finish(whole));
  return std::shared_ptr<const Nfa>(std::move(nfa));
}

}  // namespace hr::engine
