// The pattern parser (to a small syntax tree) and its emission into the automaton.
#include "grammar/regex.h"

#include <algorithm>
#include <memory>
#include <vector>

namespace hr::grammar {

namespace {

using Ranges = std::vector<std::pair<uint32_t, uint32_t>>;  // code points, inclusive

Ranges normalize(Ranges r) {
  std::sort(r.begin(), r.end());
  Ranges out;
  for (auto [lo, hi] : r) {
    if (!out.empty() && lo <= out.back().second + 1) {
      out.back().second = std::max(out.back().second, hi);
    } else {
      out.push_back({lo, hi});
    }
  }
  return out;
}

Ranges complement(const Ranges& r) {
  Ranges out;
  uint32_t next = 0;
  for (auto [lo, hi] : normalize(r)) {
    if (lo > next) out.push_back({next, lo - 1});
    next = hi + 1;
  }
  if (next <= 0x10FFFF) out.push_back({next, 0x10FFFF});
  return out;
}

const Ranges& digit_set() {
  static const Ranges r = {{'0', '9'}};
  return r;
}
const Ranges& word_set() {
  static const Ranges r = {{'0', '9'}, {'A', 'Z'}, {'_', '_'}, {'a', 'z'}};
  return r;
}
// ECMAScript's \s: WhiteSpace and LineTerminator.
const Ranges& space_set() {
  static const Ranges r = {{0x09, 0x0D},     {0x20, 0x20},     {0xA0, 0xA0},     {0x1680, 0x1680},
                           {0x2000, 0x200A}, {0x2028, 0x2029}, {0x202F, 0x202F}, {0x205F, 0x205F},
                           {0x3000, 0x3000}, {0xFEFF, 0xFEFF}};
  return r;
}

struct Node {
  enum Kind { kSet, kSeq, kAlt, kRepeat } kind = kSet;
  Ranges set;
  std::vector<std::unique_ptr<Node>> kids;
  int min = 0, max = -1;  // kRepeat; max -1: unbounded
};
using NodePtr = std::unique_ptr<Node>;

class Parser {
 public:
  explicit Parser(const std::string& p) {
    // Decode UTF-8 into code points (the pattern came from valid JSON text).
    for (size_t i = 0; i < p.size();) {
      unsigned char c = static_cast<unsigned char>(p[i]);
      int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : 4;
      uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
      for (int k = 1; k < n && i + static_cast<size_t>(k) < p.size(); ++k)
        cp = (cp << 6) | (static_cast<unsigned char>(p[i + static_cast<size_t>(k)]) & 0x3F);
      cps_.push_back(cp);
      i += static_cast<size_t>(n);
    }
  }

  Result<NodePtr> parse() {
    if (at('^')) ++pos_;
    HR_ASSIGN_OR_RETURN(NodePtr n, alternation());
    if (pos_ < cps_.size()) {
      if (cps_[pos_] == '$' && pos_ + 1 == cps_.size()) return n;
      return error(cps_[pos_] == ')' ? "an unmatched ')'" : "'$' before the end");
    }
    return n;
  }

 private:
  bool at(uint32_t c) const { return pos_ < cps_.size() && cps_[pos_] == c; }
  Status error(const std::string& what) const {
    return invalid_argument("the pattern has " + what + " at character " + std::to_string(pos_) +
                            ", which is not supported");
  }

  Result<NodePtr> alternation() {
    auto alt = std::make_unique<Node>();
    alt->kind = Node::kAlt;
    for (;;) {
      HR_ASSIGN_OR_RETURN(NodePtr s, sequence());
      alt->kids.push_back(std::move(s));
      if (!at('|')) break;
      ++pos_;
    }
    if (alt->kids.size() == 1) return std::move(alt->kids[0]);
    return alt;
  }

  Result<NodePtr> sequence() {
    auto seq = std::make_unique<Node>();
    seq->kind = Node::kSeq;
    while (pos_ < cps_.size() && !at('|') && !at(')')) {
      if (at('$') && pos_ + 1 == cps_.size()) break;
      HR_ASSIGN_OR_RETURN(NodePtr a, atom());
      HR_ASSIGN_OR_RETURN(a, quantified(std::move(a)));
      seq->kids.push_back(std::move(a));
    }
    return seq;
  }

  Result<NodePtr> quantified(NodePtr a) {
    for (;;) {
      int min = 0, max = -1;
      if (at('*')) {
        ++pos_;
      } else if (at('+')) {
        min = 1;
        ++pos_;
      } else if (at('?')) {
        max = 1;
        ++pos_;
      } else if (at('{') && brace(&min, &max)) {
      } else {
        return a;
      }
      if (at('?')) ++pos_;  // lazy: the same strings
      auto r = std::make_unique<Node>();
      r->kind = Node::kRepeat;
      r->min = min;
      r->max = max;
      r->kids.push_back(std::move(a));
      a = std::move(r);
    }
  }

  // {n}, {n,}, {n,m}; false (nothing consumed) when the brace is a literal one.
  bool brace(int* min, int* max) {
    size_t p = pos_ + 1;
    auto number = [&](int* out) {
      size_t begin = p;
      long v = 0;
      while (p < cps_.size() && cps_[p] >= '0' && cps_[p] <= '9' && v < 100000) {
        v = v * 10 + static_cast<long>(cps_[p] - '0');
        ++p;
      }
      *out = static_cast<int>(v);
      return p > begin;
    };
    if (!number(min)) return false;
    *max = *min;
    if (p < cps_.size() && cps_[p] == ',') {
      ++p;
      if (!number(max)) *max = -1;
    }
    if (p >= cps_.size() || cps_[p] != '}') return false;
    if (*max >= 0 && *max < *min) return false;
    pos_ = p + 1;
    return true;
  }

  static NodePtr set_node(Ranges r) {
    auto n = std::make_unique<Node>();
    n->kind = Node::kSet;
    n->set = normalize(std::move(r));
    return n;
  }

  Result<NodePtr> atom() {
    const uint32_t c = cps_[pos_];
    if (c == '(') {
      ++pos_;
      if (at('?')) {
        if (pos_ + 1 < cps_.size() && cps_[pos_ + 1] == ':') {
          pos_ += 2;
        } else {
          return error("a lookaround or named group");
        }
      }
      HR_ASSIGN_OR_RETURN(NodePtr inner, alternation());
      if (!at(')')) return error("an unclosed '('");
      ++pos_;
      return inner;
    }
    if (c == '[') return char_class();
    if (c == '.') {
      ++pos_;
      return set_node(complement({{'\n', '\n'}, {'\r', '\r'}, {0x2028, 0x2029}}));
    }
    if (c == '\\') {
      ++pos_;
      HR_ASSIGN_OR_RETURN(Ranges r, escape(/*in_class=*/false));
      return set_node(std::move(r));
    }
    if (c == '^' || c == '$') return error("an anchor inside the pattern");
    if (c == '*' || c == '+' || c == '?') return error("a quantifier with nothing before it");
    if (c == ')') return error("an unmatched ')'");
    ++pos_;
    return set_node({{c, c}});
  }

  Result<NodePtr> char_class() {
    ++pos_;  // [
    bool negate = false;
    if (at('^')) {
      negate = true;
      ++pos_;
    }
    Ranges r;
    while (pos_ < cps_.size() && !at(']')) {
      Ranges lo_set;
      uint32_t lo;
      if (at('\\')) {
        ++pos_;
        HR_ASSIGN_OR_RETURN(lo_set, escape(/*in_class=*/true));
      } else {
        lo_set = {{cps_[pos_], cps_[pos_]}};
        ++pos_;
      }
      if (lo_set.size() == 1 && lo_set[0].first == lo_set[0].second && at('-') &&
          pos_ + 1 < cps_.size() && cps_[pos_ + 1] != ']') {
        lo = lo_set[0].first;
        ++pos_;  // -
        uint32_t hi;
        if (at('\\')) {
          ++pos_;
          HR_ASSIGN_OR_RETURN(Ranges h, escape(/*in_class=*/true));
          if (h.size() != 1 || h[0].first != h[0].second) return error("a class range to a set");
          hi = h[0].first;
        } else {
          hi = cps_[pos_++];
        }
        if (hi < lo) return error("a class range out of order");
        r.push_back({lo, hi});
      } else {
        r.insert(r.end(), lo_set.begin(), lo_set.end());
      }
    }
    if (!at(']')) return error("an unclosed '['");
    ++pos_;
    return set_node(negate ? complement(r) : r);
  }

  Result<uint32_t> hex(size_t digits) {
    uint32_t v = 0;
    for (size_t k = 0; k < digits; ++k) {
      if (pos_ >= cps_.size()) return error("a short hex escape");
      uint32_t h = cps_[pos_++];
      int d = h >= '0' && h <= '9'   ? static_cast<int>(h - '0')
              : h >= 'a' && h <= 'f' ? static_cast<int>(h - 'a' + 10)
              : h >= 'A' && h <= 'F' ? static_cast<int>(h - 'A' + 10)
                                     : -1;
      if (d < 0) return error("a bad hex escape");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    return v;
  }

  Result<Ranges> escape(bool in_class) {
    if (pos_ >= cps_.size()) return error("a trailing backslash");
    const uint32_t c = cps_[pos_++];
    switch (c) {
      case 'd':
        return digit_set();
      case 'D':
        return complement(digit_set());
      case 'w':
        return word_set();
      case 'W':
        return complement(word_set());
      case 's':
        return space_set();
      case 'S':
        return complement(space_set());
      case 'n':
        return Ranges{{'\n', '\n'}};
      case 't':
        return Ranges{{'\t', '\t'}};
      case 'r':
        return Ranges{{'\r', '\r'}};
      case 'f':
        return Ranges{{'\f', '\f'}};
      case 'v':
        return Ranges{{'\v', '\v'}};
      case '0':
        return Ranges{{0, 0}};
      case 'x': {
        HR_ASSIGN_OR_RETURN(uint32_t v, hex(2));
        return Ranges{{v, v}};
      }
      case 'u': {
        if (at('{')) {
          ++pos_;
          uint32_t v = 0;
          size_t n = 0;
          while (pos_ < cps_.size() && !at('}') && n < 7) {
            HR_ASSIGN_OR_RETURN(uint32_t d, hex(1));
            v = v * 16 + d;
            ++n;
          }
          if (!at('}') || n == 0 || v > 0x10FFFF) return error("a bad \\u{...} escape");
          ++pos_;
          return Ranges{{v, v}};
        }
        HR_ASSIGN_OR_RETURN(uint32_t v, hex(4));
        return Ranges{{v, v}};
      }
      case 'b':
        if (in_class) return Ranges{{8, 8}};
        return error("a word boundary (\\b)");
      default:
        break;
    }
    if (c == 'B') return error("a word boundary (\\B)");
    if (c == 'p' || c == 'P') return error("a Unicode property escape");
    if (c == 'c') return error("a control escape (\\c)");
    if (c == 'k') return error("a named backreference");
    if (c >= '1' && c <= '9') return error("a backreference");
    // Escaped punctuation stands for itself (the u flag allows no other identity escapes).
    if ((c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) ||
        (c >= 0x7B && c <= 0x7E)) {
      return Ranges{{c, c}};
    }
    --pos_;
    return error("an unknown escape");
  }

  std::vector<uint32_t> cps_;
  size_t pos_ = 0;
};

// One character of `set` as JSON string contents: a quote or backslash escaped, controls as
// escapes, everything else as its UTF-8 bytes.
Frag emit_set(Nfa& nfa, const Ranges& set) {
  std::vector<Frag> options;
  static const char* kShort[32] = {nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                   nullptr, "\\b",   "\\t",   "\\n",   nullptr, "\\f",   "\\r"};
  for (auto [lo, hi] : set) {
    for (uint32_t c = lo; c <= std::min<uint32_t>(hi, 0x1F); ++c) {
      if (kShort[c]) {
        options.push_back(nfa.literal(kShort[c]));
      } else {
        static const char* kHex = "0123456789abcdef";
        std::string e = "\\u00";
        e += kHex[c >> 4];
        e += kHex[c & 15];
        options.push_back(nfa.literal(e));
      }
    }
    uint32_t a = std::max<uint32_t>(lo, 0x20);
    auto plain = [&](uint32_t from, uint32_t to) {
      if (from <= to) options.push_back(nfa.code_points(from, to));
    };
    for (uint32_t special : {0x22u, 0x5Cu}) {
      if (a <= special && hi >= special) {
        plain(a, special - 1);
        options.push_back(nfa.literal(special == 0x22 ? "\\\"" : "\\\\"));
        a = special + 1;
      }
    }
    if (hi >= a) plain(a, hi);
  }
  if (options.size() == 1) return options[0];
  return nfa.alt(options);
}

Frag emit(Nfa& nfa, const Node& n) {
  switch (n.kind) {
    case Node::kSet:
      return emit_set(nfa, n.set);
    case Node::kSeq: {
      Frag f = nfa.empty();
      for (const NodePtr& k : n.kids) f = nfa.seq(f, emit(nfa, *k));
      return f;
    }
    case Node::kAlt: {
      std::vector<Frag> options;
      for (const NodePtr& k : n.kids) options.push_back(emit(nfa, *k));
      return nfa.alt(options);
    }
    case Node::kRepeat: {
      Frag f = nfa.empty();
      for (int i = 0; i < n.min && !nfa.overflowed(); ++i) f = nfa.seq(f, emit(nfa, *n.kids[0]));
      if (n.max < 0) return nfa.seq(f, nfa.star(emit(nfa, *n.kids[0])));
      // Up to max - min more, each optional: nested so that skipping one skips the rest.
      Frag tail = nfa.empty();
      for (int i = n.min; i < n.max && !nfa.overflowed(); ++i)
        tail = nfa.opt(nfa.seq(emit(nfa, *n.kids[0]), tail));
      return nfa.seq(f, tail);
    }
  }
  return nfa.empty();
}

}  // namespace

Result<Frag> add_pattern(Nfa& nfa, const std::string& pattern) {
  Parser p(pattern);
  HR_ASSIGN_OR_RETURN(NodePtr tree, p.parse());
  return emit(nfa, *tree);
}

Frag add_json_char(Nfa& nfa) {
  Frag f{nfa.add_node(), nfa.add_node()};
  // Raw: any code point from U+0020 but the quote and the backslash.
  Frag raw1 = nfa.code_points(0x20, 0x21);
  Frag raw2 = nfa.code_points(0x23, 0x5B);
  Frag raw3 = nfa.code_points(0x5D, 0x10FFFF);
  for (Frag r : {raw1, raw2, raw3}) {
    nfa.add_eps(f.in, r.in);
    nfa.add_eps(r.out, f.out);
  }
  // Escapes: \" \\ \/ \b \f \n \r \t, and \uXXXX but for surrogates (a lone one is no character).
  int32_t bs = nfa.add_node();
  nfa.add_bytes(f.in, '\\', '\\', bs);
  for (char c : std::string("\"\\/bfnrt"))
    nfa.add_bytes(bs, static_cast<uint8_t>(c), static_cast<uint8_t>(c), f.out);
  int32_t u = nfa.add_node();
  nfa.add_bytes(bs, 'u', 'u', u);
  int32_t h1 = nfa.add_node(), d = nfa.add_node(), h2 = nfa.add_node(), h3 = nfa.add_node();
  auto hex_edges = [&](int32_t from, int32_t to, bool digits, bool af) {
    if (digits) nfa.add_bytes(from, '0', '9', to);
    if (af) {
      nfa.add_bytes(from, 'a', 'f', to);
      nfa.add_bytes(from, 'A', 'F', to);
    }
  };
  // First digit 0-9, a-c, e-f (any second digit); d/D needs a second digit 0-7.
  nfa.add_bytes(u, '0', '9', h1);
  nfa.add_bytes(u, 'a', 'c', h1);
  nfa.add_bytes(u, 'A', 'C', h1);
  nfa.add_bytes(u, 'e', 'f', h1);
  nfa.add_bytes(u, 'E', 'F', h1);
  nfa.add_bytes(u, 'd', 'd', d);
  nfa.add_bytes(u, 'D', 'D', d);
  hex_edges(h1, h2, true, true);
  nfa.add_bytes(d, '0', '7', h2);
  hex_edges(h2, h3, true, true);
  hex_edges(h3, f.out, true, true);
  return f;
}

}  // namespace hr::grammar
