// Tool calls read out of an answer while it streams, in the formats of tool_calls.h: a call's
// name as soon as the model has written it and the start of its arguments, then the arguments'
// text as it comes, so that a client sees the call build up (OpenAI's delta.tool_calls). A call
// whose arguments come before its name, or are a JSON string rather than an object, is not
// streamed: parse_tool_calls reads it at the end. Used by one thread.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "engine/tool_calls.h"

namespace hr::engine {

struct CallPiece {
  int index = 0;       // the call's place among the answer's calls
  bool first = false;  // the call's first piece: it names the function
  std::string name;    // first piece only
  std::string arguments;
};

class ToolCallStream {
 public:
  explicit ToolCallStream(ToolCallFormat format) : format_(format) {}

  // The pieces not given before, from the whole answer so far (each call gets bytes of
  // `text` only once they are certain to belong to its arguments).
  std::vector<CallPiece> update(const std::string& text);
  // How many calls have been started (named).
  int num_started() const { return static_cast<int>(calls_.size()); }

 private:
  struct Call {
    size_t args_begin = 0;   // where the arguments' text begins in the answer
    size_t sent = 0;         // how far they went out
    bool done = false;       // the arguments are complete
    std::string end_marker;  // raw sections: what ends the arguments ("" for a JSON value)
    size_t object_begin = std::string::npos;  // JSON calls: where the call's object begins
  };
  // Looks for the next call from pos_; true when one was started (appended to calls_).
  bool start_next(const std::string& text, std::vector<CallPiece>* out);

  ToolCallFormat format_;
  size_t pos_ = 0;       // where the next call may start
  bool opened_ = false;  // Mistral: past "[TOOL_CALLS]["
  std::vector<Call> calls_;
};

}  // namespace hr::engine
