// A chat template's source as tokens: text between tags, and the names, literals and operators
// inside {{ }} and {% %}. As Hugging Face renders templates: a trailing newline is dropped,
// spaces and tabs before a block tag at the start of a line are stripped (lstrip_blocks), the
// first newline after a block tag is removed (trim_blocks), `-` in a tag strips the whitespace on
// its side, comments are dropped and transformers' {% generation %} tags are removed.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace hr::engine::jinja {

enum class TokenType {
  kText,
  kNumber,
  kString,
  kIdentifier,
  kEquals,           // =
  kOpenParen,        // (
  kCloseParen,       // )
  kOpenStatement,    // {%
  kCloseStatement,   // %}
  kOpenExpression,   // {{
  kCloseExpression,  // }}
  kOpenBracket,      // [
  kCloseBracket,     // ]
  kOpenBrace,        // {
  kCloseBrace,       // }
  kComma,
  kDot,
  kColon,
  kPipe,
  kAdditive,        // + - ~
  kMultiplicative,  // * / // %
  kPower,           // **
  kComparison,      // < > <= >= == !=
  kUnary,           // a lone - or +
  kComment,
};

struct Token {
  TokenType type;
  std::string value;
  int line = 1;  // in the template as given
};

// kInvalidArgument naming the line for a character that starts no token, an unterminated string
// or comment, or a bad escape.
[[nodiscard]] Result<std::vector<Token>> tokenize(std::string_view source);

}  // namespace hr::engine::jinja
