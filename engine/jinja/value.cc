// Template values.
#include "engine/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace hr::engine::jinja {

const Value* Object::find(const std::string& key) const {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

Value* Object::find(const std::string& key) {
  auto it = index_.find(key);
  return it == index_.end() ? nullptr : &entries_[it->second].second;
}

void Object::set(const std::string& key, Value value) {
  if (Value* v = find(key)) {
    *v = std::move(value);
    return;
  }
  index_[key] = entries_.size();
  entries_.emplace_back(key, std::move(value));
}

bool Object::erase(const std::string& key) {
  auto it = index_.find(key);
  if (it == index_.end()) return false;
  entries_.erase(entries_.begin() + static_cast<std::ptrdiff_t>(it->second));
  index_.clear();
  for (size_t i = 0; i < entries_.size(); ++i) index_[entries_[i].first] = i;
  return true;
}

Value Value::null() {
  Value v;
  v.kind = Kind::kNull;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind = Kind::kBool;
  v.b = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind = Kind::kInt;
  v.i = i;
  return v;
}

Value Value::floating(double f) {
  Value v;
  v.kind = Kind::kFloat;
  v.f = f;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.kind = Kind::kString;
  v.s = std::move(s);
  return v;
}

Value Value::list(Array items, Kind kind) {
  Value v;
  v.kind = kind;
  v.array = std::make_shared<Array>(std::move(items));
  return v;
}

Value Value::mapping(Object o, Kind kind) {
  Value v;
  v.kind = kind;
  v.object = std::make_shared<Object>(std::move(o));
  return v;
}

Value Value::function(Function f) {
  Value v;
  v.kind = Kind::kFunction;
  v.fn = std::make_shared<Function>(std::move(f));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return null();
    case nlohmann::ordered_json::value_t::boolean:
      return boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return integer(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float: {
      // A JavaScript number that happens to be whole is an integer there.
      const double d = j.get<double>();
      if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9007199254740992.0) {
        return integer(static_cast<int64_t>(d));
      }
      return floating(d);
    }
    case nlohmann::ordered_json::value_t::string:
      return string(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      Array items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      Object o;
      for (const auto& [k, e] : j.items()) o.set(k, from_json(e));
      return mapping(std::move(o));
    }
    default:
      return undefined();
  }
}

bool Value::truthy() const {
  switch (kind) {
    case Kind::kUndefined:
    case Kind::kNull:
      return false;
    case Kind::kBool:
      return b;
    case Kind::kInt:
      return i != 0;
    case Kind::kFloat:
      return f != 0 && !std::isnan(f);
    case Kind::kString:
      return !s.empty();
    case Kind::kArray:
    case Kind::kTuple:
      return !array->empty();
    case Kind::kObject:
    case Kind::kKwargs:
      return object->size() > 0;
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

// The shortest digits that read back the same, in fixed notation from 1e-7 up to 1e21 and in
// exponent notation outside, as JavaScript writes them.
std::string js_number(double d) {
  if (std::isnan(d)) return "NaN";
  if (std::isinf(d)) return d > 0 ? "Infinity" : "-Infinity";
  if (d == 0) return "0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // e.g. "-1.2345e+02"
  bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  size_t e = sci.find('e');
  std::string digits = sci.substr(0, e);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  int exponent = std::atoi(sci.c_str() + e + 1);
  const int n = exponent + 1;  // the decimal point after n digits
  std::string out;
  const int k = static_cast<int>(digits.size());
  if (k <= n && n <= 21) {
    out = digits + std::string(static_cast<size_t>(n - k), '0');
  } else if (0 < n && n <= 21) {
    out = digits.substr(0, static_cast<size_t>(n)) + "." + digits.substr(static_cast<size_t>(n));
  } else if (-6 < n && n <= 0) {
    out = "0." + std::string(static_cast<size_t>(-n), '0') + digits;
  } else {
    out = digits.substr(0, 1);
    if (k > 1) out += "." + digits.substr(1);
    out += "e";
    out += (n - 1 >= 0 ? "+" : "-");
    out += std::to_string(std::abs(n - 1));
  }
  return negative ? "-" + out : out;
}

namespace {

std::string float_text(double f) {
  if (f == 0 && std::signbit(f)) return "-0.0";
  if (std::isfinite(f) && f == std::floor(f) && std::fabs(f) < 1e21) {
    return js_number(f) + ".0";
  }
  return js_number(f);
}

// JSON.stringify of a string: quotes, backslash and control characters escaped.
void append_json_string(std::string* out, const std::string& s) {
  out->push_back('"');
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          *out += buf;
        } else {
          out->push_back(static_cast<char>(c));
        }
    }
  }
  out->push_back('"');
}

// Escapes every character from U+007F up as \uXXXX (UTF-16 units, as JavaScript strings hold
// them).
std::string ascii_safe(const std::string& s) {
  std::string out;
  out.reserve(s.size());
  char buf[8];
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    uint32_t cp = c;
    size_t n = 1;
    if (c >= 0xF0 && i + 3 < s.size() + 0) {
      cp = ((c & 0x07u) << 18) | ((s[i + 1] & 0x3Fu) << 12) | ((s[i + 2] & 0x3Fu) << 6) |
           (s[i + 3] & 0x3Fu);
      n = 4;
    } else if (c >= 0xE0 && i + 2 < s.size()) {
      cp = ((c & 0x0Fu) << 12) | ((s[i + 1] & 0x3Fu) << 6) | (s[i + 2] & 0x3Fu);
      n = 3;
    } else if (c >= 0xC0 && i + 1 < s.size()) {
      cp = ((c & 0x1Fu) << 6) | (s[i + 1] & 0x3Fu);
      n = 2;
    }
    if (cp < 0x7F) {
      out.push_back(static_cast<char>(c));
    } else if (cp <= 0xFFFF) {
      std::snprintf(buf, sizeof buf, "\\u%04x", cp);
      out += buf;
    } else {
      const uint32_t v = cp - 0x10000;
      std::snprintf(buf, sizeof buf, "\\u%04x", 0xD800 + (v >> 10));
      out += buf;
      std::snprintf(buf, sizeof buf, "\\u%04x", 0xDC00 + (v & 0x3FF));
      out += buf;
    }
    i += n;
  }
  return out;
}

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// String.prototype.localeCompare, approximately: case-insensitive first, then lower case
// before upper.
bool locale_less(const std::string& a, const std::string& b) {
  const std::string la = lower(a), lb = lower(b);
  if (la != lb) return la < lb;
  return a > b;  // 'a' (0x61) sorts before 'A' (0x41)
}

}  // namespace

std::string Value::to_string() const {
  switch (kind) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNull:
      return "null";
    case Kind::kBool:
      return b ? "true" : "false";
    case Kind::kInt:
      return std::to_string(i);
    case Kind::kFloat:
      return float_text(f);
    case Kind::kString:
      return s;
    case Kind::kArray:
    case Kind::kTuple:
    case Kind::kObject:
    case Kind::kKwargs:
    case Kind::kNamespace: {
      JsonOptions o;
      o.undefined_as_null = false;
      return to_json_text(*this, o);
    }
    case Kind::kFunction:
      return "[function]";
  }
  return "";
}

const char* Value::kind_name() const {
  switch (kind) {
    case Kind::kUndefined:
      return "undefined";
    case Kind::kNull:
      return "none";
    case Kind::kBool:
      return "boolean";
    case Kind::kInt:
      return "integer";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "string";
    case Kind::kArray:
      return "list";
    case Kind::kTuple:
      return "tuple";
    case Kind::kObject:
      return "mapping";
    case Kind::kKwargs:
      return "keyword arguments";
    case Kind::kNamespace:
      return "namespace";
    case Kind::kFunction:
      return "function";
  }
  return "value";
}

std::string to_json_text(const Value& v, const JsonOptions& o, int depth) {
  std::string item_sep = o.item_separator, key_sep = o.key_separator;
  if (item_sep.empty() && key_sep.empty()) {
    item_sep = o.indent > 0 ? "," : ", ";
    key_sep = ": ";
  }
  switch (v.kind) {
    case Kind::kNull:
      return "null";
    case Kind::kUndefined:
      return o.undefined_as_null ? "null" : "undefined";
    case Kind::kBool:
      return v.b ? "true" : "false";
    case Kind::kInt:
      return std::to_string(v.i);
    case Kind::kFloat:
      return std::isfinite(v.f) ? js_number(v.f) : "null";
    case Kind::kString: {
      std::string out;
      append_json_string(&out, v.s);
      return o.ensure_ascii ? ascii_safe(out) : out;
    }
    case Kind::kArray:
    case Kind::kTuple:
    case Kind::kObject:
    case Kind::kKwargs:
    case Kind::kNamespace: {
      const std::string indent =
          o.indent > 0 ? std::string(static_cast<size_t>(o.indent), ' ') : "";
      std::string base = "\n";
      for (int d = 0; d < depth; ++d) base += indent;
      const std::string child = base + indent;
      std::vector<std::string> core;
      if (v.is_list()) {
        for (const Value& e : *v.array) core.push_back(to_json_text(e, o, depth + 1));
        std::string out = "[";
        if (o.indent > 0 && !core.empty()) {
          out += child;
          for (size_t k = 0; k < core.size(); ++k) {
            if (k) out += item_sep + child;
            out += core[k];
          }
          out += base;
        } else {
          for (size_t k = 0; k < core.size(); ++k) {
            if (k) out += item_sep;
            out += core[k];
          }
        }
        return out + "]";
      }
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : v.object->entries()) entries.push_back(&e);
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return locale_less(a->first, b->first); });
      }
      for (const auto* e : entries) {
        std::string key;
        append_json_string(&key, e->first);
        if (o.ensure_ascii) key = ascii_safe(key);
        std::string item = key + key_sep + to_json_text(e->second, o, depth + 1);
        core.push_back(o.indent > 0 ? child + item : item);
      }
      std::string out = "{";
      for (size_t k = 0; k < core.size(); ++k) {
        if (k) out += item_sep;
        out += core[k];
      }
      if (o.indent > 0 && !core.empty()) out += base;
      return out + "}";
    }
    case Kind::kFunction:
      throw Error("cannot convert a function to JSON");
  }
  return "null";
}

namespace {

bool is_reference(const Value& v) {
  return v.is_list() || v.is_mapping() || v.kind == Kind::kNamespace || v.kind == Kind::kFunction;
}

const void* identity(const Value& v) {
  if (v.is_list()) return v.array.get();
  if (v.kind == Kind::kFunction) return v.fn.get();
  return v.object.get();
}

// JavaScript's ToNumber of a string: whitespace-trimmed decimal, "" is 0, anything else NaN.
double string_number(const std::string& s) {
  size_t a = s.find_first_not_of(" \t\n\r\f\v");
  if (a == std::string::npos) return 0;
  size_t z = s.find_last_not_of(" \t\n\r\f\v");
  const std::string t = s.substr(a, z - a + 1);
  char* end = nullptr;
  double d = std::strtod(t.c_str(), &end);
  return end == t.c_str() + t.size() ? d : std::nan("");
}

double number_of(const Value& v) {
  switch (v.kind) {
    case Kind::kBool:
      return v.b ? 1 : 0;
    case Kind::kInt:
      return static_cast<double>(v.i);
    case Kind::kFloat:
      return v.f;
    case Kind::kString:
      return string_number(v.s);
    default:
      return std::nan("");
  }
}

}  // namespace

bool loosely_equal(const Value& a, const Value& b) {
  const bool an = a.is_null() || a.is_undefined(), bn = b.is_null() || b.is_undefined();
  if (an || bn) return an && bn;
  if (is_reference(a) || is_reference(b)) {
    return is_reference(a) && is_reference(b) && identity(a) == identity(b);
  }
  if (a.is_string() && b.is_string()) return a.s == b.s;
  return number_of(a) == number_of(b);
}

bool strictly_equal(const Value& a, const Value& b) {
  if (is_reference(a) || is_reference(b)) {
    return is_reference(a) && is_reference(b) && identity(a) == identity(b);
  }
  if (a.is_number() && b.is_number()) return number_of(a) == number_of(b);
  if (a.kind != b.kind) return false;
  switch (a.kind) {
    case Kind::kBool:
      return a.b == b.b;
    case Kind::kString:
      return a.s == b.s;
    default:
      return true;  // none, undefined
  }
}

int compare_values(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_null() && b.is_null()) return 0;
  if (a.is_null() || b.is_null()) {
    throw Error(std::string("cannot compare ") + a.kind_name() + " with " + b.kind_name());
  }
  if (a.is_undefined() && b.is_undefined()) return 0;
  if (a.is_undefined() || b.is_undefined()) {
    throw Error(std::string("cannot compare ") + a.kind_name() + " with " + b.kind_name());
  }
  auto numeric = [](const Value& v) { return v.is_number() || v.kind == Kind::kBool; };
  if (numeric(a) && numeric(b)) {
    const double x = number_of(a), y = number_of(b);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  if (a.is_string() && b.is_string()) {
    const std::string x = case_sensitive ? a.s : lower(a.s);
    const std::string y = case_sensitive ? b.s : lower(b.s);
    return x < y ? -1 : x > y ? 1 : 0;
  }
  throw Error(std::string("cannot compare ") + a.kind_name() + " with " + b.kind_name());
}

}  // namespace hr::engine::jinja
