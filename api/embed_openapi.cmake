# Writes OUT: a C++ file holding the OpenAPI document IN (cmake -P script).
file(READ "${IN}" text)
file(WRITE "${OUT}.tmp" "// Generated from api/openapi.json at build time.\n#include \"api/openapi.h\"\n\nnamespace hr::api {\n\nstd::string_view openapi_document() {\n  static constexpr std::string_view kDocument = R\"hr_json(${text})hr_json\";\n  return kDocument;\n}\n\n}  // namespace hr::api\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
