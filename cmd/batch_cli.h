// `headroom batch`: a client of the HTTP API (HEADROOM_URL, HEADROOM_API_KEY) for people and
// scripts: submit a JSONL file in either shape and watch it go, a batch's status, the account's
// batches, cancel, retry and results. Exit codes scripts can use: 0 completed (or still open for
// `status`), 2 completed with failed, cancelled or expired requests, 3 the batch failed, expired
// or was cancelled, 1 a usage or connection error, 130 watching stopped by Ctrl-C (the batch goes
// on). Errors are one line naming what to fix.
#pragma once

#include <string>

namespace hr::cmd {

struct BatchCommand {
  std::string action;  // submit, status, list, cancel, retry, results
  std::string url;     // HEADROOM_URL
  std::string api_key;
  std::string file;   // submit
  std::string id;     // status, cancel, retry, results
  std::string model;  // submit, Workers-AI shape
  std::string shape;  // submit: workers-ai or openai (empty: from the file's first line)
  std::string webhook_url;
  std::string completion_window;
  std::string output;   // results: a file (empty: stdout)
  bool resume = false;  // results: continue the file from its last whole line
  bool wait = false;
  int poll_ms = 1000;
  int limit = 20;  // list
};

int run_batch(const BatchCommand& command);

}  // namespace hr::cmd
