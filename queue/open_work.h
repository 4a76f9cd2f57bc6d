// What a forecast of the queue reads (queue/estimate.h): a model's open batches from Postgres,
// and the model's throughput, which the dispatcher relaying the model publishes in Redis
// (hr:rate:{model}, RelayWindow::saturated_rate_per_s, expiring 10 minutes after it was last
// written: a model no dispatcher relays has no known rate). Also the open requests of every model,
// for the operator's view of the queue.
#pragma once

#include <pqxx/pqxx>

#include <map>
#include <optional>
#include <string>
#include <vector>

#include "base/status.h"
#include "queue/estimate.h"
#include "queue/redis.h"

namespace hr::queue {

// The model's batches not yet finished, with their accounts' weights (one query over the open
// batches' partial index).
[[nodiscard]] Result<std::vector<OpenBatch>> read_open_batches(pqxx::connection& conn,
                                                               const std::string& model);

// Requests of open batches not yet ended (queued or running), by model; models without any are
// left out.
[[nodiscard]] Result<std::map<std::string, int64_t>> open_requests_by_model(pqxx::connection& conn);

std::string model_rate_key(const std::string& model);
// Writes the model's throughput in requests a second.
[[nodiscard]] Status publish_model_rate(RedisClient& redis, const std::string& model, double per_s);
// The model's last published throughput; none when no dispatcher published one lately.
[[nodiscard]] Result<std::optional<double>> read_model_rate(RedisClient& redis,
                                                            const std::string& model);

}  // namespace hr::queue
