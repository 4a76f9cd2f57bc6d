// Small string helpers shared across folders.
#pragma once

#include <string_view>

namespace hr {

// Without the leading and/or trailing whitespace (space, \t, \n, \v, \f, \r).
std::string_view trim_start(std::string_view s);
std::string_view trim_end(std::string_view s);
std::string_view trim(std::string_view s);

// Whether a equals b, in time that depends on their lengths only, not on where they first differ
// (for secrets: tokens, keys).
bool constant_time_equal(std::string_view a, std::string_view b);
// Whether `s` starts with `prefix`, ASCII letters compared without case.
bool starts_with_ignoring_case(std::string_view s, std::string_view prefix);

}  // namespace hr
