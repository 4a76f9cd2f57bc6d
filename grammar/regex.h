// A JSON Schema `pattern` (ECMAScript syntax, the subset below) compiled to the automaton of the
// JSON string contents it matches, as JSON writes them (a quote or backslash escaped, control
// characters as escapes). The whole string matches the pattern, which implies the schema's
// meaning of `pattern` (a match anywhere). Supported: literals, `.`, classes `[...]`/`[^...]` with
// ranges, `\d \D \w \W \s \S`, escapes (`\n \t \r \f \v \0 \xHH \uHHHH \u{H...}` and escaped
// punctuation), groups `(...)`/`(?:...)`, `|`, quantifiers `* + ? {n} {n,} {n,m}` (lazy or not),
// and `^`/`$` at the ends. Refused by name: backreferences, lookaround, named groups, `\b`, `\p`.
#pragma once

#include <string>

#include "base/status.h"
#include "grammar/nfa.h"

namespace hr::grammar {

// The string's contents (between its quotes) matching `pattern`.
[[nodiscard]] Result<Frag> add_pattern(Nfa& nfa, const std::string& pattern);

// One JSON string character of any code point but the controls, raw or as any JSON escape.
Frag add_json_char(Nfa& nfa);

}  // namespace hr::grammar
