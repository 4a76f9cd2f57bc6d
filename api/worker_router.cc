// Placing sync calls on remote workers, and forwarding them.
#include "api/worker_router.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <limits>
#include <thread>

#include "api/internal/worker_call.h"
#include "base/clock.h"
#include "base/hash.h"
#include "base/log.h"
#include "base/metrics.h"
#include "wire/openai_chat.h"
#include "wire/worker_protocol.h"

namespace hr::api {

using nlohmann::json;

namespace {

int load_of(const queue::WorkerInfo& w, int in_flight) { return std::max(w.sync_load, in_flight); }

Result<SyncAnswer> answer_from_json(const json& j, const std::string& worker) {
  Result<wire::Answer> a = wire::answer_from_protocol(j);
  if (!a.is_ok()) return internal_error("malformed answer from worker " + worker);
  return SyncAnswer{std::move(a).value(), worker};
}

metrics::Counter& routed(const std::string& outcome) {
  return metrics::counter("headroom_sync_routed_total",
                          "Sync calls forwarded to workers, by outcome",
                          "outcome=\"" + outcome + "\"");
}

}  // namespace

std::vector<size_t> route_order(const std::vector<queue::WorkerInfo>& workers,
                                const std::vector<int>& in_flight, const std::string& affinity,
                                uint64_t seed) {
  std::vector<size_t> order(workers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (!affinity.empty()) {
    std::vector<uint64_t> score(workers.size());
    for (size_t i = 0; i < workers.size(); ++i)
      score[i] = rendezvous_score(affinity, workers[i].id);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return score[a] != score[b] ? score[a] > score[b] : workers[a].id < workers[b].id;
    });
    return order;
  }
  // Least loaded by the fraction of sync capacity in use, in eighths: announced loads are up to a
  // heartbeat old (and may still count this API's finished calls), so finer differences are
  // noise and would send every call to one worker until the next heartbeat. Then fewer async
  // sequences (less to preempt); then a per-call random order, so equal workers share the traffic.
  auto fraction = [&](size_t i) {
    int cap = std::max(1, workers[i].capacity);
    return 8 * load_of(workers[i], in_flight[i]) / cap;
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    int fa = fraction(a), fb = fraction(b);
    if (fa != fb) return fa < fb;
    if (workers[a].async_running != workers[b].async_running) {
      return workers[a].async_running < workers[b].async_running;
    }
    return mix64(seed ^ fnv1a64(workers[a].id)) < mix64(seed ^ fnv1a64(workers[b].id));
  });
  return order;
}

bool has_room(const queue::WorkerInfo& w, int in_flight) {
  return !w.draining && load_of(w, in_flight) < w.capacity;
}

struct WorkerRouter::Attempt {
  WorkerRouter* router;
  std::string worker_id;
  std::string url;
  bool counted = true;  // in in_flight_
  ~Attempt() {
    if (!counted) return;
    std::lock_guard<std::mutex> lock(router->mu_);
    auto it = router->in_flight_.find(worker_id);
    if (it != router->in_flight_.end() && --it->second <= 0) router->in_flight_.erase(it);
  }
};

WorkerRouter::WorkerRouter(RouterOptions options) : options_(std::move(options)) {}

WorkerRouter::~WorkerRouter() = default;

Result<std::vector<queue::WorkerInfo>> WorkerRouter::workers_of(const std::string& model) {
  // Called with mu_ held.
  int64_t now = steady_now_ns();
  ModelView& view = views_[model];
  if (view.fetched_ns != 0 && now - view.fetched_ns < int64_t{options_.refresh_ms} * 1000000) {
    return view.workers;
  }
  Status st = Status::ok();
  if (!registry_) {
    auto r = queue::WorkerRegistry::connect(options_.redis_url, 1000);
    if (r.is_ok()) {
      registry_ = std::move(r).value();
    } else {
      st = r.status();
    }
  }
  if (registry_) {
    Result<std::vector<queue::WorkerInfo>> live = registry_->live(model);
    if (live.is_ok()) {
      view.workers = std::move(live).value();
      view.fetched_ns = now;
      return view.workers;
    }
    st = live.status();
    registry_.reset();
  }
  // The registry is unreachable: a recent view is better than nothing.
  if (view.fetched_ns != 0 && now - view.fetched_ns < int64_t{10000} * 1000000) return view.workers;
  log::warn("router.registry_unavailable", {{"error", st}});
  return unavailable("the worker registry is unavailable: " + st.message());
}

void WorkerRouter::suspect(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  suspect_until_ns_[worker_id] = steady_now_ns() + int64_t{options_.suspect_ms} * 1000000;
}

Result<std::shared_ptr<WorkerRouter::Attempt>> WorkerRouter::place(
    const SyncCall& call, const std::vector<std::string>& skip) {
  const int64_t deadline =
      steady_now_ns() + (call.reject_if_busy ? 0 : int64_t{call.queue_timeout_ms} * 1000000);
  for (;;) {
    bool any_live = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      HR_ASSIGN_OR_RETURN(std::vector<queue::WorkerInfo> all, workers_of(call.model));
      int64_t now = steady_now_ns();
      std::vector<queue::WorkerInfo> workers;
      std::vector<int> in_flight;
      for (queue::WorkerInfo& w : all) {
        if (w.draining || std::find(skip.begin(), skip.end(), w.id) != skip.end()) continue;
        auto s = suspect_until_ns_.find(w.id);
        if (s != suspect_until_ns_.end()) {
          if (s->second > now) continue;
          suspect_until_ns_.erase(s);
        }
        auto f = in_flight_.find(w.id);
        in_flight.push_back(f == in_flight_.end() ? 0 : f->second);
        workers.push_back(std::move(w));
      }
      any_live = !workers.empty();
      std::vector<size_t> order = route_order(workers, in_flight, call.affinity, mix64(++calls_));
      // With affinity only the owner will do: moving the conversation loses its cached prefix.
      if (!call.affinity.empty() && order.size() > 1) order.erase(order.begin() + 1, order.end());
      for (size_t i : order) {
        // A flex call waits in the worker's engine, on the room sync calls leave: it needs none
        // of their room, and takes none (it is not counted in flight).
        if (call.flex) {
          return std::shared_ptr<Attempt>(
              new Attempt{this, workers[i].id, workers[i].url, /*counted=*/false});
        }
        if (!has_room(workers[i], in_flight[i])) continue;
        ++in_flight_[workers[i].id];
        return std::shared_ptr<Attempt>(new Attempt{this, workers[i].id, workers[i].url});
      }
    }
    if (call.client_gone && call.client_gone()) {
      routed("client_gone").add();
      return Status(StatusCode::kCancelled, "the client went away while the call waited for room");
    }
    if (steady_now_ns() >= deadline) {
      routed("no_capacity").add();
      return Status(StatusCode::kResourceExhausted,
                    any_live ? "Out of capacity: every worker for " + call.model + " is busy"
                             : "Out of capacity: no worker is serving " + call.model);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string WorkerRouter::body_for(const wire::ChatRequest& request, const SyncCall& call,
                                   bool stream) const {
  return wire::encode_forwarded_call({request, stream, call.reject_if_busy, call.queue_timeout_ms,
                                      call.cache_namespace, call.flex, call.flex_timeout_ms});
}

template <typename T, typename OnOk>
Result<T> WorkerRouter::forward(const SyncCall& call, const std::string& body, OnOk on_ok) {
  std::vector<std::string> skip;
  Status last = Status::ok();
  for (int attempt = 0; attempt < options_.max_attempts; ++attempt) {
    HR_ASSIGN_OR_RETURN(std::shared_ptr<Attempt> a, place(call, skip));
    auto wc = std::make_unique<WorkerCall>(options_, &connections_, call.client_gone);
    Status st = wc->open(a->url, body);
    std::optional<Result<T>> got;
    if (!st.is_ok()) {
      got.emplace(st);
    } else if (wc->status() == 200) {
      got.emplace(on_ok(a, std::move(wc)));
    }
    if (got && !got->is_ok() && got->status().code() == StatusCode::kUnavailable) {
      // Unreachable, or gone mid-answer: nothing reached the client yet, so another worker may
      // answer instead.
      log::warn("router.worker_failed", {{"worker", a->worker_id}, {"error", got->status()}});
      routed("worker_failed").add();
      suspect(a->worker_id);
      connections_.forget(a->url);
      skip.push_back(a->worker_id);
      last = got->status();
      continue;
    }
    if (got) {
      const bool left = !got->is_ok() && got->status().code() == StatusCode::kCancelled;
      routed(got->is_ok() ? "ok" : left ? "client_gone" : "error").add();
      return std::move(*got);
    }
    Result<std::string> text = wc->read_all();
    Status err = wire::status_from_protocol_error(wc->status(), text.is_ok() ? *text : "");
    // A worker that says another may take the call (it is stopping, or its engine failed before
    // the call's answer began) hands it on; so does a full one when the call may wait for room. A
    // flex call waits in the worker, not for room: its refusal is the answer.
    if ((text.is_ok() && wire::protocol_retry_elsewhere(*text)) ||
        (err.code() == StatusCode::kResourceExhausted && !call.reject_if_busy && !call.flex)) {
      skip.push_back(a->worker_id);
      last = err;
      continue;
    }
    routed("error").add();
    return err;
  }
  return last.code() == StatusCode::kResourceExhausted
             ? last
             : unavailable("no worker could answer: " + last.message());
}

Result<SyncAnswer> WorkerRouter::run(const wire::ChatRequest& request, const SyncCall& call) {
  return forward<SyncAnswer>(
      call, body_for(request, call, false),
      [](const std::shared_ptr<Attempt>& a, std::unique_ptr<WorkerCall> wc) -> Result<SyncAnswer> {
        HR_ASSIGN_OR_RETURN(std::string answer, wc->read_all());
        return answer_from_json(json::parse(answer, nullptr, false), a->worker_id);
      });
}

namespace {

// A streamed answer read from a worker's x-ndjson lines.
class RemoteStream final : public wire::AnswerStream {
 public:
  RemoteStream(std::shared_ptr<void> attempt, std::unique_ptr<WorkerCall> call, std::string worker)
      : attempt_(std::move(attempt)), call_(std::move(call)), worker_(std::move(worker)) {}

  bool next(std::string* delta) override {
    if (finished_) return false;
    for (;;) {
      size_t nl = pending_.find('\n');
      if (nl != std::string::npos) {
        json line = json::parse(pending_.substr(0, nl), nullptr, false);
        pending_.erase(0, nl + 1);
        if (line.contains("delta") && line["delta"].is_string()) {
          *delta = line["delta"];
          logprobs_.reset();
          Result<std::vector<wire::ToolCallDelta>> calls =
              wire::delta_tool_calls_from_protocol(line);
          if (!calls.is_ok()) {
            status_ = internal_error("malformed tool call pieces from worker " + worker_);
            return finish();
          }
          calls_ = std::move(calls).value();
          if (line.contains("logprobs") && line["logprobs"].is_array()) {
            Result<std::vector<wire::TokenLogprob>> lp =
                wire::logprob_entries_from_json(line["logprobs"]);
            if (!lp.is_ok()) {
              status_ = internal_error("malformed logprobs from worker " + worker_);
              return finish();
            }
            logprobs_ = std::move(lp).value();
          }
          return true;
        }
        if (line.contains("answer")) {
          Result<SyncAnswer> a = answer_from_json(line["answer"], worker_);
          if (a.is_ok()) {
            answer_ = std::move(a->answer);
          } else {
            status_ = a.status();
          }
        } else {
          status_ = wire::status_from_protocol_error(200, line.dump());
        }
        call_->finish_reading();
        return finish();
      }
      Result<bool> more = call_->read_some(&pending_);
      if (!more.is_ok() || !*more) {
        status_ = unavailable("worker " + worker_ + " stopped before the answer was complete");
        return finish();
      }
    }
  }
  const wire::Logprobs& delta_logprobs() const override { return logprobs_; }
  const std::vector<wire::ToolCallDelta>& delta_tool_calls() const override { return calls_; }
  const Status& status() const override { return status_; }
  const wire::Answer& answer() const override { return answer_; }
  std::string worker() const override { return worker_; }

 private:
  bool finish() {
    finished_ = true;
    call_.reset();     // the connection is closed, or kept for the next call when read to its end
    attempt_.reset();  // the worker's slot is free again
    return false;
  }
  std::shared_ptr<void> attempt_;
  std::unique_ptr<WorkerCall> call_;
  std::string worker_;
  std::string pending_;
  wire::Logprobs logprobs_;                 // the last delta's
  std::vector<wire::ToolCallDelta> calls_;  // the last delta's
  bool finished_ = false;
  Status status_;
  wire::Answer answer_;
};

}  // namespace

Result<std::unique_ptr<wire::AnswerStream>> WorkerRouter::start_stream(
    const wire::ChatRequest& request, const SyncCall& call) {
  return forward<std::unique_ptr<wire::AnswerStream>>(
      call, body_for(request, call, true),
      [](const std::shared_ptr<Attempt>& a,
         std::unique_ptr<WorkerCall> wc) -> Result<std::unique_ptr<wire::AnswerStream>> {
        return std::unique_ptr<wire::AnswerStream>(
            new RemoteStream(a, std::move(wc), a->worker_id));
      });
}

}  // namespace hr::api
