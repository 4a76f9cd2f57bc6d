// JSON text from outside the process (a client's body, a stored or forwarded document), parsed
// with limits that keep it safe to handle.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <string_view>

namespace hr::wire {

// json::parse with exceptions off: discarded (is_discarded()) when malformed, or when it nests
// deeper than kMaxJsonDepth (copying or printing a document recurses once per level: a deep one
// would overflow the stack) or holds a NUL character in a string (Postgres cannot store one).
// `why` (may be null) then says which, as "nests deeper than 64 levels", "holds a NUL character
// (\u0000)" or "is not valid JSON".
constexpr int kMaxJsonDepth = 64;
nlohmann::json parse_client_json(std::string_view text, std::string* why = nullptr);

}  // namespace hr::wire
