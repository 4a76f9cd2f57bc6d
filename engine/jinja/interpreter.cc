// The template interpreter.
#include "engine/jinja/interpreter.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <functional>
#include <optional>
#include <unordered_set>
#include <utility>
#include <vector>

#include "base/strings.h"

namespace hr::engine::jinja {

Value Env::lookup(const std::string& name) const {
  for (const Env* e = this; e != nullptr; e = e->parent_) {
    auto it = e->vars_.find(name);
    if (it != e->vars_.end()) return it->second;
  }
  return Value::undefined();
}

namespace {

struct BreakLoop {};
struct ContinueLoop {};

std::string ascii_upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}

std::string ascii_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

std::string trim_start(const std::string& s) { return std::string(hr::trim_start(s)); }
std::string trim_end(const std::string& s) { return std::string(hr::trim_end(s)); }
std::string trim(const std::string& s) { return std::string(hr::trim(s)); }

bool is_word(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// JavaScript's /\b\w/g upper-casing.
std::string title_case(std::string s) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (is_word(s[i]) && (i == 0 || !is_word(s[i - 1]))) {
      s[i] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[i])));
    }
  }
  return s;
}

// The code points of a UTF-8 string, each as its own string.
std::vector<std::string> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
    n = std::min(n, s.size() - i);
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

// The length JavaScript gives a string: UTF-16 code units.
int64_t js_length(const std::string& s) {
  int64_t n = 0;
  for (const std::string& ch : characters(s)) n += ch.size() == 4 ? 2 : 1;
  return n;
}

// A scalar's value as JavaScript's toString writes it (for `~` and string `+`): numbers without a
// forced decimal point.
std::string value_text(const Value& v) {
  switch (v.kind) {
    case Kind::kFloat:
      return js_number(v.f);
    case Kind::kArray:
    case Kind::kTuple: {
      std::string out;
      for (size_t k = 0; k < v.array->size(); ++k) {
        if (k) out += ",";
        const Value& e = (*v.array)[k];
        if (!e.is_null() && !e.is_undefined()) out += value_text(e);
      }
      return out;
    }
    case Kind::kObject:
    case Kind::kKwargs:
    case Kind::kNamespace:
      return "[object Map]";
    default:
      return v.to_string();
  }
}

double as_double(const Value& v) {
  return v.kind == Kind::kFloat  ? v.f
         : v.kind == Kind::kBool ? (v.b ? 1 : 0)
                                 : static_cast<double>(v.i);
}

// Whether `v` is or contains (through lists and mappings) the entries `target`. Each container is
// looked at once, so shared parts cost nothing more.
bool holds(const Value& v, const Object* target) {
  std::unordered_set<const void*> seen;
  std::vector<const Value*> todo = {&v};
  while (!todo.empty()) {
    const Value* x = todo.back();
    todo.pop_back();
    if (x->object) {
      if (x->object.get() == target) return true;
      if (!seen.insert(x->object.get()).second) continue;
      for (const auto& [k, e] : x->object->entries()) todo.push_back(&e);
    }
    if (x->array && seen.insert(x->array.get()).second) {
      for (const Value& e : *x->array) todo.push_back(&e);
    }
  }
  return false;
}

// An arithmetic result: an integer when both operands were, unless it is not one (1 % 0 is NaN
// and 1 // 0 infinite, as in the reference's JavaScript, and neither fits an int64).
Value number(double d, bool is_float) {
  if (is_float || !std::isfinite(d) || d < -9.2e18 || d > 9.2e18) return Value::floating(d);
  return Value::integer(static_cast<int64_t>(d));
}

// Python-style slicing of `n` items.
std::vector<size_t> slice_indices(size_t n, const Value& start_v, const Value& stop_v,
                                  const Value& step_v) {
  const int64_t len = static_cast<int64_t>(n);
  const int64_t step = step_v.is_undefined() ? 1 : step_v.i;
  if (step == 0) throw Error("slice step cannot be zero");
  int64_t start, stop;
  if (step > 0) {
    start = start_v.is_undefined() ? 0 : start_v.i;
    stop = stop_v.is_undefined() ? len : stop_v.i;
    start = start < 0 ? std::max<int64_t>(len + start, 0) : std::min(start, len);
    stop = stop < 0 ? std::max<int64_t>(len + stop, 0) : std::min(stop, len);
  } else {
    start = start_v.is_undefined() ? len - 1 : start_v.i;
    stop = stop_v.is_undefined() ? -1 : stop_v.i;
    start = start < 0 ? std::max<int64_t>(len + start, -1) : std::min(start, len - 1);
    stop = stop < -1 ? std::max<int64_t>(len + stop, -1) : std::min(stop, len - 1);
  }
  std::vector<size_t> out;
  const int64_t dir = step > 0 ? 1 : -1;
  for (int64_t i = start; dir * i < dir * stop; i += step) out.push_back(static_cast<size_t>(i));
  return out;
}

// Keyword arguments, when the last argument is them.
const Object* kwargs_of(const std::vector<Value>& args) {
  if (!args.empty() && args.back().kind == Kind::kKwargs) return args.back().object.get();
  return nullptr;
}

// The positional arguments (without a trailing keyword-arguments value).
size_t num_positional(const std::vector<Value>& args) {
  return kwargs_of(args) ? args.size() - 1 : args.size();
}

// Positional argument `i`, else keyword argument `name`, else undefined.
Value arg(const std::vector<Value>& args, size_t i, const char* name) {
  if (i < num_positional(args)) return args[i];
  if (const Object* kw = kwargs_of(args); kw != nullptr && name != nullptr) {
    if (const Value* v = kw->find(name)) return *v;
  }
  return Value::undefined();
}

std::string python_split_error() { return "split() separator must be a string or none"; }

// The methods of strings, mappings and lists (what `.name` finds on them).
Value builtin(const Value& self, const std::string& name) {
  if (self.is_string()) {
    const std::string s = self.s;
    if (name == "length") return Value::integer(js_length(s));
    auto fn = [](std::function<Value(std::vector<Value>&)> f) {
      return Value::function([f = std::move(f)](std::vector<Value>& a, Env&) { return f(a); });
    };
    if (name == "upper") return fn([s](auto&) { return Value::string(ascii_upper(s)); });
    if (name == "lower") return fn([s](auto&) { return Value::string(ascii_lower(s)); });
    if (name == "strip") return fn([s](auto&) { return Value::string(trim(s)); });
    if (name == "rstrip") return fn([s](auto&) { return Value::string(trim_end(s)); });
    if (name == "lstrip") return fn([s](auto&) { return Value::string(trim_start(s)); });
    if (name == "title") return fn([s](auto&) { return Value::string(title_case(s)); });
    if (name == "capitalize") {
      return fn([s](auto&) {
        std::string out = s;
        if (!out.empty())
          out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
        return Value::string(out);
      });
    }
    if (name == "startswith" || name == "endswith") {
      const bool starts = name == "startswith";
      return fn([s, starts](std::vector<Value>& a) {
        if (a.empty())
          throw Error(std::string(starts ? "startswith" : "endswith") + "() needs an argument");
        auto test = [&](const std::string& p) {
          if (p.size() > s.size()) return false;
          return starts ? s.compare(0, p.size(), p) == 0
                        : s.compare(s.size() - p.size(), p.size(), p) == 0;
        };
        if (a[0].is_string()) return Value::boolean(test(a[0].s));
        if (a[0].is_list()) {
          for (const Value& p : *a[0].array) {
            if (!p.is_string()) throw Error("startswith()/endswith() tuple items must be strings");
            if (test(p.s)) return Value::boolean(true);
          }
          return Value::boolean(false);
        }
        throw Error("startswith()/endswith() takes a string or a tuple of strings");
      });
    }
    if (name == "split") {
      return fn([s](std::vector<Value>& a) {
        Value sep = a.size() > 0 ? a[0] : Value::null();
        Value maxsplit = a.size() > 1 ? a[1] : Value::integer(-1);
        if (!sep.is_string() && !sep.is_null()) throw Error(python_split_error());
        if (maxsplit.kind != Kind::kInt) throw Error("split() maxsplit must be an integer");
        Array parts;
        if (sep.is_null()) {
          const std::string t = trim_start(s);
          size_t i = 0;
          while (i < t.size()) {
            while (i < t.size() && is_space(t[i])) ++i;
            if (i >= t.size()) break;
            if (maxsplit.i != -1 && static_cast<int64_t>(parts.size()) >= maxsplit.i) {
              parts.push_back(Value::string(t.substr(i)));
              break;
            }
            size_t j = i;
            while (j < t.size() && !is_space(t[j])) ++j;
            parts.push_back(Value::string(t.substr(i, j - i)));
            i = j;
          }
        } else {
          if (sep.s.empty()) throw Error("empty separator");
          std::vector<std::string> pieces;
          size_t start = 0, at;
          while ((at = s.find(sep.s, start)) != std::string::npos) {
            pieces.push_back(s.substr(start, at - start));
            start = at + sep.s.size();
          }
          pieces.push_back(s.substr(start));
          if (maxsplit.i != -1 && static_cast<int64_t>(pieces.size()) > maxsplit.i) {
            std::string rest;
            for (size_t k = static_cast<size_t>(maxsplit.i); k < pieces.size(); ++k) {
              if (k > static_cast<size_t>(maxsplit.i)) rest += sep.s;
              rest += pieces[k];
            }
            pieces.resize(static_cast<size_t>(maxsplit.i));
            pieces.push_back(rest);
          }
          for (auto& p : pieces) parts.push_back(Value::string(std::move(p)));
        }
        return Value::list(std::move(parts));
      });
    }
    if (name == "replace") {
      return fn([s](std::vector<Value>& a) {
        if (num_positional(a) < 2) throw Error("replace() needs two arguments");
        const Value from = a[0], to = a[1];
        if (!from.is_string() || !to.is_string())
          throw Error("replace() arguments must be strings");
        Value count = arg(a, 2, "count");
        if (count.is_undefined()) count = Value::null();
        if (count.kind != Kind::kInt && !count.is_null())
          throw Error("replace() count must be an integer");
        int64_t remaining = count.is_null() || count.i < 0 ? INT64_MAX : count.i;
        std::string out;
        if (from.s.empty()) {
          // Between every two characters, and at both ends.
          std::vector<std::string> chars = characters(s);
          for (size_t k = 0; k <= chars.size(); ++k) {
            if (remaining > 0) {
              out += to.s;
              --remaining;
            }
            if (k < chars.size()) out += chars[k];
          }
          return Value::string(out);
        }
        size_t start = 0, at;
        while (remaining > 0 && (at = s.find(from.s, start)) != std::string::npos) {
          out += s.substr(start, at - start) + to.s;
          start = at + from.s.size();
          --remaining;
        }
        out += s.substr(start);
        return Value::string(out);
      });
    }
    return Value::undefined();
  }
  if (self.is_list()) {
    if (name == "length") return Value::integer(static_cast<int64_t>(self.array->size()));
    return Value::undefined();
  }
  if (self.is_mapping()) {
    std::shared_ptr<Object> obj = self.object;
    auto fn = [](std::function<Value(std::vector<Value>&)> f) {
      return Value::function([f = std::move(f)](std::vector<Value>& a, Env&) { return f(a); });
    };
    auto pairs = [obj] {
      Array items;
      for (const auto& [k, v] : obj->entries()) items.push_back(Value::list({Value::string(k), v}));
      return items;
    };
    if (name == "get") {
      return fn([obj](std::vector<Value>& a) {
        if (a.empty() || !a[0].is_string()) throw Error("get() takes a string key");
        if (const Value* v = obj->find(a[0].s)) {
          if (!v->is_undefined()) return *v;
        }
        return a.size() > 1 ? a[1] : Value::null();
      });
    }
    if (name == "items") return fn([pairs](auto&) { return Value::list(pairs()); });
    if (name == "keys") {
      return fn([obj](auto&) {
        Array keys;
        for (const auto& e : obj->entries()) keys.push_back(Value::string(e.first));
        return Value::list(std::move(keys));
      });
    }
    if (name == "values") {
      return fn([obj](auto&) {
        Array values;
        for (const auto& e : obj->entries()) values.push_back(e.second);
        return Value::list(std::move(values));
      });
    }
    if (name == "dictsort") {
      return fn([pairs](std::vector<Value>& a) {
        Value cs = arg(a, 0, "case_sensitive"), by = arg(a, 1, "by"), rev = arg(a, 2, "reverse");
        if (cs.is_undefined()) cs = Value::boolean(false);
        if (by.is_undefined()) by = Value::string("key");
        if (rev.is_undefined()) rev = Value::boolean(false);
        if (cs.kind != Kind::kBool) throw Error("case_sensitive must be a boolean");
        if (!by.is_string() || (by.s != "key" && by.s != "value"))
          throw Error("by must be 'key' or 'value'");
        if (rev.kind != Kind::kBool) throw Error("reverse must be a boolean");
        Array items = pairs();
        const size_t idx = by.s == "key" ? 0 : 1;
        std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
          const int c = compare_values((*x.array)[idx], (*y.array)[idx], cs.b);
          return rev.b ? c > 0 : c < 0;
        });
        return Value::list(std::move(items));
      });
    }
  }
  return Value::undefined();
}

bool apply_test(const std::string& name, const Value& v, const Value* other = nullptr) {
  if (name == "boolean") return v.kind == Kind::kBool;
  if (name == "callable") return v.kind == Kind::kFunction;
  if (name == "odd" || name == "even") {
    if (v.kind != Kind::kInt) throw Error("cannot test " + name + " on " + v.kind_name());
    return (v.i % 2 != 0) == (name == "odd");
  }
  if (name == "false") return v.kind == Kind::kBool && !v.b;
  if (name == "true") return v.kind == Kind::kBool && v.b;
  if (name == "none") return v.is_null();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.kind == Kind::kInt;
  if (name == "iterable") return v.kind == Kind::kArray || v.is_string();
  if (name == "mapping") return v.is_mapping();
  if (name == "sequence") return v.is_list() || v.is_mapping() || v.is_string();
  if (name == "lower") return v.is_string() && v.s == ascii_lower(v.s);
  if (name == "upper") return v.is_string() && v.s == ascii_upper(v.s);
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "equalto" || name == "eq") {
    return other != nullptr && strictly_equal(v, *other) && v.kind != Kind::kArray;
  }
  throw Error("unknown test " + name);
}

bool known_test(const std::string& name) {
  static const char* kTests[] = {"boolean",  "callable",  "odd",      "even",   "false",
                                 "true",     "none",      "string",   "number", "integer",
                                 "iterable", "mapping",   "sequence", "lower",  "upper",
                                 "defined",  "undefined", "equalto",  "eq"};
  for (const char* t : kTests) {
    if (name == t) return true;
  }
  return false;
}

// The value at "a.b.0" inside mappings and lists; undefined when absent.
Value attribute_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part =
        path.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (v.has_attributes()) {
      const Value* f = v.object->find(part);
      v = f ? *f : Value::undefined();
    } else if (v.is_list()) {
      char* end = nullptr;
      const long idx = std::strtol(part.c_str(), &end, 10);
      if (end == part.c_str() || idx < 0 || static_cast<size_t>(idx) >= v.array->size()) {
        return Value::undefined();
      }
      v = (*v.array)[static_cast<size_t>(idx)];
    } else {
      return Value::undefined();
    }
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

std::string indent_text(const std::string& s, const std::string& pad, bool first, bool blank) {
  std::string out;
  size_t start = 0;
  bool is_first = true;
  while (true) {
    const size_t nl = s.find('\n', start);
    const std::string line =
        s.substr(start, nl == std::string::npos ? std::string::npos : nl - start);
    if (!is_first) out += "\n";
    const bool skip = (is_first && !first) || (line.empty() && !blank);
    out += skip ? line : pad + line;
    is_first = false;
    if (nl == std::string::npos) break;
    start = nl + 1;
  }
  return out;
}

// JavaScript's parseInt/parseFloat of a string (the leading number; NaN when none).
std::optional<double> leading_number(const std::string& s, bool integer) {
  const std::string t = trim_start(s);
  char* end = nullptr;
  const double d = integer ? static_cast<double>(std::strtoll(t.c_str(), &end, 10))
                           : std::strtod(t.c_str(), &end);
  if (end == t.c_str()) return std::nullopt;
  return d;
}

class Interpreter {
 public:
  std::string block(const std::vector<NodePtr>& statements, Env& env) {
    std::string out;
    for (const NodePtr& st : statements) {
      Value v = eval(*st, env);
      if (!v.is_null() && !v.is_undefined()) out += v.to_string();
      if (out.size() > kMaxOutputBytes) {
        throw Error(
            "the template's text grew past " + std::to_string(kMaxOutputBytes >> 20) + " MiB",
            st->line);
      }
    }
    return out;
  }

  // A render's bounds, so that a template that recurses or loops without end (a macro calling
  // itself, range(10**9)) is an error naming its line, not a crash or a hung worker: how deep
  // evaluation may nest, how many nodes one render may evaluate, how long its text may grow.
  static constexpr int kMaxDepth = 200;
  static constexpr int64_t kMaxSteps = 1'000'000;
  static constexpr size_t kMaxOutputBytes = 64 << 20;

  // Counts `cost` steps of the render at `n`.
  void step(const Node& n, int64_t cost = 1) {
    if ((steps_ += cost) > kMaxSteps) {
      throw Error("the template ran more than " + std::to_string(kMaxSteps) + " steps", n.line);
    }
  }

  Value eval(const Node& n, Env& env) {
    step(n);
    if (depth_ >= kMaxDepth) {
      throw Error("the template nests calls more than " + std::to_string(kMaxDepth) + " deep",
                  n.line);
    }
    struct Deeper {
      int& d;
      explicit Deeper(int& d) : d(++d) {}
      ~Deeper() { --d; }
    } deeper(depth_);
    try {
      return eval_node(n, env);
    } catch (const Error& e) {
      if (e.line() == 0) throw Error(e.what(), n.line);
      throw;
    }
  }

 private:
  Value eval_node(const Node& n, Env& env) {
    switch (n.kind) {
      case NodeKind::kText:
      case NodeKind::kString:
        return Value::string(n.text);
      case NodeKind::kComment:
        return Value::null();
      case NodeKind::kOutput:
        return eval(*n.kids[0], env);
      case NodeKind::kSet:
        return set(n, env);
      case NodeKind::kIf: {
        const bool test = eval(*n.kids[0], env).truthy();
        return Value::string(block(test ? n.body : n.alternate, env));
      }
      case NodeKind::kFor:
        return for_loop(n, env);
      case NodeKind::kMacro:
        return macro(n, env);
      case NodeKind::kCallBlock:
        return call_block(n, env);
      case NodeKind::kFilterBlock:
        return filter(Value::string(block(n.body, env)), *n.kids[0], env);
      case NodeKind::kBreak:
        throw BreakLoop{};
      case NodeKind::kContinue:
        throw ContinueLoop{};
      case NodeKind::kInteger:
        return Value::integer(n.integer);
      case NodeKind::kFloat:
        return Value::floating(n.number);
      case NodeKind::kIdentifier:
        return env.lookup(n.text);
      case NodeKind::kArray:
      case NodeKind::kTuple: {
        Array items;
        for (const NodePtr& k : n.kids) items.push_back(eval(*k, env));
        return Value::list(std::move(items),
                           n.kind == NodeKind::kTuple ? Kind::kTuple : Kind::kArray);
      }
      case NodeKind::kObjectLit: {
        Object o;
        for (size_t k = 0; k + 1 < n.kids.size(); k += 2) {
          Value key = eval(*n.kids[k], env);
          if (!key.is_string())
            throw Error(std::string("mapping keys must be strings, not ") + key.kind_name());
          o.set(key.s, eval(*n.kids[k + 1], env));
        }
        return Value::mapping(std::move(o));
      }
      case NodeKind::kMember:
        return member(n, env);
      case NodeKind::kCall:
        return call(n, env);
      case NodeKind::kUnary:
        return unary(n, env);
      case NodeKind::kBinary:
        return binary(n, env);
      case NodeKind::kFilter:
        return filter(eval(*n.kids[0], env), *n.kids[1], env);
      case NodeKind::kTest: {
        if (!known_test(n.text)) throw Error("unknown test " + n.text);
        const bool r = apply_test(n.text, eval(*n.kids[0], env));
        return Value::boolean(n.negate ? !r : r);
      }
      case NodeKind::kSelect:
        if (!eval(*n.kids[1], env).truthy()) return Value::undefined();
        return eval(*n.kids[0], env);
      case NodeKind::kTernary:
        return eval(*n.kids[0], env).truthy() ? eval(*n.kids[1], env) : eval(*n.kids[2], env);
      case NodeKind::kKeywordArg:
      case NodeKind::kSpread:
      case NodeKind::kKeywordSpread:
      case NodeKind::kSlice:
        throw Error("unexpected argument syntax outside a call");
    }
    throw Error("unknown syntax");
  }

  Value set(const Node& n, Env& env) {
    Value rhs = n.kids.size() > 1 ? eval(*n.kids[1], env) : Value::string(block(n.body, env));
    const Node& target = *n.kids[0];
    if (target.kind == NodeKind::kIdentifier) {
      env.set(target.text, std::move(rhs));
    } else if (target.kind == NodeKind::kTuple) {
      if (!rhs.is_list()) throw Error(std::string("cannot unpack ") + rhs.kind_name() + " in set");
      if (rhs.array->size() != target.kids.size()) {
        throw Error(rhs.array->size() < target.kids.size() ? "too few items to unpack in set"
                                                           : "too many items to unpack in set");
      }
      for (size_t k = 0; k < target.kids.size(); ++k) {
        if (target.kids[k]->kind != NodeKind::kIdentifier)
          throw Error("can only unpack to names in set");
        env.set(target.kids[k]->text, (*rhs.array)[k]);
      }
    } else if (target.kind == NodeKind::kMember) {
      Value obj = eval(*target.kids[0], env);
      if (obj.kind != Kind::kNamespace)
        throw Error("cannot assign an attribute of anything but a namespace");
      if (target.kids[1]->kind != NodeKind::kIdentifier)
        throw Error("cannot assign to a computed member");
      // A namespace that held itself would never be freed (found by jinja_fuzz): refused.
      if (holds(rhs, obj.object.get())) throw Error("cannot store a namespace inside itself");
      obj.object->set(target.kids[1]->text, std::move(rhs));
    } else {
      throw Error("cannot assign to this");
    }
    return Value::null();
  }

  void bind_loop_target(const Node& target, const Value& item, Env& scope) {
    if (target.kind == NodeKind::kIdentifier) {
      scope.set(target.text, item);
      return;
    }
    if (!item.is_list()) throw Error(std::string("cannot unpack ") + item.kind_name());
    if (item.array->size() != target.kids.size()) {
      throw Error(item.array->size() < target.kids.size() ? "too few items to unpack"
                                                          : "too many items to unpack");
    }
    for (size_t k = 0; k < target.kids.size(); ++k) {
      if (target.kids[k]->kind != NodeKind::kIdentifier) throw Error("can only unpack to names");
      scope.set(target.kids[k]->text, (*item.array)[k]);
    }
  }

  Value for_loop(const Node& n, Env& env) {
    Env scope(&env);
    const Node& target = *n.kids[0];
    const Node* iterable_node = n.kids[1].get();
    const Node* test = nullptr;
    if (iterable_node->kind == NodeKind::kSelect) {
      test = iterable_node->kids[1].get();
      iterable_node = iterable_node->kids[0].get();
    }
    Value iterable = eval(*iterable_node, scope);
    Array source;
    if (iterable.is_list()) {
      source = *iterable.array;
    } else if (iterable.is_mapping()) {
      for (const auto& e : iterable.object->entries()) source.push_back(Value::string(e.first));
    } else {
      throw Error(std::string("cannot loop over ") + iterable.kind_name());
    }
    Array items;
    if (test != nullptr) {
      for (const Value& item : source) {
        Env item_scope(&scope);
        bind_loop_target(target, item, item_scope);
        if (eval(*test, item_scope).truthy()) items.push_back(item);
      }
    } else {
      items = std::move(source);
    }
    std::string out;
    bool iterated = false;
    const int64_t count = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < count; ++i) {
      step(n, 10);  // a turn costs about ten nodes (the loop variable), body or not
      Object loop;
      loop.set("index", Value::integer(i + 1));
      loop.set("index0", Value::integer(i));
      loop.set("revindex", Value::integer(count - i));
      loop.set("revindex0", Value::integer(count - i - 1));
      loop.set("first", Value::boolean(i == 0));
      loop.set("last", Value::boolean(i == count - 1));
      loop.set("length", Value::integer(count));
      loop.set("previtem", i > 0 ? items[static_cast<size_t>(i - 1)] : Value::undefined());
      loop.set("nextitem", i < count - 1 ? items[static_cast<size_t>(i + 1)] : Value::undefined());
      scope.set("loop", Value::mapping(std::move(loop)));
      bind_loop_target(target, items[static_cast<size_t>(i)], scope);
      try {
        out += block(n.body, scope);
      } catch (const ContinueLoop&) {
        continue;
      } catch (const BreakLoop&) {
        break;
      }
      iterated = true;
    }
    if (!iterated) out += block(n.alternate, scope);
    return Value::string(out);
  }

  // Whether `nodes` read `name` (kwargs, varargs) anywhere.
  static bool reads(const std::vector<NodePtr>& nodes, const std::string& name) {
    for (const NodePtr& k : nodes) {
      if (k && reads(*k, name)) return true;
    }
    return false;
  }
  static bool reads(const Node& n, const std::string& name) {
    if (n.kind == NodeKind::kIdentifier && n.text == name) return true;
    if (n.kind == NodeKind::kMember && !n.computed) return reads(*n.kids[0], name);
    return reads(n.kids, name) || reads(n.args, name) || reads(n.body, name) ||
           reads(n.alternate, name);
  }

  void bind_arguments(const std::string& display, const std::vector<NodePtr>& params,
                      bool takes_kwargs, bool takes_varargs, std::vector<Value>& given,
                      Env& scope) {
    std::vector<Value> positional = given;
    Object keywords;
    if (!positional.empty() && positional.back().kind == Kind::kKwargs) {
      keywords = *positional.back().object;
      positional.pop_back();
    }
    std::vector<std::pair<std::string, const Node*>> pending;
    for (size_t k = 0; k < params.size(); ++k) {
      const Node& p = *params[k];
      const std::string& name = p.text;
      const Node* def = p.kind == NodeKind::kKeywordArg ? p.kids[0].get() : nullptr;
      Value v = k < positional.size() ? positional[k] : Value::undefined();
      bool have = k < positional.size();
      if (!have) {
        if (const Value* kv = keywords.find(name)) {
          v = *kv;
          keywords.erase(name);
          have = true;
        }
      }
      if (!have && def != nullptr) pending.emplace_back(name, def);
      scope.set(name, have ? v : Value::undefined());
    }
    if (takes_kwargs) {
      scope.set("kwargs", Value::mapping(keywords));
    } else if (keywords.size() > 0) {
      throw Error("macro " + display + " takes no keyword argument '" +
                  keywords.entries()[0].first + "'");
    }
    if (takes_varargs) {
      Array rest;
      for (size_t k = params.size(); k < positional.size(); ++k) rest.push_back(positional[k]);
      scope.set("varargs", Value::list(std::move(rest)));
    } else if (positional.size() > params.size()) {
      throw Error("macro " + display + " takes not more than " + std::to_string(params.size()) +
                  " argument(s)");
    }
    for (const auto& [name, def] : pending) scope.set(name, eval(*def, scope));
  }

  Value macro(const Node& n, Env& env) {
    const bool kw = reads(n.body, "kwargs"), va = reads(n.body, "varargs");
    const Node* node = &n;
    env.set(n.text, Value::function([this, node, kw, va](std::vector<Value>& args, Env& scope) {
              Env macro_scope(&scope);
              bind_arguments("'" + node->text + "'", node->args, kw, va, args, macro_scope);
              return Value::string(block(node->body, macro_scope));
            }));
    return Value::null();
  }

  Value call_block(const Node& n, Env& env) {
    const bool kw = reads(n.body, "kwargs"), va = reads(n.body, "varargs");
    const Node* node = &n;
    Env* outer = &env;
    Value caller = Value::function([this, node, outer, kw, va](std::vector<Value>& args, Env&) {
      Env caller_scope(outer);
      bind_arguments("None", node->args, kw, va, args, caller_scope);
      return Value::string(block(node->body, caller_scope));
    });
    const Node& call_node = *n.kids[0];
    std::vector<Value> args = arguments(call_node.args, env);
    if (num_positional(args) == args.size())
      args.push_back(Value::mapping(Object(), Kind::kKwargs));
    Value fn = eval(*call_node.kids[0], env);
    if (fn.kind != Kind::kFunction) throw Error(std::string("cannot call ") + fn.kind_name());
    Env call_env(&env);
    call_env.set("caller", caller);
    return (*fn.fn)(args, call_env);
  }

  // Positional arguments (with *spread), then one kKwargs value when any keyword was given.
  std::vector<Value> arguments(const std::vector<NodePtr>& nodes, Env& env) {
    std::vector<Value> positional;
    Object keywords;
    bool any_keyword = false;
    for (const NodePtr& a : nodes) {
      if (a->kind == NodeKind::kSpread) {
        Value v = eval(*a->kids[0], env);
        if (!v.is_list()) throw Error(std::string("cannot unpack ") + v.kind_name());
        for (const Value& e : *v.array) positional.push_back(e);
      } else if (a->kind != NodeKind::kKeywordArg && a->kind != NodeKind::kKeywordSpread) {
        positional.push_back(eval(*a, env));
      }
    }
    for (const NodePtr& a : nodes) {
      if (a->kind == NodeKind::kKeywordArg) {
        if (keywords.find(a->text))
          throw Error("got multiple values for keyword argument '" + a->text + "'");
        keywords.set(a->text, eval(*a->kids[0], env));
        any_keyword = true;
      } else if (a->kind == NodeKind::kKeywordSpread) {
        Value v = eval(*a->kids[0], env);
        if (!v.is_mapping())
          throw Error(std::string("argument after ** must be a mapping, not ") + v.kind_name());
        for (const auto& [k, e] : v.object->entries()) {
          if (keywords.find(k)) throw Error("got multiple values for keyword argument '" + k + "'");
          keywords.set(k, e);
          any_keyword = true;
        }
      }
    }
    if (any_keyword) positional.push_back(Value::mapping(std::move(keywords), Kind::kKwargs));
    return positional;
  }

  Value call(const Node& n, Env& env) {
    std::vector<Value> args = arguments(n.args, env);
    Value fn = eval(*n.kids[0], env);
    if (fn.kind != Kind::kFunction) throw Error(std::string("cannot call ") + fn.kind_name());
    return (*fn.fn)(args, env);
  }

  Value member(const Node& n, Env& env) {
    Value object = eval(*n.kids[0], env);
    const Node& prop = *n.kids[1];
    if (n.computed && prop.kind == NodeKind::kSlice) {
      if (!object.is_list() && !object.is_string())
        throw Error("only lists and strings can be sliced");
      Value parts[3];
      for (int k = 0; k < 3; ++k) {
        parts[k] = prop.kids[static_cast<size_t>(k)] ? eval(*prop.kids[static_cast<size_t>(k)], env)
                                                     : Value::undefined();
        if (!parts[k].is_undefined() && parts[k].kind != Kind::kInt) {
          throw Error("slice bounds must be integers");
        }
      }
      if (object.is_list()) {
        Array out;
        for (size_t i : slice_indices(object.array->size(), parts[0], parts[1], parts[2])) {
          out.push_back((*object.array)[i]);
        }
        return Value::list(std::move(out));
      }
      std::vector<std::string> chars = characters(object.s);
      std::string out;
      for (size_t i : slice_indices(chars.size(), parts[0], parts[1], parts[2])) out += chars[i];
      return Value::string(out);
    }
    Value property;
    if (n.computed) {
      property = eval(prop, env);
    } else if (prop.kind == NodeKind::kInteger) {
      property = Value::integer(prop.integer);
    } else {
      property = Value::string(prop.text);
    }
    if (object.has_attributes()) {
      if (!property.is_string()) {
        throw Error(std::string("cannot index a mapping with ") + property.kind_name());
      }
      if (const Value* v = object.object->find(property.s)) return *v;
      return object.is_mapping() ? builtin(object, property.s) : Value::undefined();
    }
    if (object.is_list() || object.is_string()) {
      if (property.kind == Kind::kInt) {
        if (object.is_list()) {
          const int64_t len = static_cast<int64_t>(object.array->size());
          const int64_t i = property.i < 0 ? len + property.i : property.i;
          if (i < 0 || i >= len) return Value::undefined();
          return (*object.array)[static_cast<size_t>(i)];
        }
        std::vector<std::string> chars = characters(object.s);
        const int64_t len = static_cast<int64_t>(chars.size());
        const int64_t i = property.i < 0 ? len + property.i : property.i;
        if (i < 0 || i >= len) return Value::undefined();
        return Value::string(chars[static_cast<size_t>(i)]);
      }
      if (property.is_string()) return builtin(object, property.s);
      throw Error(std::string("cannot index with ") + property.kind_name());
    }
    if (!property.is_string())
      throw Error(std::string("cannot index with ") + property.kind_name());
    return builtin(object, property.s);
  }

  Value unary(const Node& n, Env& env) {
    Value v = eval(*n.kids[0], env);
    if (n.text == "not") return Value::boolean(!v.truthy());
    const double sign = n.text == "-" ? -1 : 1;
    if (v.is_number() || v.kind == Kind::kBool)
      return number(sign * as_double(v), v.kind == Kind::kFloat);
    throw Error("unary " + n.text + " needs a number, not " + v.kind_name());
  }

  Value binary(const Node& n, Env& env) {
    const std::string& op = n.text;
    Value left = eval(*n.kids[0], env);
    if (op == "and") return left.truthy() ? eval(*n.kids[1], env) : left;
    if (op == "or") return left.truthy() ? left : eval(*n.kids[1], env);
    Value right = eval(*n.kids[1], env);
    if (op == "==") return Value::boolean(loosely_equal(left, right));
    if (op == "!=") return Value::boolean(!loosely_equal(left, right));
    if (left.is_undefined() || right.is_undefined()) {
      if (right.is_undefined() && (op == "in" || op == "not in"))
        return Value::boolean(op == "not in");
      throw Error("cannot apply " + op + " to an undefined value");
    }
    if (left.is_null() || right.is_null()) throw Error("cannot apply " + op + " to none");
    if (op == "~") return Value::string(value_text(left) + value_text(right));
    const bool ln = left.is_number(), rn = right.is_number();
    if (op == "**" && (ln || left.kind == Kind::kBool) && (rn || right.kind == Kind::kBool)) {
      const double a = as_double(left), b = as_double(right);
      if (a == 0 && b < 0) throw Error("0.0 cannot be raised to a negative power");
      const double r = std::pow(a, b);
      if (!std::isfinite(r)) throw Error("the power is not a finite real number");
      return number(r, left.kind == Kind::kFloat || right.kind == Kind::kFloat || b < 0);
    }
    if (ln && rn) {
      const double a = as_double(left), b = as_double(right);
      const bool is_float = left.kind == Kind::kFloat || right.kind == Kind::kFloat;
      if (op == "+") return number(a + b, is_float);
      if (op == "-") return number(a - b, is_float);
      if (op == "*") return number(a * b, is_float);
      if (op == "/") return Value::floating(a / b);
      if (op == "//") return number(std::floor(a / b), is_float);
      if (op == "%") return number(std::fmod(a, b), is_float);
      if (op == "<") return Value::boolean(a < b);
      if (op == ">") return Value::boolean(a > b);
      if (op == ">=") return Value::boolean(a >= b);
      if (op == "<=") return Value::boolean(a <= b);
    } else if (left.is_list() && right.is_list()) {
      if (op == "+") {
        Array joined = *left.array;
        joined.insert(joined.end(), right.array->begin(), right.array->end());
        return Value::list(std::move(joined));
      }
    } else if (right.is_list()) {
      bool found = false;
      for (const Value& e : *right.array) {
        if (strictly_equal(e, left)) {
          found = true;
          break;
        }
      }
      if (op == "in") return Value::boolean(found);
      if (op == "not in") return Value::boolean(!found);
    }
    if ((left.is_string() || right.is_string()) && op == "+") {
      return Value::string(value_text(left) + value_text(right));
    }
    if (left.is_string() && right.is_string()) {
      const bool found = right.s.find(left.s) != std::string::npos;
      if (op == "in") return Value::boolean(found);
      if (op == "not in") return Value::boolean(!found);
    }
    if (left.is_string() && right.is_mapping()) {
      const bool found = right.object->find(left.s) != nullptr;
      if (op == "in") return Value::boolean(found);
      if (op == "not in") return Value::boolean(!found);
    }
    throw Error("unknown operator " + op + " between " + left.kind_name() + " and " +
                right.kind_name());
  }

  Value filter(Value operand, const Node& f, Env& env) {
    if (f.kind == NodeKind::kIdentifier) return plain_filter(std::move(operand), f.text, env);
    if (f.kind != NodeKind::kCall || f.kids[0]->kind != NodeKind::kIdentifier) {
      throw Error("unknown filter");
    }
    return call_filter(std::move(operand), f.kids[0]->text, f.args, env);
  }

  Value plain_filter(Value v, const std::string& name, Env& env) {
    if (name == "safe") return v;
    if (name == "tojson") return Value::string(to_json_text(v, {}));
    if (v.is_list()) {
      const Array& a = *v.array;
      if (name == "list") return v;
      if (name == "first") return a.empty() ? Value::undefined() : a.front();
      if (name == "last") return a.empty() ? Value::undefined() : a.back();
      if (name == "length") return Value::integer(static_cast<int64_t>(a.size()));
      if (name == "reverse") return Value::list(Array(a.rbegin(), a.rend()));
      if (name == "sort") {
        Array sorted = a;
        std::stable_sort(sorted.begin(), sorted.end(), [](const Value& x, const Value& y) {
          return compare_values(x, y, false) < 0;
        });
        return Value::list(std::move(sorted));
      }
      if (name == "join") {
        std::string out;
        for (const Value& e : a) {
          if (!e.is_null() && !e.is_undefined()) out += value_text(e);
        }
        return Value::string(out);
      }
      if (name == "string") {
        JsonOptions o;
        o.undefined_as_null = false;
        return Value::string(to_json_text(v, o));
      }
      if (name == "unique") {
        Array out;
        for (const Value& e : a) {
          bool seen = false;
          for (const Value& o : out) {
            if (strictly_equal(o, e)) seen = true;
          }
          if (!seen) out.push_back(e);
        }
        return Value::list(std::move(out));
      }
      throw Error("unknown list filter " + name);
    }
    if (v.is_string()) {
      if (name == "length" || name == "upper" || name == "lower" || name == "title" ||
          name == "capitalize") {
        Value b = builtin(v, name);
        if (b.kind == Kind::kFunction) {
          std::vector<Value> none;
          return (*b.fn)(none, env);
        }
        return b;
      }
      if (name == "trim") return Value::string(trim(v.s));
      if (name == "indent") return Value::string(indent_text(v.s, "    ", false, false));
      if (name == "join" || name == "string") return v;
      if (name == "int") {
        auto d = leading_number(v.s, true);
        return Value::integer(d ? static_cast<int64_t>(*d) : 0);
      }
      if (name == "float") {
        auto d = leading_number(v.s, false);
        return Value::floating(d ? *d : 0.0);
      }
      throw Error("unknown string filter " + name);
    }
    if (v.is_number()) {
      if (name == "abs") return number(std::fabs(as_double(v)), v.kind == Kind::kFloat);
      if (name == "int") return Value::integer(static_cast<int64_t>(std::floor(as_double(v))));
      if (name == "float") return Value::floating(as_double(v));
      if (name == "string") return Value::string(v.to_string());
      throw Error("unknown number filter " + name);
    }
    if (v.is_mapping()) {
      if (name == "items") {
        std::vector<Value> none;
        return (*builtin(v, "items").fn)(none, env);
      }
      if (name == "length") return Value::integer(static_cast<int64_t>(v.object->size()));
      Value b = builtin(v, name);
      if (b.kind == Kind::kFunction) {
        std::vector<Value> none;
        return (*b.fn)(none, env);
      }
      if (!b.is_undefined()) return b;
      throw Error("unknown mapping filter " + name);
    }
    if (v.kind == Kind::kBool) {
      if (name == "bool") return v;
      if (name == "int") return Value::integer(v.b ? 1 : 0);
      if (name == "float") return Value::floating(v.b ? 1.0 : 0.0);
      if (name == "string") return Value::string(v.b ? "true" : "false");
      throw Error("unknown boolean filter " + name);
    }
    throw Error("cannot apply filter " + name + " to " + v.kind_name());
  }

  Value call_filter(Value v, const std::string& name, const std::vector<NodePtr>& arg_nodes,
                    Env& env) {
    if (name == "tojson") {
      std::vector<Value> args = arguments(arg_nodes, env);
      JsonOptions o;
      if (const Object* kw = kwargs_of(args)) {
        if (const Value* x = kw->find("indent"); x && !x->is_null()) {
          if (x->kind != Kind::kInt) throw Error("tojson indent must be an integer");
          o.indent = static_cast<int>(x->i);
        }
        if (const Value* x = kw->find("ensure_ascii")) {
          if (x->kind != Kind::kBool) throw Error("tojson ensure_ascii must be a boolean");
          o.ensure_ascii = x->b;
        }
        if (const Value* x = kw->find("sort_keys")) {
          if (x->kind != Kind::kBool) throw Error("tojson sort_keys must be a boolean");
          o.sort_keys = x->b;
        }
        if (const Value* x = kw->find("separators"); x && !x->is_null()) {
          if (!x->is_list() || x->array->size() != 2 || !(*x->array)[0].is_string() ||
              !(*x->array)[1].is_string()) {
            throw Error("tojson separators must be two strings");
          }
          o.item_separator = (*x->array)[0].s;
          o.key_separator = (*x->array)[1].s;
        }
      }
      return Value::string(to_json_text(v, o));
    }
    if (name == "join") {
      std::vector<std::string> parts;
      if (v.is_string()) {
        parts = characters(v.s);
      } else if (v.is_list()) {
        for (const Value& e : *v.array)
          parts.push_back(e.is_null() || e.is_undefined() ? "" : value_text(e));
      } else {
        throw Error(std::string("cannot join ") + v.kind_name());
      }
      std::vector<Value> args = arguments(arg_nodes, env);
      Value sep = arg(args, 0, "separator");
      if (sep.is_undefined()) sep = Value::string("");
      if (!sep.is_string()) throw Error("join separator must be a string");
      std::string out;
      for (size_t k = 0; k < parts.size(); ++k) {
        if (k) out += sep.s;
        out += parts[k];
      }
      return Value::string(out);
    }
    if (name == "int" || name == "float") {
      std::vector<Value> args = arguments(arg_nodes, env);
      Value def = arg(args, 0, "default");
      if (def.is_undefined()) def = name == "int" ? Value::integer(0) : Value::floating(0);
      if (v.is_string()) {
        auto d = leading_number(v.s, name == "int");
        if (!d) return def;
        return name == "int" ? Value::integer(static_cast<int64_t>(*d)) : Value::floating(*d);
      }
      if (v.is_number()) return v;
      if (v.kind == Kind::kBool)
        return name == "int" ? Value::integer(v.b) : Value::floating(v.b ? 1 : 0);
      throw Error("cannot apply filter " + name + " to " + v.kind_name());
    }
    if (name == "default") {
      std::vector<Value> args = arguments(arg_nodes, env);
      Value def = num_positional(args) > 0 ? args[0] : Value::string("");
      Value boolean = arg(args, 1, "boolean");
      if (boolean.is_undefined()) boolean = Value::boolean(false);
      if (boolean.kind != Kind::kBool) throw Error("default's boolean flag must be a boolean");
      if (v.is_undefined() || (boolean.b && !v.truthy())) return def;
      return v;
    }
    if (v.is_list()) {
      if (name == "sort") {
        std::vector<Value> args = arguments(arg_nodes, env);
        Value rev = arg(args, 0, "reverse"), cs = arg(args, 1, "case_sensitive"),
              attr = arg(args, 2, "attribute");
        if (rev.is_undefined()) rev = Value::boolean(false);
        if (cs.is_undefined()) cs = Value::boolean(false);
        if (rev.kind != Kind::kBool || cs.kind != Kind::kBool)
          throw Error("sort flags must be booleans");
        std::string path;
        if (attr.is_string())
          path = attr.s;
        else if (attr.kind == Kind::kInt)
          path = std::to_string(attr.i);
        else if (!attr.is_undefined() && !attr.is_null())
          throw Error("sort attribute must be a string or an integer");
        auto key = [&](const Value& x) { return path.empty() ? x : attribute_path(x, path); };
        Array sorted = *v.array;
        std::stable_sort(sorted.begin(), sorted.end(), [&](const Value& x, const Value& y) {
          const int c = compare_values(key(x), key(y), cs.b);
          return rev.b ? c > 0 : c < 0;
        });
        return Value::list(std::move(sorted));
      }
      if (name == "selectattr" || name == "rejectattr") {
        const bool select = name == "selectattr";
        for (const Value& e : *v.array) {
          if (!e.has_attributes()) throw Error(name + " applies to lists of mappings only");
        }
        for (const NodePtr& a : arg_nodes) {
          if (a->kind != NodeKind::kString)
            throw Error("the arguments of " + name + " must be strings");
        }
        const std::string attr = arg_nodes.size() > 0 ? arg_nodes[0]->text : "";
        const std::string test = arg_nodes.size() > 1 ? arg_nodes[1]->text : "";
        const Value value =
            arg_nodes.size() > 2 ? Value::string(arg_nodes[2]->text) : Value::undefined();
        if (!test.empty() && !known_test(test)) throw Error("unknown test " + test);
        Array out;
        for (const Value& e : *v.array) {
          const Value* a = e.object->find(attr);
          bool r = false;
          if (a != nullptr && !a->is_undefined()) {
            r = test.empty() ? a->truthy() : apply_test(test, *a, &value);
          }
          if (r == select) out.push_back(e);
        }
        return Value::list(std::move(out));
      }
      if (name == "map") {
        std::vector<Value> args = arguments(arg_nodes, env);
        const Object* kw = kwargs_of(args);
        const Value* attr = kw ? kw->find("attribute") : nullptr;
        if (attr == nullptr) throw Error("map without attribute= is not supported");
        if (!attr->is_string()) throw Error("map attribute must be a string");
        const Value* def = kw->find("default");
        Array out;
        for (const Value& e : *v.array) {
          if (!e.has_attributes()) throw Error("map applies to lists of mappings only");
          Value x = attribute_path(e, attr->s);
          out.push_back(x.is_undefined() && def ? *def : x);
        }
        return Value::list(std::move(out));
      }
      throw Error("unknown list filter " + name);
    }
    if (v.is_string()) {
      if (name == "indent") {
        std::vector<Value> args = arguments(arg_nodes, env);
        Value width = arg(args, 0, "width"), first = arg(args, 1, "first"),
              blank = arg(args, 2, "blank");
        if (width.is_undefined()) width = Value::integer(4);
        if (width.kind != Kind::kInt) throw Error("indent width must be an integer");
        return Value::string(
            indent_text(v.s, std::string(static_cast<size_t>(std::max<int64_t>(0, width.i)), ' '),
                        first.truthy(), blank.truthy()));
      }
      if (name == "replace") {
        std::vector<Value> args = arguments(arg_nodes, env);
        if (!kwargs_of(args)) args.push_back(Value::mapping(Object(), Kind::kKwargs));
        return (*builtin(v, "replace").fn)(args, env);
      }
      throw Error("unknown string filter " + name);
    }
    if (v.is_mapping()) {
      Value b = builtin(v, name);
      if (b.kind == Kind::kFunction) {
        std::vector<Value> args = arguments(arg_nodes, env);
        return (*b.fn)(args, env);
      }
      throw Error("unknown mapping filter " + name);
    }
    throw Error("cannot apply filter " + name + " to " + v.kind_name());
  }

  int64_t steps_ = 0;
  int depth_ = 0;
};

// Python's strftime for the directives templates use (%Y %m %d %b %B %H %M %%), in local time.
std::string strftime_now(const std::string& format) {
  static const char* kShort[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                 "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};
  static const char* kLong[] = {"January",   "February", "March",    "April",
                                "May",       "June",     "July",     "August",
                                "September", "October",  "November", "December"};
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  auto pad2 = [](int n) { return (n < 10 ? "0" : "") + std::to_string(n); };
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out.push_back(format[i]);
      continue;
    }
    const char d = format[++i];
    switch (d) {
      case 'Y':
        out += std::to_string(tm.tm_year + 1900);
        break;
      case 'm':
        out += pad2(tm.tm_mon + 1);
        break;
      case 'd':
        out += pad2(tm.tm_mday);
        break;
      case 'b':
        out += kShort[tm.tm_mon];
        break;
      case 'B':
        out += kLong[tm.tm_mon];
        break;
      case 'H':
        out += pad2(tm.tm_hour);
        break;
      case 'M':
        out += pad2(tm.tm_min);
        break;
      case '%':
        out += "%";
        break;
      default:
        out.push_back('%');
        out.push_back(d);
    }
  }
  return out;
}

}  // namespace

void add_globals(Env& env) {
  env.set("false", Value::boolean(false));
  env.set("true", Value::boolean(true));
  env.set("none", Value::null());
  env.set("False", Value::boolean(false));
  env.set("True", Value::boolean(true));
  env.set("None", Value::null());
  env.set("raise_exception", Value::function([](std::vector<Value>& args, Env&) -> Value {
            throw Error(args.empty() ? "raise_exception" : args[0].to_string());
          }));
  env.set("range", Value::function([](std::vector<Value>& args, Env&) {
            const size_t n = num_positional(args);
            if (n == 0) throw Error("range() needs an argument");
            for (size_t k = 0; k < n; ++k) {
              if (args[k].kind != Kind::kInt) throw Error("range() arguments must be integers");
            }
            int64_t start = 0, stop = args[0].i, step = 1;
            if (n > 1) {
              start = args[0].i;
              stop = args[1].i;
            }
            if (n > 2) step = args[2].i;
            if (step == 0) throw Error("range() step must not be zero");
            // Far more than any conversation has messages; each element takes about 100 bytes.
            constexpr int64_t kMaxRange = 1'000'000;
            const long double count = (static_cast<long double>(stop) - start) / step;
            if (count > kMaxRange) {
              throw Error("range() of more than " + std::to_string(kMaxRange) + " numbers");
            }
            Array out;
            for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
              out.push_back(Value::integer(i));
              if (__builtin_add_overflow(i, step, &i)) break;
            }
            return Value::list(std::move(out));
          }));
  env.set("strftime_now", Value::function([](std::vector<Value>& args, Env&) {
            if (args.empty() || !args[0].is_string())
              throw Error("strftime_now() takes a format string");
            return Value::string(strftime_now(args[0].s));
          }));
  env.set("namespace", Value::function([](std::vector<Value>& args, Env&) {
            Object entries;
            const size_t n = num_positional(args);
            if (n > 1) throw Error("namespace() takes at most one positional argument");
            if (n == 1) {
              const Value& src = args[0];
              if (src.is_mapping()) {
                for (const auto& [k, v] : src.object->entries()) entries.set(k, v);
              } else if (src.is_list()) {
                for (const Value& pair : *src.array) {
                  if (!pair.is_list() || pair.array->size() != 2 || !(*pair.array)[0].is_string()) {
                    throw Error("namespace() takes a mapping or [key, value] pairs");
                  }
                  entries.set((*pair.array)[0].s, (*pair.array)[1]);
                }
              } else {
                throw Error(std::string("namespace() cannot take ") + src.kind_name());
              }
            }
            if (const Object* kw = kwargs_of(args)) {
              for (const auto& [k, v] : kw->entries()) entries.set(k, v);
            }
            return Value::mapping(std::move(entries), Kind::kNamespace);
          }));
}

std::string render_program(const std::vector<NodePtr>& program, Env& globals) {
  Interpreter interpreter;
  try {
    return interpreter.block(program, globals);
  } catch (const BreakLoop&) {
    throw Error("break outside a loop");
  } catch (const ContinueLoop&) {
    throw Error("continue outside a loop");
  }
}

}  // namespace hr::engine::jinja
