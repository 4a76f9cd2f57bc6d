// Per-model Redis streams.
#include "queue/stream.h"

namespace hr::queue {

std::string stream_key(const std::string& model) { return "hr:stream:" + model; }

Result<bool> group_exists(RedisClient& redis, const std::string& model) {
  HR_ASSIGN_OR_RETURN(RedisReply r, redis.command({"XINFO", "GROUPS", stream_key(model)}));
  if (r.is_error()) {
    if (r.str.find("no such key") != std::string::npos) return false;
    return unavailable("redis XINFO GROUPS: " + r.str);
  }
  for (const RedisReply& g : r.elements) {  // each group: [name, value, field, value, ...]
    for (size_t f = 0; f + 1 < g.elements.size(); f += 2) {
      if (g.elements[f].str == "name" && g.elements[f + 1].str == kConsumerGroup) return true;
    }
  }
  return false;
}

Status create_group(RedisClient& redis, const std::string& model) {
  HR_ASSIGN_OR_RETURN(RedisReply r, redis.command({"XGROUP", "CREATE", stream_key(model),
                                                   kConsumerGroup, "0", "MKSTREAM"}));
  if (r.is_error() && r.str.rfind("BUSYGROUP", 0) != 0) {
    return unavailable("redis XGROUP CREATE: " + r.str);
  }
  return Status::ok();
}

Status enqueue(RedisClient& redis, const std::string& model, const std::vector<RequestRef>& refs) {
  if (refs.empty()) return Status::ok();
  std::string key = stream_key(model);
  std::vector<std::vector<std::string>> cmds;
  cmds.reserve(refs.size());
  for (const RequestRef& r : refs) {
    cmds.push_back({"XADD", key, "*", "b", r.batch_id, "i", std::to_string(r.idx)});
  }
  HR_ASSIGN_OR_RETURN(auto replies, redis.pipeline(cmds));
  for (const auto& r : replies) {
    if (r.is_error()) return unavailable("redis XADD: " + r.str);
  }
  return Status::ok();
}

Status push_requeued(RedisClient& redis, PgSession& pg, const std::string& model,
                     const std::vector<Requeued>& requeued) {
  if (requeued.empty()) return Status::ok();
  std::vector<RequestRef> refs;
  refs.reserve(requeued.size());
  for (const Requeued& r : requeued) refs.push_back({r.batch_id, r.idx});
  HR_RETURN_IF_ERROR(enqueue(redis, model, refs));
  return pg.run("mark pushed", [&](pqxx::connection& conn) { return mark_pushed(conn, requeued); });
}

Status ack_and_delete(RedisClient& redis, const std::string& model,
                      const std::vector<std::string>& entry_ids) {
  if (entry_ids.empty()) return Status::ok();
  std::string key = stream_key(model);
  std::vector<std::string> ack = {"XACK", key, kConsumerGroup};
  std::vector<std::string> del = {"XDEL", key};
  ack.insert(ack.end(), entry_ids.begin(), entry_ids.end());
  del.insert(del.end(), entry_ids.begin(), entry_ids.end());
  HR_ASSIGN_OR_RETURN(auto replies, redis.pipeline({ack, del}));
  for (const auto& r : replies) {
    // No group (Redis lost the stream, and a push made it anew): nothing is pending to ack.
    if (r.is_error() && r.str.rfind("NOGROUP", 0) != 0)
      return unavailable("redis XACK/XDEL: " + r.str);
  }
  return Status::ok();
}

}  // namespace hr::queue
