// Chat template tokens (lexer.h) into a syntax tree (ast.h), with the grammar and operator
// precedence of @huggingface/jinja: ternaries and `x if c` selections, or, and, not, comparisons
// and membership, + - ~, * / // %, **, tests (`is`), filters (`|`), unary signs, calls, member
// access and slices.
#pragma once

#include <vector>

#include "base/status.h"
#include "engine/jinja/ast.h"
#include "engine/jinja/lexer.h"

namespace hr::engine::jinja {

// The template's statements; kInvalidArgument naming the line for a syntax error.
[[nodiscard]] Result<std::vector<NodePtr>> parse(const std::vector<Token>& tokens);

}  // namespace hr::engine::jinja
