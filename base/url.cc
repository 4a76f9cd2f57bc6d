// A small URL parser.
#include "base/url.h"

#include <cctype>

namespace hr {

std::string percent_decode(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] == '%' && i + 2 < s.size() && std::isxdigit(static_cast<unsigned char>(s[i + 1])) &&
        std::isxdigit(static_cast<unsigned char>(s[i + 2]))) {
      out += static_cast<char>(std::stoi(std::string(s.substr(i + 1, 2)), nullptr, 16));
      i += 2;
    } else {
      out += s[i];
    }
  }
  return out;
}

Result<Url> parse_url(std::string_view text) {
  Url u;
  size_t p = text.find("://");
  if (p == std::string_view::npos || p == 0) return invalid_argument("URL has no scheme://");
  // RFC 3986: ALPHA *( ALPHA / DIGIT / "+" / "-" / "." ).
  for (char c : text.substr(0, p)) {
    const bool alpha = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
    const bool other = (c >= '0' && c <= '9') || c == '+' || c == '-' || c == '.';
    if (!alpha && (u.scheme.empty() || !other)) {
      return invalid_argument("URL scheme '" + std::string(text.substr(0, p)) +
                              "' is not a scheme: a letter, then letters, digits, '+', '-' or '.'");
    }
    u.scheme += static_cast<char>(std::tolower(c));
  }
  std::string_view rest = text.substr(p + 3);
  size_t q = rest.find('?');
  if (q != std::string_view::npos) {
    u.query = std::string(rest.substr(q + 1));
    rest = rest.substr(0, q);
  }
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) u.path = std::string(rest.substr(slash));
  size_t at = authority.rfind('@');
  if (at != std::string_view::npos) {
    std::string_view userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    size_t colon = userinfo.find(':');
    u.user = percent_decode(userinfo.substr(0, colon));
    if (colon != std::string_view::npos) u.password = percent_decode(userinfo.substr(colon + 1));
  }
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return invalid_argument("URL has an unclosed [ in host");
    u.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return invalid_argument("URL has junk after ]");
      port_text = after.substr(1);
    }
  } else {
    size_t colon = authority.rfind(':');
    u.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) port_text = authority.substr(colon + 1);
  }
  if (!port_text.empty()) {
    uint32_t port = 0;
    for (char c : port_text) {
      if (!std::isdigit(static_cast<unsigned char>(c)))
        return invalid_argument("URL port is not a number");
      port = port * 10 + static_cast<uint32_t>(c - '0');
      if (port > 65535) return invalid_argument("URL port is out of range");
    }
    if (port == 0) return invalid_argument("URL port is out of range");
    u.port = static_cast<uint16_t>(port);
  }
  return u;
}

std::string Url::redacted() const {
  std::string s = scheme + "://";
  if (!user.empty() || !password.empty()) {
    s += user;
    if (!password.empty()) s += ":***";
    s += '@';
  }
  const bool v6 = host.find(':') != std::string::npos;
  if (v6) s += '[';
  s += host;
  if (v6) s += ']';
  if (port != 0) {
    s += ':';
    s += std::to_string(port);
  }
  s += path;
  if (!query.empty()) {
    s += '?';
    s += query;
  }
  return s;
}

}  // namespace hr
