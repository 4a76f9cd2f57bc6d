// The values a chat template computes with, following the semantics of @huggingface/jinja (the
// interpreter transformers.js uses), which our renders are checked against: undefined, none,
// booleans, integers, floats, strings, lists (and tuples), mappings in insertion order,
// namespaces and functions. Lists, mappings and namespaces are shared by reference, as in
// Python and JavaScript; everything else is copied.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hr::engine::jinja {

// A template's runtime error (raise_exception, a bad operand, an unknown filter...). The
// interpreter adds the template line.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& message, int line = 0)
      : std::runtime_error(message), line_(line) {}
  int line() const { return line_; }

 private:
  int line_;
};

enum class Kind {
  kUndefined,
  kNull,
  kBool,
  kInt,
  kFloat,
  kString,
  kArray,
  kTuple,
  kObject,
  kKwargs,  // keyword arguments passed to a function (a mapping)
  kNamespace,
  kFunction,
};

struct Value;
class Env;
class Object;

using Array = std::vector<Value>;
// args: positional, then (when any were given) one kKwargs value last.
using Function = std::function<Value(std::vector<Value>& args, Env& scope)>;

struct Value {
  Kind kind = Kind::kUndefined;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;
  std::shared_ptr<Array> array;    // kArray, kTuple
  std::shared_ptr<Object> object;  // kObject, kKwargs, kNamespace
  std::shared_ptr<Function> fn;    // kFunction

  static Value undefined() { return {}; }
  static Value null();
  static Value boolean(bool v);
  static Value integer(int64_t v);
  static Value floating(double v);
  static Value string(std::string v);
  static Value list(Array items, Kind kind = Kind::kArray);
  static Value mapping(Object o, Kind kind = Kind::kObject);
  static Value function(Function f);
  // From JSON: integers stay integers, other numbers are floats, objects keep their key order.
  static Value from_json(const nlohmann::ordered_json& j);

  bool is_undefined() const { return kind == Kind::kUndefined; }
  bool is_null() const { return kind == Kind::kNull; }
  bool is_string() const { return kind == Kind::kString; }
  bool is_number() const { return kind == Kind::kInt || kind == Kind::kFloat; }
  bool is_list() const { return kind == Kind::kArray || kind == Kind::kTuple; }
  bool is_mapping() const { return kind == Kind::kObject || kind == Kind::kKwargs; }
  bool has_attributes() const { return is_mapping() || kind == Kind::kNamespace; }

  // Python's truthiness: empty strings, lists and mappings are false.
  bool truthy() const;
  // How the value prints in the output ({{ x }}): none and undefined print nothing (the caller
  // skips them), booleans as true/false, floats with a decimal point, lists and mappings as JSON.
  std::string to_string() const;
  const char* kind_name() const;
};

// A mapping that keeps its keys in insertion order.
class Object {
 public:
  const Value* find(const std::string& key) const;
  Value* find(const std::string& key);
  void set(const std::string& key, Value value);
  bool erase(const std::string& key);
  size_t size() const { return entries_.size(); }
  const std::vector<std::pair<std::string, Value>>& entries() const { return entries_; }

 private:
  std::vector<std::pair<std::string, Value>> entries_;
  std::unordered_map<std::string, size_t> index_;
};

// A number as JavaScript's String(n) writes it ("1", "0.5", "1e-7", "1.5e+21").
std::string js_number(double d);

struct JsonOptions {
  int indent = -1;  // < 0: on one line
  bool ensure_ascii = false;
  bool sort_keys = false;
  // Item and key separators; empty: ", " and ": " (or "," and ": " when indenting).
  std::string item_separator;
  std::string key_separator;
  bool undefined_as_null = true;  // to_string renders undefined as "undefined"
};
// The tojson filter (Python's json.dumps with the given options).
std::string to_json_text(const Value& v, const JsonOptions& options, int depth = 0);

// `==` as the reference interpreter compares: by value for scalars (JavaScript's loose equality:
// none equals undefined, 1 equals true and "1"), by identity for lists and mappings.
bool loosely_equal(const Value& a, const Value& b);
// Strict equality (`in` over a list): same kind and value for scalars, identity otherwise.
bool strictly_equal(const Value& a, const Value& b);
// Ordering for sort and dictsort: numbers (and booleans) with numbers, strings with strings
// (case-insensitively unless `case_sensitive`); anything else is an Error. -1, 0 or 1.
int compare_values(const Value& a, const Value& b, bool case_sensitive);

}  // namespace hr::engine::jinja
