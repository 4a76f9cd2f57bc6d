// Small string helpers shared across folders.
#pragma once

#include <string_view>

namespace hr {

// Without the leading and/or trailing whitespace (space, \t, \n, \v, \f, \r).
std::string_view trim_start(std::string_view s);
std::string_view trim_end(std::string_view s);
std::string_view trim(std::string_view s);

}  // namespace hr
