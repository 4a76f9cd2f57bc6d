// The worker's step loop.
#include "workers/worker.h"

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <future>
#include <limits>
#include <unordered_map>
#include <utility>

#include "api/errors.h"
#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/priority.h"
#include "engine/backend_factory.h"
#include "engine/chat_template.h"
#include "engine/model_config.h"
#include "engine/tokenizer.h"
#include "queue/lease.h"
#include "workers/answer_logprobs.h"
#include "workers/queue_io.h"
#include "workers/utilization.h"

namespace hr::workers {

using nlohmann::json;

// Tokens as OpenAI's logprobs show them: text ("bytes:" and escapes where the bytes are not UTF-8
// on their own, as for part of a character), log probability and bytes. The text and bytes of
// each token are worked out once. Used by the step loop alone.
class TokenShapes {
 public:
  explicit TokenShapes(std::shared_ptr<const engine::Tokenizer> tok) : tok_(std::move(tok)) {}

  json entry(int32_t id, float logprob) {
    if (id >= static_cast<int32_t>(shapes_.size())) shapes_.resize(static_cast<size_t>(id) + 1);
    json& shape = shapes_[static_cast<size_t>(id)];
    if (shape.is_null()) shape = make(id);
    json e = shape;
    // -inf (a token the logits gave no weight) has no JSON number: the lowest float stands in.
    e["logprob"] = std::isfinite(logprob) ? logprob : -std::numeric_limits<float>::max();
    return e;
  }

 private:
  json make(int32_t id) const {
    const std::string raw = tok_->token_bytes(id);
    json bytes = json::array();
    for (unsigned char c : raw) bytes.push_back(static_cast<int>(c));
    std::string text = raw;
    try {
      (void)json(raw).dump();  // what the answer will go through
    } catch (const json::exception&) {
      static const char* kHex = "0123456789abcdef";
      text = "bytes:";
      for (unsigned char c : raw) text += std::string("\\x") + kHex[c >> 4] + kHex[c & 15];
    }
    return {{"token", std::move(text)}, {"bytes", std::move(bytes)}};
  }

  std::shared_ptr<const engine::Tokenizer> tok_;
  std::vector<json> shapes_;
};

struct LoadedModel {
  engine::ModelConfig config;
  std::shared_ptr<const engine::Tokenizer> tokenizer;
  engine::ChatFormat chat_format = engine::ChatFormat::kHeadroom;
  std::unique_ptr<engine::Engine> engine;
  std::unique_ptr<TokenShapes> token_shapes;  // created with the tokenizer
};

namespace {

// Turns a stored request body into the engine's request; errors name the field.
Result<engine::GenerationRequest> to_generation(const json& body, const LoadedModel& m,
                                                engine::RequestClass cls) {
  std::vector<engine::ChatMessage> messages;
  if (body.contains("messages")) {
    for (const auto& msg : body["messages"]) {
      messages.push_back({msg.value("role", ""), msg.value("content", "")});
    }
  } else {
    messages.push_back({"user", body.value("prompt", "")});
  }
  HR_ASSIGN_OR_RETURN(std::string text,
                      engine::render_chat(m.chat_format, messages, m.tokenizer->bos_text(),
                                          m.tokenizer->eos_text()));
  engine::GenerationRequest r;
  r.prompt = m.tokenizer->encode(text);
  r.cls = cls;
  r.params.max_tokens = body.value("max_tokens", 256);
  r.params.temperature = body.value("temperature", 0.6f);
  r.params.top_p = body.value("top_p", 1.0f);
  r.params.top_k = body.value("top_k", 0);
  r.params.penalties = {body.value("frequency_penalty", 0.0f), body.value("presence_penalty", 0.0f),
                        body.value("repetition_penalty", 1.0f)};
  if (body.value("logprobs", false)) r.params.logprobs = body.value("top_logprobs", 0);
  if (auto lb = body.find("logit_bias"); lb != body.end() && lb->is_object()) {
    for (const auto& [key, value] : lb->items()) {
      const int64_t id = std::strtoll(key.c_str(), nullptr, 10);
      if (id < 0 || id >= m.config.vocab_size) {
        return invalid_argument("logit_bias names token " + key + "; the model's vocabulary has " +
                                    std::to_string(m.config.vocab_size) + " tokens",
                                "logit_bias." + key);
      }
      r.params.logit_bias.push_back({static_cast<int32_t>(id), value.get<float>()});
    }
  }
  if (body.contains("seed")) r.params.seed = body["seed"].get<uint64_t>();
  if (body.contains("stop")) r.params.stop = body["stop"].get<std::vector<std::string>>();
  return r;
}

// An event's entry in OpenAI's logprobs content (token, log probability, bytes, top_logprobs), or
// null for an event without log probabilities.
json logprob_entry(TokenShapes& shapes, const engine::TokenEvent& ev) {
  if (!ev.logprobs || ev.token < 0) return json();
  json entry = shapes.entry(ev.token, ev.logprobs->logprob);
  json top = json::array();
  for (int i = 0; i < ev.logprobs->num_top; ++i) {
    top.push_back(shapes.entry(ev.logprobs->top_ids[i], ev.logprobs->top_logprobs[i]));
  }
  entry["top_logprobs"] = std::move(top);
  return entry;
}

// AnswerLogprobs::add for an engine event.
void add_event(AnswerLogprobs& lp, TokenShapes& shapes, const engine::TokenEvent& ev) {
  if (!lp.wanted()) return;
  lp.add(logprob_entry(shapes, ev), ev.text_bytes, ev.text_delta.size(), ev.finished);
}

std::string default_worker_name() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return std::string(host) + ":" + std::to_string(getpid());
}

}  // namespace

Result<std::unique_ptr<Worker>> Worker::create(const WorkerConfig& given,
                                               const queue::StoreConfig& store,
                                               std::shared_ptr<engine::Backend> backend) {
  const WorkerConfig config = given.resolved();
  std::unique_ptr<Worker> w(new Worker(config, store));
  if (w->config_.worker_name.empty()) w->config_.worker_name = default_worker_name();
  auto m = std::make_unique<LoadedModel>();
  HR_ASSIGN_OR_RETURN(m->config, engine::load_model_config(config.model_dir));
  HR_ASSIGN_OR_RETURN(auto tok, engine::Tokenizer::load(config.model_dir));
  m->tokenizer = std::shared_ptr<const engine::Tokenizer>(tok.release());
  m->token_shapes = std::make_unique<TokenShapes>(m->tokenizer);
  HR_ASSIGN_OR_RETURN(m->chat_format,
                      engine::load_chat_format(config.model_dir, config.chat_template));
  engine::BackendSpec spec;
  spec.device = config.device;
  spec.cuda_options = config.cuda_options;
  spec.kv_cache_bytes = static_cast<size_t>(config.kv_cache_bytes);
  spec.max_num_tokens = config.max_batched_tokens;
  spec.max_num_seqs = config.max_num_seqs;
  spec.cpu_thread_nice = config.engine_nice;
  if (!backend) {
    HR_ASSIGN_OR_RETURN(backend, engine::make_backend(config.model_dir, spec));
  }
  engine::EngineOptions eo;
  eo.max_model_len = config.max_model_len;
  eo.scheduler.max_num_seqs = config.max_num_seqs;
  eo.scheduler.max_batched_tokens = config.max_batched_tokens;
  eo.scheduler.max_prefill_chunk = config.max_batched_tokens;
  eo.scheduler.max_async_tokens_with_sync = config.async_tokens_with_sync;
  eo.scheduler.sync_prefill_alone = config.sync_prefill_alone;
  HR_ASSIGN_OR_RETURN(m->engine, engine::Engine::create(std::move(backend), m->tokenizer,
                                                        m->config.max_position_embeddings, eo));
  // Decode graphs are captured now, not while the first requests wait.
  const int64_t warm_start = steady_now_ns();
  HR_RETURN_IF_ERROR(m->engine->warm_up());
  log::info("worker.model_loaded",
            {{"model", config.model_name},
             {"dir", config.model_dir},
             {"weight_bytes", static_cast<int64_t>(m->engine->backend().weight_bytes())},
             {"kv_blocks", m->engine->headroom().total_kv_blocks},
             {"backend", m->engine->backend().name()},
             {"pipelined", m->engine->pipelined()},
             {"max_num_seqs", config.max_num_seqs},
             {"max_batched_tokens", config.max_batched_tokens},
             {"context_length", m->engine->context_length()},
             {"warm_up_ms", (steady_now_ns() - warm_start) / 1000000}});
  w->model_ = std::move(m);
  return w;
}

// One sync request: its deltas and final answer, handed from the step loop to the waiting
// handler thread under `mu`.
struct Worker::SyncJob {
  engine::GenerationRequest request;
  std::string text;
  AnswerLogprobs logprobs{false};  // step loop only
  std::promise<Result<api::SyncAnswer>> done;
  bool streaming = false;
  std::mutex mu;
  std::condition_variable cv;
  // A streamed answer's pieces: text, and the logprobs entries it completes (null when none were
  // asked for).
  struct Piece {
    std::string text;
    json logprobs;
  };
  std::deque<Piece> pieces;  // guarded by mu
  bool finished = false;     // guarded by mu
  Status status;             // guarded by mu
  api::SyncAnswer answer;    // guarded by mu
  int64_t arrival_ns = steady_now_ns();
  std::atomic<bool> abandoned{false};  // the client went away: cancel in the engine
  int64_t engine_id = -1;              // step loop only
};

namespace {

// Holds one of the worker's sync slots (one count in `active`) for as long as it lives; adopts a
// slot that Worker::take_sync_slot() has already counted.
class ActiveSync {
 public:
  explicit ActiveSync(std::atomic<int>& active) : active_(&active) {}
  ~ActiveSync() {
    if (active_) --*active_;
  }
  ActiveSync(ActiveSync&& other) noexcept : active_(std::exchange(other.active_, nullptr)) {}
  ActiveSync(const ActiveSync&) = delete;
  ActiveSync& operator=(const ActiveSync&) = delete;
  ActiveSync& operator=(ActiveSync&&) = delete;

 private:
  std::atomic<int>* active_;
};

class WorkerStream final : public api::SyncStream {
 public:
  WorkerStream(std::shared_ptr<Worker::SyncJob> job, ActiveSync active)
      : job_(std::move(job)), active_(std::move(active)) {}
  // Dropped before the end (the client left): the step loop cancels the request.
  ~WorkerStream() override { job_->abandoned = true; }
  bool next(std::string* delta) override {
    std::unique_lock<std::mutex> lock(job_->mu);
    job_->cv.wait(lock, [&] { return !job_->pieces.empty() || job_->finished; });
    if (!job_->pieces.empty()) {
      *delta = std::move(job_->pieces.front().text);
      logprobs_ = std::move(job_->pieces.front().logprobs);
      job_->pieces.pop_front();
      return true;
    }
    status_ = job_->status;
    answer_ = job_->answer;
    return false;
  }
  const json& delta_logprobs() const override { return logprobs_; }
  const Status& status() const override { return status_; }
  const api::SyncAnswer& answer() const override { return answer_; }

 private:
  std::shared_ptr<Worker::SyncJob> job_;
  ActiveSync active_;
  Status status_;
  api::SyncAnswer answer_;
  json logprobs_;
};

// Request metrics of one class (sync or async).
struct ClassMetrics {
  explicit ClassMetrics(const std::string& cls)
      : labels("class=\"" + cls + "\""),
        ttft(metrics::histogram("headroom_time_to_first_token_seconds",
                                "Time from arrival at the worker to the first generated token",
                                labels)),
        itl(metrics::histogram("headroom_inter_token_latency_seconds",
                               "Time between consecutive generated tokens", labels)),
        e2e(metrics::histogram("headroom_e2e_latency_seconds",
                               "Time from arrival at the worker to the last token", labels)),
        queue(metrics::histogram("headroom_queue_time_seconds",
                                 "Sync: waiting for the step loop; async: from batch submit to "
                                 "being pulled by a worker",
                                 labels)),
        prompt(metrics::counter("headroom_prompt_tokens_total",
                                "Prompt tokens of finished requests", labels)),
        cached(metrics::counter("headroom_cached_prompt_tokens_total",
                                "Prompt tokens served from the prefix cache", labels)),
        generated(metrics::counter("headroom_generation_tokens_total",
                                   "Generated tokens of finished requests", labels)),
        running(metrics::gauge("headroom_requests_running", "Requests in the engine, generating",
                               labels)),
        waiting(metrics::gauge("headroom_requests_waiting",
                               "Requests in the engine, waiting to be scheduled", labels)) {}
  std::string labels;
  metrics::Histogram& ttft;
  metrics::Histogram& itl;
  metrics::Histogram& e2e;
  metrics::Histogram& queue;
  metrics::Counter& prompt;
  metrics::Counter& cached;
  metrics::Counter& generated;
  metrics::Gauge& running;
  metrics::Gauge& waiting;
};

ClassMetrics& class_metrics(engine::RequestClass cls) {
  static ClassMetrics sync("sync");
  static ClassMetrics async("async");
  return cls == engine::RequestClass::kSync ? sync : async;
}

// Wraps a request's event callback so its tokens and its end are timed from `arrival_ns`.
std::function<void(const engine::TokenEvent&)> timed(
    std::function<void(const engine::TokenEvent&)> inner, engine::RequestClass cls,
    int64_t arrival_ns) {
  auto last_ns = std::make_shared<int64_t>(0);
  ClassMetrics* m = &class_metrics(cls);
  const char* cls_name = cls == engine::RequestClass::kSync ? "sync" : "async";
  return
      [inner = std::move(inner), last_ns, m, arrival_ns, cls_name](const engine::TokenEvent& ev) {
        int64_t now = steady_now_ns();
        if (ev.token >= 0) {
          if (*last_ns == 0) {
            m->ttft.observe(static_cast<double>(now - arrival_ns) / 1e9);
          } else {
            m->itl.observe(static_cast<double>(now - *last_ns) / 1e9);
          }
          *last_ns = now;
        }
        if (ev.finished) {
          m->e2e.observe(static_cast<double>(now - arrival_ns) / 1e9);
          m->prompt.add(ev.usage.prompt_tokens);
          m->cached.add(ev.usage.cached_tokens);
          m->generated.add(ev.usage.completion_tokens);
          metrics::counter("headroom_requests_finished_total", "Requests that left the engine",
                           std::string("class=\"") + cls_name + "\",reason=\"" +
                               engine::finish_reason_name(ev.finish_reason) + "\"")
              .add();
        }
        inner(ev);
      };
}

}  // namespace

Status Worker::take_sync_slot(bool reject_if_busy) {
  if (stopping_ || draining_)
    return Status(StatusCode::kResourceExhausted, "Out of capacity: the worker is stopping");
  if (!reject_if_busy) {
    ++sync_active_;
    return Status::ok();
  }
  // Async sequences give way to sync ones, so only sync requests can fill the worker. The check
  // and the count are one step: concurrent callers cannot all see the last free slot.
  int active = sync_active_.load();
  do {
    if (active >= config_.max_num_seqs)
      return Status(StatusCode::kResourceExhausted, "Out of capacity");
  } while (!sync_active_.compare_exchange_weak(active, active + 1));
  return Status::ok();
}

WorkerLoad Worker::load() const {
  WorkerLoad l;
  l.capacity = config_.max_num_seqs;
  l.sync_load = sync_active_.load();
  l.async_running = async_running_.load();
  l.free_kv_blocks = free_kv_blocks_.load();
  l.total_kv_blocks = total_kv_blocks_.load();
  l.utilization = utilization_.load();
  l.stopping = stopping_.load() || draining_.load();
  return l;
}

Result<std::unique_ptr<api::SyncStream>> Worker::start_stream(const json& request,
                                                              const api::SyncCall& call) {
  HR_RETURN_IF_ERROR(take_sync_slot(call.reject_if_busy));
  ActiveSync active(sync_active_);
  HR_ASSIGN_OR_RETURN(auto gen, to_generation(request, *model_, engine::RequestClass::kSync));
  auto job = std::make_shared<SyncJob>();
  job->request = std::move(gen);
  job->streaming = true;
  HR_RETURN_IF_ERROR(hand_to_step_loop(job));
  return std::unique_ptr<api::SyncStream>(new WorkerStream(job, std::move(active)));
}

Status Worker::hand_to_step_loop(const std::shared_ptr<SyncJob>& job) {
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    // The step loop has ended (stopped, or its engine failed) and reads the inbox no more.
    if (inbox_closed_)
      return Status(StatusCode::kResourceExhausted, "Out of capacity: the worker is stopping");
    inbox_.push_back(job);
  }
  inbox_cv_.notify_one();
  return Status::ok();
}

void Worker::fail_job(SyncJob& job, const Status& st) {
  {
    std::lock_guard<std::mutex> lock(job.mu);
    job.finished = true;
    job.status = st;
    job.cv.notify_one();
  }
  if (!job.streaming) job.done.set_value(st);
}

Result<api::SyncAnswer> Worker::run(const json& request, const api::SyncCall& call) {
  HR_RETURN_IF_ERROR(take_sync_slot(call.reject_if_busy));
  ActiveSync active(sync_active_);
  HR_ASSIGN_OR_RETURN(auto gen, to_generation(request, *model_, engine::RequestClass::kSync));
  auto job = std::make_shared<SyncJob>();
  job->request = std::move(gen);
  auto future = job->done.get_future();
  HR_RETURN_IF_ERROR(hand_to_step_loop(job));
  // The answer's own generation time is bounded by max_tokens; the wait covers queueing too.
  // A client that goes away meanwhile stops the generation (the step loop cancels it).
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::milliseconds(call.queue_timeout_ms) +
                        std::chrono::seconds(120);
  while (future.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
    const bool gone = call.client_gone && call.client_gone();
    if (gone || std::chrono::steady_clock::now() >= deadline) {
      job->abandoned = true;
      inbox_cv_.notify_one();
      return gone ? Status(StatusCode::kCancelled,
                           "the client went away before the answer was ready")
                  : Status(StatusCode::kDeadlineExceeded, "the request did not finish in time");
    }
  }
  return future.get();
}

Worker::Worker(WorkerConfig config, queue::StoreConfig store)
    : config_(std::move(config)), store_(std::move(store)) {}

Worker::~Worker() { stop(); }

int Worker::context_length() const { return model_->engine->context_length(); }

Status Worker::start() {
  thread_ = std::thread([this] { loop(); });
  return Status::ok();
}

void Worker::stop() {
  if (!thread_.joinable()) return;
  stopping_ = true;
  thread_.join();
}

void Worker::loop() {
  engine::Engine& eng = *model_->engine;
  // Queue traffic runs on its own thread; it wakes this loop when leases arrive or are lost.
  QueueIo io(config_, store_, stats_, [this] {
    {
      std::lock_guard<std::mutex> lock(inbox_mu_);
      io_ready_ = true;
    }
    inbox_cv_.notify_one();
  });
  io.start();
  // The step loop computes; the I/O thread above and the HTTP threads keep their priority.
  if (!lower_thread_priority(config_.engine_nice)) {
    log::warn("worker.nice_refused", {{"nice", config_.engine_nice}});
  }
  struct Running {
    queue::Lease lease;
    std::string text;
    AnswerLogprobs logprobs;
  };
  std::unordered_map<int64_t, Running> running;      // engine id → lease
  std::vector<std::shared_ptr<SyncJob>> generating;  // sync requests in the engine
  std::vector<queue::Lease> unstarted;               // pulled while stopping: handed back
  int64_t drain_deadline = 0;
  metrics::Counter& credits_granted = metrics::counter(
      "headroom_async_credits_granted_total", "Async requests the worker had headroom to pull");
  metrics::Counter& pulled =
      metrics::counter("headroom_async_pulled_total", "Async requests pulled from the queue");
  metrics::Counter& steps = metrics::counter("headroom_engine_steps_total", "Engine steps run");
  metrics::Counter& preemptions = metrics::counter(
      "headroom_preemptions_total", "Async sequences preempted to make room for sync ones");
  metrics::Counter& prefix_queries = metrics::counter(
      "headroom_prefix_cache_queries_total", "Full prompt blocks looked up in the prefix cache");
  metrics::Counter& prefix_hits = metrics::counter("headroom_prefix_cache_hits_total",
                                                   "Full prompt blocks found in the prefix cache");
  metrics::Gauge& kv_used =
      metrics::gauge("headroom_kv_cache_blocks_used", "KV cache blocks in use");
  metrics::Gauge& kv_total = metrics::gauge("headroom_kv_cache_blocks_total", "KV cache blocks");
  metrics::Gauge& kv_usage =
      metrics::gauge("headroom_kv_cache_usage_ratio", "Fraction of the KV cache in use");
  metrics::Gauge& utilization = metrics::gauge(
      "headroom_device_utilization_ratio",
      "Busy fraction of the device (engine steps, or NVML on a GPU), smoothed over ~1 s");
  metrics::Counter& braked =
      metrics::counter("headroom_async_pulls_braked_total",
                       "Times the utilization brake (--max-utilization) held back a pull");
  std::unique_ptr<engine::GpuMonitor> gpu;
  int gpu_index = 0;
  if (std::string(eng.backend().name()) == "cuda") {
    auto opened = engine::GpuMonitor::open();
    if (opened.is_ok()) gpu = std::move(opened).value();
    size_t colon = config_.device.find(':');
    if (colon != std::string::npos) gpu_index = std::atoi(config_.device.c_str() + colon + 1);
  }
  UtilizationBrake brake(config_.max_utilization, std::move(gpu), gpu_index);
  RecentPeak sync_peak;       // most sync sequences at once over the last 10 s
  RecentPeak sync_recent(3);  // the same over the last 3 s: is sync traffic about?
  StepCost step_cost;         // time per token, for sizing steps with async work
  const double async_step_ms = config_.async_step_ms;
  int failed_steps = 0;  // engine steps failed in a row
  int64_t busy_ns = 0;   // time in engine steps since mark_ns
  int64_t mark_ns = steady_now_ns();
  auto publish_engine_gauges = [&] {
    engine::Headroom h = eng.headroom();
    ClassMetrics& sync = class_metrics(engine::RequestClass::kSync);
    ClassMetrics& async = class_metrics(engine::RequestClass::kAsync);
    sync.running.set(h.running_sync);
    sync.waiting.set(h.waiting_sync);
    async.running.set(h.running_async);
    async.waiting.set(h.waiting_async);
    int used = h.total_kv_blocks - h.free_kv_blocks;
    kv_used.set(used);
    kv_total.set(h.total_kv_blocks);
    kv_usage.set(h.total_kv_blocks > 0 ? static_cast<double>(used) / h.total_kv_blocks : 0);
    prefix_queries.set_total(static_cast<double>(eng.blocks().num_prefix_queries()));
    prefix_hits.set_total(static_cast<double>(eng.blocks().num_prefix_hit_blocks()));
  };

  while (true) {
    // Sync requests first: they enter the engine's sync class, ahead of all async work.
    std::vector<std::shared_ptr<SyncJob>> jobs;
    {
      std::lock_guard<std::mutex> lock(inbox_mu_);
      jobs.swap(inbox_);
    }
    for (auto& job : jobs) {
      class_metrics(engine::RequestClass::kSync)
          .queue.observe(static_cast<double>(steady_now_ns() - job->arrival_ns) / 1e9);
      job->logprobs = AnswerLogprobs(job->request.params.logprobs >= 0);
      TokenShapes* shapes = model_->token_shapes.get();
      job->request.on_event = timed(
          [job, shapes](const engine::TokenEvent& ev) {
            if (ev.finish_reason == engine::FinishReason::kError) {
              // Nothing reached the client: another worker may answer (as async work is retried).
              fail_job(*job, unavailable(ev.error));
              return;
            }
            job->text += ev.text_delta;
            add_event(job->logprobs, *shapes, ev);
            // Streamed, each delta carries the entries of the tokens whose text it completes; the
            // last ones may come with an empty delta.
            json piece_logprobs;
            if (job->streaming && job->logprobs.wanted() &&
                (!ev.text_delta.empty() || ev.finished)) {
              piece_logprobs = job->logprobs.take();
            }
            api::SyncAnswer answer;
            if (ev.finished) {
              answer.text = job->text;
              if (!job->streaming) answer.logprobs = job->logprobs.object();
              answer.finish_reason = engine::finish_reason_name(ev.finish_reason);
              answer.prompt_tokens = ev.usage.prompt_tokens;
              answer.completion_tokens = ev.usage.completion_tokens;
              answer.cached_tokens = ev.usage.cached_tokens;
            }
            if (job->streaming) {
              std::lock_guard<std::mutex> lock(job->mu);
              if (!ev.text_delta.empty() ||
                  (piece_logprobs.is_array() && !piece_logprobs.empty())) {
                job->pieces.push_back({ev.text_delta, std::move(piece_logprobs)});
              }
              if (ev.finished) {
                job->finished = true;
                job->answer = answer;
              }
              job->cv.notify_one();
            } else if (ev.finished) {
              {
                std::lock_guard<std::mutex> lock(job->mu);
                job->finished = true;
              }
              job->done.set_value(answer);
            }
          },
          engine::RequestClass::kSync, job->arrival_ns);
      auto id = eng.add(std::move(job->request));
      if (!id.is_ok()) {
        fail_job(*job, id.status());
      } else {
        job->engine_id = *id;
        generating.push_back(job);
      }
    }
    // Sync answers whose client went away stop generating.
    std::erase_if(generating, [&](const std::shared_ptr<SyncJob>& job) {
      bool finished = false;
      {
        std::lock_guard<std::mutex> lock(job->mu);
        finished = job->finished;
      }
      if (finished) return true;
      if (!job->abandoned) return false;
      eng.cancel(job->engine_id);
      if (job->streaming) {
        ++stats_.streams_cancelled;
        metrics::counter("headroom_streams_cancelled_total",
                         "Streamed answers stopped because the client went away")
            .add();
      } else {
        ++stats_.calls_cancelled;
        metrics::counter("headroom_sync_calls_cancelled_total",
                         "Sync answers (not streamed) stopped because the client went away")
            .add();
      }
      return true;
    });
    bool stopping = stopping_.load();
    if (stopping && drain_deadline == 0) {
      drain_deadline = steady_now_ns() + static_cast<int64_t>(config_.drain_seconds) * 1000000000;
    }
    // Leases taken over elsewhere (e.g. after a long stall): stop working on them.
    for (int64_t id : io.take_lost()) {
      if (running.erase(id) > 0) eng.cancel(id);
    }
    // Requests the I/O thread pulled for earlier credits join the engine.
    std::vector<queue::Lease> arrived = io.take_pulled();
    if (stopping) {
      unstarted.insert(unstarted.end(), arrived.begin(), arrived.end());
      arrived.clear();
    }
    if (!arrived.empty()) {
      pulled.add(static_cast<double>(arrived.size()));
      int64_t pulled_ns = steady_now_ns();
      int64_t now_ms = SystemClock::instance().now_unix_ms();
      for (queue::Lease& l : arrived) {
        if (l.submitted_at_ms > 0) {
          class_metrics(engine::RequestClass::kAsync)
              .queue.observe(static_cast<double>(std::max<int64_t>(0, now_ms - l.submitted_at_ms)) /
                             1e3);
        }
        json body = api::parse_client_json(l.body);
        auto gen = body.is_discarded()
                       ? Result<engine::GenerationRequest>(invalid_argument("bad body"))
                       : to_generation(body, *model_, engine::RequestClass::kAsync);
        if (!gen.is_ok()) {
          io.fail({l, "invalid_request", gen.status().message(), false});
          continue;
        }
        auto* runs = &running;
        QueueIo* q = &io;
        TokenShapes* shapes = model_->token_shapes.get();
        AnswerLogprobs logprobs(gen->params.logprobs >= 0);
        gen->on_event = timed(
            [runs, q, shapes](const engine::TokenEvent& ev) {
              auto it = runs->find(ev.id);
              if (it == runs->end()) return;
              it->second.text += ev.text_delta;
              add_event(it->second.logprobs, *shapes, ev);
              if (!ev.finished) return;
              if (ev.finish_reason == engine::FinishReason::kError) {
                // Another attempt (here or on another worker) may well succeed.
                q->drop(ev.id);
                q->fail({it->second.lease, "inference_error", ev.error, true});
                runs->erase(it);
                return;
              }
              json usage = {{"prompt_tokens", ev.usage.prompt_tokens},
                            {"completion_tokens", ev.usage.completion_tokens},
                            {"total_tokens", ev.usage.prompt_tokens + ev.usage.completion_tokens},
                            {"prompt_tokens_details", {{"cached_tokens", ev.usage.cached_tokens}}}};
              json result = {{"response", it->second.text},
                             {"usage", usage},
                             {"finish_reason", engine::finish_reason_name(ev.finish_reason)}};
              if (it->second.logprobs.wanted()) result["logprobs"] = it->second.logprobs.object();
              q->drop(ev.id);
              q->complete({it->second.lease, result.dump(), ev.usage.prompt_tokens,
                           ev.usage.completion_tokens, ev.usage.cached_tokens});
              runs->erase(it);
            },
            engine::RequestClass::kAsync, pulled_ns);
        auto id = eng.add(std::move(gen).value());
        if (!id.is_ok()) {
          io.fail({l, "invalid_request", id.status().message(), false});
          continue;
        }
        running.emplace(*id, Running{l, "", std::move(logprobs)});
        io.hold(*id, l);
      }
    }
    // Pull only into headroom.
    engine::Headroom h = eng.headroom();
    async_running_ = h.running_async;
    free_kv_blocks_ = h.free_kv_blocks;
    total_kv_blocks_ = h.total_kv_blocks;
    int credits = 0;
    int sync_now = h.running_sync + h.waiting_sync;
    const int64_t now_ns = steady_now_ns();
    sync_peak.record(sync_now, now_ns);
    sync_recent.record(sync_now, now_ns);
    // While sync traffic is about, async steps stay short even between sync requests.
    eng.set_sync_expected(sync_recent.peak() > 0);
    if (async_step_ms > 0) eng.set_async_step_cap(step_cost.tokens_within(async_step_ms));
    // Room kept for sync: the configured reserve, or as many more sync sequences as the recent
    // peak had (up to half the slots: a past burst must not shut async work out), whichever is
    // larger.
    int reserve = std::max(config_.reserve_slots,
                           std::min(sync_peak.peak() - sync_now, config_.max_num_seqs / 2));
    if (!stopping && !draining_.load() && h.waiting_sync == 0 && h.waiting_async == 0) {
      credits = std::min(h.free_seq_slots - reserve, config_.max_pull);
      int blocks_per_request = 4;
      credits =
          std::min(credits, (h.free_kv_blocks - reserve * blocks_per_request) / blocks_per_request);
      // The last step used its whole token budget: new requests would only wait in the engine.
      if (eng.has_work() && h.token_budget_left <= 0) credits = 0;
      credits -= io.in_transit();  // already granted, still on their way
    }
    {
      brake.record(busy_ns, now_ns - mark_ns, now_ns);
      mark_ns = now_ns;
      busy_ns = 0;
      utilization.set(brake.utilization());
      utilization_ = brake.utilization();
      if (credits > 0 && brake.engaged()) {
        credits = 0;
        ++stats_.braked;
        braked.add();
      }
    }
    if (credits > 0) credits_granted.add(credits);
    io.want(std::max(credits, 0));
    // What the last step, admissions and cancellations left (also when no step runs after them).
    publish_engine_gauges();
    if (eng.has_work()) {
      int64_t step_start = steady_now_ns();
      auto st = eng.step();
      int64_t step_ns = steady_now_ns() - step_start;
      busy_ns += step_ns;
      ++stats_.steps;
      steps.add();
      if (!st.is_ok()) {
        log::error("worker.step_failed", {{"error", st.status()}, {"in_a_row", failed_steps + 1}});
        if (++failed_steps >= kMaxFailedSteps) {
          // End everything held here, so that no client waits on this engine: sync calls get an
          // error their router may take elsewhere, async requests go back to the queue.
          const bool device = st.status().code() == StatusCode::kInternal;
          log::error(
              "worker.engine_failed",
              {{"error", st.status()}, {"failed_steps", failed_steps}, {"stopping", device}});
          eng.fail_all("the worker's engine failed " + std::to_string(failed_steps) +
                       " steps in a row: " + st.status().message());
          publish_engine_gauges();
          failed_steps = 0;
          if (device) {
            // The device is not coming back (a lost GPU context, say): stop, so that a fresh
            // process starts clean. (Other failures, from the work itself, leave a clean engine.)
            failed_ = true;
            stopping_ = true;
            break;
          }
          continue;
        }
        // A passing fault may clear: give it a moment before the step is tried again.
        std::this_thread::sleep_for(std::chrono::milliseconds(50 * failed_steps));
      } else {
        failed_steps = 0;
        preemptions.add(st->num_preempted);
        step_cost.record(step_ns, st->num_collected_tokens);
      }
    } else {
      // Idle: wait for a sync arrival or for pulled work.
      std::unique_lock<std::mutex> lock(inbox_mu_);
      inbox_cv_.wait_for(lock, std::chrono::milliseconds(stopping ? 1 : config_.idle_poll_ms),
                         [&] { return !inbox_.empty() || io_ready_; });
      io_ready_ = false;
    }
    if (stopping && (!eng.has_work() || steady_now_ns() > drain_deadline)) break;
  }
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    for (auto& job : inbox_) fail_job(*job, unavailable("the worker stopped"));
    inbox_.clear();
    inbox_closed_ = true;
  }
  // Hand back what did not finish in time, and what was pulled but never started.
  // (Out of `running` first: a cancel's final event looks its request up there, and would
  // complete it as cancelled besides handing it back.)
  std::unordered_map<int64_t, Running> unfinished;
  unfinished.swap(running);
  for (const auto& [id, r] : unfinished) {
    unstarted.push_back(r.lease);
    eng.cancel(id);
  }
  io.stop(unstarted);
  log::info("worker.stopped",
            {{"completed", stats_.completed.load()}, {"released", stats_.released.load()}});
  if (failed_ && on_failure_) on_failure_();
}

}  // namespace hr::workers
