// The API's configuration: where it listens, its limits, the models it serves and how long sync
// calls wait for room. Bound to the command line of `api` and `serve`, validated once.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "api/batch_request.h"
#include "base/status.h"
#include "http/server.h"
#include "webhooks/address_policy.h"

namespace hr::api {

struct ApiConfig {
  std::string host = "127.0.0.1";
  int port = 8080;
  int io_threads = 2;
  // A sync call (streamed or not) holds one while it is generated. Threads borrow database
  // connections from a pool of db_connections only while they query, so these may be many more.
  int handler_threads = 512;
  int db_connections = 16;
  int db_wait_ms = 5000;  // a request waits this long for a free connection, then gets 429
  // Keys in neither of the key caches are looked up in Postgres at most this fast (a burst of
  // twice as many first); past it such requests get 429 with Retry-After.
  int key_lookups_per_s = 200;
  // And keys that turn out bad: at most this many a second from one client address (twice
  // that in a burst) before its unknown keys get 429 without a lookup, so that one client
  // guessing keys cannot spend the whole budget above; good keys never count.
  int key_lookups_per_client_per_s = 10;
  // Answers sent a page at a time (polls of large batches, results so far of large OpenAI
  // batches) that one account may have in flight at once; past it, 429 (api/response_slots.h).
  int max_large_answers_per_account = 8;
  int64_t body_limit_bytes = 10 << 20;
  int max_batch_requests = 100000;
  // OpenAI Batch API input files (POST /v1/files may carry up to this much, plus the form).
  int64_t max_file_bytes = 200 << 20;
  int max_file_lines = 100000;
  // Served models as NAME:CONTEXT_LENGTH; a batch for one of these is accepted even while no
  // worker for it is up.
  std::vector<std::string> models = {"@hr/tiny-reverse:128"};
  // Non-public webhook targets accepted anyway (CIDRs, "loopback", "private").
  std::vector<std::string> webhook_allow;
  // The product's own services ("host:port": Postgres, Redis, workers), refused as webhook
  // targets whatever webhook_allow says; the API's own host:port is added to them.
  std::vector<std::string> refused_webhook_services;
  // How webhook hosts are looked up when a batch names one (null: the system resolver).
  webhooks::HostLookup webhook_lookup;
  // A sync request waits this long for a worker with room (unless options.rejectIfBusy), then
  // gets 429 with code 3040.
  int sync_queue_timeout_ms = 2000;
  // A service_tier "flex" call waits this long (unless it sets its own flex_timeout_s) for its
  // generation to start, then gets 429 resource_unavailable.
  int flex_timeout_ms = 600000;
  // A sync call counted among its account's calls at once keeps its place while its API process
  // lives; that of a process that died lapses after this long (api/sync_limits.h).
  int64_t sync_call_lease_ms = 60000;
  // Sent to workers with each forwarded sync request (`api` only; workers check it when set).
  std::string internal_token;
  // How long batches (from their creation) and files are kept when neither the request
  // (output_expires_after, expires_after) nor the account says (docs/retention.md).
  double retention_days = 30;
  // The operator's view samples the deployment's load this often (api/operator_stats.h).
  int stats_interval_ms = 5000;
  int64_t retain_seconds() const { return static_cast<int64_t>(retention_days * 86400); }

  void bind(CLI::App& app);
  [[nodiscard]] Status validate() const;
  [[nodiscard]] Result<std::vector<ModelSpec>> model_specs() const;
  http::HttpServerOptions server_options() const;
};

}  // namespace hr::api
