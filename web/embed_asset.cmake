# Writes OUT: a C++ source whose function hr::web::NAME() returns the bytes of IN (cmake -P).
file(READ "${IN}" text)
string(FIND "${text}" ")hr_asset\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} holds the raw string's delimiter )hr_asset\"")
endif()
file(WRITE "${OUT}.tmp" "// Generated from ${IN} at build time.\n#include <string_view>\n\nnamespace hr::web {\n\nstd::string_view ${NAME}() {\n  static constexpr char kBytes[] = R\"hr_asset(${text})hr_asset\";\n  return std::string_view(kBytes, sizeof(kBytes) - 1);\n}\n\n}  // namespace hr::web\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
