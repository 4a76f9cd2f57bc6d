// The webhook admin API, scoped to the caller's account:
//   POST/GET /v1/webhooks, GET/PATCH/DELETE /v1/webhooks/{id},
//   POST /v1/webhooks/{id}/rotate-secret, GET /v1/webhooks/{id}/deliveries,
//   GET /v1/webhooks/signing-secret, POST /v1/webhooks/signing-secret/rotate,
//   GET /v1/webhooks/deliveries (?batch_id=&status=), POST /v1/webhooks/deliveries/{id}/retry.
// Plus the edge check of a webhook target URL, shared with batch submission. Thread-safe.
#pragma once

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "http/server.h"
#include "queue/pg_pool.h"
#include "webhooks/address_policy.h"

namespace hr::api {

struct WebhookApiContext {
  // The handlers' connections (given back while a thread looks a host up).
  queue::PgPool* pool = nullptr;
  webhooks::AddressPolicy policy;                 // which targets may be registered
  int64_t default_grace_ms = 24LL * 3600 * 1000;  // old secret keeps signing this long
};

// Handles a /v1/webhooks route; nullopt when `path` is not one.
std::optional<http::HttpResponse> handle_webhooks(const http::HttpRequest& req,
                                                  const std::string& path,
                                                  const std::map<std::string, std::string>& query,
                                                  const std::string& account,
                                                  const WebhookApiContext& ctx);

// The webhook fields of a batch submit, all optional: webhook_url, webhook_events (an array, or
// a comma-separated string as OpenAI metadata values must be) and webhook_secret (whsec_...).
struct BatchWebhook {
  std::optional<std::string> url;
  std::optional<std::vector<std::string>> events;
  std::optional<std::string> secret;
};
// Reads them from `fields` (a JSON object; other keys are ignored). Errors name the field with
// `prefix` before it (e.g. "metadata.webhook_url").
[[nodiscard]] Result<BatchWebhook> parse_batch_webhook(const nlohmann::json& fields,
                                                       const webhooks::AddressPolicy& policy,
                                                       const std::string& prefix = "");

// A webhook target must be an http(s) URL without credentials, at most 2048 characters, whose
// host resolves only to addresses the policy allows. Errors name `field`.
[[nodiscard]] Status check_webhook_url(const std::string& url,
                                       const webhooks::AddressPolicy& policy,
                                       const std::string& field);

}  // namespace hr::api
