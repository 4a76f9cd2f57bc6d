// Queue benchmark driver (run by scripts/bench_queue.sh against a running `headroom api` and
// `headroom dispatcher`): durable intake rate, pull+complete throughput with a no-work consumer,
// poll latency under 100 concurrent pollers, and the API's peak RSS. Prints one JSON object.
#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "queue/lease.h"
#include "tests/bench/bench_http.h"

using nlohmann::json;
using namespace hr::bench;  // NOLINT: the driver's helpers

namespace {

struct Args {
  int port = 0;
  std::string key, model, database_url, redis_url;
  int api_pid = 0;
};

long peak_rss_mb(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmHWM:", 0) == 0) return std::stol(line.substr(6)) / 1024;
  }
  return -1;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--port") a.port = std::stoi(v);
    if (k == "--key") a.key = v;
    if (k == "--model") a.model = v;
    if (k == "--database-url") a.database_url = v;
    if (k == "--redis-url") a.redis_url = v;
    if (k == "--api-pid") a.api_pid = std::stoi(v);
  }
  json out;
  std::string target = "/ai/run/" + a.model + "?queueRequest=true";

  // (a) intake
  long rss_before = peak_rss_mb(a.api_pid);
  std::vector<std::string> ids;
  for (int n : {10000, 100000}) {
    std::string body = batch_body(n);
    Conn c(a.port);
    auto t0 = Clock::now();
    auto [status, resp] = c.call(beast_http::verb::post, target, a.key, body);
    double s = seconds_since(t0);
    if (status != 200) {
      std::fprintf(stderr, "submit failed: %d %s\n", status, resp.c_str());
      return 1;
    }
    ids.push_back(json::parse(resp)["result"]["request_id"]);
    out["intake_" + std::to_string(n / 1000) + "k_requests_per_s"] = n / s;
    out["intake_" + std::to_string(n / 1000) + "k_seconds"] = s;
    out["intake_" + std::to_string(n / 1000) + "k_body_mb"] = body.size() / 1048576.0;
    std::printf("{\"phase\":\"intake\",\"requests\":%d,\"seconds\":%.3f}\n", n, s);
    std::fflush(stdout);
  }
  out["intake_requests_per_s"] = out["intake_100k_requests_per_s"];
  out["api_peak_rss_mb"] = peak_rss_mb(a.api_pid);
  out["api_rss_before_intake_mb"] = rss_before;

  // (c) poll latency: 100 pollers, each polling every 20 ms for 5 s; once while the dispatcher is
  // still relaying the 110,000 new requests into Redis, once after.
  auto poll_phase = [&](const std::string& prefix) {
    std::vector<std::thread> pollers;
    std::vector<std::vector<double>> lat(100);
    std::atomic<int> errors{0};
    auto end = Clock::now() + std::chrono::seconds(5);
    for (int p = 0; p < 100; ++p) {
      pollers.emplace_back([&, p] {
        Conn c(a.port);
        std::string t = "/v1/async/" + ids[0];
        while (Clock::now() < end) {
          auto t0 = Clock::now();
          auto [status, body] = c.call(beast_http::verb::get, t, a.key);
          lat[p].push_back(seconds_since(t0) * 1000);
          if (status != 200) ++errors;
          std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
      });
    }
    for (auto& t : pollers) t.join();
    std::vector<double> all;
    for (auto& v : lat) all.insert(all.end(), v.begin(), v.end());
    out[prefix + "p50_ms"] = percentile(all, 0.50);
    out[prefix + "p99_ms"] = percentile(all, 0.99);
    out[prefix + "per_s"] = all.size() / 5.0;
    out[prefix + "errors"] = errors.load();
  };
  poll_phase("poll_during_relay_");
  // Until the relay has pushed what it will before workers take any: everything when the
  // model's ready-queue is unbounded, else its window (docs/fair-share.md); the stream's length
  // then stays put.
  {
    auto redis = hr::queue::RedisClient::connect(a.redis_url).value();
    long long last = -1;
    int still = 0;
    for (int i = 0; i < 600 && still < 5; ++i) {
      auto n = redis->command({"XLEN", hr::queue::stream_key(a.model)});
      const long long len = n.is_ok() ? n->integer : -1;
      still = len == last && len > 0 ? still + 1 : 0;
      last = len;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    out["stream_before_pull"] = last;
  }
  poll_phase("poll_");

  // (b) pull + complete with no-work consumers until both batches are done.
  {
    const int total = 110000;
    std::atomic<int> done{0};
    auto t0 = Clock::now();
    std::vector<std::thread> consumers;
    for (int k = 0; k < 2; ++k) {
      consumers.emplace_back([&, k] {
        auto c = hr::queue::LeaseClient::create(a.database_url, a.redis_url,
                                                {a.model, "bench-" + std::to_string(k), 60000, 3});
        if (!c.is_ok()) return;
        while (done.load() < total && seconds_since(t0) < 120) {
          auto got = (*c)->pull(500, 200);
          if (!got.is_ok() || got->empty()) continue;
          std::vector<hr::queue::Completion> cs;
          cs.reserve(got->size());
          for (const auto& l : *got) cs.push_back({l, "{\"response\":\"ok\"}", 12, 12, 0});
          auto r = (*c)->complete(cs);
          if (r.is_ok()) done += static_cast<int>(std::count(r->begin(), r->end(), true));
        }
      });
    }
    for (auto& t : consumers) t.join();
    double s = seconds_since(t0);
    out["pull_complete_requests"] = done.load();
    out["pull_complete_seconds"] = s;
    out["pull_complete_requests_per_s"] = done.load() / s;
  }
  out["goals"] = {{"intake_requests_per_s", ">= 50000"},
                  {"pull_complete_requests_per_s", ">= 10000"},
                  {"poll_p99_ms", "<= 10"}};
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
