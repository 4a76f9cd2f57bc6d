// The schema walker: one fragment per (sub)schema, built afresh at each use.
#include "grammar/json_schema.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <vector>

#include "grammar/regex.h"

namespace hr::grammar {

namespace {

using ojson = nlohmann::ordered_json;

const std::set<std::string>& annotations() {
  static const std::set<std::string> s = {"title",    "description", "default",  "examples",
                                          "$schema",  "$id",         "$comment", "deprecated",
                                          "readOnly", "writeOnly",   "$defs",    "definitions"};
  return s;
}

const std::set<std::string>& supported() {
  static const std::set<std::string> s = {"type",
                                          "properties",
                                          "required",
                                          "additionalProperties",
                                          "enum",
                                          "const",
                                          "items",
                                          "minItems",
                                          "maxItems",
                                          "anyOf",
                                          "$ref",
                                          "minLength",
                                          "maxLength",
                                          "pattern",
                                          "minimum",
                                          "maximum",
                                          "exclusiveMinimum",
                                          "exclusiveMaximum"};
  return s;
}

std::string json_literal(const ojson& v) {
  return v.dump(-1, ' ', /*ensure_ascii=*/false, ojson::error_handler_t::strict);
}

class Compiler {
 public:
  Compiler(Nfa& nfa, const ojson& root, const JsonLimits& limits)
      : nfa_(nfa), root_(root), limits_(limits) {}

  Result<Frag> value(const ojson& s, const std::string& path) {
    if (nfa_.overflowed()) return nfa_.empty();
    if (s.is_boolean()) return s.get<bool>() ? any_value(0) : nothing();
    if (!s.is_object()) return bad(path, "a schema must be an object or a boolean");
    for (const auto& [key, v] : s.items()) {
      if (!supported().count(key) && !annotations().count(key)) {
        return invalid_argument(
            "the JSON Schema keyword '" + key + "' is not supported (see the documented subset)",
            join(path, key));
      }
    }
    auto only_with = [&](const char* keyword,
                         std::initializer_list<const char*> allowed) -> Status {
      for (const auto& item : s.items()) {
        const std::string& key = item.key();
        if (key == keyword || annotations().count(key)) continue;
        if (std::find_if(allowed.begin(), allowed.end(), [&](const char* a) { return key == a; }) !=
            allowed.end())
          continue;
        return invalid_argument(
            std::string("'") + key + "' beside '" + keyword + "' is not supported",
            join(path, key));
      }
      return Status::ok();
    };
    if (s.contains("$ref")) {
      HR_RETURN_IF_ERROR(only_with("$ref", {}));
      return ref(s["$ref"], join(path, "$ref"));
    }
    if (s.contains("anyOf")) {
      HR_RETURN_IF_ERROR(only_with("anyOf", {}));
      const ojson& options = s["anyOf"];
      const std::string p = join(path, "anyOf");
      if (!options.is_array() || options.empty())
        return bad(p, "'anyOf' must be a non-empty array of schemas");
      std::vector<Frag> frags;
      for (size_t i = 0; i < options.size(); ++i) {
        HR_ASSIGN_OR_RETURN(Frag f, value(options[i], p + "[" + std::to_string(i) + "]"));
        frags.push_back(f);
      }
      return nfa_.alt(frags);
    }
    if (s.contains("enum") || s.contains("const")) {
      const bool is_enum = s.contains("enum");
      HR_RETURN_IF_ERROR(only_with(is_enum ? "enum" : "const", {"type"}));
      std::vector<ojson> values;
      if (is_enum) {
        if (!s["enum"].is_array() || s["enum"].empty())
          return bad(join(path, "enum"), "'enum' must be a non-empty array");
        for (const ojson& v : s["enum"]) values.push_back(v);
      } else {
        values.push_back(s["const"]);
      }
      std::vector<Frag> frags;
      for (const ojson& v : values) {
        if (s.contains("type") && !type_allows(s["type"], v)) continue;
        frags.push_back(value_literal(v));
      }
      if (frags.empty())
        return bad(join(path, is_enum ? "enum" : "const"), "no value has the schema's type");
      return nfa_.alt(frags);
    }
    std::vector<std::string> types;
    if (s.contains("type")) {
      const ojson& t = s["type"];
      if (t.is_string()) {
        types.push_back(t.get<std::string>());
      } else if (t.is_array() && !t.empty()) {
        for (const ojson& x : t) {
          if (!x.is_string()) return bad(join(path, "type"), "'type' must name JSON types");
          types.push_back(x.get<std::string>());
        }
      } else {
        return bad(join(path, "type"), "'type' must be a type name or a list of them");
      }
    } else if (s.contains("properties") || s.contains("required") ||
               s.contains("additionalProperties")) {
      types.push_back("object");
    } else if (s.contains("items") || s.contains("minItems") || s.contains("maxItems")) {
      types.push_back("array");
    } else if (s.contains("minLength") || s.contains("maxLength") || s.contains("pattern")) {
      types.push_back("string");
    } else if (s.contains("minimum") || s.contains("maximum") || s.contains("exclusiveMinimum") ||
               s.contains("exclusiveMaximum")) {
      types.push_back("number");
    } else {
      return any_value(0);
    }
    std::vector<Frag> frags;
    for (const std::string& t : types) {
      if (t == "object") {
        HR_ASSIGN_OR_RETURN(Frag f, object(s, path));
        frags.push_back(f);
      } else if (t == "array") {
        HR_ASSIGN_OR_RETURN(Frag f, array(s, path));
        frags.push_back(f);
      } else if (t == "string") {
        HR_ASSIGN_OR_RETURN(Frag f, string(s, path));
        frags.push_back(f);
      } else if (t == "number") {
        HR_ASSIGN_OR_RETURN(Frag f, bounded(s, path, /*integer=*/false));
        frags.push_back(f);
      } else if (t == "integer") {
        HR_ASSIGN_OR_RETURN(Frag f, bounded(s, path, /*integer=*/true));
        frags.push_back(f);
      } else if (t == "boolean") {
        frags.push_back(nfa_.alt({nfa_.literal("true"), nfa_.literal("false")}));
      } else if (t == "null") {
        frags.push_back(nfa_.literal("null"));
      } else {
        return bad(join(path, "type"), "unknown type '" + t + "'");
      }
    }
    return frags.size() == 1 ? frags[0] : nfa_.alt(frags);
  }

  Frag any_value(int depth) {
    std::vector<Frag> f = {string_chars(0, -1), number(), nfa_.literal("true"),
                           nfa_.literal("false"), nfa_.literal("null")};
    if (depth < limits_.max_nesting) {
      f.push_back(free_object(depth + 1, nullptr, "").value());
      f.push_back(list("[", any_value(depth + 1), "]", /*allow_empty=*/true));
    }
    return nfa_.alt(f);
  }

  // Any object whose values are valid against `values` (null: any JSON value).
  Result<Frag> free_object(int depth, const ojson* values, const std::string& path) {
    Frag v;
    if (values) {
      HR_ASSIGN_OR_RETURN(v, value(*values, path));
    } else {
      v = any_value(depth);
    }
    Frag key = nfa_.seq(nfa_.seq(string_chars(0, -1), nfa_.literal(":")), ws());
    return list("{", nfa_.seq(key, v), "}", /*allow_empty=*/true);
  }

 private:
  static std::string join(const std::string& path, const std::string& key) {
    return path.empty() ? key : path + "." + key;
  }
  static Status bad(const std::string& path, const std::string& msg) {
    return invalid_argument(msg, path);
  }
  Frag nothing() { return nfa_.alt({}); }

  // open ws item ("," ws item)* ws close, with one copy of `item` (its end loops back through the
  // separator); or open ws ws close when allow_empty.
  Frag list(const char* open, Frag item, const char* close, bool allow_empty) {
    Frag o = nfa_.seq(nfa_.literal(open), ws());
    Frag sep = nfa_.seq(nfa_.literal(","), ws());
    Frag c = nfa_.seq(ws(), nfa_.literal(close));
    nfa_.add_eps(o.out, item.in);
    nfa_.add_eps(item.out, sep.in);
    nfa_.add_eps(sep.out, item.in);
    nfa_.add_eps(item.out, c.in);
    if (allow_empty) nfa_.add_eps(o.out, c.in);
    return {o.in, c.out};
  }

  static bool type_allows(const ojson& type, const ojson& v) {
    auto one = [&](const std::string& t) {
      if (t == "string") return v.is_string();
      if (t == "number") return v.is_number();
      if (t == "integer")
        return v.is_number_integer() ||
               (v.is_number_float() &&
                v.get<double>() == static_cast<double>(static_cast<long long>(v.get<double>())));
      if (t == "boolean") return v.is_boolean();
      if (t == "null") return v.is_null();
      if (t == "object") return v.is_object();
      if (t == "array") return v.is_array();
      return false;
    };
    if (type.is_string()) return one(type.get<std::string>());
    if (type.is_array()) {
      for (const ojson& t : type) {
        if (t.is_string() && one(t.get<std::string>())) return true;
      }
    }
    return false;
  }

  // Up to max_whitespace spaces, tabs or newlines.
  Frag ws() {
    Frag tail = nfa_.empty();
    for (int i = 0; i < limits_.max_whitespace; ++i) {
      Frag c{nfa_.add_node(), nfa_.add_node()};
      nfa_.add_bytes(c.in, ' ', ' ', c.out);
      nfa_.add_bytes(c.in, '\t', '\n', c.out);
      tail = nfa_.opt(nfa_.seq(c, tail));
    }
    return tail;
  }

  Frag digits(int min, int max) {
    Frag f = nfa_.empty();
    for (int i = 0; i < min; ++i) f = nfa_.seq(f, nfa_.byte_range('0', '9'));
    Frag tail = nfa_.empty();
    for (int i = min; i < max; ++i) tail = nfa_.opt(nfa_.seq(nfa_.byte_range('0', '9'), tail));
    return nfa_.seq(f, tail);
  }

  Frag integer() {
    Frag sign = nfa_.opt(nfa_.literal("-"));
    Frag mag = nfa_.alt({nfa_.literal("0"), nfa_.seq(nfa_.byte_range('1', '9'), digits(0, 15))});
    return nfa_.seq(sign, mag);
  }

  // The largest magnitude written: 16 digits.
  static constexpr int64_t kMaxMagnitude = 9'999'999'999'999'999;

  // A number or integer within the schema's minimum/maximum/exclusive bounds (none: any).
  Result<Frag> bounded(const ojson& s, const std::string& path, bool integer_only) {
    double lo = -static_cast<double>(kMaxMagnitude), hi = static_cast<double>(kMaxMagnitude);
    bool lo_open = false, hi_open = false, any = false;
    for (const char* key : {"minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"}) {
      if (!s.contains(key)) continue;
      const ojson& v = s[key];
      if (!v.is_number())
        return bad(join(path, key), std::string("'") + key + "' must be a number");
      any = true;
      const double x = v.get<double>();
      const std::string k = key;
      if (k == "minimum" && x > lo) lo = x, lo_open = false;
      if (k == "exclusiveMinimum" && x >= lo) lo = x, lo_open = true;
      if (k == "maximum" && x < hi) hi = x, hi_open = false;
      if (k == "exclusiveMaximum" && x <= hi) hi = x, hi_open = true;
    }
    if (!any) return integer_only ? integer() : number();
    auto clamp = [](double x) {
      return std::max(-static_cast<double>(kMaxMagnitude),
                      std::min(static_cast<double>(kMaxMagnitude), x));
    };
    lo = clamp(lo);
    hi = clamp(hi);
    // The integers inside the bounds.
    const int64_t ilo = static_cast<int64_t>(lo_open ? std::floor(lo) + 1 : std::ceil(lo));
    const int64_t ihi = static_cast<int64_t>(hi_open ? std::ceil(hi) - 1 : std::floor(hi));
    std::vector<Frag> options;
    if (ilo <= ihi) options.push_back(int_range(ilo, ihi));
    if (!integer_only) {
      // N.fraction lies in [N, N + 1): inside when N >= ilo and N + 1 <= hi.
      const int64_t top = static_cast<int64_t>(std::floor(hi)) - 1;
      if (std::max<int64_t>(ilo, 0) <= top)
        options.push_back(nfa_.seq(nonneg_range(std::max<int64_t>(ilo, 0), top), fraction()));
      // -N.fraction lies in (-(N + 1), -N]: inside when -(N + 1) >= lo and -N <= hi (< hi when
      // open).
      const int64_t nmax = static_cast<int64_t>(std::floor(-lo)) - 1;
      const int64_t nmin = std::max<int64_t>(
          0, static_cast<int64_t>(hi_open ? std::floor(-hi) + 1 : std::ceil(-hi)));
      if (nmin <= nmax)
        options.push_back(
            nfa_.seq(nfa_.seq(nfa_.literal("-"), nonneg_range(nmin, nmax)), fraction()));
    }
    if (!integer_only) {
      // An open bound at a whole number: just past it, with a fraction that is not all zeros.
      if (lo_open && lo == std::floor(lo) && lo >= 0 && lo + 1 <= hi) {
        options.push_back(nfa_.seq(nonneg_range(static_cast<int64_t>(lo), static_cast<int64_t>(lo)),
                                   nonzero_fraction()));
      }
      if (hi_open && hi == std::floor(hi) && hi <= 0 && hi - 1 >= lo) {
        const int64_t n = static_cast<int64_t>(-hi);
        options.push_back(
            nfa_.seq(nfa_.seq(nfa_.literal("-"), nonneg_range(n, n)), nonzero_fraction()));
      }
    }
    if (options.empty()) return bad(path, "no number lies within the schema's bounds");
    return nfa_.alt(options);
  }

  // One given JSON value, with whitespace where a document may have it (inside an object or
  // array value, as elsewhere).
  Frag value_literal(const ojson& v) {
    if (!v.is_object() && !v.is_array()) return nfa_.literal(json_literal(v));
    const bool obj = v.is_object();
    Frag f = nfa_.seq(nfa_.literal(obj ? "{" : "["), ws());
    bool first = true;
    for (const auto& [key, item] : v.items()) {
      if (!first) f = nfa_.seq(f, nfa_.seq(nfa_.literal(","), ws()));
      first = false;
      if (obj) f = nfa_.seq(f, nfa_.seq(nfa_.literal(json_literal(ojson(key)) + ":"), ws()));
      f = nfa_.seq(f, value_literal(item));
    }
    return nfa_.seq(f, nfa_.seq(ws(), nfa_.literal(obj ? "}" : "]")));
  }

  Frag fraction() { return nfa_.seq(nfa_.literal("."), digits(1, 16)); }

  // "." and 1 to 16 digits, not all zeros.
  Frag nonzero_fraction() {
    std::vector<Frag> options;
    for (int zeros = 0; zeros < 16; ++zeros) {
      Frag f = nfa_.literal(std::string(static_cast<size_t>(zeros), '0'));
      f = nfa_.seq(nfa_.seq(f, nfa_.byte_range('1', '9')), digits(0, 15 - zeros));
      options.push_back(f);
    }
    return nfa_.seq(nfa_.literal("."), nfa_.alt(options));
  }

  // Integers in [lo, hi].
  Frag int_range(int64_t lo, int64_t hi) {
    std::vector<Frag> options;
    if (hi >= 0) options.push_back(nonneg_range(std::max<int64_t>(lo, 0), hi));
    if (lo < 0) {
      const int64_t a = std::max<int64_t>(1, -hi), b = -lo;
      if (a <= b) options.push_back(nfa_.seq(nfa_.literal("-"), nonneg_range(a, b)));
    }
    return nfa_.alt(options);
  }

  // Non-negative integers in [lo, hi], without leading zeros: one digit-string range per length.
  Frag nonneg_range(int64_t lo, int64_t hi) {
    std::vector<Frag> options;
    int64_t first = 0, last = 9;
    for (int len = 1; len <= 16; ++len) {
      const int64_t a = std::max(lo, first), b = std::min(hi, last);
      if (a <= b) options.push_back(same_length(std::to_string(a), std::to_string(b)));
      first = last + 1;
      if (len < 16) last = last * 10 + 9;
    }
    return nfa_.alt(options);
  }

  // Digit strings of one length from a to b (a <= b).
  Frag same_length(const std::string& a, const std::string& b) {
    if (a.empty()) return nfa_.empty();
    const size_t rest = a.size() - 1;
    // Every digit string of the length (keeps the splits below linear in the length).
    if (a.find_first_not_of('0') == std::string::npos &&
        b.find_first_not_of('9') == std::string::npos)
      return digits(static_cast<int>(a.size()), static_cast<int>(a.size()));
    if (a[0] == b[0])
      return nfa_.seq(nfa_.literal(a.substr(0, 1)), same_length(a.substr(1), b.substr(1)));
    std::vector<Frag> options;
    options.push_back(
        nfa_.seq(nfa_.literal(a.substr(0, 1)), same_length(a.substr(1), std::string(rest, '9'))));
    if (b[0] - a[0] >= 2) {
      options.push_back(
          nfa_.seq(nfa_.byte_range(static_cast<uint8_t>(a[0] + 1), static_cast<uint8_t>(b[0] - 1)),
                   digits(static_cast<int>(rest), static_cast<int>(rest))));
    }
    options.push_back(
        nfa_.seq(nfa_.literal(b.substr(0, 1)), same_length(std::string(rest, '0'), b.substr(1))));
    return nfa_.alt(options);
  }

  Frag number() {
    Frag f = integer();
    f = nfa_.seq(f, nfa_.opt(nfa_.seq(nfa_.literal("."), digits(1, 16))));
    Frag exp = nfa_.seq(
        nfa_.alt({nfa_.literal("e"), nfa_.literal("E")}),
        nfa_.seq(nfa_.opt(nfa_.alt({nfa_.literal("+"), nfa_.literal("-")})), digits(1, 2)));
    return nfa_.seq(f, nfa_.opt(exp));
  }

  // A quoted string of min..max characters (max -1: no limit).
  Frag string_chars(int min, int max) {
    Frag f = nfa_.literal("\"");
    for (int i = 0; i < min && !nfa_.overflowed(); ++i) f = nfa_.seq(f, add_json_char(nfa_));
    if (max < 0) {
      f = nfa_.seq(f, nfa_.star(add_json_char(nfa_)));
    } else {
      Frag tail = nfa_.empty();
      for (int i = min; i < max && !nfa_.overflowed(); ++i)
        tail = nfa_.opt(nfa_.seq(add_json_char(nfa_), tail));
      f = nfa_.seq(f, tail);
    }
    return nfa_.seq(f, nfa_.literal("\""));
  }

  Result<int> count(const ojson& s, const std::string& key, const std::string& path, int dflt) {
    if (!s.contains(key)) return dflt;
    const ojson& v = s[key];
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      return bad(join(path, key), "'" + key + "' must be a non-negative integer");
    if (v.get<int64_t>() > 100000)
      return bad(join(path, key), "'" + key + "' is larger than the supported 100000");
    return static_cast<int>(v.get<int64_t>());
  }

  Result<Frag> string(const ojson& s, const std::string& path) {
    HR_ASSIGN_OR_RETURN(int min, count(s, "minLength", path, 0));
    HR_ASSIGN_OR_RETURN(int max, count(s, "maxLength", path, -1));
    if (max >= 0 && max < min) return bad(join(path, "maxLength"), "maxLength is below minLength");
    if (s.contains("pattern")) {
      if (s.contains("minLength") || s.contains("maxLength"))
        return bad(join(path, "pattern"), "'pattern' with minLength or maxLength is not supported");
      if (!s["pattern"].is_string())
        return bad(join(path, "pattern"), "'pattern' must be a string");
      auto body = add_pattern(nfa_, s["pattern"].get<std::string>());
      if (!body.is_ok()) return invalid_argument(body.status().message(), join(path, "pattern"));
      return nfa_.seq(nfa_.seq(nfa_.literal("\""), body.value()), nfa_.literal("\""));
    }
    return string_chars(min, max);
  }

  Result<Frag> array(const ojson& s, const std::string& path) {
    HR_ASSIGN_OR_RETURN(int min, count(s, "minItems", path, 0));
    HR_ASSIGN_OR_RETURN(int max, count(s, "maxItems", path, -1));
    if (max >= 0 && max < min) return bad(join(path, "maxItems"), "maxItems is below minItems");
    const ojson* items = s.contains("items") ? &s["items"] : nullptr;
    if (items && items->is_array())
      return bad(join(path, "items"), "'items' as a list (tuple) is not supported");
    const std::string ipath = join(path, "items");
    auto item = [&]() -> Result<Frag> {
      if (!items) return any_value(1);
      return value(*items, ipath);
    };
    auto sep_item = [&]() -> Result<Frag> {
      HR_ASSIGN_OR_RETURN(Frag it, item());
      return nfa_.seq(nfa_.seq(nfa_.literal(","), ws()), it);
    };
    if (max == 0) return nfa_.seq(nfa_.seq(nfa_.literal("["), ws()), nfa_.literal("]"));
    if (max < 0 && min <= 1) {
      HR_ASSIGN_OR_RETURN(Frag it, item());
      return list("[", it, "]", /*allow_empty=*/min == 0);
    }
    // Counted: min items, then up to max - min more (or any number more).
    HR_ASSIGN_OR_RETURN(Frag seq, item());
    for (int i = 1; i < min && !nfa_.overflowed(); ++i) {
      HR_ASSIGN_OR_RETURN(Frag f, sep_item());
      seq = nfa_.seq(seq, f);
    }
    if (max < 0) {
      HR_ASSIGN_OR_RETURN(Frag f, sep_item());
      seq = nfa_.seq(seq, nfa_.star(f));
    } else {
      Frag tail = nfa_.empty();
      for (int i = std::max(min, 1); i < max && !nfa_.overflowed(); ++i) {
        HR_ASSIGN_OR_RETURN(Frag f, sep_item());
        tail = nfa_.opt(nfa_.seq(f, tail));
      }
      seq = nfa_.seq(seq, tail);
    }
    Frag open = nfa_.seq(nfa_.literal("["), ws());
    Frag close = nfa_.seq(ws(), nfa_.literal("]"));
    seq = nfa_.seq(nfa_.seq(open, seq), close);
    if (min > 0) return seq;
    // No items at all: "[" ws "]".
    return nfa_.alt({seq, nfa_.seq(nfa_.seq(nfa_.literal("["), ws()), nfa_.literal("]"))});
  }

  Result<Frag> object(const ojson& s, const std::string& path) {
    const ojson* props = s.contains("properties") ? &s["properties"] : nullptr;
    if (props && !props->is_object())
      return bad(join(path, "properties"), "'properties' must be an object of schemas");
    const ojson* extra = s.contains("additionalProperties") ? &s["additionalProperties"] : nullptr;
    if (extra && !extra->is_boolean() && !extra->is_object())
      return bad(join(path, "additionalProperties"),
                 "'additionalProperties' must be a boolean or a schema");
    std::vector<std::string> names;
    if (props) {
      for (const auto& [k, v] : props->items()) names.push_back(k);
    }
    std::vector<bool> required(names.size(), false);
    if (s.contains("required")) {
      const ojson& r = s["required"];
      if (!r.is_array()) return bad(join(path, "required"), "'required' must be an array of names");
      for (const ojson& n : r) {
        if (!n.is_string()) return bad(join(path, "required"), "'required' must list names");
        auto it = std::find(names.begin(), names.end(), n.get<std::string>());
        if (it == names.end()) {
          return bad(join(path, "required"), "required property '" + n.get<std::string>() +
                                                 "' is not among the properties");
        }
        required[static_cast<size_t>(it - names.begin())] = true;
      }
    }
    if (names.empty()) {
      if (extra && extra->is_boolean() && !extra->get<bool>())
        return nfa_.seq(nfa_.seq(nfa_.literal("{"), ws()), nfa_.literal("}"));
      if (extra && extra->is_object())
        return free_object(0, extra, join(path, "additionalProperties"));
      return free_object(0, nullptr, "");
    }
    if (extra && extra->is_object()) {
      return bad(join(path, "additionalProperties"),
                 "'additionalProperties' as a schema beside 'properties' is not supported");
    }
    const int n = static_cast<int>(names.size());
    // after[k + 1]: the node after property k was written (after[0]: none yet).
    std::vector<int32_t> after(static_cast<size_t>(n) + 1);
    for (auto& a : after) a = nfa_.add_node();
    Frag open = nfa_.seq(nfa_.literal("{"), ws());
    nfa_.add_eps(open.out, after[0]);
    for (int j = 0; j < n; ++j) {
      const std::string& name = names[static_cast<size_t>(j)];
      HR_ASSIGN_OR_RETURN(Frag v, value((*props)[name], join(join(path, "properties"), name)));
      Frag kv = nfa_.seq(nfa_.seq(nfa_.literal(json_literal(ojson(name)) + ":"), ws()), v);
      nfa_.add_eps(kv.out, after[static_cast<size_t>(j) + 1]);
      Frag comma = nfa_.seq(nfa_.literal(","), ws());
      nfa_.add_eps(comma.out, kv.in);
      // From "nothing yet" when no required property comes before j; from after k when none
      // comes between k and j.
      bool blocked = false;
      for (int k = j - 1; k >= -1 && !blocked; --k) {
        if (k == -1) {
          nfa_.add_eps(after[0], kv.in);
        } else {
          nfa_.add_eps(after[static_cast<size_t>(k) + 1], comma.in);
          blocked = required[static_cast<size_t>(k)];
        }
      }
    }
    Frag close = nfa_.seq(ws(), nfa_.literal("}"));
    for (int k = n - 1; k >= -1; --k) {
      nfa_.add_eps(after[static_cast<size_t>(k) + 1], close.in);
      if (k >= 0 && required[static_cast<size_t>(k)]) break;
    }
    return Frag{open.in, close.out};
  }

  Result<Frag> ref(const ojson& r, const std::string& path) {
    if (!r.is_string()) return bad(path, "'$ref' must be a string");
    const std::string target = r.get<std::string>();
    if (target.empty() || target[0] != '#')
      return bad(path, "only local $ref (\"#...\") is supported, not '" + target + "'");
    const ojson* node = &root_;
    std::string pointer = target.substr(1);
    if (!pointer.empty()) {
      if (pointer[0] != '/') return bad(path, "'$ref' must be a JSON pointer ('#/...')");
      size_t at = 1;
      while (at <= pointer.size()) {
        size_t end = pointer.find('/', at);
        if (end == std::string::npos) end = pointer.size();
        std::string token = pointer.substr(at, end - at);
        std::string key;
        for (size_t i = 0; i < token.size(); ++i) {
          if (token[i] == '~' && i + 1 < token.size() &&
              (token[i + 1] == '0' || token[i + 1] == '1')) {
            key += token[i + 1] == '0' ? '~' : '/';
            ++i;
          } else {
            key += token[i];
          }
        }
        if (node->is_object() && node->contains(key)) {
          node = &(*node)[key];
        } else if (node->is_array() && !key.empty() &&
                   key.find_first_not_of("0123456789") == std::string::npos &&
                   std::stoul(key) < node->size()) {
          node = &(*node)[std::stoul(key)];
        } else {
          return bad(path, "'$ref' points at nothing: " + target);
        }
        at = end + 1;
      }
    }
    int& depth = ref_depth_[target];
    if (depth >= limits_.max_ref_depth) return nothing();  // cut: only non-recursive branches
    ++depth;
    auto f = value(*node, path);
    --depth;
    return f;
  }

  Nfa& nfa_;
  const ojson& root_;
  JsonLimits limits_;
  std::map<std::string, int> ref_depth_;
};

}  // namespace

Result<Frag> add_json_schema(Nfa& nfa, const ojson& schema, const std::string& where,
                             const JsonLimits& limits) {
  Compiler c(nfa, schema, limits);
  return c.value(schema, where);
}

Result<std::shared_ptr<const Nfa>> compile_json_schema(const ojson& schema,
                                                       const std::string& where,
                                                       const JsonLimits& limits) {
  JsonLimits l = limits;
  for (;;) {
    auto nfa = std::make_shared<Nfa>(2'000'000);
    HR_ASSIGN_OR_RETURN(Frag f, add_json_schema(*nfa, schema, where, l));
    if (nfa->overflowed() && l.max_ref_depth > 1) {
      l.max_ref_depth /= 2;  // a recursive schema unrolled too far: unroll less
      continue;
    }
    Status s = nfa->finish(f);
    if (!s.is_ok()) return invalid_argument(s.message(), where);
    return std::shared_ptr<const Nfa>(std::move(nfa));
  }
}

std::shared_ptr<const Nfa> compile_json_object(const JsonLimits& limits) {
  auto nfa = std::make_shared<Nfa>();
  ojson root = ojson::object();
  Compiler c(*nfa, root, limits);
  Frag f = c.free_object(1, nullptr, "").value();
  Status s = nfa->finish(f);
  HR_CHECK(s.is_ok()) << s.message();
  return nfa;
}

}  // namespace hr::grammar
