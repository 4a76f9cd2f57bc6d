// Per-model Redis streams.
#include "queue/stream.h"

#include <algorithm>
#include <cstdlib>

namespace hr::queue {

std::string stream_key(const std::string& model) { return "hr:stream:" + model; }

std::string worker_stream_key(const std::string& model, const std::string& worker) {
  return "hr:wstream:" + model + ":" + worker;
}

std::string worker_streams_key(const std::string& model) { return "hr:wstreams:" + model; }

std::string catch_up_stream_key(const std::string& model) { return "hr:cstream:" + model; }

std::string catch_up_made_key(const std::string& model) { return "hr:cstream-made:" + model; }

std::vector<StreamEntry> parse_entries(const RedisReply& list) {
  std::vector<StreamEntry> out;
  out.reserve(list.elements.size());
  for (const RedisReply& e : list.elements) {
    if (e.elements.empty()) continue;
    StreamEntry entry;
    entry.id = e.elements[0].str;
    if (e.elements.size() >= 2) {
      const auto& f = e.elements[1].elements;
      for (size_t k = 0; k + 1 < f.size(); k += 2) {
        if (f[k].str == "b") entry.ref.batch_id = f[k + 1].str;
        if (f[k].str == "i") entry.ref.idx = std::atoi(f[k + 1].str.c_str());
      }
    }
    out.push_back(std::move(entry));
  }
  return out;
}

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

namespace {

void add_entries(const std::string& key, const std::vector<RequestRef>& refs,
                 std::vector<std::vector<std::string>>* cmds) {
  for (const RequestRef& r : refs) {
    cmds->push_back({"XADD", key, "*", "b", r.batch_id, "i", std::to_string(r.idx)});
  }
}

// Keys: the worker's stream, the shared stream, the listing; ARGV: the worker.
constexpr const char* kMoveScript = R"lua(
local entries = redis.call('XRANGE', KEYS[1], '-', '+')
for _, e in ipairs(entries) do
  redis.call('XADD', KEYS[2], '*', unpack(e[2]))
end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[3], ARGV[1])
return #entries
)lua";

}  // namespace

Status enqueue(RedisClient& redis, const std::string& model, const std::vector<RequestRef>& refs) {
  if (refs.empty()) return Status::ok();
  std::vector<std::vector<std::string>> cmds;
  cmds.reserve(refs.size());
  add_entries(stream_key(model), refs, &cmds);
  HR_ASSIGN_OR_RETURN(auto replies, redis.pipeline(cmds));
  for (const auto& r : replies) {
    if (r.is_error()) return unavailable("redis XADD: " + r.str);
  }
  return Status::ok();
}

namespace {

// In one transaction: `first` (which marks the stream as made), the stream's group (created with
// the stream if missing), then the entries.
Status enqueue_made(RedisClient& redis, const std::string& key, std::vector<std::string> first,
                    const std::vector<RequestRef>& refs, const char* what) {
  if (refs.empty()) return Status::ok();
  std::vector<std::vector<std::string>> cmds = {
      {"MULTI"}, std::move(first), {"XGROUP", "CREATE", key, kConsumerGroup, "0", "MKSTREAM"}};
  add_entries(key, refs, &cmds);
  cmds.push_back({"EXEC"});
  HR_ASSIGN_OR_RETURN(auto replies, redis.pipeline(cmds));
  const RedisReply& exec = replies.back();
  if (exec.is_error()) return unavailable("redis EXEC: " + exec.str);
  if (exec.elements.size() != cmds.size() - 2) return unavailable("redis EXEC: a short answer");
  for (size_t k = 0; k < exec.elements.size(); ++k) {
    const RedisReply& r = exec.elements[k];
    // The group was there already: the usual case.
    if (r.is_error() && !(k == 1 && r.str.rfind("BUSYGROUP", 0) == 0)) {
      return unavailable(std::string("redis (") + what + "): " + r.str);
    }
  }
  return Status::ok();
}

}  // namespace

Status enqueue_for_worker(RedisClient& redis, const std::string& model, const std::string& worker,
                          const std::vector<RequestRef>& refs) {
  return enqueue_made(redis, worker_stream_key(model, worker),
                      {"SADD", worker_streams_key(model), worker}, refs, "a worker's stream");
}

Status enqueue_catch_up(RedisClient& redis, const std::string& model,
                        const std::vector<RequestRef>& refs) {
  return enqueue_made(redis, catch_up_stream_key(model), {"SET", catch_up_made_key(model), "1"},
                      refs, "the catch-up stream");
}

Result<std::vector<std::string>> workers_with_streams(RedisClient& redis,
                                                      const std::string& model) {
  HR_ASSIGN_OR_RETURN(RedisReply r, redis.command({"SMEMBERS", worker_streams_key(model)}));
  if (r.is_error()) return unavailable("redis SMEMBERS: " + r.str);
  std::vector<std::string> out;
  for (const RedisReply& e : r.elements) out.push_back(e.str);
  std::sort(out.begin(), out.end());
  return out;
}

Result<int64_t> move_worker_stream(RedisClient& redis, const std::string& model,
                                   const std::string& worker) {
  HR_ASSIGN_OR_RETURN(RedisReply r,
                      redis.command({"EVAL", kMoveScript, "3", worker_stream_key(model, worker),
                                     stream_key(model), worker_streams_key(model), worker}));
  if (r.is_error()) return unavailable("redis (moving a worker's stream): " + r.str);
  return r.integer;
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

Status ack_and_delete(RedisClient& redis, const std::string& key,
                      const std::vector<std::string>& entry_ids) {
  if (entry_ids.empty()) return Status::ok();
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
