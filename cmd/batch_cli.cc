// `headroom batch`: submit, watch, status, list, cancel, retry, results over the HTTP API.
#include "cmd/batch_cli.h"

#include <sys/ioctl.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <sstream>
#include <thread>

#include "base/ids.h"
#include "cmd/api_client.h"

namespace hr::cmd {

namespace {

using nlohmann::json;

volatile std::sig_atomic_t g_interrupted = 0;
void on_interrupt(int) { g_interrupted = 1; }

int fail(const std::string& message) {
  std::fprintf(stderr, "headroom batch: %s\n", message.c_str());
  return 1;
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string clock_text(double seconds) {
  if (!(seconds >= 0) || seconds > 99 * 3600) return "--:--";
  const auto s = static_cast<int64_t>(std::llround(seconds));
  char out[32];
  if (s >= 3600) {
    std::snprintf(out, sizeof(out), "%lld:%02lld:%02lld", static_cast<long long>(s / 3600),
                  static_cast<long long>(s / 60 % 60), static_cast<long long>(s % 60));
  } else {
    std::snprintf(out, sizeof(out), "%02lld:%02lld", static_cast<long long>(s / 60),
                  static_cast<long long>(s % 60));
  }
  return out;
}

// The "result" of a poll of batch `id`; on failure a message.
Result<json> poll(const ApiClient& api, const std::string& id) {
  HR_ASSIGN_OR_RETURN(ApiReply r, api.call("GET", "/v1/async/" + id));
  if (r.status != 200) return invalid_argument("batch " + id + ": " + api_error_message(r), "id");
  json j = json::parse(r.body, nullptr, false);
  if (!j.is_object() || !j.contains("result")) {
    return unavailable("batch " + id + ": the API's answer is not a poll result");
  }
  return j["result"];
}

int64_t count(const json& progress, const char* key) {
  return progress.contains(key) && progress[key].is_number() ? progress[key].get<int64_t>() : 0;
}

// The exit code a batch's state stands for (see batch_cli.h).
int exit_code_of(const json& result) {
  if (!result.contains("finished_at")) return 0;
  const json& p = result["progress"];
  if (result.value("status", "").rfind("completed", 0) == 0) {  // completed[_with_errors]
    return count(p, "failed") + count(p, "cancelled") + count(p, "expired") > 0 ? 2 : 0;
  }
  return 3;
}

std::string summary_line(const json& r) {
  const json& p = r["progress"];
  std::ostringstream out;
  out << r.value("request_id", "?") << "  " << r.value("status", "?") << "  "
      << count(p, "completed") << " completed, " << count(p, "failed") << " failed";
  if (count(p, "cancelled") > 0) out << ", " << count(p, "cancelled") << " cancelled";
  if (count(p, "expired") > 0) out << ", " << count(p, "expired") << " expired";
  out << " of " << count(p, "total");
  return out.str();
}

// Watches batch `id` until it ends (or Ctrl-C): a progress line redrawn in place on a terminal,
// a plain line every 10 s otherwise.
int watch(const ApiClient& api, const std::string& id, int poll_ms) {
  const bool tty = ::isatty(STDOUT_FILENO) != 0;
  std::signal(SIGINT, on_interrupt);
  const double started = now_s();
  double last_plain = 0;
  double rate = 0;
  int64_t last_done = -1;
  double last_t = started;
  for (;;) {
    Result<json> r = poll(api, id);
    if (!r.is_ok()) {
      if (tty) std::printf("\n");
      return fail(r.status().message());
    }
    const json& p = (*r)["progress"];
    const int64_t total = count(p, "total");
    const int64_t ended =
        count(p, "completed") + count(p, "failed") + count(p, "cancelled") + count(p, "expired");
    const double t = now_s();
    if (last_done >= 0 && t > last_t) {
      const double sample = static_cast<double>(ended - last_done) / (t - last_t);
      rate = rate == 0 ? sample : 0.7 * rate + 0.3 * sample;
    }
    last_done = ended;
    last_t = t;
    double eta = -1;
    std::string eta_from;
    if (r->contains("estimated_completion_at")) {
      eta = std::max(0.0, (*r)["estimated_completion_at"].get<double>() - t);
      eta_from = " (server)";
    } else if (rate > 0) {
      eta = static_cast<double>(total - ended) / rate;
    }
    char progress[256];
    std::snprintf(progress, sizeof(progress),
                  "%s  %lld/%lld done, %lld failed  %.1f req/s  ETA %s%s  elapsed %s",
                  r->value("status", "?").c_str(), static_cast<long long>(ended),
                  static_cast<long long>(total), static_cast<long long>(count(p, "failed")), rate,
                  clock_text(eta).c_str(), eta_from.c_str(), clock_text(t - started).c_str());
    const bool done = r->contains("finished_at");
    if (tty) {
      // The id is on the line above; this one is cut to the terminal's width, so that it never
      // wraps (a wrapped line cannot be redrawn in place).
      std::string line = progress;
      winsize ws{};
      if (::ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0 && ws.ws_col > 1 &&
          line.size() >= ws.ws_col) {
        line.resize(ws.ws_col - 1);
      }
      std::printf("\r\033[2K%s", line.c_str());
      std::fflush(stdout);
    } else if (done || t - last_plain >= 10) {
      std::printf("%s  %s\n", id.c_str(), progress);
      std::fflush(stdout);
      last_plain = t;
    }
    if (done) {
      if (tty) std::printf("\n");
      std::printf("%s\n", summary_line(*r).c_str());
      return exit_code_of(*r);
    }
    for (int waited = 0; waited < poll_ms && !g_interrupted; waited += 50) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    if (g_interrupted) {
      if (tty) std::printf("\n");
      std::fprintf(stderr,
                   "headroom batch: stopped watching; the batch goes on (headroom batch status "
                   "%s)\n",
                   id.c_str());
      return 130;
    }
  }
}

Result<std::vector<json>> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  if (!in) return invalid_argument("cannot read " + path, "FILE");
  std::vector<json> lines;
  std::string line;
  int number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) {
      return invalid_argument(path + " line " + std::to_string(number) + " is not a JSON object",
                              "FILE");
    }
    lines.push_back(std::move(j));
  }
  if (lines.empty()) return invalid_argument(path + " has no requests", "FILE");
  return lines;
}

// Submits the file; the new batch's id.
Result<std::string> submit(const ApiClient& api, const BatchCommand& c) {
  HR_ASSIGN_OR_RETURN(std::vector<json> lines, read_jsonl(c.file));
  std::string shape = c.shape;
  if (shape.empty()) {
    shape = lines[0].contains("custom_id") && lines[0].contains("body") ? "openai" : "workers-ai";
  }
  if (shape == "workers-ai") {
    if (c.model.empty()) {
      return invalid_argument(
          "--model is needed for a Workers-AI file (or give OpenAI batch lines)", "model");
    }
    json body = {{"requests", lines}};
    if (!c.webhook_url.empty()) body["webhook_url"] = c.webhook_url;
    if (!c.completion_window.empty()) body["completion_window"] = c.completion_window;
    HR_ASSIGN_OR_RETURN(ApiReply r,
                        api.call("POST", "/ai/run/" + c.model + "?queueRequest=true", body.dump()));
    if (r.status != 200) return invalid_argument("submit: " + api_error_message(r), "FILE");
    json j = json::parse(r.body, nullptr, false);
    return j["result"].value("request_id", "");
  }
  if (shape != "openai") {
    return invalid_argument("--shape is workers-ai or openai, not '" + shape + "'", "shape");
  }
  // OpenAI: the file goes up as is, then a batch of it.
  std::ifstream in(c.file, std::ios::binary);
  std::ostringstream content;
  content << in.rdbuf();
  const std::string boundary = "----headroom-" + random_hex(8);
  const std::string name = c.file.substr(c.file.find_last_of('/') + 1);
  std::string form = "--" + boundary +
                     "\r\nContent-Disposition: form-data; name=\"purpose\"\r\n\r\nbatch\r\n--" +
                     boundary + "\r\nContent-Disposition: form-data; name=\"file\"; filename=\"" +
                     name + "\"\r\nContent-Type: application/jsonl\r\n\r\n" + content.str() +
                     "\r\n--" + boundary + "--\r\n";
  HR_ASSIGN_OR_RETURN(ApiReply up, api.call("POST", "/v1/files", form,
                                            "multipart/form-data; boundary=" + boundary));
  if (up.status != 200) return invalid_argument("upload: " + api_error_message(up), "FILE");
  json file = json::parse(up.body, nullptr, false);
  json body = {{"input_file_id", file.value("id", "")},
               {"endpoint", lines[0].value("url", "/v1/chat/completions")},
               {"completion_window", c.completion_window.empty() ? "24h" : c.completion_window}};
  if (!c.webhook_url.empty()) body["webhook_url"] = c.webhook_url;
  HR_ASSIGN_OR_RETURN(ApiReply r, api.call("POST", "/v1/batches", body.dump()));
  if (r.status != 200) return invalid_argument("batch: " + api_error_message(r), "FILE");
  json batch = json::parse(r.body, nullptr, false);
  if (batch.value("status", "") == "failed") {
    std::string why = "the file failed validation";
    if (batch.contains("errors") && batch["errors"].contains("data") &&
        !batch["errors"]["data"].empty()) {
      const json& e = batch["errors"]["data"][0];
      why += ": line " + std::to_string(e.value("line", 0)) + ": " + e.value("message", "");
    }
    return invalid_argument(why, "FILE");
  }
  return batch.value("id", "");
}

// Lines in `path` (0 when it does not exist); a last line without its newline is cut off, so that
// a resumed download starts at a whole request.
Result<int64_t> whole_lines(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return int64_t{0};
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  const size_t end = text.rfind('\n');
  const size_t keep = end == std::string::npos ? 0 : end + 1;
  if (keep != text.size()) {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(text.data(), static_cast<std::streamsize>(keep));
    if (!out) return invalid_argument("cannot write " + path, "output");
  }
  return static_cast<int64_t>(std::count(text.begin(), text.begin() + keep, '\n'));
}

// The results a page at a time (from=, limit=), each written as it comes: memory stays at a
// page, and --resume continues a file where an interrupted download stopped.
int results(const ApiClient& api, const BatchCommand& c) {
  constexpr int kPage = 1000;
  int64_t from = 0;
  if (c.resume) {
    if (c.output.empty()) return fail("--resume needs -o FILE");
    Result<int64_t> have = whole_lines(c.output);
    if (!have.is_ok()) return fail(have.status().message());
    from = *have;
  }
  std::ofstream file;
  if (!c.output.empty()) {
    file.open(c.output, c.resume ? std::ios::app : std::ios::trunc);
    if (!file) return fail("cannot write " + c.output);
  }
  std::ostream& out = c.output.empty() ? static_cast<std::ostream&>(std::cout) : file;
  for (;;) {
    Result<ApiReply> r =
        api.call("GET", "/v1/async/" + c.id + "?include=partial&from=" + std::to_string(from) +
                            "&limit=" + std::to_string(kPage));
    if (!r.is_ok()) return fail(r.status().message());
    if (r->status != 200) return fail("batch " + c.id + ": " + api_error_message(*r));
    json j = json::parse(r->body, nullptr, false);
    if (!j.is_object() || !j["result"].contains("responses")) {
      return fail("batch " + c.id + ": the API's answer has no responses");
    }
    const json& responses = j["result"]["responses"];
    for (const json& response : responses) out << response.dump() << "\n";
    out.flush();
    if (!out) return fail("writing the results failed");
    from += static_cast<int64_t>(responses.size());
    if (static_cast<int>(responses.size()) < kPage) return exit_code_of(j["result"]);
  }
}

}  // namespace

int run_batch(const BatchCommand& c) {
  if (c.api_key.empty()) return fail("set HEADROOM_API_KEY (or --api-key) to an API key");
  Result<ApiClient> api = ApiClient::create(c.url, c.api_key);
  if (!api.is_ok()) return fail(api.status().message());
  if (c.action == "submit") {
    Result<std::string> id = submit(*api, c);
    if (!id.is_ok()) return fail(id.status().message());
    std::printf("%s\n", id->c_str());
    std::fflush(stdout);
    return c.wait ? watch(*api, *id, c.poll_ms) : 0;
  }
  if (c.action == "status") {
    if (c.wait) return watch(*api, c.id, c.poll_ms);
    Result<json> r = poll(*api, c.id);
    if (!r.is_ok()) return fail(r.status().message());
    std::printf("%s\n", r->dump(2).c_str());
    return exit_code_of(*r);
  }
  if (c.action == "list") {
    Result<ApiReply> r = api->call("GET", "/v1/async?limit=" + std::to_string(c.limit));
    if (!r.is_ok()) return fail(r.status().message());
    if (r->status != 200) return fail(api_error_message(*r));
    json j = json::parse(r->body, nullptr, false);
    for (const json& b : j["result"]["data"]) std::printf("%s\n", summary_line(b).c_str());
    return 0;
  }
  if (c.action == "cancel" || c.action == "retry") {
    Result<ApiReply> r = api->call("POST", "/v1/async/" + c.id + "/" + c.action, "");
    if (!r.is_ok()) return fail(r.status().message());
    if (r->status != 200) return fail(c.action + " " + c.id + ": " + api_error_message(*r));
    json j = json::parse(r->body, nullptr, false);
    const json& result = j.contains("result") ? j["result"] : j;
    std::printf("%s\n", result.value("request_id", c.id).c_str());
    return 0;
  }
  if (c.action == "results") return results(*api, c);
  return fail("unknown action '" + c.action + "'");
}

}  // namespace hr::cmd
