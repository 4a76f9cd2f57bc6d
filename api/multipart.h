// A multipart/form-data parser (RFC 7578 on RFC 2046) for file uploads: finds the boundary in the
// Content-Type, splits the body into parts and reads each part's Content-Disposition (name,
// filename, filename*) and Content-Type. Parts point into the body: nothing is copied, so the body
// must outlive them. Delimiter lines end in CRLF or a bare LF; a boundary string inside a part's
// data is data unless it starts a line and is followed by "--" or a line end. Pure functions.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"

namespace hr::api {

struct MultipartPart {
  std::string name;                     // the form field
  std::optional<std::string> filename;  // present for file fields
  std::string content_type;             // empty when the part has none
  std::string_view data;                // into the body
};

// The boundary parameter of a multipart/form-data Content-Type; errors name "Content-Type".
[[nodiscard]] Result<std::string> multipart_boundary(std::string_view content_type);

// Splits `body` into its parts; errors (kInvalidArgument) name "body".
[[nodiscard]] Result<std::vector<MultipartPart>> parse_multipart(std::string_view body,
                                                                 std::string_view boundary);

// The first part named `name`, or nullptr.
const MultipartPart* find_part(const std::vector<MultipartPart>& parts, std::string_view name);

}  // namespace hr::api
