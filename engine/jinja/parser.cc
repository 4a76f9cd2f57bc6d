// The template parser.
#include "engine/jinja/parser.h"

#include <cstdlib>
#include <set>
#include <string>
#include <utility>

#include "engine/jinja/value.h"

namespace hr::engine::jinja {
namespace {

class Parser {
 public:
  explicit Parser(const std::vector<Token>& tokens) : t_(tokens) {}

  // Blocks and expressions nest at most this deep (real templates: a dozen), so that a hostile
  // or broken template is an error rather than the end of the thread's stack.
  static constexpr int kMaxNesting = 200;

  std::vector<NodePtr> program() {
    std::vector<NodePtr> out;
    while (pos_ < t_.size()) out.push_back(any());
    return out;
  }

 private:
  const Token& peek(size_t ahead = 0) const {
    if (pos_ + ahead >= t_.size()) fail("unexpected end of template");
    return t_[pos_ + ahead];
  }
  int line() const {
    if (t_.empty()) return 1;
    return t_[std::min(pos_, t_.size() - 1)].line;
  }
  [[noreturn]] void fail(const std::string& what) const { throw Error(what, line()); }

  bool is(TokenType type, size_t ahead = 0) const {
    return pos_ + ahead < t_.size() && t_[pos_ + ahead].type == type;
  }
  bool is_identifier(const char* name, size_t ahead = 0) const {
    return is(TokenType::kIdentifier, ahead) && t_[pos_ + ahead].value == name;
  }
  bool is_statement(std::initializer_list<const char*> names) const {
    if (!is(TokenType::kOpenStatement) || !is(TokenType::kIdentifier, 1)) return false;
    for (const char* n : names) {
      if (t_[pos_ + 1].value == n) return true;
    }
    return false;
  }
  const Token& expect(TokenType type, const char* what) {
    if (!is(type)) fail(std::string("expected ") + what);
    return t_[pos_++];
  }
  void expect_identifier(const char* name) {
    if (!is_identifier(name)) fail(std::string("expected ") + name);
    ++pos_;
  }

  // Counts one level of nesting while it lives.
  struct Deeper {
    explicit Deeper(Parser* p) : p(p) {
      if (++p->depth_ > kMaxNesting) {
        --p->depth_;
        p->fail("the template nests more than " + std::to_string(kMaxNesting) + " deep");
      }
    }
    ~Deeper() { --p->depth_; }
    Parser* p;
  };

  NodePtr node(NodeKind kind, int at = 0) {
    auto n = std::make_shared<Node>();
    n->kind = kind;
    n->line = at ? at : line();
    return n;
  }

  NodePtr any() {
    Deeper deeper(this);
    const Token& tok = peek();
    switch (tok.type) {
      case TokenType::kComment: {
        auto n = node(NodeKind::kComment);
        ++pos_;
        return n;
      }
      case TokenType::kText: {
        auto n = node(NodeKind::kText);
        n->text = t_[pos_++].value;
        return n;
      }
      case TokenType::kOpenStatement:
        return statement();
      case TokenType::kOpenExpression: {
        auto n = node(NodeKind::kOutput);
        ++pos_;
        n->kids.push_back(expression());
        expect(TokenType::kCloseExpression, "}}");
        return n;
      }
      default:
        fail("unexpected " + tok.value);
    }
  }

  void close_block(const char* end) {
    expect(TokenType::kOpenStatement, "{%");
    expect_identifier(end);
    expect(TokenType::kCloseStatement, "%}");
  }

  NodePtr statement() {
    expect(TokenType::kOpenStatement, "{%");
    if (!is(TokenType::kIdentifier)) fail("expected a statement name after {%");
    const std::string name = t_[pos_].value;
    const int at = t_[pos_].line;
    ++pos_;
    if (name == "set") return set_statement(at);
    if (name == "if") {
      NodePtr n = if_statement(at);
      close_block("endif");
      return n;
    }
    if (name == "macro") {
      auto n = node(NodeKind::kMacro, at);
      NodePtr id = primary();
      if (id->kind != NodeKind::kIdentifier) fail("expected a name after macro");
      n->text = id->text;
      n->args = arguments(true);
      expect(TokenType::kCloseStatement, "%}");
      while (!is_statement({"endmacro"})) n->body.push_back(any());
      close_block("endmacro");
      return n;
    }
    if (name == "for") {
      NodePtr n = for_statement(at);
      close_block("endfor");
      return n;
    }
    if (name == "call") {
      auto n = node(NodeKind::kCallBlock, at);
      if (is(TokenType::kOpenParen)) n->args = arguments(true);
      NodePtr callee = primary();
      if (callee->kind != NodeKind::kIdentifier) fail("expected a name after call");
      auto call = node(NodeKind::kCall, at);
      call->kids.push_back(callee);
      call->args = arguments(false);
      n->kids.push_back(call);
      expect(TokenType::kCloseStatement, "%}");
      while (!is_statement({"endcall"})) n->body.push_back(any());
      close_block("endcall");
      return n;
    }
    if (name == "break" || name == "continue") {
      expect(TokenType::kCloseStatement, "%}");
      return node(name == "break" ? NodeKind::kBreak : NodeKind::kContinue, at);
    }
    if (name == "filter") {
      auto n = node(NodeKind::kFilterBlock, at);
      NodePtr f = primary();
      if (f->kind == NodeKind::kIdentifier && is(TokenType::kOpenParen)) f = call_expression(f);
      n->kids.push_back(f);
      expect(TokenType::kCloseStatement, "%}");
      while (!is_statement({"endfilter"})) n->body.push_back(any());
      close_block("endfilter");
      return n;
    }
    throw Error("unknown statement " + name, at);
  }

  NodePtr set_statement(int at) {
    auto n = node(NodeKind::kSet, at);
    n->kids.push_back(expression_sequence(false));
    if (is(TokenType::kEquals)) {
      ++pos_;
      n->kids.push_back(expression_sequence(false));
    } else {
      expect(TokenType::kCloseStatement, "%}");
      while (!is_statement({"endset"})) n->body.push_back(any());
      expect(TokenType::kOpenStatement, "{%");
      expect_identifier("endset");
    }
    expect(TokenType::kCloseStatement, "%}");
    return n;
  }

  NodePtr if_statement(int at) {
    auto n = node(NodeKind::kIf, at);
    n->kids.push_back(expression());
    expect(TokenType::kCloseStatement, "%}");
    while (!is_statement({"elif", "else", "endif"})) n->body.push_back(any());
    if (is_statement({"elif"})) {
      const int elif_at = t_[pos_ + 1].line;
      pos_ += 2;
      n->alternate.push_back(if_statement(elif_at));
    } else if (is_statement({"else"})) {
      pos_ += 2;
      expect(TokenType::kCloseStatement, "%}");
      while (!is_statement({"endif"})) n->alternate.push_back(any());
    }
    return n;
  }

  NodePtr for_statement(int at) {
    auto n = node(NodeKind::kFor, at);
    NodePtr target = expression_sequence(true);
    if (target->kind != NodeKind::kIdentifier && target->kind != NodeKind::kTuple) {
      fail("expected a name or a tuple of names after for");
    }
    n->kids.push_back(target);
    if (!is_identifier("in")) fail("expected `in` after the loop variable");
    ++pos_;
    n->kids.push_back(expression());
    expect(TokenType::kCloseStatement, "%}");
    while (!is_statement({"endfor", "else"})) n->body.push_back(any());
    if (is_statement({"else"})) {
      pos_ += 2;
      expect(TokenType::kCloseStatement, "%}");
      while (!is_statement({"endfor"})) n->alternate.push_back(any());
    }
    return n;
  }

  NodePtr expression_sequence(bool primary_only) {
    const int at = line();
    NodePtr first = primary_only ? primary() : expression();
    if (!is(TokenType::kComma)) return first;
    auto tuple = node(NodeKind::kTuple, at);
    tuple->kids.push_back(first);
    while (is(TokenType::kComma)) {
      ++pos_;
      tuple->kids.push_back(primary_only ? primary() : expression());
      if (!is(TokenType::kComma)) break;
    }
    return tuple;
  }

  NodePtr expression() {
    Deeper deeper(this);
    return if_expression();
  }

  NodePtr if_expression() {
    NodePtr a = or_expression();
    if (is_identifier("if")) {
      const int at = line();
      ++pos_;
      NodePtr test = or_expression();
      if (is_identifier("else")) {
        ++pos_;
        auto n = node(NodeKind::kTernary, at);
        n->kids = {test, a, if_expression()};
        return n;
      }
      auto n = node(NodeKind::kSelect, at);
      n->kids = {a, test};
      return n;
    }
    return a;
  }

  NodePtr binary(const std::string& op, NodePtr l, NodePtr r, int at) {
    auto n = node(NodeKind::kBinary, at);
    n->text = op;
    n->kids = {std::move(l), std::move(r)};
    return n;
  }

  NodePtr or_expression() {
    NodePtr left = and_expression();
    while (is_identifier("or")) {
      const int at = line();
      ++pos_;
      left = binary("or", left, and_expression(), at);
    }
    return left;
  }

  NodePtr and_expression() {
    NodePtr left = not_expression();
    while (is_identifier("and")) {
      const int at = line();
      ++pos_;
      left = binary("and", left, not_expression(), at);
    }
    return left;
  }

  NodePtr not_expression() {
    NodePtr right;
    while (is_identifier("not")) {
      const int at = line();
      ++pos_;
      auto n = node(NodeKind::kUnary, at);
      n->text = "not";
      Deeper deeper(this);
      n->kids.push_back(not_expression());
      right = n;
    }
    return right ? right : comparison();
  }

  NodePtr comparison() {
    NodePtr left = additive();
    while (true) {
      const int at = line();
      std::string op;
      if (is_identifier("not") && is_identifier("in", 1)) {
        op = "not in";
        pos_ += 2;
      } else if (is_identifier("in")) {
        op = "in";
        ++pos_;
      } else if (is(TokenType::kComparison)) {
        op = t_[pos_++].value;
      } else {
        break;
      }
      left = binary(op, left, additive(), at);
    }
    return left;
  }

  NodePtr additive() {
    NodePtr left = multiplicative();
    while (is(TokenType::kAdditive)) {
      const int at = line();
      const std::string op = t_[pos_++].value;
      left = binary(op, left, multiplicative(), at);
    }
    return left;
  }

  NodePtr multiplicative() {
    NodePtr left = power();
    while (is(TokenType::kMultiplicative)) {
      const int at = line();
      const std::string op = t_[pos_++].value;
      left = binary(op, left, power(), at);
    }
    return left;
  }

  NodePtr power() {
    NodePtr left = test_expression();
    while (is(TokenType::kPower)) {
      const int at = line();
      ++pos_;
      left = binary("**", left, test_expression(), at);
    }
    return left;
  }

  NodePtr test_expression() {
    NodePtr operand = filter_expression();
    while (is_identifier("is")) {
      const int at = line();
      ++pos_;
      const bool negate = is_identifier("not");
      if (negate) ++pos_;
      NodePtr test = primary();
      if (test->kind != NodeKind::kIdentifier) fail("expected the name of a test after is");
      auto n = node(NodeKind::kTest, at);
      n->text = test->text;
      n->negate = negate;
      n->kids.push_back(operand);
      operand = n;
    }
    return operand;
  }

  NodePtr filter_expression() {
    NodePtr operand = unary_sign();
    while (is(TokenType::kPipe)) {
      const int at = line();
      ++pos_;
      NodePtr filter = primary();
      if (filter->kind != NodeKind::kIdentifier) fail("expected the name of a filter after |");
      if (is(TokenType::kOpenParen)) filter = call_expression(filter);
      auto n = node(NodeKind::kFilter, at);
      n->kids = {operand, filter};
      operand = n;
    }
    return operand;
  }

  NodePtr unary_sign() {
    if ((is(TokenType::kUnary) || is(TokenType::kAdditive)) &&
        (t_[pos_].value == "-" || t_[pos_].value == "+")) {
      auto n = node(NodeKind::kUnary);
      n->text = t_[pos_++].value;
      Deeper deeper(this);
      n->kids.push_back(unary_sign());
      return n;
    }
    return call_member();
  }

  NodePtr call_member() {
    NodePtr member = member_expression(primary());
    if (is(TokenType::kOpenParen)) return call_expression(member);
    return member;
  }

  NodePtr call_expression(NodePtr callee) {
    auto n = node(NodeKind::kCall, callee->line);
    n->kids.push_back(callee);
    n->args = arguments(false);
    NodePtr expr = member_expression(n);
    if (is(TokenType::kOpenParen)) expr = call_expression(expr);
    return expr;
  }

  // ( ... ): call arguments, or a macro's parameters (names with optional defaults).
  std::vector<NodePtr> arguments(bool parameters) {
    expect(TokenType::kOpenParen, "(");
    std::vector<NodePtr> args;
    std::set<std::string> names;
    bool keyword_seen = false, spread_seen = false;
    while (!is(TokenType::kCloseParen)) {
      const bool kw_spread = is(TokenType::kPower);
      const bool spread = is(TokenType::kMultiplicative) && t_[pos_].value == "*";
      if (parameters && (kw_spread || spread)) fail("unpacking is not allowed in parameters");
      if (kw_spread) {
        ++pos_;
        auto n = node(NodeKind::kKeywordSpread);
        n->kids.push_back(expression());
        args.push_back(n);
        if (is(TokenType::kComma)) ++pos_;
        if (!is(TokenType::kCloseParen)) fail("`**` must be applied to the last argument");
        break;
      }
      NodePtr arg;
      if (spread) {
        if (spread_seen) fail("only one `*` unpacking is allowed");
        spread_seen = true;
        ++pos_;
        arg = node(NodeKind::kSpread);
        arg->kids.push_back(expression());
      } else {
        arg = expression();
        if (is(TokenType::kEquals)) {
          ++pos_;
          if (arg->kind != NodeKind::kIdentifier) fail("expected a name before =");
          auto kw = node(NodeKind::kKeywordArg, arg->line);
          kw->text = arg->text;
          kw->kids.push_back(expression());
          arg = kw;
        }
        if (parameters) {
          if (arg->kind != NodeKind::kIdentifier && arg->kind != NodeKind::kKeywordArg) {
            fail("expected a parameter name");
          }
          if (!names.insert(arg->text).second) fail("duplicate parameter " + arg->text);
        }
        if (arg->kind == NodeKind::kKeywordArg) {
          keyword_seen = true;
        } else if (keyword_seen) {
          fail(parameters ? "a parameter without default follows one with a default"
                          : "positional arguments must come before keyword arguments");
        } else if (spread_seen) {
          fail("positional arguments must not follow `*` unpacking");
        }
      }
      args.push_back(arg);
      if (is(TokenType::kComma)) ++pos_;
    }
    expect(TokenType::kCloseParen, ")");
    return args;
  }

  // [ ... ]: an index or key, or a slice [a:b:c].
  NodePtr member_arguments() {
    std::vector<NodePtr> slices;
    bool is_slice = false;
    const int at = line();
    while (!is(TokenType::kCloseBracket)) {
      if (is(TokenType::kColon)) {
        slices.push_back(nullptr);
        ++pos_;
        is_slice = true;
      } else {
        slices.push_back(expression());
        if (is(TokenType::kColon)) {
          ++pos_;
          is_slice = true;
        }
      }
    }
    if (slices.empty()) fail("expected an index inside []");
    if (is_slice) {
      if (slices.size() > 3) fail("a slice takes at most three parts");
      auto n = node(NodeKind::kSlice, at);
      n->kids = slices;
      n->kids.resize(3);
      return n;
    }
    return slices[0];
  }

  NodePtr member_expression(NodePtr object) {
    while (is(TokenType::kDot) || is(TokenType::kOpenBracket)) {
      const bool computed = is(TokenType::kOpenBracket);
      const int at = line();
      ++pos_;
      NodePtr property;
      if (computed) {
        property = member_arguments();
        expect(TokenType::kCloseBracket, "]");
      } else {
        property = primary();
        if (property->kind != NodeKind::kIdentifier && property->kind != NodeKind::kInteger) {
          fail("expected a name or an index after .");
        }
      }
      auto n = node(NodeKind::kMember, at);
      n->computed = computed;
      n->kids = {object, property};
      object = n;
    }
    return object;
  }

  NodePtr primary() {
    const Token& tok = peek();
    const int at = tok.line;
    ++pos_;
    switch (tok.type) {
      case TokenType::kNumber: {
        if (tok.value.find('.') != std::string::npos) {
          auto n = node(NodeKind::kFloat, at);
          n->number = std::strtod(tok.value.c_str(), nullptr);
          return n;
        }
        auto n = node(NodeKind::kInteger, at);
        n->integer = std::strtoll(tok.value.c_str(), nullptr, 10);
        return n;
      }
      case TokenType::kString: {
        auto n = node(NodeKind::kString, at);
        n->text = tok.value;
        while (is(TokenType::kString)) n->text += t_[pos_++].value;  // adjacent strings join
        return n;
      }
      case TokenType::kIdentifier: {
        auto n = node(NodeKind::kIdentifier, at);
        n->text = tok.value;
        return n;
      }
      case TokenType::kOpenParen: {
        NodePtr e = expression_sequence(false);
        expect(TokenType::kCloseParen, ")");
        return e;
      }
      case TokenType::kOpenBracket: {
        auto n = node(NodeKind::kArray, at);
        while (!is(TokenType::kCloseBracket)) {
          n->kids.push_back(expression());
          if (is(TokenType::kComma)) ++pos_;
        }
        ++pos_;
        return n;
      }
      case TokenType::kOpenBrace: {
        auto n = node(NodeKind::kObjectLit, at);
        while (!is(TokenType::kCloseBrace)) {
          n->kids.push_back(expression());
          expect(TokenType::kColon, ":");
          n->kids.push_back(expression());
          if (is(TokenType::kComma)) ++pos_;
        }
        ++pos_;
        return n;
      }
      default:
        throw Error("unexpected " + tok.value, at);
    }
  }

  const std::vector<Token>& t_;
  size_t pos_ = 0;
  int depth_ = 0;
};

}  // namespace

Result<std::vector<NodePtr>> parse(const std::vector<Token>& tokens) {
  try {
    return Parser(tokens).program();
  } catch (const Error& e) {
    return invalid_argument("chat template line " + std::to_string(e.line()) + ": " + e.what(),
                            "chat_template");
  }
}

}  // namespace hr::engine::jinja
