// The Standard Webhooks signature.
#include "webhooks/signature.h"

#include <optional>

#include "base/hash.h"

namespace hr::webhooks {

std::string sign_webhook(const std::vector<std::string>& secrets, const std::string& msg_id,
                         int64_t timestamp_s, const std::string& body) {
  std::string content = msg_id + "." + std::to_string(timestamp_s) + "." + body;
  std::string out;
  for (const std::string& s : secrets) {
    if (s.rfind("whsec_", 0) != 0) continue;
    std::optional<std::string> key = base64_decode(s.substr(6));
    if (!key) continue;
    if (!out.empty()) out += ' ';
    out += "v1," + base64_encode(hmac_sha256(*key, content));
  }
  return out;
}

}  // namespace hr::webhooks
