// A model's open batches and throughput, for forecasts.
#include "queue/open_work.h"

#include <cstdio>
#include <cstdlib>

#include "queue/pg.h"

namespace hr::queue {

Result<std::vector<OpenBatch>> read_open_batches(pqxx::connection& conn, const std::string& model) {
  std::vector<OpenBatch> out;
  Status st = pg_guard("read open batches", [&]() -> Status {
    pqxx::nontransaction tx(conn);
    pqxx::result r = tx.exec_params(
        "SELECT b.id::text, b.account_id::text, a.weight, b.priority, "
        "  (extract(epoch FROM b.deadline) * 1000)::bigint, "
        "  greatest(0, b.num_total - b.num_completed - b.num_failed - b.num_cancelled - "
        "    b.num_expired), "
        "  CASE WHEN b.status IN ('queued', 'running') "
        "    THEN greatest(0, b.num_total - b.num_dispatched) ELSE 0 END "
        "FROM batches b JOIN accounts a ON a.id = b.account_id "
        "WHERE b.model = $1 AND b.finished_at IS NULL",
        model);
    out.reserve(r.size());
    for (const auto& row : r) {
      OpenBatch b;
      b.id = row[0].as<std::string>();
      b.account_id = row[1].as<std::string>();
      b.weight = row[2].as<double>();
      b.priority = row[3].as<int>();
      if (!row[4].is_null()) b.deadline_ms = row[4].as<int64_t>();
      b.remaining = row[5].as<int64_t>();
      b.queued = row[6].as<int64_t>();
      out.push_back(std::move(b));
    }
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return out;
}

Result<std::map<std::string, int64_t>> open_requests_by_model(pqxx::connection& conn) {
  std::map<std::string, int64_t> out;
  Status st = pg_guard("read open requests", [&]() -> Status {
    pqxx::nontransaction tx(conn);
    pqxx::result r = tx.exec(
        "SELECT model, sum(greatest(0, num_total - num_completed - num_failed - num_cancelled - "
        "  num_expired))::bigint FROM batches WHERE finished_at IS NULL GROUP BY model");
    for (const auto& row : r) {
      const int64_t n = row[1].as<int64_t>();
      if (n > 0) out[row[0].as<std::string>()] = n;
    }
    return Status::ok();
  });
  if (!st.is_ok()) return st;
  return out;
}

std::string model_rate_key(const std::string& model) { return "hr:rate:" + model; }

Status publish_model_rate(RedisClient& redis, const std::string& model, double per_s) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.6g", per_s);
  HR_ASSIGN_OR_RETURN(RedisReply r,
                      redis.command({"SET", model_rate_key(model), text, "EX", "600"}));
  if (r.is_error()) return unavailable("redis SET " + model_rate_key(model) + ": " + r.str);
  return Status::ok();
}

Result<std::optional<double>> read_model_rate(RedisClient& redis, const std::string& model) {
  HR_ASSIGN_OR_RETURN(RedisReply r, redis.command({"GET", model_rate_key(model)}));
  if (r.is_error()) return unavailable("redis GET " + model_rate_key(model) + ": " + r.str);
  if (r.is_nil()) return std::optional<double>();
  char* end = nullptr;
  const double v = std::strtod(r.str.c_str(), &end);
  if (end == r.str.c_str() || !(v > 0)) return std::optional<double>();
  return std::optional<double>(v);
}

}  // namespace hr::queue
