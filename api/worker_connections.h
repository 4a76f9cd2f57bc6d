// The API's connections to its workers (api/worker_router.h): how calls reach them, and the idle
// connections kept open between calls (HTTP/1.1 keep-alive). A call takes an idle one to its
// worker when there is one, and gives it back once the worker's answer has been read to its end.
// One the worker closed meanwhile is noticed before use, or costs one more try on a new
// connection; a sweep every second closes idle ones that workers closed or that sat too long.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

namespace hr::api {

struct RouterOptions {
  std::string redis_url;
  std::string internal_token;
  int refresh_ms = 250;  // how old the view of a model's workers may get
  int connect_timeout_ms = 1000;
  int idle_timeout_ms = 300000;  // longest silence while an answer is generated
  int suspect_ms = 3000;         // an unreachable worker is skipped this long
  int max_attempts = 3;          // workers tried for one call
  int max_idle_per_worker = 64;  // idle connections kept open to each worker
  // An idle connection is closed after this long; below the workers' own limit on waiting for the
  // next request (HttpServerOptions::read_timeout_s, 30 s), so that they rarely close it first.
  int idle_keep_ms = 10000;
};

struct WorkerConnection;  // an open connection to a worker, idle or in use by one call

// Idle connections to workers, by worker URL. Thread-safe. A thread of its own closes, every
// second, those idle too long and those the worker has closed (a worker that stopped), so that
// none waits in CLOSE_WAIT for a next call that may never come.
class WorkerConnections {
 public:
  explicit WorkerConnections(const RouterOptions& options);
  ~WorkerConnections();
  WorkerConnections(const WorkerConnections&) = delete;
  WorkerConnections& operator=(const WorkerConnections&) = delete;
  // An idle connection to `url` that still looks open (the worker has not closed it), or null.
  std::unique_ptr<WorkerConnection> take(const std::string& url);
  // Keeps `c`, whose last answer was read to its end, for the next call to its worker.
  void give_back(std::unique_ptr<WorkerConnection> c);
  // Closes every idle connection to `url` (its worker failed).
  void forget(const std::string& url);
  size_t idle() const;

 private:
  void sweep();

  const RouterOptions& options_;
  mutable std::mutex mu_;
  // Per worker URL, the least recently used first.
  std::unordered_map<std::string, std::vector<std::unique_ptr<WorkerConnection>>> idle_;
  bool stopping_ = false;  // guarded by mu_
  std::condition_variable wake_;
  std::thread sweeper_;  // last: it starts once the rest is ready
};

}  // namespace hr::api
