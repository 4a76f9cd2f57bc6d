// Fair-share benchmark driver (run by scripts/bench_fairness.sh against `headroom api`, one
// `headroom dispatcher` and two workers on the bundled model). Phases, each on an idle queue:
//  - alone: tenant B's 50-request batch with nothing else queued (5 runs, median);
//  - shared: tenant A's 20,000-request batch running; A's rate before, then B's 50 submitted up
//    to three times one after another while A's batch lasts: B's time (median) against alone =
//    small_tenant_slowdown, and A's rate while B runs against before;
//  - weights: tenants C (weight 3) and D (weight 1) saturating: their generated tokens over
//    --share-seconds;
//  - deadline: tenant E's 20,000-request batch without a deadline, then E's 50 with a 20 s
//    completion window: finished before its deadline?
//  - estimate: tenant A's 3 × 20,000 as a steady backlog; then batches of B's and E's of 3,000 to
//    9,000 requests one after another: the estimated completion at submit against the actual
//    (estimate_errors: (estimated − actual) / actual of each, and their spread).
// Each batch left running is cancelled after its phase. Reads progress and tokens from Postgres.
// Prints one JSON object.
// With --phases prefix, only cache-aware dispatch (Driver::prefix_run): one batch whose requests
// share --prefixes system prompts in turn, on --prefix-model; the cached prompt tokens against
// the ideal.
#include <nlohmann/json.hpp>
#include <pqxx/pqxx>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "tests/bench/bench_http.h"

using nlohmann::json;
using namespace hr::bench;  // NOLINT: the driver's helpers

namespace {

struct Args {
  int port = 0;
  std::string model, database_url;
  std::string key_a, key_b, key_c, key_d, key_e;
  int big = 20000;
  int small = 50;
  int max_tokens = 64;
  double share_seconds = 60;
};

class Driver {
 public:
  explicit Driver(const Args& a) : a_(a), pg_(a.database_url) {}

  std::string submit(const std::string& key, int n, const json& extra = json::object()) {
    return submit_answer(key, n, extra)["request_id"];
  }

  // The submit's "result": its request_id and, when the queue's throughput is known, its
  // estimated_completion_at.
  json submit_answer(const std::string& key, int n, const json& extra = json::object()) {
    json reqs = json::array();
    for (int i = 0; i < n; ++i) {
      // A long line to reverse: the answer runs to max_tokens.
      std::string text = "item " + std::to_string(i) + " ";
      while (static_cast<int>(text.size()) < a_.max_tokens + 8) text += "abcdefghij";
      reqs.push_back({{"messages", {{{"role", "user"}, {"content", "reverse: " + text}}}},
                      {"max_tokens", a_.max_tokens}});
    }
    json body = {{"requests", reqs}};
    body.update(extra);
    Conn conn(a_.port);  // a new connection each time: phases idle past keep-alive timeouts
    auto [status, resp] = conn.call(beast_http::verb::post,
                                    "/ai/run/" + a_.model + "?queueRequest=true", key, body.dump());
    if (status != 200) {
      std::fprintf(stderr, "submit failed: %d %s\n", status, resp.c_str());
      std::exit(1);
    }
    return json::parse(resp)["result"];
  }

  void cancel(const std::string& key, const std::string& id) {
    Conn(a_.port).call(beast_http::verb::post, "/v1/async/" + id + "/cancel", key, "{}");
  }

  struct Progress {
    int64_t ended = 0;
    int64_t completion_tokens = 0;
    bool finished = false;
    double finished_before_deadline_s = 0;  // deadline − finished_at (when both are there)
  };
  Progress progress(const std::string& id) {
    pqxx::nontransaction tx(pg_);
    pqxx::row r = tx.exec_params1(
        "SELECT num_completed + num_failed + num_cancelled + num_expired, completion_tokens, "
        "finished_at IS NOT NULL, "
        "coalesce(extract(epoch FROM deadline - finished_at), 0)::float8 "
        "FROM batches WHERE id = $1::uuid",
        id);
    return {r[0].as<int64_t>(), r[1].as<int64_t>(), r[2].as<bool>(), r[3].as<double>()};
  }

  // Submits `n` for `key` and waits until the batch ends; its seconds.
  double run_to_end(const std::string& key, int n, const json& extra = json::object(),
                    std::string* id_out = nullptr) {
    auto t0 = Clock::now();
    std::string id = submit(key, n, extra);
    if (id_out) *id_out = id;
    while (!progress(id).finished && seconds_since(t0) < 600) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return seconds_since(t0);
  }

  // Where a finished batch's time went: from its creation to its first request's start, to its
  // last request's start, and to its end, in seconds.
  json timeline(const std::string& id) {
    pqxx::nontransaction tx(pg_);
    pqxx::row r = tx.exec_params1(
        "SELECT extract(epoch FROM min(r.started_at) - b.created_at)::float8, "
        "extract(epoch FROM max(r.started_at) - b.created_at)::float8, "
        "extract(epoch FROM b.finished_at - b.created_at)::float8 "
        "FROM batches b JOIN requests r ON r.batch_id = b.id WHERE b.id = $1::uuid "
        "GROUP BY b.id",
        id);
    return {{"first_start_s", r[0].as<double>()},
            {"last_start_s", r[1].as<double>()},
            {"end_s", r[2].as<double>()}};
  }

  // Cache-aware dispatch: `n` requests of `key` for `model`, request i with system prompt i mod
  // `prompts` (each about `prompt_bytes` of text that `salt` makes new to every worker's prefix
  // cache) and a question of its own, submitted as one batch, waited for to the end. Then the
  // prompt tokens found cached against the ideal: each prompt computed once, every other request
  // finding its whole cacheable start (the most cached tokens any request had).
  json prefix_run(const std::string& key, const std::string& model, int n, int prompts,
                  int prompt_bytes, const std::string& salt) {
    std::vector<std::string> systems;
    for (int p = 0; p < prompts; ++p) {
      std::string text = "system prompt " + std::to_string(p) + " of run " + salt + ": ";
      uint64_t x =
          0x9e3779b97f4a7c15ULL * static_cast<uint64_t>(p + 1) ^ std::hash<std::string>{}(salt);
      while (static_cast<int>(text.size()) < prompt_bytes) {
        x = x * 6364136223846793005ULL + 1442695040888963407ULL;
        text += static_cast<char>('a' + (x >> 33) % 26);
        if ((x >> 40) % 7 == 0) text += ' ';
      }
      systems.push_back(text);
    }
    json reqs = json::array();
    for (int i = 0; i < n; ++i) {
      reqs.push_back(
          {{"messages",
            {{{"role", "system"}, {"content", systems[static_cast<size_t>(i % prompts)]}},
             {{"role", "user"}, {"content", "question " + std::to_string(i)}}}},
           {"max_tokens", 4}});
    }
    const json body = {{"requests", reqs}};
    Conn conn(a_.port);
    auto t0 = Clock::now();
    auto [status, resp] = conn.call(beast_http::verb::post,
                                    "/ai/run/" + model + "?queueRequest=true", key, body.dump());
    if (status != 200) {
      std::fprintf(stderr, "submit failed: %d %s\n", status, resp.c_str());
      std::exit(1);
    }
    const std::string id = json::parse(resp)["result"]["request_id"];
    while (!progress(id).finished && seconds_since(t0) < 1800) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    const double seconds = seconds_since(t0);
    pqxx::nontransaction tx(pg_);
    pqxx::row r = tx.exec_params1(
        "SELECT count(*) FILTER (WHERE status = 'completed'), coalesce(sum(cached_tokens), 0), "
        "coalesce(max(cached_tokens), 0), coalesce(sum(prompt_tokens), 0), "
        "count(*) FILTER (WHERE cached_tokens > 0) FROM requests WHERE batch_id = $1::uuid",
        id);
    const int64_t completed = r[0].as<int64_t>();
    const int64_t cached = r[1].as<int64_t>();
    const int64_t cacheable = r[2].as<int64_t>();
    const double ideal =
        static_cast<double>(std::max<int64_t>(0, n - prompts)) * static_cast<double>(cacheable);
    return {{"requests", n},
            {"completed", completed},
            {"seconds", seconds},
            {"requests_per_s", completed / seconds},
            {"prompt_tokens", r[3].as<int64_t>()},
            {"cached_tokens", cached},
            {"cacheable_tokens_per_request", cacheable},
            {"requests_with_a_hit", r[4].as<int64_t>()},
            {"cached_fraction_of_ideal", ideal > 0 ? static_cast<double>(cached) / ideal : 0}};
  }

  // Requests of `id` ended per second over `seconds`.
  double rate(const std::string& id, double seconds) {
    int64_t e0 = progress(id).ended;
    auto t0 = Clock::now();
    std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
    return (progress(id).ended - e0) / seconds_since(t0);
  }

 private:
  const Args& a_;
  pqxx::connection pg_;
};

// Wall-clock seconds since the epoch (the estimates are wall-clock times).
double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  auto f = flags(argc, argv);
  a.port = std::stoi(f["--port"]);
  a.model = f["--model"];
  a.database_url = f["--database-url"];
  a.key_a = f["--key-a"];
  a.key_b = f["--key-b"];
  a.key_c = f["--key-c"];
  a.key_d = f["--key-d"];
  a.key_e = f["--key-e"];
  if (f.count("--big")) a.big = std::stoi(f["--big"]);
  if (f.count("--max-tokens")) a.max_tokens = std::stoi(f["--max-tokens"]);
  if (f.count("--share-seconds")) a.share_seconds = std::stod(f["--share-seconds"]);
  const bool fifo_only = f.count("--phases") && f["--phases"] == "shared";
  Driver d(a);
  json out;
  auto say = [](const json& j) {
    std::printf("%s\n", j.dump().c_str());
    std::fflush(stdout);
  };
  if (f.count("--phases") && f["--phases"] == "prefix") {
    json run =
        d.prefix_run(a.key_a, f["--prefix-model"], std::stoi(f["--prefix-requests"]),
                     std::stoi(f["--prefixes"]), std::stoi(f["--prefix-bytes"]), f["--salt"]);
    say(run);
    return 0;
  }

  // Alone.
  std::vector<double> alone;
  std::string small_id;
  for (int k = 0; k < 5; ++k)
    alone.push_back(d.run_to_end(a.key_b, a.small, json::object(), &small_id));
  out["small_alone_s"] = median(alone);
  out["small_alone_timeline"] = d.timeline(small_id);
  say({{"phase", "alone"}, {"seconds", alone}, {"timeline", out["small_alone_timeline"]}});

  // Shared with a big batch.
  {
    std::string big = d.submit(a.key_a, a.big);
    std::this_thread::sleep_for(std::chrono::seconds(3));  // running steadily
    const double before = d.rate(big, 4);
    std::vector<double> shared;
    int64_t e0 = d.progress(big).ended;
    auto t0 = Clock::now();
    // Only runs that begin while the big batch still has work count: first in, first out, the
    // first run waits for all of it, and the big batch is done by the next.
    json timelines = json::array();
    for (int k = 0; k < 3 && !d.progress(big).finished; ++k) {
      shared.push_back(d.run_to_end(a.key_b, a.small, json::object(), &small_id));
      timelines.push_back(d.timeline(small_id));
    }
    out["small_shared_timeline"] = d.timeline(small_id);
    const double during = (d.progress(big).ended - e0) / seconds_since(t0);
    const double small_requests = static_cast<double>(shared.size()) * a.small;
    const double small_share = small_requests / (small_requests + during * seconds_since(t0));
    d.cancel(a.key_a, big);
    out["small_shared_s"] = median(shared);
    out["small_tenant_slowdown"] = median(shared) / median(alone);
    out["big_rate_before_per_s"] = before;
    out["big_rate_during_per_s"] = during;
    out["big_rate_ratio"] = during / before;
    out["small_share_during"] = small_share;
    say({{"phase", "shared"},
         {"seconds", shared},
         {"big_before", before},
         {"big_during", during},
         {"timelines", timelines}});
  }
  if (fifo_only) {
    say(out);
    return 0;
  }

  // Weights 3:1.
  {
    std::string c = d.submit(a.key_c, a.big);
    std::string dd = d.submit(a.key_d, a.big);
    std::this_thread::sleep_for(std::chrono::seconds(5));
    auto pc = d.progress(c);
    auto pd = d.progress(dd);
    std::this_thread::sleep_for(std::chrono::duration<double>(a.share_seconds));
    auto qc = d.progress(c);
    auto qd = d.progress(dd);
    d.cancel(a.key_c, c);
    d.cancel(a.key_d, dd);
    const double tc = static_cast<double>(qc.completion_tokens - pc.completion_tokens);
    const double td = static_cast<double>(qd.completion_tokens - pd.completion_tokens);
    out["weights_tokens"] = {tc, td};
    out["weights_token_ratio"] = td > 0 ? tc / td : 0;
    out["weights_request_ratio"] =
        qd.ended > pd.ended ? double(qc.ended - pc.ended) / double(qd.ended - pd.ended) : 0;
    say({{"phase", "weights"}, {"tokens", {tc, td}}});
  }

  // A tight deadline behind the same account's big batch.
  {
    std::string big = d.submit(a.key_e, a.big);
    std::this_thread::sleep_for(std::chrono::seconds(3));
    std::string tight;
    const double s = d.run_to_end(a.key_e, a.small, {{"completion_window", "20s"}}, &tight);
    auto p = d.progress(tight);
    d.cancel(a.key_e, big);
    pqxx::connection pg(a.database_url);
    pqxx::nontransaction tx(pg);
    const int64_t completed =
        tx.exec_params1("SELECT num_completed FROM batches WHERE id = $1::uuid", tight)[0]
            .as<int64_t>();
    out["deadline_batch_s"] = s;
    out["deadline_window_s"] = 20;
    out["deadline_met"] = completed == a.small && p.finished_before_deadline_s > 0;
    say({{"phase", "deadline"}, {"seconds", s}, {"completed", completed}});
  }
  // The estimate at submit, into a steady backlog.
  {
    std::string backlog = d.submit(a.key_a, 3 * a.big);
    std::this_thread::sleep_for(std::chrono::seconds(8));  // the throughput is learnt
    json errors = json::array();
    json samples = json::array();
    const int sizes[] = {3000, 6000, 9000, 6000, 3000};
    int k = 0;
    for (int n : sizes) {
      const std::string& key = k++ % 2 == 0 ? a.key_b : a.key_e;
      const double t0 = unix_seconds();
      json answer = d.submit_answer(key, n);
      if (!answer.contains("estimated_completion_at")) {
        std::fprintf(stderr, "no estimate at submit: %s\n", answer.dump().c_str());
        continue;
      }
      const double estimated = answer["estimated_completion_at"].get<double>() - t0;
      const std::string id = answer["request_id"];
      while (!d.progress(id).finished && unix_seconds() - t0 < 600) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      const double actual = unix_seconds() - t0;
      errors.push_back((estimated - actual) / actual);
      samples.push_back({{"requests", n}, {"estimated_s", estimated}, {"actual_s", actual}});
      say({{"phase", "estimate"},
           {"requests", n},
           {"estimated_s", estimated},
           {"actual_s", actual}});
    }
    d.cancel(a.key_a, backlog);
    std::vector<double> abs_errors;
    for (const json& e : errors) abs_errors.push_back(std::abs(e.get<double>()));
    out["estimate_samples"] = samples;
    out["estimate_errors"] = errors;
    out["estimate_abs_error_median"] = median(abs_errors);
    out["estimate_abs_error_max"] =
        abs_errors.empty() ? 0 : *std::max_element(abs_errors.begin(), abs_errors.end());
  }
  out["goals"] = {{"small_tenant_slowdown", "<= 2"},
                  {"estimate_abs_error_max", "<= 0.25"},
                  {"weights_token_ratio", "3 +- 10% (2.7 to 3.3)"},
                  {"deadline_met", true}};
  say(out);
  return 0;
}
