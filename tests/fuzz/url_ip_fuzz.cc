// URLs (base/url.h: service locations and webhook targets) and the webhook address policy's IP
// and CIDR parsing (webhooks/address_policy.h). A parsed URL's parts may not hold what would end
// them, and an address that parses prints as one that parses to the same.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "base/url.h"
#include "webhooks/address_policy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (auto url = hr::parse_url(text); url.is_ok()) {
    if (url->scheme.find_first_of(":/") != std::string::npos) std::abort();
    (void)url->redacted();
  }
  (void)hr::percent_decode(text);
  if (auto ip = hr::webhooks::parse_ip(text); ip.is_ok()) {
    (void)hr::webhooks::forbidden_range(*ip);
  }
  (void)hr::webhooks::parse_cidr(text);
  (void)hr::webhooks::AddressPolicy::parse({std::string(text)});
  return 0;
}
