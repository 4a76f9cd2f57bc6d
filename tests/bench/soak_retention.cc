// Retention soak driver (run by scripts/soak_retention.sh against a running `headroom api` with a
// retention of minutes and `headroom dispatcher` with short partitions): submits batches without
// pause, completes their requests with a no-work consumer, polls batches that have not expired,
// and samples the database's size. Prints a JSON line per sample and one JSON object last: whether
// the size levelled off after the first retention window, the queue's throughput early and late,
// and how many polls of unexpired batches failed (none may).
#include <pqxx/pqxx>

#include <atomic>
#include <cstdio>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "queue/lease.h"
#include "tests/bench/bench_http.h"

using namespace hr::bench;  // NOLINT: the driver's helpers

namespace {

struct Args {
  int port = 0;
  std::string key, model, database_url, redis_url;
  int seconds = 1200;           // how long batches are submitted
  int retention_s = 180;        // the API's retention
  int partition_s = 60;         // the dispatcher's partition interval
  int batch_size = 100;         // requests a batch
  int batch_interval_ms = 500;  // between submits
};

struct Submitted {
  std::string id;
  Clock::time_point at;
};

struct Sample {
  double t = 0;
  int64_t database_bytes = 0;
  int64_t requests_bytes = 0;
  int64_t batches = 0;
  int64_t partitions = 0;
  int64_t completed = 0;  // requests completed by the consumer so far
  int64_t submitted = 0;  // requests accepted so far
};

}  // namespace

int main(int argc, char** argv) {
  Args a;
  std::map<std::string, std::string> f = flags(argc, argv);
  auto text = [&](const char* k, std::string* v) {
    if (f.count(k)) *v = f[k];
  };
  auto number = [&](const char* k, int* v) {
    if (f.count(k)) *v = std::stoi(f[k]);
  };
  number("--port", &a.port);
  text("--key", &a.key);
  text("--model", &a.model);
  text("--database-url", &a.database_url);
  text("--redis-url", &a.redis_url);
  number("--seconds", &a.seconds);
  number("--retention-s", &a.retention_s);
  number("--partition-s", &a.partition_s);
  number("--batch-size", &a.batch_size);
  number("--batch-interval-ms", &a.batch_interval_ms);
  const Clock::time_point start = Clock::now();
  const auto end = start + std::chrono::seconds(a.seconds);
  std::atomic<bool> stop{false};
  std::mutex mu;
  std::vector<Submitted> submitted;  // guarded by mu
  std::atomic<int64_t> requests_submitted{0};
  std::atomic<int64_t> requests_completed{0};
  std::atomic<int64_t> submit_errors{0};
  std::vector<double> submit_ms;  // guarded by mu

  std::thread submitter([&] {
    Conn c(a.port);
    std::string body = batch_body(a.batch_size);
    std::string target = "/ai/run/" + a.model + "?queueRequest=true";
    while (Clock::now() < end) {
      auto t0 = Clock::now();
      auto [status, resp] = c.call(beast_http::verb::post, target, a.key, body);
      double ms = seconds_since(t0) * 1000;
      if (status == 200) {
        std::lock_guard<std::mutex> lock(mu);
        submitted.push_back({json::parse(resp)["result"]["request_id"], t0});
        submit_ms.push_back(ms);
        requests_submitted += a.batch_size;
      } else {
        ++submit_errors;
      }
      std::this_thread::sleep_until(t0 + std::chrono::milliseconds(a.batch_interval_ms));
    }
  });

  std::thread consumer([&] {
    auto lease = hr::queue::LeaseClient::create(a.database_url, a.redis_url,
                                                {a.model, "soak-consumer", 30000, 3});
    if (!lease.is_ok()) {
      std::fprintf(stderr, "consumer: %s\n", lease.status().to_string().c_str());
      return;
    }
    const std::string result =
        R"({"response":"meti","usage":{"prompt_tokens":7,"completion_tokens":3,"total_tokens":10}})";
    while (!stop.load()) {
      auto pulled = (*lease)->pull(500, 200);
      if (!pulled.is_ok() || pulled->empty()) continue;
      std::vector<hr::queue::Completion> done;
      for (const auto& l : *pulled) done.push_back({l, result, 7, 3, 0});
      if ((*lease)->complete(done).is_ok()) requests_completed += static_cast<int64_t>(done.size());
    }
  });

  // Polls batches that must still answer: submitted long enough ago to have ended, and not
  // within 20 s of their expiry.
  std::atomic<int64_t> polls{0};
  std::atomic<int64_t> polls_lost{0};
  std::vector<double> poll_ms;  // guarded by mu
  std::thread poller([&] {
    Conn c(a.port);
    std::mt19937 rng(7);
    while (!stop.load()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
      std::string id;
      {
        std::lock_guard<std::mutex> lock(mu);
        auto now = Clock::now();
        size_t lo = 0;
        while (lo < submitted.size() &&
               submitted[lo].at < now - std::chrono::seconds(a.retention_s - 20)) {
          ++lo;
        }
        if (lo >= submitted.size()) continue;
        id = submitted[lo + rng() % (submitted.size() - lo)].id;
      }
      auto t0 = Clock::now();
      auto [status, body] = c.call(beast_http::verb::get, "/v1/async/" + id, a.key);
      double ms = seconds_since(t0) * 1000;
      ++polls;
      if (status != 200) {
        ++polls_lost;
        std::fprintf(stderr, "poll of unexpired %s: %d %s\n", id.c_str(), status, body.c_str());
      }
      std::lock_guard<std::mutex> lock(mu);
      poll_ms.push_back(ms);
    }
  });

  std::vector<Sample> samples;
  pqxx::connection pg(a.database_url);
  auto sample = [&] {
    pqxx::nontransaction tx(pg);
    pqxx::row r = tx.exec1(
        "SELECT pg_database_size(current_database()), "
        "  (SELECT coalesce(sum(pg_total_relation_size(inhrelid)), 0)::bigint FROM pg_inherits "
        "   WHERE inhparent = 'requests'::regclass), "
        "  (SELECT count(*) FROM batches), (SELECT count(*) FROM request_partitions)");
    Sample s;
    s.t = seconds_since(start);
    s.database_bytes = r[0].as<int64_t>();
    s.requests_bytes = r[1].as<int64_t>();
    s.batches = r[2].as<int64_t>();
    s.partitions = r[3].as<int64_t>();
    s.completed = requests_completed.load();
    s.submitted = requests_submitted.load();
    samples.push_back(s);
    std::printf(
        "{\"t\":%.0f,\"database_mb\":%.1f,\"requests_mb\":%.1f,\"batches\":%lld,"
        "\"partitions\":%lld,\"submitted\":%lld,\"completed\":%lld}\n",
        s.t, static_cast<double>(s.database_bytes) / 1048576,
        static_cast<double>(s.requests_bytes) / 1048576, static_cast<long long>(s.batches),
        static_cast<long long>(s.partitions), static_cast<long long>(s.submitted),
        static_cast<long long>(s.completed));
    std::fflush(stdout);
  };
  while (Clock::now() < end) {
    sample();
    std::this_thread::sleep_for(std::chrono::seconds(10));
  }
  sample();
  stop = true;
  submitter.join();
  consumer.join();
  poller.join();

  // The first retention window: a batch expires retention_s after it is submitted, and its
  // partition goes once its interval has closed and the drop margin (an interval) has passed.
  const double window = a.retention_s + 2.0 * a.partition_s + 30;
  json out;
  // The size comes and goes by a partition at a time (a saw tooth of one interval), so the value
  // after the first window is its highest over the next two intervals, and every later size is
  // compared with it. Without the purge it would grow at the rate of the first window for good.
  int64_t first_window_peak = 0;
  int64_t later_peak = 0;
  for (const Sample& s : samples) {
    if (s.t >= window && s.t < window + 2.0 * a.partition_s) {
      first_window_peak = std::max(first_window_peak, s.database_bytes);
    } else if (s.t >= window + 2.0 * a.partition_s) {
      later_peak = std::max(later_peak, s.database_bytes);
    }
  }
  const Sample* at_window = first_window_peak > 0 ? &samples.front() : nullptr;
  double growth_per_s = 0;  // before the purge first removed anything
  for (size_t i = 1; i < samples.size() && samples[i].t <= a.retention_s; ++i) {
    growth_per_s = static_cast<double>(samples[i].database_bytes - samples.front().database_bytes) /
                   samples[i].t;
  }
  const Sample& last = samples.back();
  // Throughput early (the minute after the first window) and late (the last minute).
  auto rate = [&](double from, double to) {
    const Sample* x = nullptr;
    const Sample* y = nullptr;
    for (const Sample& s : samples) {
      if (x == nullptr && s.t >= from) x = &s;
      if (s.t <= to) y = &s;
    }
    if (x == nullptr || y == nullptr || y->t <= x->t) return 0.0;
    return static_cast<double>(y->completed - x->completed) / (y->t - x->t);
  };
  out["seconds"] = last.t;
  out["retention_s"] = a.retention_s;
  out["partition_s"] = a.partition_s;
  out["requests_submitted"] = last.submitted;
  out["requests_completed"] = last.completed;
  out["backlog_last"] = last.submitted - last.completed;
  out["submit_errors"] = submit_errors.load();
  if (at_window != nullptr && later_peak > 0) {
    out["database_mb_after_first_window"] = static_cast<double>(first_window_peak) / 1048576;
    out["database_mb_peak_later"] = static_cast<double>(later_peak) / 1048576;
    out["database_mb_last"] = static_cast<double>(last.database_bytes) / 1048576;
    out["database_mb_if_never_purged"] =
        static_cast<double>(samples.front().database_bytes) / 1048576 +
        growth_per_s * last.t / 1048576;
    out["size_ratio_later_to_first_window"] =
        static_cast<double>(later_peak) / static_cast<double>(first_window_peak);
    out["levels_off"] = later_peak <= first_window_peak * 12 / 10;
  }
  out["requests_mb_last"] = static_cast<double>(last.requests_bytes) / 1048576;
  out["partitions_last"] = last.partitions;
  out["batches_stored_last"] = last.batches;
  out["completed_per_s_early"] = rate(window, window + 60);
  out["completed_per_s_late"] = rate(last.t - 60, last.t);
  out["throughput_late_to_early"] =
      rate(window, window + 60) > 0 ? rate(last.t - 60, last.t) / rate(window, window + 60) : 0.0;
  {
    std::lock_guard<std::mutex> lock(mu);
    out["submit_ms_p50"] = percentile(submit_ms, 0.5);
    out["submit_ms_p99"] = percentile(submit_ms, 0.99);
    out["poll_ms_p50"] = percentile(poll_ms, 0.5);
    out["poll_ms_p99"] = percentile(poll_ms, 0.99);
  }
  out["polls_of_unexpired"] = polls.load();
  out["polls_of_unexpired_lost"] = polls_lost.load();
  std::printf("%s\n", out.dump().c_str());
  return polls_lost.load() == 0 ? 0 : 1;
}
