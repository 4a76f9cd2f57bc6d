// Sync requests on their way through a worker: the job a handler thread hands to the step loop,
// the stream the handler reads the answer from, and the step loop's side, which puts jobs into
// the engine's sync class (ahead of all async work) and stops those whose client went away.
// A job is shared by one handler thread and the step loop; its answer crosses under its mutex.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "base/clock.h"
#include "base/status.h"
#include "engine/engine.h"
#include "engine/tool_call_stream.h"
#include "engine/tool_calls.h"
#include "wire/answer.h"
#include "wire/answer_stream.h"
#include "workers/answer_logprobs.h"

namespace hr::workers {

class TokenBytes;
struct LoopMetrics;
struct WorkerStats;

// One sync request: its deltas and final answer, handed from the step loop to the waiting handler
// thread under `mu`.
struct SyncJob {
  engine::GenerationRequest request;
  std::string text;                // step loop only
  AnswerLogprobs logprobs{false};  // step loop only
  std::promise<Result<wire::Answer>> done;
  bool streaming = false;
  std::mutex mu;
  std::condition_variable cv;
  // A streamed answer's pieces: text, and the logprobs entries it completes (nullopt when none
  // were asked for).
  struct Piece {
    std::string text;
    wire::Logprobs logprobs;
    std::vector<wire::ToolCallDelta> calls;  // tool-call pieces read out of the answer so far
  };
  std::deque<Piece> pieces;  // guarded by mu
  bool finished = false;     // guarded by mu
  Status status;             // guarded by mu
  wire::Answer answer;       // guarded by mu
  int64_t arrival_ns = steady_now_ns();
  // A flex job (SyncOptions::flex): given up when no token has come by then (0: never).
  int64_t start_deadline_ns = 0;
  bool started = false;  // step loop only: a token came
  bool expired = false;  // step loop only: given up; the engine's last event is ignored
  std::atomic<bool> abandoned{false};  // the client went away: cancel in the engine
  int64_t engine_id = -1;              // step loop only
  // How the model writes tool calls when the request offered tools (read out of the answer).
  engine::ToolCallFormat tool_calls = engine::ToolCallFormat::kNone;
  size_t sent = 0;  // step loop only: bytes of `text` streamed (the rest may be a tool call)
  // Streamed with tools: the calls as they are written, and the ids their first pieces gave them
  // (the final answer's calls keep them). Step loop only.
  std::unique_ptr<engine::ToolCallStream> call_stream;
  std::vector<std::string> call_ids;

  // Ends the job with an error (for the handler waiting on it), unless it ended already. From
  // the step loop, or from the step watchdog's thread while the loop is stuck.
  void fail(const Status& st);
};

// Holds one of the worker's sync slots (one count in `active`) for as long as it lives; adopts a
// slot that the worker has already counted.
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

// The handler's view of a streamed job; dropping it before the end cancels the request.
std::unique_ptr<wire::AnswerStream> make_job_stream(std::shared_ptr<SyncJob> job,
                                                    ActiveSync active);

// The step loop's sync requests. Step loop only.
class SyncJobs {
 public:
  SyncJobs(engine::Engine& eng, TokenBytes& bytes, LoopMetrics& metrics, WorkerStats& stats)
      : eng_(eng), bytes_(bytes), metrics_(metrics), stats_(stats) {}
  // Puts the jobs into the engine's sync class; a job the engine refuses ends with its error.
  void admit(std::vector<std::shared_ptr<SyncJob>> jobs);
  // Stops the requests whose client went away, and forgets the finished ones.
  void cancel_abandoned();

 private:
  engine::Engine& eng_;
  TokenBytes& bytes_;
  LoopMetrics& metrics_;
  WorkerStats& stats_;
  std::vector<std::shared_ptr<SyncJob>> generating_;  // in the engine
};

}  // namespace hr::workers
