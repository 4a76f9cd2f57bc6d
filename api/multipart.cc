// multipart/form-data parsing.
#include "api/multipart.h"

#include <algorithm>
#include <cctype>

#include "base/url.h"

namespace hr::api {
namespace {

bool iequals(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(), [](char x, char y) {
           return std::tolower(static_cast<unsigned char>(x)) ==
                  std::tolower(static_cast<unsigned char>(y));
         });
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

Status bad_body(const std::string& msg) { return invalid_argument(msg, "body"); }

// The end of the ';'-separated item starting at `from` (quotes respected), or nullopt when a quoted
// string does not end.
std::optional<size_t> item_end(std::string_view s, size_t from) {
  bool quoted = false;
  for (size_t k = from; k < s.size(); ++k) {
    if (quoted && s[k] == '\\') {
      ++k;
    } else if (s[k] == '"') {
      quoted = !quoted;
    } else if (!quoted && s[k] == ';') {
      return k;
    }
  }
  if (quoted) return std::nullopt;
  return s.size();
}

struct Param {
  std::string key;  // lowercase
  std::string value;
};

// Splits `first; key=value; key="quoted; value"`. Returns false on an unterminated quote.
bool parse_params(std::string_view s, std::string* first, std::vector<Param>* out) {
  std::optional<size_t> end = item_end(s, 0);
  if (!end) return false;
  *first = std::string(trim(s.substr(0, *end)));
  for (size_t i = *end; i < s.size(); i = *end) {
    ++i;  // the ';'
    end = item_end(s, i);
    if (!end) return false;
    std::string_view item = trim(s.substr(i, *end - i));
    if (item.empty()) continue;
    size_t eq = item.find('=');
    Param p;
    p.key = std::string(trim(item.substr(0, eq)));
    std::transform(p.key.begin(), p.key.end(), p.key.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (eq != std::string_view::npos) {
      std::string_view v = trim(item.substr(eq + 1));
      if (v.size() >= 2 && v.front() == '"' && v.back() == '"') {
        v = v.substr(1, v.size() - 2);
        for (size_t k = 0; k < v.size(); ++k) {
          if (v[k] == '\\' && k + 1 < v.size()) ++k;
          p.value.push_back(v[k]);
        }
      } else {
        p.value = std::string(v);
      }
    }
    out->push_back(std::move(p));
  }
  return true;
}

// Position just past a line end ("\r\n" or "\n") at `p` (after optional spaces and tabs), or npos.
size_t skip_line_end(std::string_view body, size_t p) {
  while (p < body.size() && (body[p] == ' ' || body[p] == '\t')) ++p;
  if (p < body.size() && body[p] == '\r') ++p;
  if (p < body.size() && body[p] == '\n') return p + 1;
  return std::string_view::npos;
}

// Reads a part's header lines from `p` up to the empty line; returns the position after it.
Result<size_t> parse_part_headers(std::string_view body, size_t p, MultipartPart* part) {
  bool has_disposition = false;
  for (;;) {
    size_t nl = body.find('\n', p);
    if (nl == std::string_view::npos) return bad_body("a part's headers do not end");
    std::string_view line = body.substr(p, nl - p);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    p = nl + 1;
    if (line.empty()) break;
    size_t colon = line.find(':');
    if (colon == std::string_view::npos) return bad_body("a part has a malformed header line");
    std::string_view name = trim(line.substr(0, colon));
    std::string_view value = trim(line.substr(colon + 1));
    if (iequals(name, "Content-Type")) {
      part->content_type = std::string(value);
    } else if (iequals(name, "Content-Disposition")) {
      std::string type;
      std::vector<Param> params;
      if (!parse_params(value, &type, &params)) {
        return bad_body("a part's Content-Disposition has an unterminated quoted string");
      }
      if (!iequals(type, "form-data")) {
        return bad_body("a part's Content-Disposition must be form-data");
      }
      has_disposition = true;
      std::optional<std::string> encoded_filename;
      for (const Param& prm : params) {
        if (prm.key == "name") part->name = prm.value;
        if (prm.key == "filename") part->filename = prm.value;
        if (prm.key == "filename*") encoded_filename = prm.value;
      }
      // RFC 5987: charset'language'percent-encoded, preferred over filename when both are given.
      if (encoded_filename) {
        size_t q = encoded_filename->find('\'');
        size_t q2 = q == std::string::npos ? q : encoded_filename->find('\'', q + 1);
        if (q2 != std::string::npos) {
          part->filename = percent_decode(std::string_view(*encoded_filename).substr(q2 + 1));
        }
      }
    }
  }
  if (!has_disposition) return bad_body("a part has no Content-Disposition header");
  if (part->name.empty()) return bad_body("a part's Content-Disposition has no name");
  return p;
}

}  // namespace

Result<std::string> multipart_boundary(std::string_view content_type) {
  std::string type;
  std::vector<Param> params;
  if (!parse_params(content_type, &type, &params) || !iequals(type, "multipart/form-data")) {
    return invalid_argument("Content-Type must be multipart/form-data with a boundary",
                            "Content-Type");
  }
  for (const Param& p : params) {
    if (p.key != "boundary") continue;
    if (p.value.empty() || p.value.size() > 70) {
      return invalid_argument("the multipart boundary must be 1 to 70 characters", "Content-Type");
    }
    return p.value;
  }
  return invalid_argument("Content-Type multipart/form-data has no boundary", "Content-Type");
}

Result<std::vector<MultipartPart>> parse_multipart(std::string_view body,
                                                   std::string_view boundary) {
  std::string delim = "--" + std::string(boundary);
  std::string line_delim = "\n" + delim;
  // The first delimiter starts the body or a line (anything before it is preamble).
  size_t p;
  if (body.substr(0, delim.size()) == delim) {
    p = delim.size();
  } else {
    size_t at = body.find(line_delim);
    if (at == std::string_view::npos) return bad_body("the body has no multipart boundary line");
    p = at + line_delim.size();
  }
  std::vector<MultipartPart> parts;
  for (;;) {
    if (body.substr(p, 2) == "--") return parts;  // the close delimiter
    size_t after = skip_line_end(body, p);
    if (after == std::string_view::npos) return bad_body("a multipart boundary line is malformed");
    MultipartPart part;
    HR_ASSIGN_OR_RETURN(size_t data_start, parse_part_headers(body, after, &part));
    // The data ends at the next line that is a delimiter: "\n--boundary" followed by "--" or a
    // line end. The same characters followed by anything else are data.
    size_t search = data_start > 0 ? data_start - 1 : 0;
    for (;;) {
      size_t at = body.find(line_delim, search);
      if (at == std::string_view::npos) {
        return bad_body("the body ends before the closing multipart boundary");
      }
      size_t next = at + line_delim.size();
      if (body.substr(next, 2) != "--" && skip_line_end(body, next) == std::string_view::npos) {
        search = at + 1;
        continue;
      }
      size_t data_end = at;
      if (data_end > data_start && body[data_end - 1] == '\r') --data_end;
      part.data = data_end > data_start ? body.substr(data_start, data_end - data_start)
                                        : std::string_view();
      parts.push_back(std::move(part));
      p = next;
      break;
    }
  }
}

const MultipartPart* find_part(const std::vector<MultipartPart>& parts, std::string_view name) {
  for (const MultipartPart& p : parts) {
    if (p.name == name) return &p;
  }
  return nullptr;
}

}  // namespace hr::api
