// Routes of the webhook admin API.
#include "api/webhooks_api.h"

#include <nlohmann/json.hpp>

#include "api/errors.h"
#include "api/query_params.h"
#include "base/cli.h"
#include "base/ids.h"
#include "base/url.h"
#include "queue/webhooks.h"
#include "wire/json_text.h"

namespace hr::api {

namespace beast_http = boost::beast::http;
using nlohmann::json;

namespace {

json opt_seconds(const std::optional<int64_t>& ms) { return ms ? json(*ms / 1000) : json(nullptr); }

json endpoint_json(const queue::WebhookEndpoint& e) {
  json j = {{"id", e.id},
            {"object", "webhook_endpoint"},
            {"url", e.url},
            {"description", e.description},
            {"event_types", e.event_types},
            {"enabled", e.enabled},
            {"disabled_reason", e.disabled_reason ? json(*e.disabled_reason) : json(nullptr)},
            {"created_at", e.created_at_ms / 1000},
            {"updated_at", e.updated_at_ms / 1000},
            {"previous_secret_expires_at", opt_seconds(e.previous_secret_expires_at_ms)}};
  if (e.secret) j["secret"] = *e.secret;
  return j;
}

json secret_json(const queue::SigningSecret& s) {
  return {{"object", "webhook_signing_secret"},
          {"secret", s.secret},
          {"created_at", s.created_at_ms / 1000},
          {"rotated_at", opt_seconds(s.rotated_at_ms)},
          {"previous_secret_expires_at", opt_seconds(s.previous_secret_expires_at_ms)}};
}

json delivery_json(const queue::DeliveryInfo& d) {
  json log = json::array();
  for (const auto& a : d.attempt_log) {
    log.push_back({{"attempt", a.attempt},
                   {"started_at_ms", a.started_at_ms},
                   {"duration_ms", a.duration_ms},
                   {"status_code", a.status_code ? json(*a.status_code) : json(nullptr)},
                   {"error", a.error ? json(*a.error) : json(nullptr)},
                   {"outcome", a.outcome}});
  }
  return {{"id", d.id},
          {"object", "webhook_delivery"},
          {"event_id", d.event_id},
          {"event_type", d.event_type},
          {"batch_id", d.batch_id ? json(*d.batch_id) : json(nullptr)},
          {"endpoint_id", d.endpoint_id ? json(*d.endpoint_id) : json(nullptr)},
          {"url", d.url},
          {"status", d.status},
          {"attempts", d.attempts},
          {"last_status_code", d.last_status_code ? json(*d.last_status_code) : json(nullptr)},
          {"last_error", d.last_error ? json(*d.last_error) : json(nullptr)},
          {"next_attempt_at", opt_seconds(d.next_attempt_at_ms)},
          {"last_attempt_at", opt_seconds(d.last_attempt_at_ms)},
          {"delivered_at", opt_seconds(d.delivered_at_ms)},
          {"created_at", d.created_at_ms / 1000},
          {"attempt_log", log}};
}

Result<json> body_object(const http::HttpRequest& req, bool allow_empty) {
  if (req.body().empty() && allow_empty) return json::object();
  std::string why;
  json body = wire::parse_client_json(req.body(), &why);
  if (body.is_discarded()) return invalid_argument("body " + why, "body");
  if (!body.is_object()) return invalid_argument("body must be a JSON object", "body");
  return body;
}

Status check_fields(const json& body, std::initializer_list<const char*> allowed) {
  for (const auto& [key, value] : body.items()) {
    bool ok = false;
    for (const char* a : allowed) ok = ok || key == a;
    if (!ok) return invalid_argument("unknown field '" + key + "'", key);
  }
  return Status::ok();
}

Result<std::vector<std::string>> event_types_of(const json& v, const std::string& field) {
  if (!v.is_array()) return invalid_argument(field + " must be an array of event types", field);
  std::vector<std::string> out;
  for (const auto& e : v) {
    if (!e.is_string()) return invalid_argument(field + " must be an array of strings", field);
    out.push_back(e.get<std::string>());
  }
  HR_RETURN_IF_ERROR(queue::check_event_types(out, field));
  return out;
}

Result<std::string> string_field(const json& body, const char* name, size_t max_len) {
  if (!body[name].is_string())
    return invalid_argument(std::string(name) + " must be a string", name);
  std::string s = body[name].get<std::string>();
  if (s.size() > max_len) {
    return invalid_argument(
        std::string(name) + " must be at most " + std::to_string(max_len) + " characters", name);
  }
  return s;
}

Result<int64_t> grace_of(const json& body, int64_t fallback) {
  if (!body.contains("grace_period_s")) return fallback;
  const json& g = body["grace_period_s"];
  if (!g.is_number_integer() || g.get<int64_t>() < 0 || g.get<int64_t>() > 7 * 86400) {
    return invalid_argument("grace_period_s must be an integer from 0 to 604800", "grace_period_s");
  }
  return g.get<int64_t>() * 1000;
}

Result<queue::DeliveryQuery> delivery_query(const std::map<std::string, std::string>& query) {
  queue::DeliveryQuery q;
  Result<int> limit = int_param(query, "limit", 1, 100, q.limit);
  if (!limit.is_ok()) return limit.status();
  q.limit = *limit;
  for (const char* key : {"after", "batch_id"}) {
    auto it = query.find(key);
    if (it == query.end() || it->second.empty()) continue;
    if (!parse_uuid(it->second).is_ok())
      return invalid_argument(std::string(key) + " is not an id", key);
    (std::string(key) == "after" ? q.after : q.batch_id) = it->second;
  }
  if (auto it = query.find("status"); it != query.end() && !it->second.empty()) {
    if (it->second != "pending" && it->second != "delivered" && it->second != "failed") {
      return invalid_argument("status must be pending, delivered or failed", "status");
    }
    q.status = it->second;
  }
  return q;
}

json delivery_list(const std::vector<queue::DeliveryInfo>& rows, int limit) {
  json data = json::array();
  for (int i = 0; i < std::min<int>(limit, static_cast<int>(rows.size())); ++i) {
    data.push_back(delivery_json(rows[static_cast<size_t>(i)]));
  }
  json out = {
      {"object", "list"}, {"data", data}, {"has_more", static_cast<int>(rows.size()) > limit}};
  if (!data.empty()) out["last_id"] = data.back()["id"];
  return out;
}

class Routes {
 public:
  Routes(const http::HttpRequest& req, const std::string& account, const WebhookApiContext& ctx)
      : req_(req), account_(account), ctx_(ctx) {}

  http::HttpResponse database_error(const Status& st) {
    return error_response(ctx_.pool->client_status(st));
  }

  // Runs fn(connection) → Result<json> and answers with it (or the error).
  template <typename Fn>
  http::HttpResponse with_conn(Fn&& fn, unsigned ok_status = 200) {
    Result<pqxx::connection*> c = ctx_.pool->connection();
    if (!c.is_ok()) return database_error(c.status());
    Result<json> r = fn(**c);
    if (!r.is_ok()) {
      StatusCode code = r.status().code();
      if (code == StatusCode::kUnavailable || code == StatusCode::kInternal) {
        return database_error(r.status());
      }
      return error_response(r.status());
    }
    return ok_response(std::move(r).value(), ok_status);
  }

  http::HttpResponse create() {
    Result<json> body = body_object(req_, false);
    if (!body.is_ok()) return error_response(body.status());
    Status st = check_fields(*body, {"url", "description", "event_types", "enabled"});
    if (!st.is_ok()) return error_response(st);
    if (!body->contains("url")) return error_response(invalid_argument("url is required", "url"));
    Result<std::string> url = string_field(*body, "url", 2048);
    if (!url.is_ok()) return error_response(url.status());
    ctx_.pool->release();  // the host's lookup may take seconds
    st = check_webhook_url(*url, ctx_.policy, "url");
    if (!st.is_ok()) return error_response(st);
    std::string description;
    if (body->contains("description")) {
      Result<std::string> d = string_field(*body, "description", 512);
      if (!d.is_ok()) return error_response(d.status());
      description = *d;
    }
    std::vector<std::string> types = queue::default_webhook_events();
    if (body->contains("event_types")) {
      Result<std::vector<std::string>> t = event_types_of((*body)["event_types"], "event_types");
      if (!t.is_ok()) return error_response(t.status());
      types = *t;
    }
    bool enabled = true;
    if (body->contains("enabled")) {
      if (!(*body)["enabled"].is_boolean()) {
        return error_response(invalid_argument("enabled must be true or false", "enabled"));
      }
      enabled = (*body)["enabled"].get<bool>();
    }
    return with_conn(
        [&](pqxx::connection& c) -> Result<json> {
          HR_ASSIGN_OR_RETURN(
              auto e, queue::create_endpoint(c, account_, *url, description, types, enabled));
          return endpoint_json(e);
        },
        201);
  }

  http::HttpResponse update(const std::string& id) {
    Result<json> body = body_object(req_, false);
    if (!body.is_ok()) return error_response(body.status());
    Status st = check_fields(*body, {"url", "description", "event_types", "enabled"});
    if (!st.is_ok()) return error_response(st);
    queue::EndpointPatch patch;
    if (body->contains("url")) {
      Result<std::string> url = string_field(*body, "url", 2048);
      if (!url.is_ok()) return error_response(url.status());
      ctx_.pool->release();  // the host's lookup may take seconds
      st = check_webhook_url(*url, ctx_.policy, "url");
      if (!st.is_ok()) return error_response(st);
      patch.url = *url;
    }
    if (body->contains("description")) {
      Result<std::string> d = string_field(*body, "description", 512);
      if (!d.is_ok()) return error_response(d.status());
      patch.description = *d;
    }
    if (body->contains("event_types")) {
      Result<std::vector<std::string>> t = event_types_of((*body)["event_types"], "event_types");
      if (!t.is_ok()) return error_response(t.status());
      patch.event_types = *t;
    }
    if (body->contains("enabled")) {
      if (!(*body)["enabled"].is_boolean()) {
        return error_response(invalid_argument("enabled must be true or false", "enabled"));
      }
      patch.enabled = (*body)["enabled"].get<bool>();
    }
    return with_conn([&](pqxx::connection& c) -> Result<json> {
      HR_ASSIGN_OR_RETURN(auto e, queue::update_endpoint(c, account_, id, patch));
      return endpoint_json(e);
    });
  }

  http::HttpResponse rotate(const std::string& id) {
    Result<json> body = body_object(req_, true);
    if (!body.is_ok()) return error_response(body.status());
    Status st = check_fields(*body, {"grace_period_s"});
    Result<int64_t> grace =
        st.is_ok() ? grace_of(*body, ctx_.default_grace_ms) : Result<int64_t>(st);
    if (!grace.is_ok()) return error_response(grace.status());
    return with_conn([&](pqxx::connection& c) -> Result<json> {
      if (id.empty()) {
        HR_ASSIGN_OR_RETURN(auto s, queue::rotate_signing_secret(c, account_, *grace));
        return secret_json(s);
      }
      HR_ASSIGN_OR_RETURN(auto e, queue::rotate_endpoint_secret(c, account_, id, *grace));
      return endpoint_json(e);
    });
  }

  http::HttpResponse deliveries(const std::optional<std::string>& endpoint_id,
                                const std::map<std::string, std::string>& query) {
    Result<queue::DeliveryQuery> q = delivery_query(query);
    if (!q.is_ok()) return error_response(q.status());
    q->endpoint_id = endpoint_id;
    int want = q->limit;
    q->limit = want + 1;
    return with_conn([&](pqxx::connection& c) -> Result<json> {
      HR_ASSIGN_OR_RETURN(auto rows, queue::list_deliveries(c, account_, *q));
      return delivery_list(rows, want);
    });
  }

 private:
  const http::HttpRequest& req_;
  const std::string& account_;
  const WebhookApiContext& ctx_;
};

}  // namespace

Result<BatchWebhook> parse_batch_webhook(const json& fields, const webhooks::AddressPolicy& policy,
                                         const std::string& prefix) {
  BatchWebhook out;
  if (!fields.is_object()) return out;
  const std::string url_field = prefix + "webhook_url";
  const std::string events_field = prefix + "webhook_events";
  const std::string secret_field = prefix + "webhook_secret";
  if (fields.contains("webhook_url")) {
    const json& url = fields["webhook_url"];
    if (!url.is_string()) return invalid_argument(url_field + " must be a string", url_field);
    HR_RETURN_IF_ERROR(check_webhook_url(url, policy, url_field));
    out.url = url.get<std::string>();
  }
  if (fields.contains("webhook_events")) {
    const json& ev = fields["webhook_events"];
    std::vector<std::string> types;
    if (ev.is_string()) {
      std::string list = ev.get<std::string>();
      for (size_t start = 0; start <= list.size();) {
        size_t comma = list.find(',', start);
        std::string item =
            list.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
        item.erase(0, item.find_first_not_of(' '));
        item.erase(item.find_last_not_of(' ') + 1);
        types.push_back(item);
        if (comma == std::string::npos) break;
        start = comma + 1;
      }
    } else if (ev.is_array()) {
      for (const auto& e : ev) types.push_back(e.is_string() ? e.get<std::string>() : "");
    } else {
      return invalid_argument(events_field + " must be an array of event types", events_field);
    }
    HR_RETURN_IF_ERROR(queue::check_event_types(types, events_field));
    out.events = types;
  }
  if (fields.contains("webhook_secret")) {
    const json& secret = fields["webhook_secret"];
    if (!secret.is_string())
      return invalid_argument(secret_field + " must be a string", secret_field);
    HR_RETURN_IF_ERROR(queue::check_webhook_secret(secret, secret_field));
    out.secret = secret.get<std::string>();
  }
  if ((out.events || out.secret) && !out.url) {
    return invalid_argument(events_field + " and " + secret_field + " need a " + url_field,
                            url_field);
  }
  return out;
}

Status check_webhook_url(const std::string& url, const webhooks::AddressPolicy& policy,
                         const std::string& field) {
  if (url.size() > 2048) return invalid_argument(field + " must be at most 2048 characters", field);
  Result<Url> u = parse_url(url);
  if (!u.is_ok() || (u->scheme != "http" && u->scheme != "https") || u->host.empty()) {
    return invalid_argument(field + " must be an http:// or https:// URL", field);
  }
  if (!u->user.empty() || !u->password.empty()) {
    return invalid_argument(field + " must not carry credentials", field);
  }
  for (char c : url) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) {
      return invalid_argument(field + " must not contain spaces or control characters", field);
    }
  }
  const uint16_t port = u->port != 0 ? u->port : (u->scheme == "https" ? 443 : 80);
  Result<std::vector<webhooks::IpAddress>> addrs =
      resolve_checked(u->host, policy, field, std::chrono::seconds(5), port);
  if (!addrs.is_ok()) return invalid_argument(addrs.status().message(), field);
  return Status::ok();
}

std::optional<http::HttpResponse> handle_webhooks(const http::HttpRequest& req,
                                                  const std::string& path,
                                                  const std::map<std::string, std::string>& query,
                                                  const std::string& account,
                                                  const WebhookApiContext& ctx) {
  const std::string prefix = "/v1/webhooks";
  if (path.rfind(prefix, 0) != 0) return std::nullopt;
  std::string rest = path.substr(prefix.size());
  if (!rest.empty() && rest[0] != '/') return std::nullopt;
  if (!rest.empty()) rest = rest.substr(1);
  std::vector<std::string> parts;
  for (size_t start = 0; start < rest.size();) {
    size_t slash = rest.find('/', start);
    parts.push_back(
        rest.substr(start, slash == std::string::npos ? std::string::npos : slash - start));
    if (slash == std::string::npos) break;
    start = slash + 1;
  }
  beast_http::verb m = req.method();
  Routes r(req, account, ctx);
  auto bad_id = [](const std::string& id) {
    return error_response(not_found("no such webhook endpoint: " + id));
  };

  if (parts.empty()) {
    if (m == beast_http::verb::post) return r.create();
    if (m == beast_http::verb::get) {
      return r.with_conn([&](pqxx::connection& c) -> Result<json> {
        HR_ASSIGN_OR_RETURN(auto list, queue::list_endpoints(c, account));
        json data = json::array();
        for (const auto& e : list) data.push_back(endpoint_json(e));
        return json{{"object", "list"}, {"data", data}};
      });
    }
  } else if (parts[0] == "signing-secret") {
    if (parts.size() == 1 && m == beast_http::verb::get) {
      return r.with_conn([&](pqxx::connection& c) -> Result<json> {
        HR_ASSIGN_OR_RETURN(auto s, queue::get_signing_secret(c, account));
        return secret_json(s);
      });
    }
    if (parts.size() == 2 && parts[1] == "rotate" && m == beast_http::verb::post)
      return r.rotate("");
  } else if (parts[0] == "deliveries") {
    if (parts.size() == 1 && m == beast_http::verb::get) return r.deliveries(std::nullopt, query);
    if (parts.size() == 3 && parts[2] == "retry" && m == beast_http::verb::post) {
      if (!parse_uuid(parts[1]).is_ok()) {
        return error_response(not_found("no such delivery: " + parts[1]));
      }
      return r.with_conn([&](pqxx::connection& c) -> Result<json> {
        HR_ASSIGN_OR_RETURN(auto d, queue::retry_delivery(c, account, parts[1]));
        return delivery_json(d);
      });
    }
  } else {
    const std::string& id = parts[0];
    if (!parse_uuid(id).is_ok()) return bad_id(id);
    if (parts.size() == 1) {
      if (m == beast_http::verb::get) {
        return r.with_conn([&](pqxx::connection& c) -> Result<json> {
          HR_ASSIGN_OR_RETURN(auto e, queue::get_endpoint(c, account, id));
          return endpoint_json(e);
        });
      }
      if (m == beast_http::verb::patch) return r.update(id);
      if (m == beast_http::verb::delete_) {
        return r.with_conn([&](pqxx::connection& c) -> Result<json> {
          HR_RETURN_IF_ERROR(queue::delete_endpoint(c, account, id));
          return json{{"id", id}, {"object", "webhook_endpoint"}, {"deleted", true}};
        });
      }
    } else if (parts.size() == 2 && parts[1] == "rotate-secret" && m == beast_http::verb::post) {
      return r.rotate(id);
    } else if (parts.size() == 2 && parts[1] == "deliveries" && m == beast_http::verb::get) {
      return r.deliveries(id, query);
    }
  }
  return error_response(not_found("no route for " + std::string(req.method_string()) + " " + path));
}

}  // namespace hr::api
