// Reading a retry.
#include "api/retry_request.h"

#include <nlohmann/json.hpp>

#include "api/idempotency_key.h"
#include "api/webhooks_api.h"
#include "wire/json_text.h"

namespace hr::api {

Result<queue::RetryRequest> parse_retry(const http::HttpRequest& req, const std::string& account,
                                        const std::string& batch_id,
                                        const webhooks::AddressPolicy& policy) {
  queue::RetryRequest retry;
  retry.account_id = account;
  retry.batch_id = batch_id;
  HR_ASSIGN_OR_RETURN(retry.idempotency_key, idempotency_key(req));
  const std::string& body = req.body();
  if (body.find_first_not_of(" \t\r\n") == std::string::npos) return retry;
  std::string why;
  nlohmann::json fields = wire::parse_client_json(body, &why);
  if (fields.is_discarded()) return invalid_argument("body " + why, "body");
  if (!fields.is_object()) return invalid_argument("body must be a JSON object", "body");
  for (const auto& [key, value] : fields.items()) {
    if (key != "webhook_url" && key != "webhook_events" && key != "webhook_secret") {
      return invalid_argument("unknown field '" + key + "': a retry takes only webhook fields",
                              key);
    }
  }
  if (fields.empty()) return retry;
  HR_ASSIGN_OR_RETURN(BatchWebhook hook, parse_batch_webhook(fields, policy));
  retry.webhook_given = true;
  retry.webhook_url = hook.url;
  retry.webhook_events = hook.events;
  retry.webhook_secret = hook.secret;
  return retry;
}

}  // namespace hr::api
