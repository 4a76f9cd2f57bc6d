// A private Postgres + Redis for one test, started with scripts/services.sh in a temporary folder,
// for fault tests that stop, restart or flush them without disturbing other tests.
#pragma once

#include <string>

namespace hr::testing {

class PrivateStack {
 public:
  PrivateStack();
  ~PrivateStack();
  bool ok() const { return ok_; }
  const std::string& database_url() const { return database_url_; }
  const std::string& redis_url() const { return redis_url_; }

  bool stop_postgres();
  bool start_postgres();
  // SIGSTOP / SIGCONT to Postgres and its backends: it keeps accepting connections (its kernel
  // does) and answers nothing, as a hung server does.
  bool pause_postgres();
  bool resume_postgres();
  bool flush_redis();
  bool restart_redis_empty();

 private:
  bool run(const std::string& cmd);
  std::string dir_;
  std::string database_url_;
  std::string redis_url_;
  std::string redis_port_;
  bool ok_ = false;
};

}  // namespace hr::testing
