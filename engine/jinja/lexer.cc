// The template lexer.
#include "engine/jinja/lexer.h"

#include <cctype>
#include <utility>

namespace hr::engine::jinja {
namespace {

// The preprocessed source, with the original line of every character.
struct Source {
  std::string text;
  std::vector<int> line;
  void push(char c, int l) {
    text.push_back(c);
    line.push_back(l);
  }
};

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// Hugging Face's whitespace handling (lstrip_blocks, trim_blocks, the trailing newline) and the
// removal of {% generation %} tags, keeping each character's original line.
Source preprocess(std::string_view src) {
  if (!src.empty() && src.back() == '\n') src.remove_suffix(1);
  // lstrip_blocks: spaces and tabs at the start of a line, before "{%", "{#" or "{-"... are
  // dropped (the reference strips before any of "{#", "{%", "{-").
  Source a;
  int line = 1;
  for (size_t i = 0; i < src.size();) {
    const bool line_start = i == 0 || src[i - 1] == '\n';
    if (line_start) {
      size_t j = i;
      while (j < src.size() && (src[j] == ' ' || src[j] == '\t')) ++j;
      if (j > i && j + 1 < src.size() && src[j] == '{' &&
          (src[j + 1] == '#' || src[j + 1] == '%' || src[j + 1] == '-')) {
        i = j;
      }
    }
    if (i >= src.size()) break;
    a.push(src[i], line);
    if (src[i] == '\n') ++line;
    ++i;
  }
  // trim_blocks: a newline right after "#}", "%}" or "-}" goes.
  Source b;
  for (size_t i = 0; i < a.text.size(); ++i) {
    b.push(a.text[i], a.line[i]);
    if (i + 2 < a.text.size() && a.text[i + 1] == '}' && a.text[i + 2] == '\n' &&
        (a.text[i] == '#' || a.text[i] == '%' || a.text[i] == '-')) {
      b.push(a.text[i + 1], a.line[i + 1]);
      i += 2;  // skips the newline
    }
  }
  // {% generation %} and {% endgeneration %} (with their whitespace, or without it where the
  // tag says `-`).
  Source c;
  const std::string& t = b.text;
  for (size_t i = 0; i < t.size();) {
    // Whitespace run, then a possible tag.
    size_t ws_end = i;
    while (ws_end < t.size() && is_space(t[ws_end])) ++ws_end;
    size_t p = ws_end;
    bool matched = false;
    if (p + 1 < t.size() && t[p] == '{' && t[p + 1] == '%') {
      size_t q = p + 2;
      const bool lstrip = q < t.size() && t[q] == '-';
      if (lstrip) ++q;
      while (q < t.size() && is_space(t[q])) ++q;
      if (t.compare(q, 3, "end") == 0) q += 3;
      if (t.compare(q, 10, "generation") == 0) {
        q += 10;
        while (q < t.size() && is_space(t[q])) ++q;
        const bool rstrip = q < t.size() && t[q] == '-';
        if (rstrip) ++q;
        if (q + 1 < t.size() && t[q] == '%' && t[q + 1] == '}') {
          q += 2;
          size_t after_end = q;
          while (after_end < t.size() && is_space(t[after_end])) ++after_end;
          if (!lstrip) {
            for (size_t k = i; k < ws_end; ++k) c.push(t[k], b.line[k]);
          }
          if (!rstrip) {
            for (size_t k = q; k < after_end; ++k) c.push(t[k], b.line[k]);
          }
          i = after_end;
          matched = true;
        }
      }
    }
    if (!matched) {
      for (size_t k = i; k < std::max(ws_end, i + 1) && k < t.size(); ++k) c.push(t[k], b.line[k]);
      i = std::max(ws_end, i + 1);
    }
  }
  return c;
}

bool is_word(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

struct Mapping {
  const char* seq;
  TokenType type;
};

constexpr Mapping kOrdered[] = {
    {"{%", TokenType::kOpenStatement},  {"%}", TokenType::kCloseStatement},
    {"{{", TokenType::kOpenExpression}, {"}}", TokenType::kCloseExpression},
    {"(", TokenType::kOpenParen},       {")", TokenType::kCloseParen},
    {"{", TokenType::kOpenBrace},       {"}", TokenType::kCloseBrace},
    {"[", TokenType::kOpenBracket},     {"]", TokenType::kCloseBracket},
    {",", TokenType::kComma},           {".", TokenType::kDot},
    {":", TokenType::kColon},           {"|", TokenType::kPipe},
    {"<=", TokenType::kComparison},     {">=", TokenType::kComparison},
    {"==", TokenType::kComparison},     {"!=", TokenType::kComparison},
    {"<", TokenType::kComparison},      {">", TokenType::kComparison},
    {"+", TokenType::kAdditive},        {"-", TokenType::kAdditive},
    {"~", TokenType::kAdditive},        {"**", TokenType::kPower},
    {"*", TokenType::kMultiplicative},  {"//", TokenType::kMultiplicative},
    {"/", TokenType::kMultiplicative},  {"%", TokenType::kMultiplicative},
    {"=", TokenType::kEquals},
};

Status error_at(int line, const std::string& what) {
  return invalid_argument("chat template line " + std::to_string(line) + ": " + what,
                          "chat_template");
}

// Appends the UTF-8 encoding of `cp`.
void append_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

}  // namespace

Result<std::vector<Token>> tokenize(std::string_view given) {
  const Source src = preprocess(given);
  const std::string& s = src.text;
  auto line_at = [&](size_t pos) {
    if (src.line.empty()) return 1;
    return src.line[std::min(pos, src.line.size() - 1)];
  };
  std::vector<Token> tokens;
  size_t pos = 0;
  int curly_depth = 0;
  auto push = [&](TokenType type, std::string value, size_t at) {
    tokens.push_back({type, std::move(value), line_at(at)});
  };
  auto strip_trailing_whitespace = [&] {
    if (!tokens.empty() && tokens.back().type == TokenType::kText) {
      std::string& v = tokens.back().value;
      while (!v.empty() && is_space(v.back())) v.pop_back();
      if (v.empty()) tokens.pop_back();
    }
  };
  auto skip_leading_whitespace = [&] {
    while (pos < s.size() && is_space(s[pos])) ++pos;
  };

  while (pos < s.size()) {
    const TokenType* last = tokens.empty() ? nullptr : &tokens.back().type;
    if (last == nullptr || *last == TokenType::kCloseStatement ||
        *last == TokenType::kCloseExpression || *last == TokenType::kComment) {
      const size_t start = pos;
      while (pos < s.size() && !(s[pos] == '{' && pos + 1 < s.size() &&
                                 (s[pos + 1] == '%' || s[pos + 1] == '{' || s[pos + 1] == '#'))) {
        ++pos;
      }
      if (pos > start) {
        push(TokenType::kText, s.substr(start, pos - start), start);
        continue;
      }
    }
    // A comment.
    if (s[pos] == '{' && pos + 1 < s.size() && s[pos + 1] == '#') {
      const size_t start = pos;
      pos += 2;
      const bool strip_before = pos < s.size() && s[pos] == '-';
      if (strip_before) ++pos;
      std::string comment;
      while (!(pos + 1 < s.size() && s[pos] == '#' && s[pos + 1] == '}')) {
        if (pos + 2 >= s.size()) return error_at(line_at(start), "a comment is not closed with #}");
        comment.push_back(s[pos++]);
      }
      const bool strip_after = !comment.empty() && comment.back() == '-';
      if (strip_after) comment.pop_back();
      if (strip_before) strip_trailing_whitespace();
      push(TokenType::kComment, comment, start);
      pos += 2;
      if (strip_after) skip_leading_whitespace();
      continue;
    }
    if (s.compare(pos, 3, "{%-") == 0) {
      strip_trailing_whitespace();
      push(TokenType::kOpenStatement, "{%", pos);
      pos += 3;
      continue;
    }
    if (s.compare(pos, 3, "{{-") == 0) {
      strip_trailing_whitespace();
      push(TokenType::kOpenExpression, "{{", pos);
      curly_depth = 0;
      pos += 3;
      continue;
    }
    while (pos < s.size() && is_space(s[pos])) ++pos;
    if (pos >= s.size()) break;
    if (s.compare(pos, 3, "-%}") == 0) {
      push(TokenType::kCloseStatement, "%}", pos);
      pos += 3;
      skip_leading_whitespace();
      continue;
    }
    if (s.compare(pos, 3, "-}}") == 0) {
      push(TokenType::kCloseExpression, "}}", pos);
      pos += 3;
      skip_leading_whitespace();
      continue;
    }
    const char c = s[pos];
    if (c == '-' || c == '+') {
      const TokenType prev = tokens.empty() ? TokenType::kText : tokens.back().type;
      if (tokens.empty() || prev == TokenType::kText) {
        return error_at(line_at(pos), std::string("unexpected character ") + c);
      }
      if (prev != TokenType::kIdentifier && prev != TokenType::kNumber &&
          prev != TokenType::kString && prev != TokenType::kCloseParen &&
          prev != TokenType::kCloseBracket) {
        const size_t start = pos++;
        std::string num;
        while (pos < s.size() && is_digit(s[pos])) num.push_back(s[pos++]);
        if (!num.empty() && pos + 1 < s.size() && s[pos] == '.' && is_digit(s[pos + 1])) {
          ++pos;
          num.push_back('.');
          while (pos < s.size() && is_digit(s[pos])) num.push_back(s[pos++]);
        }
        push(num.empty() ? TokenType::kUnary : TokenType::kNumber, std::string(1, c) + num, start);
        continue;
      }
    }
    bool mapped = false;
    for (const Mapping& m : kOrdered) {
      const std::string_view seq = m.seq;
      if (seq == "}}" && curly_depth > 0) continue;
      if (s.compare(pos, seq.size(), seq) == 0) {
        push(m.type, std::string(seq), pos);
        if (m.type == TokenType::kOpenExpression) {
          curly_depth = 0;
        } else if (m.type == TokenType::kOpenBrace) {
          ++curly_depth;
        } else if (m.type == TokenType::kCloseBrace) {
          --curly_depth;
        }
        pos += seq.size();
        mapped = true;
        break;
      }
    }
    if (mapped) continue;
    if (c == '\'' || c == '"') {
      const size_t start = pos++;
      std::string str;
      while (true) {
        if (pos >= s.size()) return error_at(line_at(start), "a string is not closed");
        const char ch = s[pos];
        if (ch == c) break;
        if (ch == '\\') {
          if (++pos >= s.size()) return error_at(line_at(start), "a string ends in a backslash");
          const char e = s[pos++];
          if (e == 'x' || e == 'u') {
            const size_t len = e == 'x' ? 2 : 4;
            const std::string hex = s.substr(pos, len);
            if (hex.size() != len ||
                hex.find_first_not_of("0123456789abcdefABCDEF") != std::string::npos) {
              return error_at(line_at(start), "bad escape \\" + std::string(1, e) + hex);
            }
            append_utf8(&str, static_cast<uint32_t>(std::stoul(hex, nullptr, 16)));
            pos += len;
            continue;
          }
          switch (e) {
            case 'n':
              str.push_back('\n');
              break;
            case 't':
              str.push_back('\t');
              break;
            case 'r':
              str.push_back('\r');
              break;
            case 'b':
              str.push_back('\b');
              break;
            case 'f':
              str.push_back('\f');
              break;
            case 'v':
              str.push_back('\v');
              break;
            case '\'':
              str.push_back('\'');
              break;
            case '"':
              str.push_back('"');
              break;
            case '\\':
              str.push_back('\\');
              break;
            default:
              return error_at(line_at(start), std::string("unexpected escaped character ") + e);
          }
          continue;
        }
        str.push_back(ch);
        ++pos;
      }
      ++pos;  // the closing quote
      push(TokenType::kString, std::move(str), start);
      continue;
    }
    if (is_digit(c)) {
      const size_t start = pos;
      std::string num;
      while (pos < s.size() && is_digit(s[pos])) num.push_back(s[pos++]);
      if ((tokens.empty() || tokens.back().type != TokenType::kDot) && pos + 1 < s.size() &&
          s[pos] == '.' && is_digit(s[pos + 1])) {
        ++pos;
        num.push_back('.');
        while (pos < s.size() && is_digit(s[pos])) num.push_back(s[pos++]);
      }
      push(TokenType::kNumber, std::move(num), start);
      continue;
    }
    if (is_word(c)) {
      const size_t start = pos;
      while (pos < s.size() && is_word(s[pos])) ++pos;
      push(TokenType::kIdentifier, s.substr(start, pos - start), start);
      continue;
    }
    return error_at(line_at(pos), std::string("unexpected character ") + c);
  }
  return tokens;
}

}  // namespace hr::engine::jinja
