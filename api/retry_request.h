// A retry as the client asked for it (POST /v1/async/{id}/retry, POST /v1/batches/{id}/retry):
// its Idempotency-Key and its body, empty or a JSON object with only webhook fields, which then
// replace the original batch's webhook (docs/retention.md).
#pragma once

#include <string>

#include "base/status.h"
#include "http/server.h"
#include "queue/lifecycle.h"
#include "webhooks/address_policy.h"

namespace hr::api {

// The retry of `batch_id` for `account`. A webhook host is looked up here (it may take seconds:
// hold no database connection meanwhile). Errors name the header or field at fault.
[[nodiscard]] Result<queue::RetryRequest> parse_retry(const http::HttpRequest& req,
                                                      const std::string& account,
                                                      const std::string& batch_id,
                                                      const webhooks::AddressPolicy& policy);

}  // namespace hr::api
