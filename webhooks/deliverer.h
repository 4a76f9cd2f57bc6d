// Webhook delivery, run by every dispatcher process (and by `serve`): turns outbox events into
// deliveries, claims due ones, signs them (Standard Webhooks) and POSTs them from a pool of
// sending threads, then records each attempt. At least once: a delivery is retried until a 2xx,
// with the same webhook-id, on an exponential schedule with jitter (Retry-After honoured for 429,
// 502, 503 and 504); 410 disables its endpoint; a target the address policy refuses fails at
// once. Several dispatchers share the work through SKIP LOCKED claims and never send the same
// attempt twice.
#pragma once

#include <CLI/CLI.hpp>

#include <atomic>
#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "base/status.h"
#include "queue/webhooks.h"
#include "webhooks/client.h"

namespace hr::webhooks {

struct DeliveryOptions {
  bool disabled = false;   // --no-webhooks: this process delivers none
  int concurrency = 32;    // deliveries in flight per process
  int timeout_ms = 15000;  // per attempt
  // Delays before the 2nd, 3rd, ... attempt; after the last, the delivery is failed.
  std::string retry_schedule = "5s,5m,30m,2h,5h,10h,10h";
  // Non-public targets allowed anyway: CIDRs, "loopback" or "private" (--webhook-allow).
  std::vector<std::string> allow;
  // The product's own services ("host:port"), refused as targets whatever `allow` says.
  std::vector<std::string> refused_services;
  std::string ca_file;  // extra trusted CAs for HTTPS targets
  int claim_batch = 256;
  int retention_hours = 168;  // fanned-out events and ended deliveries are kept this long

  // Registers the delivery options (--webhook-*) on a subcommand; --webhook-allow only with
  // `with_allow` (in `serve` the API's option serves both).
  void bind(CLI::App& app, bool with_allow);
  [[nodiscard]] Status validate() const;
  [[nodiscard]] Result<std::vector<int64_t>> schedule_ms() const;
};

// What one attempt's result means for the delivery. `jitter` in [0.8, 1.2] scales the delay.
queue::AttemptOutcome decide_outcome(const queue::ClaimedDelivery& d, const PostResult& r,
                                     const std::vector<int64_t>& schedule_ms, double jitter);

class Deliverer {
 public:
  [[nodiscard]] static Result<std::unique_ptr<Deliverer>> create(const std::string& database_url,
                                                                 DeliveryOptions options);
  ~Deliverer();

  // One synchronous pass: fan out, claim what is due, send it all, record. Returns the number of
  // attempts made.
  [[nodiscard]] Result<int> run_once();
  // Delivers until `stop`, waking on NOTIFY hr_webhook. Errors are logged and retried.
  void run(const std::atomic<bool>& stop);

 private:
  Deliverer(std::string database_url, DeliveryOptions options, std::vector<int64_t> schedule,
            AddressPolicy policy);
  queue::AttemptOutcome send(Client& client, const queue::ClaimedDelivery& d);

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace hr::webhooks
