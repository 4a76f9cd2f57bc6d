// Evaluates a chat template's syntax tree (ast.h) to text, with the semantics of
// @huggingface/jinja: scopes (a for loop's body and a macro's call get their own; if does not),
// loop variables, macros with defaults, keyword and variadic arguments and call blocks,
// namespaces, the filters, tests and string and mapping methods chat templates use, and the
// globals raise_exception, range, namespace and strftime_now. Differences from Python's Jinja2
// are the reference's: booleans print as true/false, none prints nothing, `%` takes the sign of
// the dividend. Strings are UTF-8; upper/lower/title change ASCII letters only.
// Not thread-safe: one Interpreter per render (Template::render makes one).
#pragma once

#include <string>
#include <unordered_map>
#include <vector>

#include "engine/jinja/ast.h"
#include "engine/jinja/value.h"

namespace hr::engine::jinja {

class Env {
 public:
  explicit Env(Env* parent = nullptr) : parent_(parent) {}
  // The variable's value here or in an enclosing scope; undefined when none has it.
  Value lookup(const std::string& name) const;
  void set(const std::string& name, Value value) { vars_[name] = std::move(value); }

 private:
  Env* parent_;
  std::unordered_map<std::string, Value> vars_;
};

// Renders `program` with the globals and the context's variables. Throws Error (with the line)
// on failure.
std::string render_program(const std::vector<NodePtr>& program, Env& globals);

// The globals every render starts with (true, false, none and their title-case forms,
// raise_exception, range, namespace, strftime_now).
void add_globals(Env& env);

}  // namespace hr::engine::jinja
