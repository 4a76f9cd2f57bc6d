// Webhook delivery benchmark driver (run by scripts/bench_webhooks.sh, next to a real `headroom
// dispatcher` process). Batches are completed through the store's real completion path
// (finish_batch_if_done writes the batch.completed event), and a local receiver records when each
// event first arrives. Phases:
//   steady  — 10,000 completions at a fixed rate to a healthy receiver: latency from completion
//             (the outbox row's time) to delivery, p50/p99;
//   burst   — 10,000 completions at once: delivered events per second;
//   flaky   — completions while the receiver refuses connections about half of the time in
//             random intervals: every event must still arrive.
// Prints one JSON object.
#include <pqxx/pqxx>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include <nlohmann/json.hpp>

#include "http/server.h"
#include "queue/store.h"
#include "queue/webhooks.h"

namespace {

using nlohmann::json;

int64_t now_ms() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

// Records the first successful receipt of every webhook-id; can go down (refuse connections).
class Receiver {
 public:
  explicit Receiver(uint16_t port) : port_(port) { up(); }
  ~Receiver() { down(); }

  void up() {
    std::lock_guard<std::mutex> lock(server_mu_);
    if (server_) return;
    hr::http::HttpServerOptions o;
    o.port = port_;
    o.io_threads = 1;
    o.handler_threads = 4;
    o.drain_timeout_s = 2;
    server_ = std::make_unique<hr::http::HttpServer>(
        o, hr::http::Handler([this](const hr::http::HttpRequest& req) {
          std::string id(req["webhook-id"]);
          int64_t at = now_ms();
          {
            std::lock_guard<std::mutex> lock(mu_);
            ++receipts_;
            first_.emplace(id, at);
          }
          return hr::http::json_response(200, "{}");
        }));
    if (!server_->start().is_ok()) {
      std::fprintf(stderr, "receiver: cannot listen on %d\n", port_);
      std::exit(1);
    }
    port_ = server_->port();
  }
  void down() {
    std::lock_guard<std::mutex> lock(server_mu_);
    if (!server_) return;
    server_->stop();
    server_.reset();
  }
  uint16_t port() const { return port_; }
  std::unordered_map<std::string, int64_t> first() {
    std::lock_guard<std::mutex> lock(mu_);
    return first_;
  }
  int64_t receipts() {
    std::lock_guard<std::mutex> lock(mu_);
    return receipts_;
  }

 private:
  uint16_t port_;
  std::mutex server_mu_;
  std::unique_ptr<hr::http::HttpServer> server_;
  std::mutex mu_;
  std::unordered_map<std::string, int64_t> first_;
  int64_t receipts_ = 0;
};

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

struct Bench {
  pqxx::connection conn;
  std::string account;
  std::string url;

  // Creates `n` one-request batches, running, with this phase's webhook; returns their ids.
  std::vector<std::string> create(int n, const std::string& path) {
    pqxx::work tx(conn);
    std::vector<std::string> ids;
    for (const auto& row : tx.exec_params(
             "WITH ids AS (SELECT gen_random_uuid() AS id FROM generate_series(1, $1)), "
             "b AS (INSERT INTO batches (id, account_id, model, api_shape, status, num_total, "
             "  num_dispatched, webhook_url, webhook_events, started_at) "
             "  SELECT id, $2, 'bench', 'workers_ai', 'running', 1, 1, $3, "
             "  '{batch.completed}', now() FROM ids RETURNING id) "
             "INSERT INTO requests (batch_id, idx, body, status) "
             "SELECT id, 0, '{}', 'running' FROM b RETURNING batch_id::text",
             n, account, url + path)) {
      ids.push_back(row[0].as<std::string>());
    }
    hr::queue::ensure_signing_secret(tx, account);
    tx.commit();
    return ids;
  }

  // Completes batches [from, to) in one transaction through the store's finishing path.
  void complete(const std::vector<std::string>& ids, size_t from, size_t to) {
    json list = json::array();
    for (size_t i = from; i < to; ++i) list.push_back(ids[i]);
    pqxx::work tx(conn);
    tx.exec_params(
        "UPDATE requests SET status = 'completed', result = '{\"response\":\"ok\"}', "
        "prompt_tokens = 5, completion_tokens = 2, finished_at = now() "
        "WHERE batch_id IN (SELECT jsonb_array_elements_text($1::jsonb)::uuid)",
        list.dump());
    tx.exec_params(
        "UPDATE batches SET num_completed = 1, prompt_tokens = 5, completion_tokens = 2 "
        "WHERE id IN (SELECT jsonb_array_elements_text($1::jsonb)::uuid)",
        list.dump());
    for (size_t i = from; i < to; ++i) hr::queue::finish_batch_if_done(tx, ids[i]);
    tx.commit();
  }

  // Completes all of `ids` at `per_second` (0: as fast as possible).
  void complete_at(const std::vector<std::string>& ids, int per_second) {
    size_t chunk = per_second > 0 ? std::max<size_t>(1, per_second / 100) : 500;
    auto start = std::chrono::steady_clock::now();
    for (size_t i = 0; i < ids.size(); i += chunk) {
      complete(ids, i, std::min(ids.size(), i + chunk));
      if (per_second > 0) {
        auto due = start + std::chrono::microseconds(static_cast<int64_t>(
                               1e6 * static_cast<double>(i + chunk) / per_second));
        std::this_thread::sleep_until(due);
      }
    }
  }

  // event id → completion time (ms) for the batches' events.
  std::unordered_map<std::string, int64_t> events(const std::vector<std::string>& ids) {
    json list = json::array();
    for (const auto& id : ids) list.push_back(id);
    pqxx::nontransaction tx(conn);
    std::unordered_map<std::string, int64_t> out;
    for (const auto& row : tx.exec_params(
             "SELECT event_id::text, (extract(epoch FROM created_at) * 1000)::bigint FROM outbox "
             "WHERE event_type = 'batch.completed' "
             "AND batch_id IN (SELECT jsonb_array_elements_text($1::jsonb)::uuid)",
             list.dump())) {
      out[row[0].as<std::string>()] = row[1].as<int64_t>();
    }
    return out;
  }

  int64_t failed_deliveries() {
    pqxx::nontransaction tx(conn);
    return tx.exec1("SELECT count(*) FROM webhook_deliveries WHERE status = 'failed'")[0]
        .as<int64_t>();
  }
};

// Waits until every event has arrived (or `timeout_s`); returns how many did.
size_t wait_delivered(Receiver& rx, const std::unordered_map<std::string, int64_t>& events,
                      int timeout_s) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(timeout_s);
  for (;;) {
    auto got = rx.first();
    size_t n = 0;
    for (const auto& [id, at] : events) n += got.count(id);
    if (n == events.size() || std::chrono::steady_clock::now() > deadline) return n;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

std::vector<double> latencies(Receiver& rx,
                              const std::unordered_map<std::string, int64_t>& events) {
  auto got = rx.first();
  std::vector<double> out;
  for (const auto& [id, done_ms] : events) {
    auto it = got.find(id);
    if (it != got.end()) out.push_back(static_cast<double>(it->second - done_ms));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string database_url;
  int port = 0;
  int events = 10000;
  int rate = 1000;
  int flaky_events = 2000;
  int flaky_rate = 200;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--database-url") database_url = v;
    if (k == "--port") port = std::stoi(v);
    if (k == "--events") events = std::stoi(v);
    if (k == "--rate") rate = std::stoi(v);
    if (k == "--flaky-events") flaky_events = std::stoi(v);
    if (k == "--flaky-rate") flaky_rate = std::stoi(v);
  }
  Receiver rx(static_cast<uint16_t>(port));
  Bench b{pqxx::connection(database_url), "", "http://127.0.0.1:" + std::to_string(rx.port())};
  b.account = hr::queue::create_api_key(b.conn, "webhook-bench").value().account_id;
  json out;
  out["events"] = events;

  // Steady: a fixed completion rate to a healthy receiver.
  {
    auto ids = b.create(events, "/steady");
    auto t0 = std::chrono::steady_clock::now();
    b.complete_at(ids, rate);
    auto ev = b.events(ids);
    size_t n = wait_delivered(rx, ev, 120);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    auto lat = latencies(rx, ev);
    out["steady_rate_per_s"] = rate;
    out["steady_delivered"] = n;
    out["delivery_p50_ms"] = percentile(lat, 0.50);
    out["delivery_p90_ms"] = percentile(lat, 0.90);
    out["delivery_p99_ms"] = percentile(lat, 0.99);
    out["delivery_max_ms"] = percentile(lat, 1.0);
    out["steady_seconds"] = secs;
    std::fprintf(stderr, "steady: %zu/%zu delivered, p50 %.0f ms, p99 %.0f ms\n", n, ev.size(),
                 percentile(lat, 0.5), percentile(lat, 0.99));
  }
  // Burst: everything completes at once; how fast does it drain?
  {
    auto ids = b.create(events, "/burst");
    int64_t t0 = now_ms();
    b.complete_at(ids, 0);
    int64_t completed = now_ms();
    auto ev = b.events(ids);
    size_t n = wait_delivered(rx, ev, 300);
    int64_t last = 0;
    auto got = rx.first();
    for (const auto& [id, at] : ev) {
      if (got.count(id)) last = std::max(last, got[id]);
    }
    double secs = static_cast<double>(last - t0) / 1000.0;
    out["burst_delivered"] = n;
    out["burst_complete_ms"] = completed - t0;
    out["burst_events_per_s"] = secs > 0 ? static_cast<double>(n) / secs : 0;
    std::fprintf(stderr, "burst: %zu delivered in %.2f s (%.0f/s)\n", n, secs,
                 secs > 0 ? static_cast<double>(n) / secs : 0);
  }
  // Flaky: the receiver refuses connections about half of the time, in random intervals.
  {
    int64_t receipts_before = rx.receipts();
    std::atomic<bool> stop{false};
    std::atomic<int64_t> down_ms{0};
    std::thread toggler([&] {
      std::mt19937 rng(42);
      std::uniform_int_distribution<int> interval(200, 2000);
      bool up = true;
      while (!stop) {
        int ms = interval(rng);
        up = !up;
        if (up)
          rx.up();
        else
          rx.down();
        for (int t = 0; t < ms && !stop; t += 20) {
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
          if (!up) down_ms += 20;
        }
      }
      rx.up();
    });
    int64_t t0 = now_ms();
    auto ids = b.create(flaky_events, "/flaky");
    b.complete_at(ids, flaky_rate);
    auto ev = b.events(ids);
    size_t n = wait_delivered(rx, ev, 240);
    int64_t t1 = now_ms();
    stop = true;
    toggler.join();
    auto lat = latencies(rx, ev);
    out["flaky_events"] = flaky_events;
    out["flaky_delivered"] = n;
    out["delivered_fraction_flaky"] =
        ev.empty() ? 0.0 : static_cast<double>(n) / static_cast<double>(ev.size());
    out["flaky_receiver_down_fraction"] =
        static_cast<double>(down_ms.load()) / static_cast<double>(t1 - t0);
    out["flaky_duplicates"] = (rx.receipts() - receipts_before) - static_cast<int64_t>(n);
    out["flaky_delivery_p50_ms"] = percentile(lat, 0.5);
    out["flaky_delivery_p99_ms"] = percentile(lat, 0.99);
    out["failed_deliveries"] = b.failed_deliveries();
    std::fprintf(stderr, "flaky: %zu/%zu delivered, receiver down %.0f%% of the time\n", n,
                 ev.size(), 100.0 * out["flaky_receiver_down_fraction"].get<double>());
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
