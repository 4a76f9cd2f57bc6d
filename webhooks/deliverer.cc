// Claim → sign → send → record, with a pool of sending threads.
#include "webhooks/deliverer.h"

#include <pqxx/pqxx>

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "base/cli.h"
#include "base/clock.h"
#include "base/duration.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/retry_pacer.h"
#include "queue/pg.h"
#include "webhooks/signature.h"

namespace hr::webhooks {

namespace {

constexpr int kFanOutBatch = 500;
constexpr int64_t kClaimMarginMs = 5000;  // a claim lapses this long after the attempt's timeout

// Fans out every pending outbox event, a bounded transaction at a time.
Status fan_out_all(pqxx::connection& c) {
  for (;;) {
    HR_ASSIGN_OR_RETURN(int n, queue::fan_out_events(c, kFanOutBatch));
    if (n < kFanOutBatch) return Status::ok();
  }
}

}  // namespace

void DeliveryOptions::bind(CLI::App& app, bool with_allow) {
  cli::add_flag(app, "--no-webhooks", disabled, "Do not deliver webhooks from this process");
  cli::add(app, "--webhook-concurrency", concurrency, "Webhook deliveries in flight at once");
  cli::add(app, "--webhook-timeout-ms", timeout_ms, "Time limit of one delivery attempt");
  cli::add(app, "--webhook-retry-schedule", retry_schedule,
           "Delays before each retry, comma-separated (e.g. 5s,5m,30m); then the delivery fails");
  cli::add(app, "--webhook-ca-file", ca_file,
           "Extra trusted CA certificates (PEM) for HTTPS targets");
  cli::add(app, "--webhook-retention-hours", retention_hours,
           "Keep sent events and ended deliveries (the delivery log) this long");
  if (with_allow) bind_webhook_allow(app, allow);
}

Status DeliveryOptions::validate() const {
  if (concurrency < 1 || concurrency > 1024) {
    return invalid_argument("--webhook-concurrency must be 1..1024", "webhook-concurrency");
  }
  if (timeout_ms < 100)
    return invalid_argument("--webhook-timeout-ms must be at least 100", "webhook-timeout-ms");
  if (retention_hours < 0) {
    return invalid_argument("--webhook-retention-hours must be >= 0", "webhook-retention-hours");
  }
  HR_RETURN_IF_ERROR(schedule_ms().status());
  return AddressPolicy::parse(allow).status();
}

Result<std::vector<int64_t>> DeliveryOptions::schedule_ms() const {
  std::vector<int64_t> out;
  size_t start = 0;
  while (start <= retry_schedule.size() && !retry_schedule.empty()) {
    size_t comma = retry_schedule.find(',', start);
    std::string item = retry_schedule.substr(
        start, comma == std::string::npos ? std::string::npos : comma - start);
    HR_ASSIGN_OR_RETURN(int64_t ms, parse_duration_ms(item, "webhook-retry-schedule"));
    out.push_back(ms);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return out;
}

queue::AttemptOutcome decide_outcome(const queue::ClaimedDelivery& d, const PostResult& r,
                                     const std::vector<int64_t>& schedule_ms, double jitter) {
  queue::AttemptOutcome o;
  o.delivery_id = d.id;
  o.attempt = d.attempt;
  o.duration_ms = r.duration_ms;
  if (r.status != 0) o.status_code = r.status;
  o.error = r.error;
  if (!d.endpoint_enabled) {
    o.outcome = "failed";
    o.error = "the endpoint is disabled";
    return o;
  }
  if (r.refused) {
    o.outcome = "failed";
    o.error = "refused: " + r.error;
    return o;
  }
  if (r.status >= 200 && r.status < 300) {
    o.outcome = "delivered";
    return o;
  }
  if (r.status == 410) {
    o.outcome = "failed";
    o.error = "the endpoint answered 410 Gone";
    if (d.endpoint_id) o.disable_endpoint = d.endpoint_id;
    return o;
  }
  if (o.error.empty()) o.error = "HTTP " + std::to_string(r.status);
  size_t retries_done = static_cast<size_t>(d.attempt - 1);
  if (d.manual || retries_done >= schedule_ms.size()) {
    o.outcome = "failed";
    return o;
  }
  o.outcome = "retry";
  o.retry_in_ms = static_cast<int64_t>(static_cast<double>(schedule_ms[retries_done]) * jitter);
  bool honours_retry_after =
      r.status == 429 || r.status == 502 || r.status == 503 || r.status == 504;
  if (honours_retry_after && r.retry_after_ms) {
    o.retry_in_ms = std::min<int64_t>(*r.retry_after_ms, 24LL * 3600 * 1000);
  }
  return o;
}

struct Deliverer::Impl {
  std::string database_url;
  DeliveryOptions options;
  std::vector<int64_t> schedule;
  AddressPolicy policy;
  queue::PgSession pg;

  std::mutex mu;
  std::condition_variable work_cv;
  std::condition_variable done_cv;
  std::deque<queue::ClaimedDelivery> work;     // guarded by mu
  std::vector<queue::AttemptOutcome> results;  // guarded by mu
  int inflight = 0;                            // claimed and not yet recorded; guarded by mu
  bool stopping = false;                       // guarded by mu

  Impl(std::string url, DeliveryOptions o, std::vector<int64_t> s, AddressPolicy p)
      : database_url(url),
        options(std::move(o)),
        schedule(std::move(s)),
        policy(std::move(p)),
        pg(std::move(url)) {}

  ClientOptions client_options() const {
    ClientOptions c;
    c.timeout_ms = options.timeout_ms;
    c.ca_file = options.ca_file;
    c.policy = policy;
    return c;
  }
  int64_t lease_ms() const { return options.timeout_ms + kClaimMarginMs; }
};

Result<std::unique_ptr<Deliverer>> Deliverer::create(const std::string& database_url,
                                                     DeliveryOptions options) {
  HR_RETURN_IF_ERROR(options.validate());
  HR_ASSIGN_OR_RETURN(std::vector<int64_t> schedule, options.schedule_ms());
  HR_ASSIGN_OR_RETURN(AddressPolicy policy, AddressPolicy::parse(options.allow));
  policy.refuse_services(options.refused_services);
  HR_RETURN_IF_ERROR(queue::pg_connect(database_url).status());
  return std::unique_ptr<Deliverer>(
      new Deliverer(database_url, std::move(options), std::move(schedule), std::move(policy)));
}

Deliverer::Deliverer(std::string database_url, DeliveryOptions options,
                     std::vector<int64_t> schedule, AddressPolicy policy)
    : impl_(std::make_unique<Impl>(std::move(database_url), std::move(options), std::move(schedule),
                                   std::move(policy))) {}

Deliverer::~Deliverer() = default;

queue::AttemptOutcome Deliverer::send(Client& client, const queue::ClaimedDelivery& d) {
  thread_local std::mt19937_64 rng(std::random_device{}());
  double jitter = std::uniform_real_distribution<double>(0.8, 1.2)(rng);
  int64_t started_ms = SystemClock::instance().now_unix_ms();
  PostResult r;
  if (!d.endpoint_enabled) {
    // Nothing is sent to a disabled endpoint.
  } else if (d.secrets.empty()) {
    r.error = "no signing secret";
  } else {
    int64_t ts = started_ms / 1000;
    std::map<std::string, std::string> headers = {
        {"webhook-id", d.event_id},
        {"webhook-timestamp", std::to_string(ts)},
        {"webhook-signature", sign_webhook(d.secrets, d.event_id, ts, d.payload)}};
    r = client.post(d.url, headers, d.payload);
  }
  queue::AttemptOutcome o = decide_outcome(d, r, impl_->schedule, jitter);
  o.started_at_ms = started_ms;
  metrics::counter("headroom_webhook_attempts_total", "Webhook delivery attempts by outcome",
                   "outcome=\"" + o.outcome + "\"")
      .add();
  metrics::histogram("headroom_webhook_attempt_seconds", "Duration of a webhook delivery attempt")
      .observe(r.duration_ms / 1e3);
  if (o.outcome == "delivered") {
    log::debug(
        "webhook.delivered",
        {{"delivery", d.id}, {"attempt", d.attempt}, {"status", r.status}, {"ms", r.duration_ms}});
  } else {
    log::info("webhook.attempt_failed", {{"delivery", d.id},
                                         {"attempt", d.attempt},
                                         {"outcome", o.outcome},
                                         {"error", o.error},
                                         {"cause", r.detail.empty() ? o.error : r.detail},
                                         {"retry_in_ms", o.retry_in_ms}});
  }
  return o;
}

Result<int> Deliverer::run_once() {
  Impl& m = *impl_;
  std::vector<queue::ClaimedDelivery> claims;
  Status st = m.pg.run("webhooks", [&](pqxx::connection& c) -> Status {
    HR_RETURN_IF_ERROR(fan_out_all(c));
    HR_ASSIGN_OR_RETURN(claims, queue::claim_deliveries(c, m.options.claim_batch, m.lease_ms()));
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  Client client(m.client_options());
  std::vector<queue::AttemptOutcome> outcomes;
  for (const auto& d : claims) outcomes.push_back(send(client, d));
  st = m.pg.run("webhooks", [&](pqxx::connection& c) -> Status {
    return queue::record_attempts(c, outcomes).status();
  });
  if (!st.is_ok()) return st;
  return static_cast<int>(claims.size());
}

void Deliverer::run(const std::atomic<bool>& stop) {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.stopping = false;
  }
  std::vector<std::thread> senders;
  for (int i = 0; i < m.options.concurrency; ++i) {
    senders.emplace_back([this, &m] {
      Client client(m.client_options());
      for (;;) {
        queue::ClaimedDelivery d;
        {
          std::unique_lock<std::mutex> lock(m.mu);
          m.work_cv.wait(lock, [&] { return m.stopping || !m.work.empty(); });
          if (m.stopping) return;
          d = std::move(m.work.front());
          m.work.pop_front();
        }
        queue::AttemptOutcome o = send(client, d);
        std::lock_guard<std::mutex> lock(m.mu);
        m.results.push_back(std::move(o));
        m.done_cv.notify_one();
      }
    });
  }
  std::unique_ptr<pqxx::connection> listener;
  // Records what the senders finished; on failure they are kept for the next pass.
  auto record = [&](pqxx::connection& c) -> Status {
    std::vector<queue::AttemptOutcome> batch;
    {
      std::lock_guard<std::mutex> lock(m.mu);
      batch.swap(m.results);
    }
    if (batch.empty()) return Status::ok();
    Result<int> r = queue::record_attempts(c, batch);
    std::lock_guard<std::mutex> lock(m.mu);
    if (!r.is_ok()) {
      m.results.insert(m.results.end(), batch.begin(), batch.end());
      return r.status();
    }
    m.inflight -= static_cast<int>(batch.size());
    return Status::ok();
  };
  int64_t next_prune_ns = 0;
  RetryPacer pacer;  // while Postgres fails: backoff, and a few counted warnings
  while (!stop.load()) {
    Status st = m.pg.run("webhooks", [&](pqxx::connection& c) -> Status {
      HR_RETURN_IF_ERROR(fan_out_all(c));
      if (steady_now_ns() >= next_prune_ns) {
        HR_ASSIGN_OR_RETURN(int pruned,
                            queue::prune_webhook_history(c, m.options.retention_hours, 10000));
        // Again soon while there is a backlog to delete, else in a minute.
        next_prune_ns = steady_now_ns() + (pruned >= 10000 ? 1 : 60) * 1000000000LL;
      }
      HR_RETURN_IF_ERROR(record(c));
      int room = 0;
      {
        std::lock_guard<std::mutex> lock(m.mu);
        room = std::min(m.options.claim_batch, 2 * m.options.concurrency - m.inflight);
      }
      if (room <= 0) return Status::ok();
      HR_ASSIGN_OR_RETURN(auto claims, queue::claim_deliveries(c, room, m.lease_ms()));
      if (claims.empty()) return Status::ok();
      std::lock_guard<std::mutex> lock(m.mu);
      m.inflight += static_cast<int>(claims.size());
      for (auto& d : claims) m.work.push_back(std::move(d));
      m.work_cv.notify_all();
      return Status::ok();
    });
    if (!st.is_ok()) {
      const int64_t delay = pacer.failed("webhook.pass_failed", st);
      listener.reset();
      sleep_unless_stopped(stop, delay);
      continue;
    }
    pacer.succeeded();
    try {
      if (!listener) {
        listener = std::make_unique<pqxx::connection>(m.database_url);
        pqxx::nontransaction(*listener).exec("LISTEN hr_webhook");
      }
      int inflight = 0;
      {
        std::unique_lock<std::mutex> lock(m.mu);
        inflight = m.inflight;
        if (inflight > 0 && m.results.empty()) {
          m.done_cv.wait_for(lock, std::chrono::milliseconds(20));
        }
      }
      if (inflight > 0) {
        listener->get_notifs();
      } else {
        listener->await_notification(0, 250000);
      }
    } catch (const std::exception& e) {
      listener.reset();
      std::this_thread::sleep_for(std::chrono::milliseconds(250));
    }
  }
  // Shutting down: unsent claims go back at once; sends under way finish and are recorded.
  std::vector<queue::ClaimedDelivery> unsent;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.stopping = true;
    unsent.assign(m.work.begin(), m.work.end());
    m.work.clear();
    m.inflight -= static_cast<int>(unsent.size());
    m.work_cv.notify_all();
  }
  for (auto& t : senders) t.join();
  Status st = m.pg.run("webhooks", [&](pqxx::connection& c) -> Status {
    HR_RETURN_IF_ERROR(queue::release_claims(c, unsent));
    return record(c);
  });
  if (!st.is_ok()) log::warn("webhook.shutdown_record_failed", {{"error", st}});
}

}  // namespace hr::webhooks
