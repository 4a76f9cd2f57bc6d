// The syntax tree of a chat template: statements (text, output, set, if, for, macro, call,
// filter, break, continue) and expressions, as the parser (parser.h) builds them. One node type
// with a kind, children in `kids` and the template line it came from.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace hr::engine::jinja {

enum class NodeKind {
  // Statements
  kText,         // text: literal output
  kOutput,       // kids[0]: the expression of {{ }}
  kSet,          // kids[0]: target; kids[1]: value (or body: a {% set %}...{% endset %} block)
  kIf,           // kids[0]: test; body; alternate
  kFor,          // kids[0]: loop target; kids[1]: iterable (or a kSelect); body; alternate (else)
  kMacro,        // name; params; body
  kCallBlock,    // kids[0]: the call; params (caller's); body
  kFilterBlock,  // kids[0]: the filter (identifier or call); body
  kBreak,
  kContinue,
  kComment,
  // Expressions
  kInteger,        // integer
  kFloat,          // number
  kString,         // text
  kIdentifier,     // text: the name
  kArray,          // kids: the items
  kTuple,          // kids: the items
  kObjectLit,      // kids: key, value, key, value...
  kMember,         // kids[0]: object; kids[1]: property; computed
  kSlice,          // kids[0..2]: start, stop, step (null when absent)
  kCall,           // kids[0]: callee; args: the arguments
  kKeywordArg,     // text: name; kids[0]: value
  kSpread,         // kids[0]: *value
  kKeywordSpread,  // kids[0]: **value
  kUnary,          // text: operator (not, -, +); kids[0]
  kBinary,         // text: operator; kids[0], kids[1]
  kFilter,         // kids[0]: operand; kids[1]: the filter (identifier or call)
  kTest,           // kids[0]: operand; text: the test's name; negate
  kSelect,         // kids[0]: value; kids[1]: condition (`x if c` without else)
  kTernary,        // kids[0]: condition; kids[1]: if true; kids[2]: if false
};

struct Node;
using NodePtr = std::shared_ptr<Node>;

struct Node {
  NodeKind kind;
  int line = 0;
  std::string text;
  int64_t integer = 0;
  double number = 0;
  bool computed = false;  // kMember: obj[expr] rather than obj.name
  bool negate = false;    // kTest: `is not`
  std::vector<NodePtr> kids;
  std::vector<NodePtr> args;       // kCall: arguments; kMacro, kCallBlock: parameters
  std::vector<NodePtr> body;       // statements
  std::vector<NodePtr> alternate;  // kIf: else; kFor: the else block
};

}  // namespace hr::engine::jinja
