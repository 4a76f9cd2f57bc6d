// OpenAI Batch API benchmark driver (run by scripts/bench_openai_batch.sh against a running
// `headroom api`, no dispatcher: this driver relays, completes and finalizes in-process so each
// phase is timed alone). Measures upload and download throughput for a ~100 MB input file (over
// HTTP, and the storage layer alone), batch creation (validate every line + store) for 10,000 and
// 100,000 requests, finalizing a finished 10,000-request batch into its output file, and reading
// that output back. Prints one JSON object as its last line.
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>
#include <vector>

#include "queue/dispatcher.h"
#include "queue/files.h"
#include "queue/lease.h"
#include "queue/openai_batches.h"
#include "queue/pg.h"
#include "queue/store.h"
#include "tests/testing/http_client.h"

namespace beast = boost::beast;
namespace beast_http = beast::http;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

struct Args {
  int port = 0;
  std::string key, model, database_url, redis_url;
};

constexpr const char* kBoundary = "hr-bench-7a1c";

struct Answer {
  int status = 0;
  std::string body;
};

Answer call(int port, beast_http::verb verb, const std::string& target, const std::string& key,
            const std::string& body = "", const std::string& content_type = "application/json") {
  hr::testing::HttpResult r =
      hr::testing::http_call(std::string(beast_http::to_string(verb)), port, target, body,
                             {{"Authorization", "Bearer " + key}, {"Content-Type", content_type}});
  if (r.status == 0) throw std::runtime_error("no answer: " + r.body);
  return {r.status, std::move(r.body)};
}

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string input_file(const std::string& model, int n, int text_len) {
  std::string out;
  for (int i = 0; i < n; ++i) {
    std::string text(static_cast<size_t>(text_len), static_cast<char>('a' + i % 26));
    out += json{{"custom_id", "req-" + std::to_string(i)},
                {"method", "POST"},
                {"url", "/v1/chat/completions"},
                {"body",
                 {{"model", model},
                  {"messages", {{{"role", "user"}, {"content", "reverse: " + text}}}},
                  {"max_tokens", 40}}}}
               .dump();
    out += '\n';
  }
  return out;
}

// Uploads `content` as a batch file; returns the file id (empty on failure) and the seconds taken.
std::pair<std::string, double> upload(const Args& a, const std::string& content) {
  std::string b = kBoundary;
  std::string body =
      "--" + b + "\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--" + b +
      "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"\r\n\r\n";
  body += content;
  body += "\r\n--" + b + "--\r\n";
  auto t0 = Clock::now();
  Answer r = call(a.port, beast_http::verb::post, "/v1/files", a.key, body,
                  "multipart/form-data; boundary=" + b);
  double s = seconds_since(t0);
  if (r.status != 200) {
    std::fprintf(stderr, "upload failed: %d %s\n", r.status, r.body.c_str());
    return {"", s};
  }
  return {json::parse(r.body)["id"], s};
}

std::pair<json, double> create(const Args& a, const std::string& file_id) {
  json body = {{"input_file_id", file_id},
               {"endpoint", "/v1/chat/completions"},
               {"completion_window", "24h"}};
  auto t0 = Clock::now();
  Answer r = call(a.port, beast_http::verb::post, "/v1/batches", a.key, body.dump());
  double s = seconds_since(t0);
  json j = json::parse(r.body, nullptr, false);
  if (r.status != 200 || j.value("status", "") != "in_progress") {
    std::fprintf(stderr, "create failed: %d %s\n", r.status, r.body.substr(0, 500).c_str());
    return {json(), s};
  }
  return {j, s};
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
  }
  json out;

  // Files: a ~100 MB input of 100,000 requests, up and down.
  std::string big = input_file(a.model, 100000, 870);
  auto [big_id, up_s] = upload(a, big);
  if (big_id.empty()) return 1;
  out["upload_bytes"] = big.size();
  out["upload_seconds"] = up_s;
  out["upload_mb_per_s"] = big.size() / 1e6 / up_s;
  std::printf("{\"phase\":\"upload\",\"mb\":%.1f,\"seconds\":%.3f}\n", big.size() / 1e6, up_s);
  std::fflush(stdout);
  auto t0 = Clock::now();
  Answer down = call(a.port, beast_http::verb::get, "/v1/files/" + big_id + "/content", a.key);
  double down_s = seconds_since(t0);
  if (down.status != 200 || down.body != big) {
    std::fprintf(stderr, "download differs: %d, %zu bytes\n", down.status, down.body.size());
    return 1;
  }
  out["download_seconds"] = down_s;
  out["download_mb_per_s"] = big.size() / 1e6 / down_s;

  // The storage layer alone: the same bytes into file_chunks and back, in-process.
  {
    auto conn = hr::queue::pg_connect(a.database_url).value();
    std::string account = hr::queue::authenticate(*conn, a.key).value();
    auto t1 = Clock::now();
    auto stored = hr::queue::create_file(*conn, {account, "batch", "direct.jsonl", big, 100000});
    double store_s = seconds_since(t1);
    if (!stored.is_ok()) return 1;
    t1 = Clock::now();
    auto back = hr::queue::read_file(*conn, *stored);
    double read_s = seconds_since(t1);
    if (!back.is_ok() || *back != big) return 1;
    out["store_mb_per_s"] = big.size() / 1e6 / store_s;
    out["read_mb_per_s"] = big.size() / 1e6 / read_s;
  }

  // Batch creation: every line validated and stored, for 100,000 and 10,000 requests.
  auto [big_batch, create_big_s] = create(a, big_id);
  if (big_batch.is_null()) return 1;
  out["create_100k_seconds"] = create_big_s;
  std::printf("{\"phase\":\"create_100k\",\"seconds\":%.3f}\n", create_big_s);
  std::fflush(stdout);
  // Cancel it so it does not compete with the 10,000-request batch below.
  call(a.port, beast_http::verb::post,
       "/v1/batches/" + big_batch["id"].get<std::string>() + "/cancel", a.key, "");
  auto [small_id, small_up_s] = upload(a, input_file(a.model, 10000, 24));
  if (small_id.empty()) return 1;
  auto [batch, create_s] = create(a, small_id);
  if (batch.is_null()) return 1;
  std::string id = batch["id"];
  out["create_10k_seconds"] = create_s;

  // Run it: relay, then a no-work consumer completes every request.
  auto d = hr::queue::Dispatcher::create(a.database_url, a.redis_url, {}).value();
  auto consumer = hr::queue::LeaseClient::create(a.database_url, a.redis_url,
                                                 {a.model, "bench-consumer", 60000, 3})
                      .value();
  for (;;) {
    auto n = d->relay_once();
    if (!n.is_ok() || *n == 0) break;
  }
  int done = 0;
  t0 = Clock::now();
  while (done < 10000 && seconds_since(t0) < 120) {
    auto got = consumer->pull(1000, 200);
    if (!got.is_ok() || got->empty()) continue;
    std::vector<hr::queue::Completion> cs;
    for (const auto& l : *got) {
      json result = {{"response", "olleh dlrow"},
                     {"usage",
                      {{"prompt_tokens", 17},
                       {"completion_tokens", 12},
                       {"total_tokens", 29},
                       {"prompt_tokens_details", {{"cached_tokens", 16}}}}},
                     {"finish_reason", "stop"}};
      cs.push_back({l, result.dump(), 17, 12, 16});
    }
    auto r = consumer->complete(cs);
    if (r.is_ok()) done += static_cast<int>(std::count(r->begin(), r->end(), true));
  }
  out["completed_10k_seconds"] = seconds_since(t0);
  if (done != 10000) {
    std::fprintf(stderr, "only %d of 10000 completed\n", done);
    return 1;
  }

  // Finalizing: the output file of 10,000 results, rendered and stored in one transaction.
  auto conn = hr::queue::pg_connect(a.database_url).value();
  t0 = Clock::now();
  auto fin = hr::queue::finalize_openai_batch(*conn, id);
  double fin_s = seconds_since(t0);
  if (!fin.is_ok() || !*fin) {
    std::fprintf(stderr, "finalize failed: %s\n", fin.status().to_string().c_str());
    return 1;
  }
  out["finalize_10k_seconds"] = fin_s;
  json final_batch =
      json::parse(call(a.port, beast_http::verb::get, "/v1/batches/" + id, a.key).body);
  if (final_batch["status"] != "completed") {
    std::fprintf(stderr, "batch is %s\n", final_batch.dump().c_str());
    return 1;
  }
  t0 = Clock::now();
  Answer output =
      call(a.port, beast_http::verb::get,
           "/v1/files/" + final_batch["output_file_id"].get<std::string>() + "/content", a.key);
  out["output_10k_download_seconds"] = seconds_since(t0);
  out["output_10k_bytes"] = output.body.size();
  t0 = Clock::now();
  Answer live = call(a.port, beast_http::verb::get, "/v1/batches/" + id + "/output", a.key);
  out["live_output_10k_seconds"] = seconds_since(t0);
  if (live.body != output.body) {
    std::fprintf(stderr, "the live output differs from the output file\n");
    return 1;
  }
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
