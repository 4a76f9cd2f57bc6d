// A small synchronous Redis client on hiredis 0.14: connect from a redis:// URL, run commands given
// as argument vectors, pipeline them, and get replies as plain values. Errors become Status
// (kUnavailable for I/O errors; the context then reconnects on the next call). Not thread-safe:
// one RedisClient per thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "base/status.h"

struct redisContext;

namespace hr::queue {

struct RedisReply {
  enum class Type { kNil, kString, kInteger, kArray, kStatus, kError };
  Type type = Type::kNil;
  std::string str;  // kString, kStatus, kError
  int64_t integer = 0;
  std::vector<RedisReply> elements;

  bool is_nil() const { return type == Type::kNil; }
  bool is_error() const { return type == Type::kError; }
};

class RedisClient {
 public:
  // Connects (with `timeout_ms` for connect and each command). kUnavailable when unreachable.
  [[nodiscard]] static Result<std::unique_ptr<RedisClient>> connect(const std::string& url,
                                                                    int timeout_ms = 5000);
  ~RedisClient();

  // Runs one command. A Redis error reply is returned as a reply of type kError, not a Status;
  // a Status means the command could not be run (connection lost, timeout).
  [[nodiscard]] Result<RedisReply> command(const std::vector<std::string>& args);
  // Sends all commands in one round trip and returns their replies in order.
  [[nodiscard]] Result<std::vector<RedisReply>> pipeline(
      const std::vector<std::vector<std::string>>& commands);
  // Like command() but with a different read timeout (for blocking reads such as XREADGROUP).
  [[nodiscard]] Result<RedisReply> blocking_command(const std::vector<std::string>& args,
                                                    int timeout_ms);

 private:
  RedisClient(std::string host, int port, int db, std::string password, int timeout_ms);
  Status ensure_connected();
  void drop();

  std::string host_;
  int port_;
  int db_;
  std::string password_;
  int timeout_ms_;
  redisContext* ctx_ = nullptr;
};

}  // namespace hr::queue
