// Loopback HTTP for the flex benchmark: plain calls (async submits, cancels, /metrics), one
// streamed chat completion timed at its first content chunk, and a /metrics sampler. One
// connection per call, blocking, on the calling thread; every function is safe to call from many
// threads at once, and so is Sampler.
#pragma once

#include <atomic>
#include <chrono>
#include <initializer_list>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace hr::bench {

using Clock = std::chrono::steady_clock;

struct HttpAnswer {
  int status = 0;  // 0: no answer (connection failed; `body` says why)
  std::string body;
};

// `key` empty: no Authorization header.
HttpAnswer http_call(int port, const std::string& method, const std::string& target,
                     const std::string& key, const std::string& body = "");

struct StreamResult {
  int status = 0;             // HTTP status; 0: no answer
  bool ok = false;            // 200, content and usage seen, ended with data: [DONE]
  std::string error;          // why not ok
  double ttft_ms = -1;        // from `start` to the first chunk with non-empty content
  double e2e_ms = -1;         // from `start` to data: [DONE]
  int completion_tokens = 0;  // from the usage chunk
  int prompt_tokens = 0;
};

// POSTs `body` (a streaming chat completion) to /v1/chat/completions and reads the server-sent
// events as they arrive. Times are measured from `start` (the scheduled send time).
StreamResult stream_chat(int port, const std::string& key, const std::string& body,
                         Clock::time_point start);

// Prometheus text: the sum of every series of `name` whose labels contain each of `labels`
// (e.g. {"class=\"async\""}); 0 when there is none.
double metric_sum(const std::string& text, const std::string& name,
                  std::initializer_list<const char*> labels = {});

// One /metrics sample; times in seconds since the start of the run.
struct Sample {
  double t = 0;
  // Tokens generated so far by class, counted as they come out of the engine (the counts of the
  // worker's time-to-first-token and inter-token-latency histograms), and those of finished
  // requests only (headroom_generation_tokens_total, which moves when a request ends).
  double async_tokens = 0, sync_tokens = 0;
  double async_finished_tokens = 0, sync_finished_tokens = 0;
  double async_finished = 0;  // headroom_requests_finished_total{class="async"}
  double running_async = 0, waiting_async = 0, running_sync = 0;
  double steps = 0, preemptions = 0;  // engine steps run, async sequences preempted
  double utilization = 0;             // the device's busy fraction, smoothed
  // Server-side sync timings (histogram sums in seconds, and counts): waiting for the step loop,
  // and arrival at the worker to the first token.
  double sync_queue_sum = 0, sync_queue_count = 0, sync_ttft_sum = 0, sync_ttft_count = 0;
};

// Polls /metrics every 0.5 s on its own thread (between start() and stop()) and keeps every
// sample; times are seconds since `t0`.
class Sampler {
 public:
  Sampler(int port, Clock::time_point t0) : port_(port), t0_(t0) {}
  ~Sampler() { stop(); }

  void start();
  void stop();
  // A fresh sample taken now (not kept); false when /metrics did not answer.
  bool now(Sample* s) { return fetch(s); }
  Sample latest();
  std::vector<Sample> all();
  int failures() const { return failures_; }

 private:
  bool fetch(Sample* s);

  const int port_;
  const Clock::time_point t0_;
  std::atomic<bool> stop_{false};
  std::atomic<int> failures_{0};
  std::thread thread_;
  std::mutex mu_;
  std::vector<Sample> samples_;  // guarded by mu_
};

}  // namespace hr::bench
