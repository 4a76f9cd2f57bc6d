// Sync requests in a worker.
#include "workers/sync_jobs.h"

#include <algorithm>

#include "workers/generation_request.h"
#include "workers/worker.h"
#include "workers/worker_metrics.h"

namespace hr::workers {

void SyncJob::fail(const Status& st) {
  {
    std::lock_guard<std::mutex> lock(mu);
    if (finished) return;  // it ended already: the first end stands
    finished = true;
    status = st;
    cv.notify_one();
  }
  if (!streaming) done.set_value(st);
}

namespace {

class JobStream final : public wire::AnswerStream {
 public:
  JobStream(std::shared_ptr<SyncJob> job, ActiveSync active)
      : job_(std::move(job)), active_(std::move(active)) {}
  // Dropped before the end (the client left): the step loop cancels the request.
  ~JobStream() override { job_->abandoned = true; }
  bool next(std::string* delta) override {
    std::unique_lock<std::mutex> lock(job_->mu);
    job_->cv.wait(lock, [&] { return !job_->pieces.empty() || job_->finished; });
    if (!job_->pieces.empty()) {
      *delta = std::move(job_->pieces.front().text);
      logprobs_ = std::move(job_->pieces.front().logprobs);
      calls_ = std::move(job_->pieces.front().calls);
      job_->pieces.pop_front();
      return true;
    }
    status_ = job_->status;
    answer_ = job_->answer;
    return false;
  }
  const wire::Logprobs& delta_logprobs() const override { return logprobs_; }
  const std::vector<wire::ToolCallDelta>& delta_tool_calls() const override { return calls_; }
  const Status& status() const override { return status_; }
  const wire::Answer& answer() const override { return answer_; }

 private:
  std::shared_ptr<SyncJob> job_;
  ActiveSync active_;
  Status status_;
  wire::Answer answer_;
  wire::Logprobs logprobs_;
  std::vector<wire::ToolCallDelta> calls_;
};

// The job's answer as the engine's events come.
void on_event(SyncJob& job, TokenBytes& bytes, const engine::TokenEvent& ev) {
  if (job.expired) return;  // failed already (a flex job not started in time)
  job.started = true;
  if (ev.finish_reason == engine::FinishReason::kError) {
    // Nothing reached the client: another worker may answer (as async work is retried).
    job.fail(unavailable(ev.error));
    return;
  }
  job.text += ev.text_delta;
  wire::Answer answer;
  if (ev.finished) {
    answer.text = job.text;
    answer.finish_reason = engine::finish_reason_name(ev.finish_reason);
    answer.usage = {ev.usage.prompt_tokens, ev.usage.completion_tokens, ev.usage.cached_tokens};
    extract_tool_calls(job.tool_calls, &answer);
    // Calls streamed as they were written keep the ids their first pieces gave them.
    for (size_t i = 0; i < answer.tool_calls.size() && i < job.call_ids.size(); ++i)
      answer.tool_calls[i].id = job.call_ids[i];
  }
  // What of the text goes out now. Streamed with tools offered, text that may be the start of a
  // call is held back until it is known; calls go out as tool_calls at the end, not as text.
  std::string piece = ev.text_delta;
  std::vector<wire::ToolCallDelta> calls;
  if (job.streaming && job.tool_calls != engine::ToolCallFormat::kNone) {
    if (!job.call_stream)
      job.call_stream = std::make_unique<engine::ToolCallStream>(job.tool_calls);
    for (engine::CallPiece& p : job.call_stream->update(job.text)) {
      wire::ToolCallDelta d;
      d.index = p.index;
      if (p.first) {
        job.call_ids.push_back(new_call_id());
        d.id = job.call_ids.back();
        d.name = std::move(p.name);
      }
      d.arguments = std::move(p.arguments);
      calls.push_back(std::move(d));
    }
  }
  if (job.streaming) {
    size_t end = job.text.size();
    if (job.tool_calls != engine::ToolCallFormat::kNone) {
      if (!ev.finished) {
        end = std::max(job.sent, engine::streamable_prefix(job.tool_calls, job.text));
      } else if (!answer.tool_calls.empty()) {
        end = job.sent;
      }
    }
    piece = job.text.substr(job.sent, end - job.sent);
    job.sent = end;
  }
  if (job.logprobs.wanted()) {
    job.logprobs.add(token_logprob(bytes, ev), ev.text_bytes, piece.size(), ev.finished);
  }
  // Streamed, each piece carries the entries of the tokens whose text it completes; the last ones
  // may come with an empty piece.
  wire::Logprobs piece_logprobs;
  if (job.streaming && job.logprobs.wanted() && (!piece.empty() || ev.finished)) {
    piece_logprobs = job.logprobs.take();
  }
  if (ev.finished && !job.streaming) answer.logprobs = job.logprobs.answer();
  if (job.streaming) {
    std::lock_guard<std::mutex> lock(job.mu);
    if (job.finished) return;  // failed meanwhile from another thread (a stuck step's watchdog)
    if (!piece.empty() || (piece_logprobs && !piece_logprobs->empty()) || !calls.empty()) {
      job.pieces.push_back({std::move(piece), std::move(piece_logprobs), std::move(calls)});
    }
    if (ev.finished) {
      job.finished = true;
      job.answer = answer;
    }
    job.cv.notify_one();
  } else if (ev.finished) {
    {
      std::lock_guard<std::mutex> lock(job.mu);
      if (job.finished) return;  // (as above)
      job.finished = true;
    }
    job.done.set_value(answer);
  }
}

}  // namespace

std::unique_ptr<wire::AnswerStream> make_job_stream(std::shared_ptr<SyncJob> job,
                                                    ActiveSync active) {
  return std::make_unique<JobStream>(std::move(job), std::move(active));
}

void SyncJobs::admit(std::vector<std::shared_ptr<SyncJob>> jobs) {
  for (auto& job : jobs) {
    class_metrics(job->request.cls)
        .queue.observe(static_cast<double>(steady_now_ns() - job->arrival_ns) / 1e9);
    job->logprobs = AnswerLogprobs(job->request.params.logprobs >= 0);
    TokenBytes* bytes = &bytes_;
    job->request.on_event =
        timed([job, bytes](const engine::TokenEvent& ev) { on_event(*job, *bytes, ev); },
              job->request.cls, job->arrival_ns);
    auto id = eng_.add(std::move(job->request));
    if (!id.is_ok()) {
      job->fail(id.status());
    } else {
      job->engine_id = *id;
      generating_.push_back(job);
    }
  }
}

void SyncJobs::cancel_abandoned() {
  std::erase_if(generating_, [&](const std::shared_ptr<SyncJob>& job) {
    bool finished = false;
    {
      std::lock_guard<std::mutex> lock(job->mu);
      finished = job->finished;
    }
    if (finished) return true;
    if (!job->abandoned && job->start_deadline_ns != 0 && !job->started &&
        steady_now_ns() >= job->start_deadline_ns) {
      // A flex job that found no room in time: the caller hears so (OpenAI's 429
      // resource_unavailable), and the engine forgets it.
      job->expired = true;
      eng_.cancel(job->engine_id);
      job->fail(Status(StatusCode::kResourceExhausted,
                       "Resource unavailable: no room to start this flex request within its "
                       "timeout; retry later, or without service_tier flex",
                       "service_tier"));
      metrics_.flex_expired.add();
      return true;
    }
    if (!job->abandoned) return false;
    eng_.cancel(job->engine_id);
    if (job->streaming) {
      ++stats_.streams_cancelled;
      metrics_.streams_cancelled.add();
    } else {
      ++stats_.calls_cancelled;
      metrics_.calls_cancelled.add();
    }
    return true;
  });
}

}  // namespace hr::workers
