// The constraint for an answer that must call tools (tool_choice "required" or a named function):
// one call, or with parallel calls one or more, in the model family's own syntax (tool_calls.h),
// each call's arguments a JSON document valid against the function's parameters (any object when
// it has none). A model whose template shows no format writes Hermes' <tool_call> sections.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/tool_calls.h"
#include "grammar/json_schema.h"
#include "grammar/nfa.h"

namespace hr::engine {

struct ToolSchema {
  std::string name;
  std::string parameters;  // JSON Schema text ("" when none)
};

// The format a constrained call is written in: the model's, or Hermes' when it has none.
ToolCallFormat constrained_call_format(ToolCallFormat model_format);

// Errors (kInvalidArgument) name the tool's parameters: "tools[i].function.parameters...".
[[nodiscard]] Result<std::shared_ptr<const grammar::Nfa>> tool_call_grammar(
    ToolCallFormat format, const std::vector<ToolSchema>& tools, bool parallel,
    const grammar::JsonLimits& limits = {});

}  // namespace hr::engine
