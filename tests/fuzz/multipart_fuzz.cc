// A file upload's form (api/multipart.h): the first line is the Content-Type header's value, the
// rest the body. Every part must lie inside the body.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "api/multipart.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nl = in.find('\n');
  const std::string_view content_type = in.substr(0, nl);
  const std::string_view body =
      nl == std::string_view::npos ? std::string_view() : in.substr(nl + 1);
  auto boundary = hr::api::multipart_boundary(content_type);
  if (!boundary.is_ok()) return 0;
  auto parts = hr::api::parse_multipart(body, *boundary);
  if (!parts.is_ok()) return 0;
  for (const auto& p : *parts) {
    if (!p.data.empty() && (p.data.data() < body.data() ||
                            p.data.data() + p.data.size() > body.data() + body.size())) {
      std::abort();
    }
  }
  (void)hr::api::find_part(*parts, "file");
  return 0;
}
