// A test consumer standing in for the workers: a dispatcher that relays, a lease client that pulls
// the harness model's requests and answers them with the reversal of their prompt, fails them, and
// finalizes OpenAI batches.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "queue/dispatcher.h"
#include "queue/lease.h"
#include "tests/testing/api_harness.h"

namespace hr::testing {

struct Consumer {
  std::unique_ptr<queue::Dispatcher> dispatcher;
  std::unique_ptr<queue::LeaseClient> lease;
  explicit Consumer(ApiHarness& h, queue::DispatcherOptions options = {});
  // Relays, then leases up to n requests.
  std::vector<queue::Lease> pull(int n);
  // What a worker stores for a request that asked for log probabilities (the shape, not the
  // values).
  static const nlohmann::json kStoredLogprobs;
  // Answers each lease with the reversal of its prompt's text ("reverse: abc" → "cba"), and log
  // probabilities where asked.
  void complete(const std::vector<queue::Lease>& leases);
  // Ends each lease failed for good (code "test_failure").
  void fail(const std::vector<queue::Lease>& leases);
  int finalize();
};

}  // namespace hr::testing
