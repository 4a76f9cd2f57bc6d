// The Standard Webhooks signature of a delivery (https://www.standardwebhooks.com): an HMAC-SHA256
// over "id.timestamp.body" with each of the endpoint's secrets. Pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace hr::webhooks {

// The webhook-signature header value: "v1,<base64 HMAC-SHA256(key, id.timestamp.body)>" for each
// secret (whsec_<base64 key>), space-separated. Secrets that do not decode are skipped.
std::string sign_webhook(const std::vector<std::string>& secrets, const std::string& msg_id,
                         int64_t timestamp_s, const std::string& body);

}  // namespace hr::webhooks
