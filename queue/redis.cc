// hiredis wrapper.
#include "queue/redis.h"

#include <hiredis/hiredis.h>
#include <sys/time.h>

#include "base/url.h"

namespace hr::queue {
namespace {

RedisReply convert(const redisReply* r) {
  RedisReply out;
  switch (r->type) {
    case REDIS_REPLY_STRING:
      out.type = RedisReply::Type::kString;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_STATUS:
      out.type = RedisReply::Type::kStatus;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_ERROR:
      out.type = RedisReply::Type::kError;
      out.str.assign(r->str, r->len);
      break;
    case REDIS_REPLY_INTEGER:
      out.type = RedisReply::Type::kInteger;
      out.integer = r->integer;
      break;
    case REDIS_REPLY_ARRAY:
      out.type = RedisReply::Type::kArray;
      out.elements.reserve(r->elements);
      for (size_t i = 0; i < r->elements; ++i) out.elements.push_back(convert(r->element[i]));
      break;
    default:
      out.type = RedisReply::Type::kNil;
  }
  return out;
}

timeval to_timeval(int ms) { return timeval{ms / 1000, (ms % 1000) * 1000}; }

void append(redisContext* ctx, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  argv.reserve(args.size());
  lens.reserve(args.size());
  for (const auto& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  redisAppendCommandArgv(ctx, static_cast<int>(args.size()), argv.data(), lens.data());
}

}  // namespace

Result<std::unique_ptr<RedisClient>> RedisClient::connect(const std::string& url, int timeout_ms) {
  Result<Url> u = parse_url(url);
  if (!u.is_ok() || u->scheme != "redis")
    return invalid_argument("not a redis:// URL", "redis-url");
  int db = 0;
  if (u->path.size() > 1) db = std::atoi(u->path.c_str() + 1);
  std::unique_ptr<RedisClient> c(new RedisClient(u->host.empty() ? "127.0.0.1" : u->host,
                                                 u->port == 0 ? 6379 : u->port, db, u->password,
                                                 timeout_ms));
  HR_RETURN_IF_ERROR(c->ensure_connected());
  return c;
}

RedisClient::RedisClient(std::string host, int port, int db, std::string password, int timeout_ms)
    : host_(std::move(host)),
      port_(port),
      db_(db),
      password_(std::move(password)),
      timeout_ms_(timeout_ms) {}

RedisClient::~RedisClient() { drop(); }

void RedisClient::drop() {
  if (ctx_ != nullptr) redisFree(ctx_);
  ctx_ = nullptr;
}

Status RedisClient::ensure_connected() {
  if (ctx_ != nullptr) return Status::ok();
  ctx_ = redisConnectWithTimeout(host_.c_str(), port_, to_timeval(timeout_ms_));
  if (ctx_ == nullptr || ctx_->err) {
    std::string msg = ctx_ ? ctx_->errstr : "allocation failed";
    drop();
    return unavailable("redis connect " + host_ + ":" + std::to_string(port_) + ": " + msg);
  }
  redisSetTimeout(ctx_, to_timeval(timeout_ms_));
  std::vector<std::vector<std::string>> setup;
  if (!password_.empty()) setup.push_back({"AUTH", password_});
  if (db_ != 0) setup.push_back({"SELECT", std::to_string(db_)});
  for (const auto& cmd : setup) {
    append(ctx_, cmd);
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
      drop();
      return unavailable("redis setup failed");
    }
    RedisReply r = convert(static_cast<redisReply*>(raw));
    freeReplyObject(raw);
    if (r.is_error()) {
      drop();
      return unavailable("redis " + cmd[0] + ": " + r.str);
    }
  }
  return Status::ok();
}

Result<std::vector<RedisReply>> RedisClient::pipeline(
    const std::vector<std::vector<std::string>>& commands) {
  HR_RETURN_IF_ERROR(ensure_connected());
  for (const auto& cmd : commands) append(ctx_, cmd);
  std::vector<RedisReply> out;
  out.reserve(commands.size());
  for (size_t i = 0; i < commands.size(); ++i) {
    void* raw = nullptr;
    if (redisGetReply(ctx_, &raw) != REDIS_OK || raw == nullptr) {
      std::string msg = ctx_->errstr;
      drop();
      return unavailable("redis: " + msg);
    }
    out.push_back(convert(static_cast<redisReply*>(raw)));
    freeReplyObject(raw);
  }
  return out;
}

Result<RedisReply> RedisClient::command(const std::vector<std::string>& args) {
  HR_ASSIGN_OR_RETURN(auto replies, pipeline({args}));
  return std::move(replies[0]);
}

Result<RedisReply> RedisClient::blocking_command(const std::vector<std::string>& args,
                                                 int timeout_ms) {
  HR_RETURN_IF_ERROR(ensure_connected());
  redisSetTimeout(ctx_, to_timeval(timeout_ms + timeout_ms_));
  Result<RedisReply> r = command(args);
  if (ctx_ != nullptr) redisSetTimeout(ctx_, to_timeval(timeout_ms_));
  return r;
}

}  // namespace hr::queue
