// The API's configuration.
#include "api/api_config.h"

#include "api/errors.h"
#include "api/internal/api_impl.h"
#include "base/cli.h"

namespace hr::api {

namespace beast_http = boost::beast::http;

void ApiConfig::bind(CLI::App& app) {
  cli::add(app, "--host", host, "Address to listen on");
  cli::add(app, "--port", port, "HTTP port to listen on (0: any free port)");
  cli::add(app, "--io-threads", io_threads, "Threads running HTTP I/O");
  cli::add(app, "--handler-threads", handler_threads,
           "Threads running request handlers (a sync call holds one while it is generated)");
  cli::add(app, "--db-connections", db_connections,
           "Most Postgres connections the handlers share (each borrowed only while querying)");
  cli::add(app, "--db-wait-ms", db_wait_ms,
           "How long a request waits for a free Postgres connection before 429");
  cli::add(app, "--key-lookups-per-s", key_lookups_per_s,
           "Most lookups a second of API keys not seen lately (more: 429; cached keys unaffected)");
  cli::add(app, "--key-lookups-per-client-per-s", key_lookups_per_client_per_s,
           "Bad keys a second one client address may send (more: 429 unlooked); good keys free");
  cli::add(app, "--max-large-answers-per-account", max_large_answers_per_account,
           "Large results (sent a page at a time) one account may download at once; more: 429");
  cli::add(app, "--body-limit-bytes", body_limit_bytes, "Largest accepted request body");
  cli::add(app, "--max-batch-requests", max_batch_requests, "Most requests in one batch");
  cli::add(app, "--max-file-bytes", max_file_bytes,
           "Largest OpenAI batch input file (POST /v1/files)");
  cli::add(app, "--max-file-lines", max_file_lines, "Most lines in an OpenAI batch input file");
  cli::add(app, "--served-model", models, "A served model as NAME:CONTEXT_LENGTH (repeatable)")
      ->delimiter(',');
  webhooks::bind_webhook_allow(app, webhook_allow);
  cli::add(app, "--sync-queue-timeout-ms", sync_queue_timeout_ms,
           "How long a sync request waits for a worker with room before 429 (code 3040)");
  cli::add(app, "--flex-timeout-ms", flex_timeout_ms,
           "How long a service_tier flex call waits to start before 429 resource_unavailable "
           "(a call's own flex_timeout_s wins)");
  cli::add(app, "--sync-call-lease-ms", sync_call_lease_ms,
           "A sync call counted against its account's calls at once is forgotten this long "
           "after its API process died");
  cli::add(app, "--stats-interval-ms", stats_interval_ms,
           "How often the operator's view (GET /v1/operator/stats, the dashboard) samples the "
           "load; it keeps the last hour");
  cli::add(app, "--internal-token", internal_token,
           "Shared secret sent to workers with forwarded sync requests (must match theirs)");
  cli::add(app, "--retention-days", retention_days,
           "How long batches and files are kept unless the request or the account says (a "
           "fraction of a day is allowed)");
}

Status ApiConfig::validate() const {
  if (port < 0 || port > 65535) return invalid_argument("--port must be 0..65535", "port");
  if (io_threads < 1 || handler_threads < 1) {
    return invalid_argument("--io-threads and --handler-threads must be at least 1", "io-threads");
  }
  if (db_connections < 1 || db_connections > 10000) {
    return invalid_argument("--db-connections must be 1..10000", "db-connections");
  }
  if (db_wait_ms < 0 || db_wait_ms > 600000) {
    return invalid_argument("--db-wait-ms must be 0..600000", "db-wait-ms");
  }
  if (key_lookups_per_s < 1 || key_lookups_per_s > 1000000) {
    return invalid_argument("--key-lookups-per-s must be 1..1000000", "key-lookups-per-s");
  }
  if (key_lookups_per_client_per_s < 1 || key_lookups_per_client_per_s > 1000000) {
    return invalid_argument("--key-lookups-per-client-per-s must be 1..1000000",
                            "key-lookups-per-client-per-s");
  }
  if (max_large_answers_per_account < 1 || max_large_answers_per_account > 10000) {
    return invalid_argument("--max-large-answers-per-account must be 1..10000",
                            "max-large-answers-per-account");
  }
  if (sync_call_lease_ms < 100 || sync_call_lease_ms > 3600000) {
    return invalid_argument("--sync-call-lease-ms must be 100..3600000", "sync-call-lease-ms");
  }
  if (body_limit_bytes < 1024) {
    return invalid_argument("--body-limit-bytes must be at least 1024", "body-limit-bytes");
  }
  if (!(retention_days * 86400 >= 60) || retention_days > 3650) {
    return invalid_argument("--retention-days must be a minute to 3650 days", "retention-days");
  }
  if (max_batch_requests < 1) {
    return invalid_argument("--max-batch-requests must be at least 1", "max-batch-requests");
  }
  HR_RETURN_IF_ERROR(webhooks::AddressPolicy::parse(webhook_allow).status());
  if (max_file_bytes < 1 || max_file_bytes > (int64_t{1} << 40)) {
    return invalid_argument("--max-file-bytes must be 1 to 2^40", "max-file-bytes");
  }
  if (max_file_lines < 1) {
    return invalid_argument("--max-file-lines must be at least 1", "max-file-lines");
  }
  if (stats_interval_ms < 100 || stats_interval_ms > 600000) {
    return invalid_argument("--stats-interval-ms must be 100..600000", "stats-interval-ms");
  }
  if (flex_timeout_ms < 1 || flex_timeout_ms > 86400000) {
    return invalid_argument("--flex-timeout-ms must be 1..86400000", "flex-timeout-ms");
  }
  if (sync_queue_timeout_ms < 0 || sync_queue_timeout_ms > 600000) {
    return invalid_argument("--sync-queue-timeout-ms must be 0..600000", "sync-queue-timeout-ms");
  }
  return model_specs().status();
}

Result<std::vector<ModelSpec>> ApiConfig::model_specs() const {
  std::vector<ModelSpec> out;
  for (const std::string& m : models) {
    size_t colon = m.rfind(':');
    if (colon == std::string::npos || colon == 0) {
      return invalid_argument("--served-model must look like NAME:CONTEXT_LENGTH, got " + m,
                              "served-model");
    }
    ModelSpec spec;
    spec.name = m.substr(0, colon);
    try {
      spec.context_length = std::stoi(m.substr(colon + 1));
    } catch (...) {
      spec.context_length = 0;
    }
    if (spec.context_length < 1) {
      return invalid_argument("--served-model context length must be a positive integer: " + m,
                              "served-model");
    }
    out.push_back(spec);
  }
  return out;
}

http::HttpServerOptions ApiConfig::server_options() const {
  http::HttpServerOptions o;
  o.host = host;
  o.port = static_cast<uint16_t>(port);
  o.io_threads = io_threads;
  o.handler_threads = handler_threads;
  o.body_limit_bytes = static_cast<size_t>(body_limit_bytes);
  // File uploads may be larger than other bodies: the file plus room for the form around it.
  o.upload_limit_bytes = static_cast<size_t>(max_file_bytes) + (1 << 20);
  o.is_upload = [](beast_http::verb method, std::string_view target) {
    return method == beast_http::verb::post && target.substr(0, target.find('?')) == "/v1/files";
  };
  o.error_body_for = [](std::string_view target, const Status& st) {
    return is_openai_path(target.substr(0, target.find('?'))) ? openai_error_body(st).dump()
                                                              : error_body(st).dump();
  };
  return o;
}

}  // namespace hr::api
