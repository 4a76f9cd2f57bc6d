// The pieces of one answer as it is generated, whoever generates it: the in-process worker
// (workers/worker.h) or a remote one reached through the API's router (api/worker_router.h).
// Used by one thread.
#pragma once

#include <string>
#include <vector>

#include "base/status.h"
#include "wire/answer.h"

namespace hr::wire {

class AnswerStream {
 public:
  virtual ~AnswerStream() = default;
  // Blocks until the next text delta (true) or the end (false; then answer() holds the whole
  // answer's totals, or status() the failure).
  virtual bool next(std::string* delta) = 0;
  // With log probabilities asked for: the entries of the tokens whose text the last delta
  // carries; else nullopt.
  virtual const Logprobs& delta_logprobs() const = 0;
  // The tool-call pieces that came with the last delta (whose text is then often empty): calls
  // read out of the answer as it is written. A call not streamed comes whole in answer().
  virtual const std::vector<ToolCallDelta>& delta_tool_calls() const {
    static const std::vector<ToolCallDelta> none;
    return none;
  }
  virtual const Status& status() const = 0;
  // At the end: text (empty: it went out in the deltas), finish reason and usage.
  virtual const Answer& answer() const = 0;
  // Which worker generates it (empty in-process).
  virtual std::string worker() const { return {}; }
};

}  // namespace hr::wire
