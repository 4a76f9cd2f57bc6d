// The worker: loading the model, taking sync requests from handler threads, and the step loop
// (admit → grant credits → step or wait).
#include "workers/worker.h"

#include <unistd.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <future>
#include <utility>

#include "base/clock.h"
#include "base/log.h"
#include "base/priority.h"
#include "engine/backend_factory.h"
#include "workers/async_jobs.h"
#include "workers/generation_request.h"
#include "workers/headroom_policy.h"
#include "workers/loaded_model.h"
#include "workers/queue_io.h"
#include "workers/step_watchdog.h"
#include "workers/sync_jobs.h"
#include "workers/utilization.h"
#include "workers/worker_metrics.h"

namespace hr::workers {

namespace {

std::string default_worker_name() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return std::string(host) + ":" + std::to_string(getpid());
}

// The tokens of a public prefix file: its messages rendered by the model's chat template (the
// generation prompt it ends with does not match a real prompt's next message, and so is never
// shared), as a prompt would be.
Result<std::vector<int32_t>> public_prefix_tokens(const std::string& file, const LoadedModel& m) {
  std::ifstream in(file);
  if (!in) return invalid_argument("cannot read --public-prefix " + file, "public-prefix");
  const nlohmann::ordered_json j = nlohmann::ordered_json::parse(in, nullptr, false);
  const nlohmann::ordered_json* messages = &j;
  if (j.is_object() && j.contains("messages")) messages = &j["messages"];
  if (!messages->is_array() || messages->empty()) {
    return invalid_argument(
        "--public-prefix " + file + " must hold a JSON array of messages, or {\"messages\": [...]}",
        "public-prefix");
  }
  Result<std::string> text =
      m.chat_template.render(*messages, nullptr, m.tokenizer->bos_text(), m.tokenizer->eos_text());
  if (!text.is_ok()) {
    return invalid_argument("--public-prefix " + file + ": " + text.status().message(),
                            "public-prefix");
  }
  return m.tokenizer->encode(*text);
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
  m->token_bytes = std::make_unique<TokenBytes>(m->tokenizer);
  m->grammars = std::make_unique<grammar::GrammarCache>(
      constraint_vocabulary(*m->tokenizer, m->config.vocab_size));
  HR_ASSIGN_OR_RETURN(m->chat_template,
                      engine::ChatTemplate::load(config.model_dir, config.chat_template));
  engine::BackendSpec spec;
  spec.device = config.device;
  spec.cuda_options = config.cuda_options;
  spec.kv_cache_bytes = static_cast<size_t>(config.kv_cache_bytes);
  spec.max_num_tokens = config.max_batched_tokens;
  spec.max_num_seqs = config.max_num_seqs;
  spec.cpu_thread_nice = config.engine_nice;
  spec.tensor_parallel = config.tensor_parallel;
  spec.pipeline_parallel = config.pipeline_parallel;
  spec.expert_parallel = config.expert_parallel;
  HR_ASSIGN_OR_RETURN(spec.stage_layers, engine::parse_stage_layers(config.stage_layers));
  if (!config.devices.empty()) {
    HR_ASSIGN_OR_RETURN(spec.devices, engine::parse_device_list(config.devices));
  }
  if (!backend) {
    HR_ASSIGN_OR_RETURN(backend, engine::make_backend(config.model_dir, spec));
  }
  engine::EngineOptions eo;
  for (const std::string& file : config.public_prefixes) {
    HR_ASSIGN_OR_RETURN(std::vector<int32_t> tokens, public_prefix_tokens(file, *m));
    log::info("worker.public_prefix",
              {{"file", file}, {"tokens", static_cast<int64_t>(tokens.size())}});
    eo.public_prefixes.push_back(std::move(tokens));
  }
  eo.max_model_len = config.max_model_len;
  eo.scheduler.max_num_seqs = config.max_num_seqs;
  eo.scheduler.max_batched_tokens = config.max_batched_tokens;
  eo.scheduler.max_prefill_chunk = config.max_batched_tokens;
  eo.scheduler.max_async_tokens_with_sync = config.async_tokens_with_sync;
  eo.scheduler.max_async_prefill_with_sync = config.async_prefill_with_sync;
  eo.scheduler.sync_prefill_alone = config.sync_prefill_alone;
  eo.scheduler.priority_runs_alone = config.catch_up_alone == 1;
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
             {"step_groups", m->engine->step_groups()},
             {"max_num_seqs", config.max_num_seqs},
             {"max_batched_tokens", config.max_batched_tokens},
             {"context_length", m->engine->context_length()},
             {"warm_up_ms", (steady_now_ns() - warm_start) / 1000000}});
  w->model_ = std::move(m);
  return w;
}

Status Worker::take_sync_slot(bool reject_if_busy) {
  if (stopping_ || draining_) {
    return Status(StatusCode::kResourceExhausted, "Out of capacity: the worker is stopping");
  }
  if (!reject_if_busy) {
    ++sync_active_;
    return Status::ok();
  }
  // Async sequences give way to sync ones, so only sync requests can fill the worker. The check
  // and the count are one step: concurrent callers cannot all see the last free slot.
  int active = sync_active_.load();
  do {
    if (active >= config_.max_num_seqs) {
      return Status(StatusCode::kResourceExhausted, "Out of capacity");
    }
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

Result<std::unique_ptr<wire::AnswerStream>> Worker::start_stream(const wire::ChatRequest& request,
                                                                 const SyncOptions& options) {
  HR_ASSIGN_OR_RETURN(ActiveSync active, take_slot(options));
  HR_ASSIGN_OR_RETURN(auto job, make_job(request, options));
  job->streaming = true;
  HR_RETURN_IF_ERROR(hand_to_step_loop(job));
  return make_job_stream(job, std::move(active));
}

Result<ActiveSync> Worker::take_slot(const SyncOptions& options) {
  if (!options.flex) {
    HR_RETURN_IF_ERROR(take_sync_slot(options.reject_if_busy));
    return ActiveSync(sync_active_);
  }
  // A flex call waits in the engine on the room sync calls leave: it is not one of theirs.
  if (stopping_ || draining_) {
    return Status(StatusCode::kResourceExhausted, "Out of capacity: the worker is stopping");
  }
  ++flex_active_;
  return ActiveSync(flex_active_);
}

Result<std::shared_ptr<SyncJob>> Worker::make_job(const wire::ChatRequest& request,
                                                  const SyncOptions& options) {
  HR_ASSIGN_OR_RETURN(auto gen, to_generation(request, *model_,
                                              options.flex ? engine::RequestClass::kAsync
                                                           : engine::RequestClass::kSync));
  gen.cache_namespace = options.cache_namespace;
  auto job = std::make_shared<SyncJob>();
  job->request = std::move(gen);
  job->tool_calls = offered_tool_calls(request, *model_);
  if (options.flex) {
    job->start_deadline_ns = job->arrival_ns + int64_t{options.flex_timeout_ms} * 1000000;
  }
  return job;
}

Status Worker::hand_to_step_loop(const std::shared_ptr<SyncJob>& job) {
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    // The step loop has ended (stopped, or its engine failed) and reads the inbox no more.
    if (inbox_closed_) {
      return Status(StatusCode::kResourceExhausted, "Out of capacity: the worker is stopping");
    }
    inbox_.push_back(job);
    if (handed_in_.size() >= prune_handed_in_at_) {
      std::erase_if(handed_in_, [](const std::weak_ptr<SyncJob>& j) { return j.expired(); });
      prune_handed_in_at_ = std::max<size_t>(64, 2 * handed_in_.size());
    }
    handed_in_.push_back(job);
  }
  inbox_cv_.notify_one();
  return Status::ok();
}

Result<wire::Answer> Worker::run(const wire::ChatRequest& request, const SyncOptions& options) {
  HR_ASSIGN_OR_RETURN(ActiveSync active, take_slot(options));
  HR_ASSIGN_OR_RETURN(auto job, make_job(request, options));
  auto future = job->done.get_future();
  HR_RETURN_IF_ERROR(hand_to_step_loop(job));
  // The answer's own generation time is bounded by max_tokens; the wait covers queueing too.
  // A client that goes away meanwhile stops the generation (the step loop cancels it).
  const auto deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(options.flex ? options.flex_timeout_ms : options.queue_timeout_ms) +
      std::chrono::seconds(120);
  while (future.wait_for(std::chrono::milliseconds(50)) != std::future_status::ready) {
    const bool gone = options.client_gone && options.client_gone();
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

Worker::~Worker() {
  stop();
  if (loop_abandoned_) {
    // Its thread still uses this worker and its engine: nothing here can be freed safely.
    log::error("worker.exiting", {{"reason", "destroyed while its step loop is stuck"}});
    std::_Exit(1);
  }
}

int Worker::context_length() const { return model_->engine->context_length(); }

Status Worker::start() {
  thread_ = std::thread([this] { loop(); });
  return Status::ok();
}

void Worker::stop() {
  if (!thread_.joinable()) return;
  stopping_ = true;
  std::unique_lock<std::mutex> lock(loop_mu_);
  // The loop ends (draining), or a step of it gets stuck meanwhile and the watchdog hands its
  // work back (bounded by kHandBackWaitMs). Without a watchdog (or should it never fire), a
  // drain that runs past its time and a step's worth more is taken as stuck: the leases it
  // holds expire and run elsewhere.
  const double step_s = config_.step_timeout_seconds > 0 ? config_.step_timeout_seconds : 300.0;
  const auto limit = std::chrono::milliseconds(static_cast<int64_t>(
      (config_.drain_seconds + step_s) * 1000.0 + kHandBackWaitMs + kStopMarginMs));
  // (Its thread is left, still using this worker: the process must exit; ~Worker makes sure.)
  auto leave = [&](const char* why) {
    log::error("worker.loop_abandoned", {{"note", why}});
    loop_abandoned_ = true;
    thread_.detach();
  };
  if (!loop_cv_.wait_for(lock, limit, [&] { return loop_ended_ || stuck_handled_; })) {
    leave("the loop did not end within its drain and a step's time");
    return;
  }
  // A stuck loop may never come back (a wedged device): a while more, then its thread is left.
  if (!loop_cv_.wait_for(lock, std::chrono::seconds(5), [&] { return loop_ended_; })) {
    leave("the stuck step never returned");
    return;
  }
  lock.unlock();
  thread_.join();
}

void Worker::fail_sync_calls(const Status& st) {
  std::vector<std::shared_ptr<SyncJob>> jobs;
  {
    std::lock_guard<std::mutex> lock(inbox_mu_);
    inbox_closed_ = true;
    inbox_.clear();
    for (const auto& weak : handed_in_) {
      if (auto job = weak.lock()) jobs.push_back(std::move(job));
    }
    handed_in_.clear();
  }
  for (auto& job : jobs) job->fail(st);  // (those answered already stay answered)
}

void Worker::report_failure() {
  if (!failure_reported_.exchange(true) && on_failure_) on_failure_();
}

std::vector<std::shared_ptr<SyncJob>> Worker::take_inbox() {
  std::vector<std::shared_ptr<SyncJob>> jobs;
  std::lock_guard<std::mutex> lock(inbox_mu_);
  jobs.swap(inbox_);
  return jobs;
}

void Worker::wait_for_work(int ms) {
  std::unique_lock<std::mutex> lock(inbox_mu_);
  inbox_cv_.wait_for(lock, std::chrono::milliseconds(ms),
                     [&] { return !inbox_.empty() || io_ready_; });
  io_ready_ = false;
}

namespace {

// The utilization brake, on NVML's view of the GPU too when the engine runs on one.
UtilizationBrake open_brake(const engine::Engine& eng, const WorkerConfig& config) {
  std::unique_ptr<engine::GpuMonitor> gpu;
  int gpu_index = 0;
  if (std::string(eng.backend().name()) == "cuda") {
    auto opened = engine::GpuMonitor::open();
    if (opened.is_ok()) gpu = std::move(opened).value();
    size_t colon = config.device.find(':');
    if (colon != std::string::npos) gpu_index = std::atoi(config.device.c_str() + colon + 1);
  }
  return UtilizationBrake(config.max_utilization, std::move(gpu), gpu_index);
}

// How the step loop paces itself: the recent sync load it keeps room for and the step time it
// sizes async steps by.
struct Pacing {
  RecentPeak sync_peak;       // most sync sequences at once over the last 10 s
  RecentPeak sync_recent{3};  // the same over the last 3 s: is sync traffic about?
  StepCost step_cost;         // time per token, for sizing steps with async work
  int failed_steps = 0;       // engine steps failed in a row
  int64_t busy_ns = 0;        // time in engine steps since mark_ns
  int64_t mark_ns = steady_now_ns();
};

enum class StepOutcome { kRan, kFailed, kGaveUp, kDeviceLost, kStuck };

// One engine step. After Worker::kMaxFailedSteps failures in a row the engine ends everything it
// holds (kGaveUp), and when the failure is the device's (kInternal) the worker must stop
// (kDeviceLost; `failed` set first).
StepOutcome run_step(engine::Engine& eng, Pacing& p, LoopMetrics& metrics, WorkerStats& stats,
                     std::atomic<bool>& failed) {
  int64_t step_start = steady_now_ns();
  auto st = eng.step();
  int64_t step_ns = steady_now_ns() - step_start;
  p.busy_ns += step_ns;
  ++stats.steps;
  metrics.steps.add();
  metrics.step_seconds.observe(static_cast<double>(step_ns) / 1e9);
  if (st.is_ok()) {
    p.failed_steps = 0;
    metrics.preemptions.add(st->num_preempted);
    p.step_cost.record(step_ns, st->num_collected_tokens);
    return StepOutcome::kRan;
  }
  log::error("worker.step_failed", {{"error", st.status()}, {"in_a_row", p.failed_steps + 1}});
  if (++p.failed_steps < Worker::kMaxFailedSteps) {
    // A passing fault may clear: give it a moment before the step is tried again.
    std::this_thread::sleep_for(std::chrono::milliseconds(50 * p.failed_steps));
    return StepOutcome::kFailed;
  }
  // End everything held here, so that no client waits on this engine: sync calls get an error
  // their router may take elsewhere, async requests go back to the queue.
  const bool device = st.status().code() == StatusCode::kInternal;
  log::error("worker.engine_failed",
             {{"error", st.status()}, {"failed_steps", p.failed_steps}, {"stopping", device}});
  // (Before the calls end: their refusals then tell the router that another worker may answer.)
  if (device) failed = true;
  eng.fail_all("the worker's engine failed " + std::to_string(p.failed_steps) +
               " steps in a row: " + st.status().message());
  metrics.publish(eng);
  p.failed_steps = 0;
  // The device is not coming back (a lost GPU context, say): stop, so that a fresh process
  // starts clean. (Other failures, from the work itself, leave a clean engine.)
  return device ? StepOutcome::kDeviceLost : StepOutcome::kGaveUp;
}

}  // namespace

// The step loop's state, and its three phases. Step loop thread only.
struct Worker::Loop {
  explicit Loop(Worker& worker);
  // Admit: sync requests first (they enter the engine's sync class, ahead of all async work),
  // then what the queue brought for earlier credits (held back when stopping).
  void admit(bool stopping);
  // Grant credits: pull only into headroom (workers/headroom_policy.h).
  void grant(bool stopping);
  // One engine step, or a wait for a sync arrival or pulled work when there is nothing to run.
  StepOutcome step_or_wait(bool stopping);
  // Fails the sync jobs still waiting and hands back every lease held.
  void finish();
  // From the watchdog's thread, the step under way having run `step_ns`: the calls and leases
  // handed back, the engine's ranks aborted, the worker failed (Worker::stuck()).
  void on_stuck(int64_t step_ns);

  Worker& w;
  engine::Engine& eng;
  QueueIo io;  // queue traffic, on its own thread; wakes the loop when leases arrive or are lost
  LoopMetrics metrics;
  SyncJobs sync;
  RequestSizes sizes;
  AsyncJobs async;
  UtilizationBrake brake;
  const HeadroomPolicyConfig policy;
  Pacing pacing;
  int64_t drain_deadline = 0;
  bool stuck = false;     // the watchdog took the GPU's utilisation read as stuck
  StepWatchdog watchdog;  // last: its thread, which uses the members above, ends first
};

Worker::Loop::Loop(Worker& worker)
    : w(worker),
      eng(*worker.model_->engine),
      io(worker.config_, worker.store_, worker.stats_,
         [&worker] {
           {
             std::lock_guard<std::mutex> lock(worker.inbox_mu_);
             worker.io_ready_ = true;
           }
           worker.inbox_cv_.notify_one();
         }),
      sync(eng, *worker.model_->token_bytes, metrics, worker.stats_),
      sizes(eng.backend().block_size()),
      async(eng, io, *worker.model_, sizes),
      brake(open_brake(eng, worker.config_)),
      policy{worker.config_.max_num_seqs, worker.config_.reserve_slots, worker.config_.max_pull},
      watchdog(static_cast<int64_t>(worker.config_.step_timeout_seconds * 1e9),
               [this](int64_t step_ns) { on_stuck(step_ns); }) {}

void Worker::Loop::admit(bool stopping) {
  sync.admit(w.take_inbox());
  sync.cancel_abandoned();
  if (stopping && drain_deadline == 0) {
    drain_deadline = steady_now_ns() + static_cast<int64_t>(w.config_.drain_seconds) * 1000000000;
  }
  async.drop_lost(io.take_lost());
  std::vector<queue::Lease> arrived = io.take_pulled();
  if (stopping) {
    io.release(std::move(arrived));  // (at once: a drain step that gets stuck holds none)
  } else if (!arrived.empty()) {
    metrics.pulled.add(static_cast<double>(arrived.size()));
    async.admit(arrived);
  }
}

void Worker::Loop::grant(bool stopping) {
  PolicyState state;
  state.headroom = eng.headroom();
  w.async_running_ = state.headroom.running_async;
  w.free_kv_blocks_ = state.headroom.free_kv_blocks;
  w.total_kv_blocks_ = state.headroom.total_kv_blocks;
  const int64_t now_ns = steady_now_ns();
  const int sync_now = state.headroom.running_sync + state.headroom.waiting_sync;
  pacing.sync_peak.record(sync_now, now_ns);
  pacing.sync_recent.record(sync_now, now_ns);
  // While sync traffic is about, async steps stay short even between sync requests.
  eng.set_sync_expected(pacing.sync_recent.peak() > 0);
  if (w.config_.async_step_ms > 0) {
    eng.set_async_step_cap(pacing.step_cost.tokens_within(w.config_.async_step_ms));
  }
  // (Watched like a step: the GPU's utilisation is read through NVML, which a wedged device
  // may hold up as it holds a step.)
  watchdog.begin_step();
  brake.record(pacing.busy_ns, now_ns - pacing.mark_ns, now_ns);
  if (watchdog.end_step()) {
    stuck = true;
    return;
  }
  pacing.mark_ns = now_ns;
  pacing.busy_ns = 0;
  metrics.utilization.set(brake.utilization());
  w.utilization_ = brake.utilization();
  state.sync_peak = pacing.sync_peak.peak();
  state.blocks_per_request = sizes.blocks_per_request();
  state.in_transit = io.in_transit();
  state.engine_has_work = eng.has_work();
  state.stopping = stopping || w.draining_.load();
  state.brake_engaged = brake.engaged();
  state.catch_up_held = async.catch_up_held();
  state.catch_up_in_transit = io.catch_up_in_transit();
  io.want_catch_up(catch_up_credits(state, policy));
  const Credits credits = grant_credits(state, policy);
  if (credits.limit == CreditLimit::kBrake) {
    ++w.stats_.braked;
    metrics.braked.add();
  }
  if (credits.granted > 0) metrics.credits_granted.add(credits.granted);
  io.want(credits.granted);
  // What the last step, admissions and cancellations left (also when no step runs after them).
  metrics.publish(eng);
}

StepOutcome Worker::Loop::step_or_wait(bool stopping) {
  if (eng.has_work()) {
    watchdog.begin_step();
    const StepOutcome outcome = run_step(eng, pacing, metrics, w.stats_, w.failed_);
    // (Taken as stuck: the watchdog hands everything back, whatever the step did after.)
    return watchdog.end_step() ? StepOutcome::kStuck : outcome;
  }
  w.wait_for_work(stopping ? 1 : w.config_.idle_poll_ms);
  return StepOutcome::kRan;
}

void Worker::Loop::finish() {
  {
    std::lock_guard<std::mutex> lock(w.inbox_mu_);
    for (auto& job : w.inbox_) job->fail(unavailable("the worker stopped"));
    w.inbox_.clear();
    w.inbox_closed_ = true;
  }
  // Hand back what did not finish in time (what was pulled but never started went back as it
  // arrived, or goes with the pulled leases nobody took).
  io.stop(async.take_unfinished());
}

void Worker::Loop::on_stuck(int64_t step_ns) {
  const double seconds = static_cast<double>(step_ns) / 1e9;
  char why[160];
  std::snprintf(why, sizeof why,
                "the worker's engine is stuck: a step (or a read of the GPU's utilisation) has "
                "run %.1f s (--step-timeout-seconds %g)",
                seconds, w.config_.step_timeout_seconds);
  log::error("worker.step_stuck",
             {{"seconds", seconds}, {"limit_seconds", w.config_.step_timeout_seconds}});
  w.stuck_ = true;
  w.failed_ = true;
  w.stopping_ = true;
  // What clients wait on first: sync calls get an error their router may take elsewhere, and
  // every lease goes back to the queue for other workers (nothing acknowledged waits on a stuck
  // engine), before anything that may itself hang.
  w.fail_sync_calls(unavailable(why));
  io.abandon(why, kHandBackWaitMs);
  // The work is back: the roles may stop now, whatever the abort below does (an NCCL abort may
  // itself hang on a wedged device).
  {
    std::lock_guard<std::mutex> lock(w.loop_mu_);
    w.stuck_handled_ = true;
  }
  w.loop_cv_.notify_all();
  w.report_failure();
  const bool aborted = eng.abort_backend(why);
  log::error("worker.engine_abandoned", {{"ranks_aborted", aborted}});
}

void Worker::loop() {
  Loop l(*this);
  l.io.start();
  // The step loop computes; the I/O thread and the HTTP threads keep their priority.
  if (!lower_thread_priority(config_.engine_nice)) {
    log::warn("worker.nice_refused", {{"nice", config_.engine_nice}});
  }
  while (true) {
    const bool stopping = stopping_.load();
    l.admit(stopping);
    l.grant(stopping);
    if (l.stuck) break;  // (the watchdog ends everything this loop held)
    const StepOutcome outcome = l.step_or_wait(stopping);
    if (outcome == StepOutcome::kStuck) break;  // the watchdog ends everything this loop held
    if (outcome == StepOutcome::kDeviceLost) {
      failed_ = true;
      stopping_ = true;
      break;
    }
    if (outcome == StepOutcome::kGaveUp) continue;
    if (stopping && (!l.eng.has_work() || steady_now_ns() > l.drain_deadline)) break;
  }
  l.finish();
  log::info("worker.stopped",
            {{"completed", stats_.completed.load()}, {"released", stats_.released.load()}});
  if (failed_) report_failure();
  {
    std::lock_guard<std::mutex> lock(loop_mu_);
    loop_ended_ = true;
  }
  loop_cv_.notify_all();
}

}  // namespace hr::workers
