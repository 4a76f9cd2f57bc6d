// Flex benchmark driver (run by scripts/bench_flex.sh against a running `headroom serve`): does
// queued async work fill the capacity that sync traffic leaves, without sync latency noticing?
// Three phases on the same server and model, in this order:
//   c — async only: a backlog of queued requests; the engine's capacity in generated tokens/s;
//   a — sync only: streamed chat completions arriving as a Poisson process at a rate that keeps
//       the engine busy about half of the time (set by a short probe: sync tokens cost more engine
//       time than async ones); client-side time to the first content chunk and end to end;
//   b — the same sync arrivals (same gaps, same prompts) over an async backlog that outlasts the
//       phase: the same sync figures, and the async tokens/s completed meanwhile.
// (a) and (b) run in alternating slices (--rounds, 3 by default: a1 b1 a2 b2 a3 b3), each round's
// pair with the same arrivals, so that drift in the machine's speed over the run (other work on
// the host) weighs on both phases alike; each phase's figures pool its slices.
// Leftover async work is cancelled between phases, and the next waits for the worker to hold
// none. Throughput is generated tokens/s by class from serve's /metrics, sampled every 0.5 s,
// leaving out the first seconds of each phase (in c and b, from the first async token: a large
// model takes seconds to pull and prefill). Tokens are counted as the engine emits them (the
// counts of the worker's TTFT and inter-token histograms): the finished-request counter
// (headroom_generation_tokens_total, also reported) moves only when requests end, in lumps as
// large as a whole batch on a slow model. Writes a PNG chart; the last line of output is one
// JSON object. async_fill_ratio is async tokens/s in (b) ÷ (capacity × the share of engine time
// that sync took in (a)); async_fill_ratio_by_tokens uses sync's tokens/s as its share instead.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "tests/bench/flex_chart.h"
#include "tests/bench/flex_client.h"

namespace {

using hr::bench::Clock;
using hr::bench::Sample;
using hr::bench::Sampler;
using hr::bench::SyncPoint;
using nlohmann::json;

struct Options {
  int port = 0;
  std::string key;
  std::string model = "@hr/tiny-reverse";
  std::string label = "flex";
  std::string chart;  // PNG path; empty: no chart
  int max_tokens = 32;
  double phase_seconds = 30;
  int rounds = 3;  // (a) and (b) run as this many alternating slices of phase_seconds / rounds
  double warmup_seconds = 2;   // left out of the throughput figures at the start of each phase
  double sync_fraction = 0.5;  // share of the capacity the sync load aims at
  int num_calibration = 10;    // sequential sync requests estimating tokens per answer
  int async_batch = 500;       // requests per async submit
  int min_letters = 8;         // prompt: "reverse: " and this many to max_letters letters
  int max_letters = 24;
  uint64_t seed = 1;
  double drain_timeout_s = 120;  // for in-flight sync requests, and for cancelled async work
};

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

std::string random_prompt(std::mt19937_64& rng, const Options& o) {
  std::uniform_int_distribution<int> len(o.min_letters, o.max_letters);
  std::uniform_int_distribution<int> letter('a', 'z');
  std::string s = "reverse: ";
  for (int i = len(rng); i > 0; --i) s.push_back(static_cast<char>(letter(rng)));
  return s;
}

json chat_messages(const std::string& prompt) {
  return json::array({{{"role", "user"}, {"content", prompt}}});
}

std::string sync_body(const Options& o, const std::string& prompt) {
  return json{{"model", o.model},
              {"messages", chat_messages(prompt)},
              {"max_tokens", o.max_tokens},
              {"temperature", 0},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}}}
      .dump();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return -1;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(p * static_cast<double>(v.size())))];
}

// Errors seen anywhere in the run: counted, and the first few kept for the report.
struct Errors {
  std::mutex mu;
  int count = 0;                   // guarded by mu
  std::vector<std::string> first;  // guarded by mu

  void add(const std::string& what) {
    std::lock_guard<std::mutex> lock(mu);
    ++count;
    if (first.size() < 5) first.push_back(what);
    std::fprintf(stderr, "error: %s\n", what.c_str());
  }
};

// Figures of one measurement window [t0, t1] (seconds since the start of the run), from the first
// sample at or after t0 to the last at or before t1.
struct Window {
  double seconds = 0;
  double async_tokens_per_s = 0, sync_tokens_per_s = 0, async_requests_per_s = 0;
  double async_finished_tokens_per_s = 0, sync_finished_tokens_per_s = 0;
  double engine_steps_per_s = 0, mean_step_ms = 0, utilization = 0, preemptions = 0;
  double server_sync_queue_ms = -1, server_sync_ttft_ms = -1;  // means; -1: no sync request
};

Window measure(const std::vector<Sample>& samples, double t0, double t1) {
  Window w;
  const Sample* first = nullptr;
  const Sample* last = nullptr;
  double util_sum = 0;
  int n = 0;
  for (const Sample& s : samples) {
    if (s.t < t0 || s.t > t1) continue;
    if (!first) first = &s;
    last = &s;
    util_sum += s.utilization;
    ++n;
  }
  if (!first || last == first) return w;
  w.seconds = last->t - first->t;
  w.async_tokens_per_s = (last->async_tokens - first->async_tokens) / w.seconds;
  w.sync_tokens_per_s = (last->sync_tokens - first->sync_tokens) / w.seconds;
  w.async_requests_per_s = (last->async_finished - first->async_finished) / w.seconds;
  w.async_finished_tokens_per_s =
      (last->async_finished_tokens - first->async_finished_tokens) / w.seconds;
  w.sync_finished_tokens_per_s =
      (last->sync_finished_tokens - first->sync_finished_tokens) / w.seconds;
  double steps = last->steps - first->steps;
  w.engine_steps_per_s = steps / w.seconds;
  w.utilization = util_sum / n;
  w.mean_step_ms = steps > 0 ? w.utilization * w.seconds * 1000 / steps : 0;
  w.preemptions = last->preemptions - first->preemptions;
  double num_queued = last->sync_queue_count - first->sync_queue_count;
  if (num_queued > 0) {
    w.server_sync_queue_ms = 1000 * (last->sync_queue_sum - first->sync_queue_sum) / num_queued;
  }
  double num_first = last->sync_ttft_count - first->sync_ttft_count;
  if (num_first > 0) {
    w.server_sync_ttft_ms = 1000 * (last->sync_ttft_sum - first->sync_ttft_sum) / num_first;
  }
  return w;
}

json window_json(const Window& w) {
  return {{"window_s", w.seconds},
          {"async_tokens_per_s", w.async_tokens_per_s},
          {"sync_tokens_per_s", w.sync_tokens_per_s},
          {"async_requests_per_s", w.async_requests_per_s},
          {"async_finished_tokens_per_s", w.async_finished_tokens_per_s},
          {"sync_finished_tokens_per_s", w.sync_finished_tokens_per_s},
          {"engine_steps_per_s", w.engine_steps_per_s},
          {"mean_step_ms", w.mean_step_ms},
          {"utilization", w.utilization},
          {"preemptions", w.preemptions},
          {"server_sync_queue_ms_mean", w.server_sync_queue_ms},
          {"server_sync_ttft_ms_mean", w.server_sync_ttft_ms}};
}

// Several windows as one: rates and means weighted by each window's length, counts summed.
Window combine(const std::vector<Window>& ws) {
  Window out;
  double sync_queue_s = 0, sync_ttft_s = 0, sync_queue_sum = 0, sync_ttft_sum = 0;
  for (const Window& w : ws) {
    out.seconds += w.seconds;
    out.async_tokens_per_s += w.async_tokens_per_s * w.seconds;
    out.sync_tokens_per_s += w.sync_tokens_per_s * w.seconds;
    out.async_requests_per_s += w.async_requests_per_s * w.seconds;
    out.async_finished_tokens_per_s += w.async_finished_tokens_per_s * w.seconds;
    out.sync_finished_tokens_per_s += w.sync_finished_tokens_per_s * w.seconds;
    out.engine_steps_per_s += w.engine_steps_per_s * w.seconds;
    out.mean_step_ms += w.mean_step_ms * w.seconds;
    out.utilization += w.utilization * w.seconds;
    out.preemptions += w.preemptions;
    if (w.server_sync_queue_ms >= 0) {
      sync_queue_sum += w.server_sync_queue_ms * w.seconds;
      sync_queue_s += w.seconds;
    }
    if (w.server_sync_ttft_ms >= 0) {
      sync_ttft_sum += w.server_sync_ttft_ms * w.seconds;
      sync_ttft_s += w.seconds;
    }
  }
  if (out.seconds <= 0) return Window{};
  for (double* f : {&out.async_tokens_per_s, &out.sync_tokens_per_s, &out.async_requests_per_s,
                    &out.async_finished_tokens_per_s, &out.sync_finished_tokens_per_s,
                    &out.engine_steps_per_s, &out.mean_step_ms, &out.utilization}) {
    *f /= out.seconds;
  }
  out.server_sync_queue_ms = sync_queue_s > 0 ? sync_queue_sum / sync_queue_s : -1;
  out.server_sync_ttft_ms = sync_ttft_s > 0 ? sync_ttft_sum / sync_ttft_s : -1;
  return out;
}

// Submits async batches on its own thread, keeping enough work queued to outlast a phase, and
// cancels them afterwards. start() and the rest are called from one thread.
class AsyncFeeder {
 public:
  AsyncFeeder(const Options& o, Sampler& sampler, Errors& errors)
      : o_(o), sampler_(sampler), errors_(errors), rng_(o.seed + 1) {}
  ~AsyncFeeder() { stop(); }

  // Submits `initial` requests now, then, until stop(), tops the backlog up whenever it holds
  // less than `refill_seconds` of work at the rate requests finish.
  void start(int initial, double refill_seconds) {
    stop();
    stop_ = false;
    num_submitted_ = 0;
    num_submits_ = 0;
    Sample s0 = sampler_.latest();
    sampler_.now(&s0);
    for (int left = initial; left > 0; left -= o_.async_batch)
      submit(std::min(left, o_.async_batch));
    thread_ = std::thread([this, s0, refill_seconds] {
      auto begin = Clock::now();
      while (!stop_) {
        std::this_thread::sleep_for(std::chrono::milliseconds(250));
        Sample s = sampler_.latest();
        double finished = s.async_finished - s0.async_finished;
        double elapsed = seconds_between(begin, Clock::now());
        double rate = elapsed > 1 ? finished / elapsed : 0;
        double want = std::max<double>(o_.async_batch, refill_seconds * rate);
        if (num_submitted_ - finished < want) submit(o_.async_batch);
      }
    });
  }
  void stop() {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  // Cancels every batch submitted so far (after stop()).
  void cancel_all() {
    for (const std::string& id : batches_) {
      auto a = hr::bench::http_call(o_.port, "POST", "/v1/async/" + id + "/cancel", o_.key, "{}");
      if (a.status != 200) errors_.add("cancel " + id + ": HTTP " + std::to_string(a.status));
    }
    batches_.clear();
  }
  int num_submitted() const { return num_submitted_; }
  int num_submits() const { return num_submits_; }

 private:
  void submit(int n) {
    json requests = json::array();
    for (int i = 0; i < n; ++i) {
      requests.push_back({{"messages", chat_messages(random_prompt(rng_, o_))},
                          {"max_tokens", o_.max_tokens},
                          {"temperature", 0}});
    }
    json body = {{"queueRequest", true}, {"requests", std::move(requests)}};
    auto a = hr::bench::http_call(o_.port, "POST", "/ai/run/" + o_.model, o_.key, body.dump());
    json answer = json::parse(a.body, nullptr, false);
    if (a.status < 200 || a.status > 299 || answer.is_discarded() || !answer.contains("result") ||
        !answer["result"].contains("request_id")) {
      errors_.add("async submit: HTTP " + std::to_string(a.status) + ": " + a.body.substr(0, 300));
      return;
    }
    batches_.push_back(answer["result"]["request_id"].get<std::string>());
    num_submitted_ += n;
    ++num_submits_;
  }

  const Options& o_;
  Sampler& sampler_;
  Errors& errors_;
  std::mt19937_64 rng_;
  std::thread thread_;
  std::atomic<bool> stop_{true};
  std::atomic<int> num_submitted_{0};
  std::atomic<int> num_submits_{0};
  std::vector<std::string> batches_;  // the feeder thread's while it runs
};

// Waits until the worker holds no async request (running or waiting) in two samples in a row.
bool wait_async_idle(Sampler& sampler, double timeout_s) {
  auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  int idle = 0;
  while (Clock::now() < deadline) {
    Sample s;
    bool ok = sampler.now(&s);
    idle = ok && s.running_async == 0 && s.waiting_async == 0 ? idle + 1 : 0;
    if (idle >= 2) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(250));
  }
  return false;
}

// Starts the feeder and waits until the engine emits async tokens; returns when they appeared
// (seconds since the start of the run), or -1 after `timeout_s`.
double start_async(AsyncFeeder& feeder, Sampler& sampler, int initial, double refill_seconds,
                   double timeout_s) {
  Sample before;
  if (!sampler.now(&before)) return -1;
  feeder.start(initial, refill_seconds);
  auto deadline = Clock::now() + std::chrono::duration<double>(timeout_s);
  while (Clock::now() < deadline) {
    Sample s;
    if (sampler.now(&s) && s.async_tokens > before.async_tokens) return s.t;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  return -1;
}

struct Arrival {
  double at_s;  // since the phase's start
  std::string body;
};

// Poisson arrivals at `rate` per second for `seconds`, each with a random prompt.
std::vector<Arrival> poisson_schedule(const Options& o, double rate, uint64_t seed,
                                      double seconds) {
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  std::vector<Arrival> out;
  for (double t = gap(rng); t < seconds; t += gap(rng)) {
    out.push_back({t, sync_body(o, random_prompt(rng, o))});
  }
  return out;
}

struct SyncLoad {
  std::vector<SyncPoint> points;  // per arrival, in order
  std::vector<hr::bench::StreamResult> results;
  double max_send_delay_ms = 0;  // how late the client launched a request, at worst
  int max_in_flight = 0;
  bool drained = false;  // every request ended within the drain timeout
};

// Sends each arrival at its scheduled time from a thread of its own (the client never queues),
// timing from the scheduled time, and waits for all of them to end.
SyncLoad run_sync_load(const Options& o, const std::vector<Arrival>& arrivals,
                       Clock::time_point run_t0, Clock::time_point phase_start) {
  struct Shared {
    std::mutex mu;
    std::condition_variable cv;
    int in_flight = 0;                             // guarded by mu
    std::vector<hr::bench::StreamResult> results;  // guarded by mu
  };
  auto shared = std::make_shared<Shared>();
  shared->results.resize(arrivals.size());
  SyncLoad load;
  for (size_t i = 0; i < arrivals.size(); ++i) {
    auto due = phase_start + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(arrivals[i].at_s));
    std::this_thread::sleep_until(due);
    load.max_send_delay_ms =
        std::max(load.max_send_delay_ms,
                 std::chrono::duration<double, std::milli>(Clock::now() - due).count());
    {
      std::lock_guard<std::mutex> lock(shared->mu);
      load.max_in_flight = std::max(load.max_in_flight, ++shared->in_flight);
    }
    std::thread([shared, i, due, &o, body = arrivals[i].body] {
      hr::bench::StreamResult r = hr::bench::stream_chat(o.port, o.key, body, due);
      std::lock_guard<std::mutex> lock(shared->mu);
      shared->results[i] = std::move(r);
      --shared->in_flight;
      shared->cv.notify_all();
    }).detach();
    load.points.push_back({seconds_between(run_t0, due), -1});
  }
  std::unique_lock<std::mutex> lock(shared->mu);
  load.drained = shared->cv.wait_for(lock, std::chrono::duration<double>(o.drain_timeout_s),
                                     [&] { return shared->in_flight == 0; });
  load.results = shared->results;
  for (size_t i = 0; i < load.points.size(); ++i) load.points[i].ttft_ms = load.results[i].ttft_ms;
  return load;
}

// Latency figures of one phase's sync requests (errors counted into `errors`).
json sync_json(const SyncLoad& load, Errors& errors, const char* phase) {
  std::vector<double> ttft, e2e;
  int num_errors = 0;
  double tokens = 0;
  for (const auto& r : load.results) {
    if (!r.ok) {
      ++num_errors;
      errors.add(std::string("sync (phase ") + phase + "): " + r.error);
      continue;
    }
    ttft.push_back(r.ttft_ms);
    e2e.push_back(r.e2e_ms);
    tokens += r.completion_tokens;
  }
  double ttft_sum = 0;
  for (double v : ttft) ttft_sum += v;
  return {
      {"requests", load.results.size()},
      {"errors", num_errors},
      {"ttft_mean_ms", ttft.empty() ? -1.0 : ttft_sum / static_cast<double>(ttft.size())},
      {"ttft_p50_ms", percentile(ttft, 0.50)},
      {"ttft_p99_ms", percentile(ttft, 0.99)},
      {"e2e_p50_ms", percentile(e2e, 0.50)},
      {"e2e_p99_ms", percentile(e2e, 0.99)},
      {"mean_completion_tokens", ttft.empty() ? 0.0 : tokens / static_cast<double>(ttft.size())},
      {"max_in_flight", load.max_in_flight},
      {"max_send_delay_ms", load.max_send_delay_ms}};
}

[[noreturn]] void give_up(const std::string& why, const Errors& errors) {
  std::fprintf(stderr, "flex bench: %s\n", why.c_str());
  std::printf("%s\n", json{{"error", why}, {"errors", errors.count}}.dump().c_str());
  std::fflush(stdout);
  std::_Exit(1);  // request threads may still be blocked on the server
}

Options parse_args(int argc, char** argv) {
  Options o;
  using Set = std::function<void(const std::string&)>;
  const std::map<std::string, Set> flags = {
      {"--port", [&](const std::string& v) { o.port = std::stoi(v); }},
      {"--key", [&](const std::string& v) { o.key = v; }},
      {"--model-name", [&](const std::string& v) { o.model = v; }},
      {"--label", [&](const std::string& v) { o.label = v; }},
      {"--chart", [&](const std::string& v) { o.chart = v; }},
      {"--max-tokens", [&](const std::string& v) { o.max_tokens = std::stoi(v); }},
      {"--phase-seconds", [&](const std::string& v) { o.phase_seconds = std::stod(v); }},
      {"--rounds", [&](const std::string& v) { o.rounds = std::stoi(v); }},
      {"--warmup-seconds", [&](const std::string& v) { o.warmup_seconds = std::stod(v); }},
      {"--sync-fraction", [&](const std::string& v) { o.sync_fraction = std::stod(v); }},
      {"--calibration-requests", [&](const std::string& v) { o.num_calibration = std::stoi(v); }},
      {"--async-batch", [&](const std::string& v) { o.async_batch = std::stoi(v); }},
      {"--min-letters", [&](const std::string& v) { o.min_letters = std::stoi(v); }},
      {"--max-letters", [&](const std::string& v) { o.max_letters = std::stoi(v); }},
      {"--seed", [&](const std::string& v) { o.seed = std::stoull(v); }},
      {"--drain-timeout-seconds", [&](const std::string& v) { o.drain_timeout_s = std::stod(v); }},
  };
  for (int i = 1; i < argc; i += 2) {
    auto it = flags.find(argv[i]);
    if (it == flags.end() || i + 1 == argc) {
      std::fprintf(stderr, "flex bench: unknown option or missing value: %s\n", argv[i]);
      std::exit(2);
    }
    it->second(argv[i + 1]);
  }
  if (o.port <= 0 || o.key.empty() || o.rounds < 1 ||
      o.phase_seconds / o.rounds <= o.warmup_seconds || o.async_batch < 1) {
    std::fprintf(stderr,
                 "usage: headroom_flex_bench --port N --key KEY [--model-name NAME] "
                 "[--max-tokens N] [--phase-seconds S] [--chart PATH] [--label L] ...\n");
    std::exit(2);
  }
  return o;
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = parse_args(argc, argv);
  const Clock::time_point t0 = Clock::now();
  auto since_t0 = [&] { return seconds_between(t0, Clock::now()); };
  Errors errors;
  Sampler sampler(o.port, t0);
  sampler.start();
  AsyncFeeder feeder(o, sampler, errors);
  std::vector<hr::bench::PhaseMark> marks;

  // Warm-up and calibration: sequential sync requests give the mean completion length.
  double calib_tokens = 0;
  int calib_ok = 0;
  std::mt19937_64 calib_rng(o.seed + 2);
  for (int i = 0; i < o.num_calibration; ++i) {
    auto r = hr::bench::stream_chat(o.port, o.key, sync_body(o, random_prompt(calib_rng, o)),
                                    Clock::now());
    if (!r.ok) {
      errors.add("sync (calibration): " + r.error);
      continue;
    }
    calib_tokens += r.completion_tokens;
    ++calib_ok;
  }
  if (calib_ok == 0) give_up("no calibration request succeeded", errors);
  const double mean_tokens = calib_tokens / calib_ok;
  std::fprintf(stderr, "[%s] calibration: %.1f completion tokens per sync answer\n",
               o.label.c_str(), mean_tokens);

  // (c) async only: the capacity, measured from `warmup_seconds` after async tokens appear.
  double c_start = since_t0();
  double c_flow = start_async(feeder, sampler, 2 * o.async_batch, 10, o.drain_timeout_s);
  if (c_flow < 0) give_up("no async token appeared in phase c", errors);
  std::this_thread::sleep_until(t0 + std::chrono::duration_cast<Clock::duration>(
                                         std::chrono::duration<double>(c_flow + o.phase_seconds)));
  double c_end = since_t0();
  feeder.stop();
  int c_submitted = feeder.num_submitted();
  feeder.cancel_all();
  Window c = measure(sampler.all(), c_flow + o.warmup_seconds, c_end);
  marks.push_back({"C ASYNC ONLY", c_start, c_flow + o.warmup_seconds, c_end});
  const double capacity = c.async_tokens_per_s;
  std::fprintf(stderr, "[%s] c: capacity %.0f tokens/s (%.1f requests/s)\n", o.label.c_str(),
               capacity, c.async_requests_per_s);
  if (!(capacity > 0)) give_up("phase c measured no async throughput", errors);
  if (!wait_async_idle(sampler, o.drain_timeout_s))
    give_up("cancelled async work did not end", errors);

  // The sync load: the same arrivals in (a) and (b). A sync token costs the engine more time
  // than an async one (smaller batches, prompts computed in steps of their own), so the rate is
  // set on engine time: a short sync-only probe at the token-based rate, then scaled so that the
  // engine is busy `sync_fraction` of the time.
  const double token_rate = o.sync_fraction * capacity / mean_tokens;
  double probe_start = since_t0();
  const double probe_seconds = std::max(6.0, o.warmup_seconds + 4);
  SyncLoad probe_load = run_sync_load(o, poisson_schedule(o, token_rate, o.seed + 1, probe_seconds),
                                      t0, Clock::now());
  if (!probe_load.drained) give_up("sync requests of the probe did not end", errors);
  Window probe =
      measure(sampler.all(), probe_start + o.warmup_seconds, probe_start + probe_seconds);
  double probe_util = probe.utilization;
  const double rate =
      probe_util > 0 ? token_rate * std::clamp(o.sync_fraction / probe_util, 0.1, 2.0) : token_rate;
  const std::vector<Arrival> arrivals = poisson_schedule(o, rate, o.seed, o.phase_seconds);
  std::fprintf(stderr,
               "[%s] sync load: %.2f requests/s (probe at %.2f/s kept the engine %.0f%% busy), "
               "%zu per phase, in %d rounds\n",
               o.label.c_str(), rate, token_rate, 100 * probe_util, arrivals.size(), o.rounds);

  // (a) and (b) alternate in `rounds` slices, each round's (a) and (b) with the same arrivals, so
  // that the machine's drift over the run (other work on the host) falls on both alike.
  const double slice = o.phase_seconds / o.rounds;
  SyncLoad a_load, b_load;  // every round's requests
  std::vector<Window> a_windows, b_windows;
  int b_submitted = 0, b_submits = 0;
  auto add_load = [](SyncLoad* all, SyncLoad&& part) {
    all->points.insert(all->points.end(), part.points.begin(), part.points.end());
    all->results.insert(all->results.end(), part.results.begin(), part.results.end());
    all->max_send_delay_ms = std::max(all->max_send_delay_ms, part.max_send_delay_ms);
    all->max_in_flight = std::max(all->max_in_flight, part.max_in_flight);
  };
  for (int round = 0; round < o.rounds; ++round) {
    std::vector<Arrival> part;
    for (const Arrival& x : arrivals) {
      if (x.at_s >= round * slice && x.at_s < (round + 1) * slice) {
        part.push_back({x.at_s - round * slice, x.body});
      }
    }
    const std::string n = std::to_string(round + 1);

    // (a) sync only.
    double a_start = since_t0();
    SyncLoad a_part = run_sync_load(o, part, t0, Clock::now());
    if (!a_part.drained) give_up("sync requests of phase a did not end", errors);
    double a_end = a_start + slice;
    a_windows.push_back(measure(sampler.all(), a_start + o.warmup_seconds, a_end));
    marks.push_back({"A" + n + " SYNC ONLY", a_start, a_start + o.warmup_seconds, a_end});
    add_load(&a_load, std::move(a_part));

    // (b) the same sync arrivals over an async backlog that outlasts the slice, starting
    // `warmup_seconds` after async tokens appear.
    double b_start = since_t0();
    int backlog =
        static_cast<int>(std::ceil(capacity / mean_tokens * (slice + o.warmup_seconds + 10)));
    if (start_async(feeder, sampler, std::max(backlog, 2 * o.async_batch), 5, o.drain_timeout_s) <
        0) {
      give_up("no async token appeared in phase b", errors);
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(o.warmup_seconds));
    double b_sync_start = since_t0();
    SyncLoad b_part = run_sync_load(o, part, t0, Clock::now());
    double b_end = b_sync_start + slice;
    feeder.stop();
    b_submitted += feeder.num_submitted();
    b_submits += feeder.num_submits();
    feeder.cancel_all();
    if (!b_part.drained) give_up("sync requests of phase b did not end", errors);
    b_windows.push_back(measure(sampler.all(), b_sync_start + o.warmup_seconds, b_end));
    marks.push_back({"B" + n + " SYNC + ASYNC", b_start, b_sync_start + o.warmup_seconds, b_end});
    add_load(&b_load, std::move(b_part));
    if (!wait_async_idle(sampler, o.drain_timeout_s))
      give_up("cancelled async work did not end", errors);
  }
  sampler.stop();
  const Window a = combine(a_windows);
  const Window b = combine(b_windows);
  json a_json = sync_json(a_load, errors, "a");
  json b_json = sync_json(b_load, errors, "b");
  std::fprintf(stderr, "[%s] a: ttft p50 %.1f ms p99 %.1f ms\n", o.label.c_str(),
               a_json["ttft_p50_ms"].get<double>(), a_json["ttft_p99_ms"].get<double>());
  std::fprintf(stderr, "[%s] b: ttft p50 %.1f ms p99 %.1f ms, async %.0f tokens/s\n",
               o.label.c_str(), b_json["ttft_p50_ms"].get<double>(),
               b_json["ttft_p99_ms"].get<double>(), b.async_tokens_per_s);

  double a_p99 = a_json["ttft_p99_ms"].get<double>();
  double b_p99 = b_json["ttft_p99_ms"].get<double>();
  double left = capacity - b.sync_tokens_per_s;
  // Sync's share of the engine measured as the time it took in (a), rather than its tokens.
  double left_time = capacity * (1 - a.utilization);
  json out;
  out["label"] = o.label;
  out["model"] = o.model;
  out["max_tokens"] = o.max_tokens;
  out["phase_seconds"] = o.phase_seconds;
  out["rounds"] = o.rounds;
  out["warmup_seconds"] = o.warmup_seconds;
  out["sync_p99_ttft_ratio"] = a_p99 > 0 && b_p99 > 0 ? b_p99 / a_p99 : -1.0;
  out["async_fill_ratio"] = left_time > 0 ? b.async_tokens_per_s / left_time : -1.0;
  out["async_fill_ratio_by_tokens"] = left > 0 ? b.async_tokens_per_s / left : -1.0;
  out["sync_rate_token_based_per_s"] = token_rate;
  out["probe_utilization"] = probe_util;
  out["capacity_tokens_per_s"] = capacity;
  out["sync_rate_per_s"] = rate;
  out["sync_tokens_per_s"] = b.sync_tokens_per_s;
  out["async_tokens_per_s"] = b.async_tokens_per_s;
  out["calibration_completion_tokens"] = mean_tokens;
  json jc = window_json(c);
  jc["async_requests_submitted"] = c_submitted;
  json ja = a_json;
  ja.update(window_json(a));
  json jb = b_json;
  jb.update(window_json(b));
  jb["async_requests_submitted"] = b_submitted;
  jb["async_submits"] = b_submits;
  out["phases"] = {{"c_async_only", jc}, {"a_sync_only", ja}, {"b_sync_plus_async", jb}};
  out["metrics_failures"] = sampler.failures();

  if (!o.chart.empty()) {
    std::vector<SyncPoint> points = a_load.points;
    points.insert(points.end(), b_load.points.begin(), b_load.points.end());
    char title[256];
    std::snprintf(title, sizeof title, "%s  %s  SYNC %.2f/S  CAPACITY %.0f TOKENS/S",
                  o.label.c_str(), o.model.c_str(), rate, capacity);
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(o.chart).parent_path(), ec);
    if (!hr::bench::write_flex_chart(o.chart, title, sampler.all(), points, marks, capacity)) {
      errors.add("cannot write the chart to " + o.chart);
    }
    out["chart"] = o.chart;
  }
  out["errors"] = errors.count;
  out["error_samples"] = errors.first;
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
