// The JSON-schema compiler (grammar/json_schema.h) on any schema text: compiled under the
// limits the API uses, then a DFA walked over a few documents. Memory and states stay bounded.
#include <cstdint>
#include <string_view>

#include "grammar/dfa.h"
#include "grammar/json_schema.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto schema = nlohmann::ordered_json::parse(data, data + size, nullptr, false);
  if (schema.is_discarded()) return 0;
  auto nfa = hr::grammar::compile_json_schema(schema, "response_format.json_schema.schema");
  if (!nfa.is_ok()) return 0;
  hr::grammar::Dfa dfa(*nfa, 4096);
  for (std::string_view doc :
       {R"({"a": 1, "b": [true, null, "x"]})", R"("text")", "-12.5e3", R"([{"k": {}}])", "{}"}) {
    int32_t state = dfa.start();
    for (char c : doc) {
      state = dfa.next(state, static_cast<uint8_t>(c));
      if (state == hr::grammar::kDead) break;
    }
  }
  return 0;
}
