// Worker announcements in Redis. Liveness is the entry key's TTL, kept by Redis itself, so workers
// and APIs need no agreement on wall-clock time; the sorted set is only an index of ids.
#include "queue/registry.h"

#include <algorithm>

#include "base/clock.h"

namespace hr::queue {

using nlohmann::json;

namespace {

std::string set_key(const std::string& model) { return "hr:workers:" + model; }
std::string entry_key(const std::string& model, const std::string& id) {
  return "hr:worker:" + model + ":" + id;
}

Status reply_error(const RedisReply& r, const char* what) {
  if (r.is_error()) return unavailable(std::string(what) + ": " + r.str);
  return Status::ok();
}

}  // namespace

json WorkerInfo::to_json() const {
  return {{"id", id},
          {"model", model},
          {"url", url},
          {"capacity", capacity},
          {"sync_load", sync_load},
          {"async_running", async_running},
          {"free_kv_blocks", free_kv_blocks},
          {"total_kv_blocks", total_kv_blocks},
          {"utilization", utilization},
          {"draining", draining},
          {"heartbeat_ms", heartbeat_ms},
          {"totals",
           {{"started_ms", totals.started_ms},
            {"sync_tokens", totals.sync_tokens},
            {"async_tokens", totals.async_tokens},
            {"credits_granted", totals.credits_granted},
            {"sync_ttft", totals.sync_ttft}}}};
}

Result<WorkerInfo> WorkerInfo::from_json(const json& j) {
  if (!j.is_object() || !j.contains("id") || !j["id"].is_string() || !j.contains("url") ||
      !j["url"].is_string()) {
    return invalid_argument("worker entry without id or url", "worker");
  }
  WorkerInfo w;
  try {
    w.id = j["id"];
    w.model = j.value("model", "");
    w.url = j["url"];
    w.capacity = j.value("capacity", 0);
    w.sync_load = j.value("sync_load", 0);
    w.async_running = j.value("async_running", 0);
    w.free_kv_blocks = j.value("free_kv_blocks", 0);
    w.total_kv_blocks = j.value("total_kv_blocks", 0);
    w.utilization = j.value("utilization", 0.0);
    w.draining = j.value("draining", false);
    w.heartbeat_ms = j.value("heartbeat_ms", int64_t{0});
    if (j.contains("totals") && j["totals"].is_object()) {  // absent from older workers
      const json& t = j["totals"];
      w.totals.started_ms = t.value("started_ms", int64_t{0});
      w.totals.sync_tokens = t.value("sync_tokens", 0.0);
      w.totals.async_tokens = t.value("async_tokens", 0.0);
      w.totals.credits_granted = t.value("credits_granted", 0.0);
      w.totals.sync_ttft = t.value("sync_ttft", std::vector<uint64_t>{});
    }
  } catch (const json::exception& e) {
    return invalid_argument(std::string("bad worker entry: ") + e.what(), "worker");
  }
  return w;
}

Result<std::unique_ptr<WorkerRegistry>> WorkerRegistry::connect(const std::string& redis_url,
                                                                int timeout_ms) {
  HR_ASSIGN_OR_RETURN(auto redis, RedisClient::connect(redis_url, timeout_ms));
  return std::unique_ptr<WorkerRegistry>(new WorkerRegistry(std::move(redis)));
}

Status WorkerRegistry::announce(const WorkerInfo& w, int ttl_ms) {
  HR_ASSIGN_OR_RETURN(
      auto replies,
      redis_->pipeline(
          {{"SET", entry_key(w.model, w.id), w.to_json().dump(), "PX", std::to_string(ttl_ms)},
           {"ZADD", set_key(w.model), std::to_string(SystemClock::instance().now_unix_ms()), w.id},
           // The index outlives its workers only briefly once they all stop.
           {"PEXPIRE", set_key(w.model), std::to_string(std::max(60000, 20 * ttl_ms))}}));
  for (const RedisReply& r : replies) HR_RETURN_IF_ERROR(reply_error(r, "announce"));
  return Status::ok();
}

Status WorkerRegistry::withdraw(const std::string& model, const std::string& id) {
  HR_ASSIGN_OR_RETURN(auto replies, redis_->pipeline({{"DEL", entry_key(model, id)},
                                                      {"ZREM", set_key(model), id}}));
  for (const RedisReply& r : replies) HR_RETURN_IF_ERROR(reply_error(r, "withdraw"));
  return Status::ok();
}

Result<std::vector<WorkerInfo>> WorkerRegistry::live(const std::string& model) {
  return live_workers(*redis_, model);
}

Result<std::vector<std::string>> live_worker_ids(RedisClient& redis, const std::string& model) {
  HR_ASSIGN_OR_RETURN(std::vector<WorkerInfo> workers, live_workers(redis, model));
  std::vector<std::string> ids;
  for (const WorkerInfo& w : workers) {
    if (!w.draining) ids.push_back(w.id);
  }
  std::sort(ids.begin(), ids.end());
  return ids;
}

Result<std::vector<WorkerInfo>> live_workers(RedisClient& redis, const std::string& model) {
  HR_ASSIGN_OR_RETURN(RedisReply ids, redis.command({"ZRANGE", set_key(model), "0", "-1"}));
  HR_RETURN_IF_ERROR(reply_error(ids, "list workers"));
  std::vector<WorkerInfo> out;
  if (ids.elements.empty()) return out;
  std::vector<std::string> mget = {"MGET"};
  for (const RedisReply& id : ids.elements) mget.push_back(entry_key(model, id.str));
  HR_ASSIGN_OR_RETURN(RedisReply entries, redis.command(mget));
  HR_RETURN_IF_ERROR(reply_error(entries, "read workers"));
  std::vector<std::string> expired = {"ZREM", set_key(model)};
  for (size_t i = 0; i < entries.elements.size() && i < ids.elements.size(); ++i) {
    const RedisReply& e = entries.elements[i];
    if (e.is_nil()) {
      expired.push_back(ids.elements[i].str);
      continue;
    }
    Result<WorkerInfo> w = WorkerInfo::from_json(json::parse(e.str, nullptr, false));
    if (w.is_ok()) out.push_back(std::move(w).value());
  }
  // Forgetting expired ids is housekeeping: a failure here does not fail the lookup, and an id
  // whose worker came back meanwhile is re-added by its next heartbeat.
  if (expired.size() > 2) (void)redis.command(expired);
  return out;
}

}  // namespace hr::queue
