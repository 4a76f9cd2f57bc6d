// JSON Schema (the subset below) compiled to the automaton of the JSON texts valid against it.
//
// Supported: `type` (one or a list), `properties`/`required`/`additionalProperties`, `enum`,
// `const`, `items`/`minItems`/`maxItems`, `anyOf`, local `$ref` (`#`, `#/$defs/...`,
// `#/definitions/...`, any JSON pointer into the document) with `$defs`/`definitions`, string
// `minLength`/`maxLength` (in code points) and `pattern` (regex.h), numeric `minimum`/`maximum`/
// `exclusiveMinimum`/`exclusiveMaximum` (integers exactly; a number with a fraction only between
// two whole numbers inside the bounds; no exponent), and boolean schemas. Annotations (`title`,
// `description`, `default`, `examples`, `$schema`, `$id`, `$comment`, `deprecated`, `readOnly`,
// `writeOnly`) are ignored. Any other keyword is refused by name, with its path.
//
// What is generated, always valid against the schema but not every valid document:
//   - properties in the schema's order; optional ones may be left out; no property beyond those
//     listed (an object without `properties` is a free map, of `additionalProperties`' schema or
//     of any values);
//   - `enum`/`const` values as their compact JSON text (objects and arrays among them with
//     whitespace where any object or array may have it);
//   - whitespace only after `{`, `[`, `,` and `:` and before `}` and `]`, at most
//     JsonLimits::max_whitespace bytes of spaces, tabs and newlines each time;
//   - numbers of at most 16 integer and 16 fraction digits and a two-digit exponent (integers:
//     at most 16 digits, no fraction or exponent), so that every number survives a double;
//   - strings without raw control characters (escapes instead), with only non-surrogate \u
//     escapes;
//   - free JSON values (an empty schema, `items` left out, json_object) nested at most
//     JsonLimits::max_nesting deep, and a recursive $ref unrolled at most max_ref_depth times
//     (fewer when the unrolled automaton would be too large).
#pragma once

#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "grammar/nfa.h"

namespace hr::grammar {

struct JsonLimits {
  int max_whitespace = 16;
  int max_nesting = 6;
  int max_ref_depth = 6;
};

// The fragment for one value valid against `schema`, added to `nfa`. Errors are
// kInvalidArgument; the field names the keyword, as "<where>.properties.a.minimum".
[[nodiscard]] Result<Frag> add_json_schema(Nfa& nfa, const nlohmann::ordered_json& schema,
                                           const std::string& where, const JsonLimits& limits);

// A whole document valid against `schema` (with a smaller $ref unrolling when the automaton
// would be too large).
[[nodiscard]] Result<std::shared_ptr<const Nfa>> compile_json_schema(
    const nlohmann::ordered_json& schema, const std::string& where, const JsonLimits& limits = {});

// A whole document that is any JSON object (response_format json_object).
std::shared_ptr<const Nfa> compile_json_object(const JsonLimits& limits = {});

}  // namespace hr::grammar
