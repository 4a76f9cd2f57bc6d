// Queued requests in a worker's engine.
#include "workers/async_jobs.h"

#include <algorithm>
#include <utility>

#include "base/clock.h"
#include "wire/chat_request_json.h"
#include "wire/stored_answer.h"
#include "workers/generation_request.h"
#include "workers/headroom_policy.h"
#include "workers/queue_io.h"
#include "workers/worker_metrics.h"

namespace hr::workers {

void AsyncJobs::admit(const std::vector<queue::Lease>& arrived) {
  const int64_t pulled_ns = steady_now_ns();
  const int64_t now_ms = SystemClock::instance().now_unix_ms();
  for (const queue::Lease& l : arrived) {
    if (l.submitted_at_ms > 0) {
      class_metrics(engine::RequestClass::kAsync)
          .queue.observe(static_cast<double>(std::max<int64_t>(0, now_ms - l.submitted_at_ms)) /
                         1e3);
    }
    Result<wire::ChatRequest> req = wire::parse_chat_request(l.body);
    Result<engine::GenerationRequest> gen =
        req.is_ok() ? to_generation(*req, model_, engine::RequestClass::kAsync)
                    : Result<engine::GenerationRequest>(req.status());
    if (!gen.is_ok()) {
      io_.fail({l, "invalid_request", gen.status().message(), false});
      continue;
    }
    gen->cache_namespace = l.account_id;
    if (l.catch_up) gen->priority = kCatchUpPriority;
    sizes_.record(static_cast<int>(gen->prompt.size()), gen->params.max_tokens);
    AnswerLogprobs logprobs(gen->params.logprobs >= 0);
    gen->on_event = timed([this](const engine::TokenEvent& ev) { on_event(ev); },
                          engine::RequestClass::kAsync, pulled_ns);
    auto id = eng_.add(std::move(gen).value());
    if (!id.is_ok()) {
      io_.fail({l, "invalid_request", id.status().message(), false});
      continue;
    }
    running_.emplace(*id, Running{l, "", std::move(logprobs), offered_tool_calls(*req, model_),
                                  wire::answers_json(*req)});
    if (l.catch_up) ++catch_up_held_;
    io_.hold(*id, l);
  }
}

void AsyncJobs::on_event(const engine::TokenEvent& ev) {
  auto it = running_.find(ev.id);
  if (it == running_.end()) return;
  Running& r = it->second;
  r.text += ev.text_delta;
  if (r.logprobs.wanted()) {
    r.logprobs.add(token_logprob(*model_.token_bytes, ev), ev.text_bytes, ev.text_delta.size(),
                   ev.finished);
  }
  if (!ev.finished) return;
  io_.drop(ev.id);
  if (ev.finish_reason == engine::FinishReason::kError) {
    // Another attempt (here or on another worker) may well succeed.
    io_.fail({r.lease, "inference_error", ev.error, true});
    erase(it);
    return;
  }
  wire::Answer answer;
  answer.text = std::move(r.text);
  answer.finish_reason = engine::finish_reason_name(ev.finish_reason);
  answer.usage = {ev.usage.prompt_tokens, ev.usage.completion_tokens, ev.usage.cached_tokens};
  answer.logprobs = r.logprobs.answer();
  extract_tool_calls(r.tool_calls, &answer);
  answer.json = r.json;
  io_.complete({r.lease, wire::encode_stored_answer(answer), ev.usage.prompt_tokens,
                ev.usage.completion_tokens, ev.usage.cached_tokens});
  erase(it);
}

void AsyncJobs::erase(std::unordered_map<int64_t, Running>::iterator it) {
  if (it->second.lease.catch_up) --catch_up_held_;
  running_.erase(it);
}

void AsyncJobs::drop_lost(const std::vector<int64_t>& lost) {
  for (int64_t id : lost) {
    auto it = running_.find(id);
    if (it == running_.end()) continue;
    erase(it);
    eng_.cancel(id);
  }
}

std::vector<queue::Lease> AsyncJobs::take_unfinished() {
  // Out of `running_` first: a cancel's final event looks its request up there, and would
  // complete it as cancelled besides handing it back.
  std::unordered_map<int64_t, Running> unfinished;
  unfinished.swap(running_);
  catch_up_held_ = 0;
  std::vector<queue::Lease> out;
  for (auto& [id, r] : unfinished) {
    out.push_back(r.lease);
    eng_.cancel(id);
  }
  return out;
}

}  // namespace hr::workers
