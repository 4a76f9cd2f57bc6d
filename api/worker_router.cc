// Routing sync calls to remote workers, and the HTTP exchange with one worker.
#include "api/worker_router.h"

#include <boost/asio/ip/tcp.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <functional>
#include <limits>
#include <optional>
#include <thread>

#include "base/clock.h"
#include "base/log.h"
#include "base/metrics.h"
#include "base/url.h"

namespace hr::api {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using nlohmann::json;

namespace {

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

uint64_t fnv1a(std::string_view s, uint64_t h = 0xcbf29ce484222325ULL) {
  for (unsigned char c : s) {
    h ^= c;
    h *= 0x100000001b3ULL;
  }
  return h;
}

// Rendezvous (highest random weight) score of `worker` for `key`.
uint64_t rendezvous(const std::string& key, const std::string& worker) {
  return mix64(fnv1a(worker, fnv1a(key) ^ 0x5bd1e995ULL));
}

int load_of(const queue::WorkerInfo& w, int in_flight) { return std::max(w.sync_load, in_flight); }

Status status_from_error_body(int http_status, const std::string& body) {
  json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object()) {
    const json& e = j["error"];
    return Status(status_code_from_name(e.value("code", "internal")), e.value("message", ""),
                  e.value("field", ""));
  }
  return internal_error("worker answered HTTP " + std::to_string(http_status));
}

// Whether a worker's error body says another worker may take the call (workers/sync_server.h).
bool retry_elsewhere(const std::string& body) {
  json j = json::parse(body, nullptr, false);
  return j.is_object() && j.contains("error") && j["error"].is_object() &&
         j["error"].value("retry_elsewhere", false);
}

Result<SyncAnswer> answer_from_json(const json& j, const std::string& worker) {
  if (!j.is_object() || !j.contains("text") || !j["text"].is_string()) {
    return internal_error("malformed answer from worker " + worker);
  }
  SyncAnswer a;
  a.text = j["text"];
  a.finish_reason = j.value("finish_reason", "");
  a.prompt_tokens = j.value("prompt_tokens", 0);
  a.completion_tokens = j.value("completion_tokens", 0);
  a.cached_tokens = j.value("cached_tokens", 0);
  if (j.contains("logprobs") && j["logprobs"].is_object()) a.logprobs = j["logprobs"];
  a.worker = worker;
  return a;
}

metrics::Counter& routed(const std::string& outcome) {
  return metrics::counter("headroom_sync_routed_total",
                          "Sync calls forwarded to workers, by outcome",
                          "outcome=\"" + outcome + "\"");
}

metrics::Counter& connects(const std::string& connection) {
  return metrics::counter("headroom_sync_worker_connections_total",
                          "Connections to workers used for sync calls: opened for the call, or "
                          "kept open from an earlier one",
                          "connection=\"" + connection + "\"");
}

metrics::Gauge& idle_connections() {
  return metrics::gauge("headroom_sync_worker_connections_idle",
                        "Connections to workers kept open for the next sync call");
}

}  // namespace

// An open connection to one worker, with an io_context of its own, so that whichever handler
// thread holds it can drive it.
struct WorkerConnection {
  explicit WorkerConnection(std::string u) : url(std::move(u)) {}
  std::string url;
  asio::io_context ioc;
  beast::tcp_stream stream{ioc};
  beast::flat_buffer buffer;
  int64_t idle_since_ns = 0;
};

namespace {

// Whether an idle connection can carry another request: the worker has not closed it (nor sent
// anything unasked). A peek; nothing is read.
bool still_open(WorkerConnection& c) {
  if (!c.stream.socket().is_open()) return false;
  char byte;
  ssize_t n = ::recv(c.stream.socket().native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

// One HTTP exchange with a worker over a connection of its own (kept open from an earlier call
// when the pool has one): send, read the header, then the body in pieces as they arrive. The
// connection goes back to the pool when the answer has been read to its end and both sides keep
// it open.
class WorkerCall {
 public:
  // `client_gone` (may be empty) is polled while the call waits on the worker: when it says the
  // client left, the connection is closed, so that the worker stops generating, and the call ends
  // with kCancelled.
  WorkerCall(const RouterOptions& o, WorkerConnections* pool, std::function<bool()> client_gone)
      : options_(o), pool_(pool), client_gone_(std::move(client_gone)) {}
  ~WorkerCall() {
    if (conn_ && !broken_ && parser_ && parser_->is_done() && parser_->get().keep_alive() &&
        !parser_->need_eof() && conn_->buffer.size() == 0) {
      pool_->give_back(std::move(conn_));
    }
  }
  WorkerCall(const WorkerCall&) = delete;
  WorkerCall& operator=(const WorkerCall&) = delete;

  // kUnavailable when the worker cannot be reached or drops the connection before answering.
  Status open(const std::string& url, const std::string& body) {
    Result<Url> u = parse_url(url);
    if (!u.is_ok() || u->scheme != "http" || u->host.empty() || u->port == 0) {
      return unavailable("worker URL is not http://host:port: " + url);
    }
    http::request<http::string_body> req{http::verb::post, "/internal/sync", 11};
    req.set(http::field::host, u->host + ":" + std::to_string(u->port));
    req.set(http::field::content_type, "application/json");
    if (!options_.internal_token.empty())
      req.set("x-headroom-internal-token", options_.internal_token);
    req.keep_alive(true);
    req.body() = body;
    req.prepare_payload();
    conn_ = pool_->take(url);
    if (conn_) {
      connects("reused").add();
      Status st = exchange(req, url);
      // A worker may close an idle connection just as the request goes out (its own limit on
      // waiting): then the request did not reach it, and a new connection is tried once. Any
      // other failure (a timeout, a reset once the worker had time to start) is the worker's.
      if (!stale_) return st;
      log::debug("router.stale_connection", {{"url", url}, {"error", st}});
    }
    conn_ = std::make_unique<WorkerConnection>(url);
    broken_ = false;
    beast::error_code ec;
    tcp::resolver resolver(conn_->ioc);
    auto eps = resolver.resolve(u->host, std::to_string(u->port), ec);
    if (ec) return unavailable("resolve " + u->host + ": " + ec.message());
    conn_->stream.expires_after(std::chrono::milliseconds(options_.connect_timeout_ms));
    conn_->stream.async_connect(eps, [&](beast::error_code e, const tcp::endpoint&) { ec = e; });
    if (!run()) return client_left();
    if (ec) return unavailable("connect " + url + ": " + ec.message());
    connects("new").add();
    // A request that stays unacknowledged this long fails the connection: a worker host that
    // vanished (no FIN, no RST) is given up on in seconds, not after the idle timeout. It does not
    // limit how long an answer may take: nothing of ours is unacknowledged meanwhile.
    const unsigned int unacked_ms =
        static_cast<unsigned int>(std::max(5000, options_.connect_timeout_ms));
    ::setsockopt(conn_->stream.socket().native_handle(), IPPROTO_TCP, TCP_USER_TIMEOUT, &unacked_ms,
                 sizeof unacked_ms);
    return exchange(req, url);
  }

  int status() const { return static_cast<int>(parser_->get().result_int()); }

  // Appends the next piece of the body to `out`; false once the body is complete.
  Result<bool> read_some(std::string* out, int timeout_ms = 0) {
    if (parser_->is_done()) return false;
    char tmp[8192];
    parser_->get().body().data = tmp;
    parser_->get().body().size = sizeof tmp;
    beast::error_code ec;
    conn_->stream.expires_after(
        std::chrono::milliseconds(timeout_ms > 0 ? timeout_ms : options_.idle_timeout_ms));
    http::async_read_some(conn_->stream, conn_->buffer, *parser_,
                          [&](beast::error_code e, size_t) { ec = e; });
    if (!run()) return client_left();
    if (ec == http::error::need_buffer) ec = {};
    if (ec) {
      broken_ = true;
      return unavailable("the worker's answer broke off: " + ec.message());
    }
    out->append(tmp, sizeof tmp - parser_->get().body().size);
    return true;
  }

  Result<std::string> read_all() {
    std::string body;
    for (;;) {
      HR_ASSIGN_OR_RETURN(bool more, read_some(&body));
      if (!more) return body;
    }
  }

  // After the last line of a streamed answer: reads the end of the body (the last chunk follows
  // at once), so that the connection can carry the next call. Anything more, or nothing within a
  // second, and the connection is closed instead.
  void finish_reading() {
    std::string rest;
    for (int i = 0; i < 4 && !parser_->is_done(); ++i) {
      Result<bool> more = read_some(&rest, 1000);
      if (!more.is_ok() || !rest.empty()) {
        broken_ = true;
        return;
      }
    }
  }

 private:
  // Sends `req` and reads the answer's header.
  // Sets stale_ when it failed as on a connection the worker had already closed: the request
  // could not be sent, or the connection ended at once, before any of the answer.
  Status exchange(const http::request<http::string_body>& req, const std::string& url) {
    parser_.emplace();
    parser_->body_limit(std::numeric_limits<std::uint64_t>::max());
    stale_ = false;
    beast::error_code ec;
    conn_->stream.expires_after(std::chrono::milliseconds(options_.idle_timeout_ms));
    http::async_write(conn_->stream, req, [&](beast::error_code e, size_t) { ec = e; });
    if (!run()) return client_left();
    if (ec) {
      broken_ = true;
      stale_ = ec != beast::error::timeout;
      return unavailable("send to " + url + ": " + ec.message());
    }
    const int64_t sent_ns = steady_now_ns();
    conn_->stream.expires_after(std::chrono::milliseconds(options_.idle_timeout_ms));
    http::async_read_header(conn_->stream, conn_->buffer, *parser_,
                            [&](beast::error_code e, size_t) { ec = e; });
    if (!run()) return client_left();
    if (ec) {
      broken_ = true;
      const bool closed = ec == http::error::end_of_stream || ec == asio::error::eof ||
                          ec == asio::error::connection_reset || ec == asio::error::broken_pipe;
      stale_ = closed && conn_->buffer.size() == 0 && !parser_->got_some() &&
               steady_now_ns() - sent_ns < int64_t{options_.connect_timeout_ms} * 1000000;
      return unavailable("answer from " + url + ": " + ec.message());
    }
    return Status::ok();
  }

  // Runs the operation queued; false when the client left meanwhile (the connection is closed).
  bool run() {
    asio::io_context& ioc = conn_->ioc;
    ioc.restart();
    if (!client_gone_) {
      ioc.run();
      return true;
    }
    while (!ioc.stopped()) {
      ioc.run_for(std::chrono::milliseconds(50));
      if (!ioc.stopped() && client_gone_()) {
        beast::error_code ignored;
        conn_->stream.socket().close(ignored);
        broken_ = true;
        ioc.run();  // the operation ends, aborted
        return false;
      }
    }
    return true;
  }
  static Status client_left() {
    return Status(StatusCode::kCancelled, "the client went away before the worker answered");
  }
  const RouterOptions& options_;
  WorkerConnections* pool_;
  std::function<bool()> client_gone_;
  std::unique_ptr<WorkerConnection> conn_;
  bool broken_ = false;  // the connection may not carry another request
  bool stale_ = false;   // the last exchange failed as on a connection closed before it began
  std::optional<http::response_parser<http::buffer_body>> parser_;
};

}  // namespace

WorkerConnections::WorkerConnections(const RouterOptions& options)
    : options_(options), sweeper_([this] {
        std::unique_lock<std::mutex> lock(mu_);
        while (!wake_.wait_for(lock, std::chrono::seconds(1), [this] { return stopping_; })) {
          lock.unlock();
          sweep();
          lock.lock();
        }
      }) {}

WorkerConnections::~WorkerConnections() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  sweeper_.join();
  idle_connections().add(-static_cast<double>(idle()));
}

void WorkerConnections::sweep() {
  const int64_t now = steady_now_ns();
  const int64_t keep_ns = int64_t{options_.idle_keep_ms} * 1000000;
  std::vector<std::unique_ptr<WorkerConnection>> closed;  // closed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  for (auto it = idle_.begin(); it != idle_.end();) {
    std::vector<std::unique_ptr<WorkerConnection>>& v = it->second;
    for (auto& c : v) {
      if (now - c->idle_since_ns >= keep_ns || !still_open(*c)) closed.push_back(std::move(c));
    }
    v.erase(std::remove(v.begin(), v.end(), nullptr), v.end());
    it = v.empty() ? idle_.erase(it) : std::next(it);
  }
  idle_connections().add(-static_cast<double>(closed.size()));
}

std::unique_ptr<WorkerConnection> WorkerConnections::take(const std::string& url) {
  const int64_t now = steady_now_ns();
  const int64_t keep_ns = int64_t{options_.idle_keep_ms} * 1000000;
  std::vector<std::unique_ptr<WorkerConnection>> closed;  // closed after the lock is released
  std::unique_ptr<WorkerConnection> c;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = idle_.find(url);
  if (it == idle_.end()) return nullptr;
  std::vector<std::unique_ptr<WorkerConnection>>& v = it->second;
  // The most recently used first: the longer a connection has been idle, the likelier that the
  // worker is about to close it.
  while (!v.empty() && !c) {
    std::unique_ptr<WorkerConnection> last = std::move(v.back());
    v.pop_back();
    idle_connections().add(-1);
    if (now - last->idle_since_ns < keep_ns && still_open(*last)) {
      c = std::move(last);
    } else {
      closed.push_back(std::move(last));
    }
  }
  if (v.empty()) idle_.erase(it);
  return c;
}

void WorkerConnections::give_back(std::unique_ptr<WorkerConnection> c) {
  const size_t limit = static_cast<size_t>(std::max(0, options_.max_idle_per_worker));
  if (limit == 0) return;
  const int64_t now = steady_now_ns();
  const int64_t keep_ns = int64_t{options_.idle_keep_ms} * 1000000;
  c->idle_since_ns = now;
  std::vector<std::unique_ptr<WorkerConnection>> closed;  // closed after the lock is released
  std::lock_guard<std::mutex> lock(mu_);
  // Oldest first in each list: those idle too long are closed, and the oldest beyond the limit.
  auto close_front = [&](std::vector<std::unique_ptr<WorkerConnection>>& v, size_t keep_at_most) {
    size_t drop = 0;
    while (drop < v.size() && now - v[drop]->idle_since_ns >= keep_ns) ++drop;
    if (v.size() - drop > keep_at_most) drop = v.size() - keep_at_most;
    for (size_t i = 0; i < drop; ++i) closed.push_back(std::move(v[i]));
    v.erase(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(drop));
    idle_connections().add(-static_cast<double>(drop));
  };
  // (Other workers' lists are swept by sweep().)
  std::vector<std::unique_ptr<WorkerConnection>>& v = idle_[c->url];
  close_front(v, limit - 1);
  v.push_back(std::move(c));
  idle_connections().add(1);
}

void WorkerConnections::forget(const std::string& url) {
  std::vector<std::unique_ptr<WorkerConnection>> closed;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = idle_.find(url);
  if (it == idle_.end()) return;
  closed = std::move(it->second);
  idle_.erase(it);
  idle_connections().add(-static_cast<double>(closed.size()));
}

size_t WorkerConnections::idle() const {
  std::lock_guard<std::mutex> lock(mu_);
  size_t n = 0;
  for (const auto& [url, v] : idle_) n += v.size();
  return n;
}

std::vector<size_t> route_order(const std::vector<queue::WorkerInfo>& workers,
                                const std::vector<int>& in_flight, const std::string& affinity,
                                uint64_t seed) {
  std::vector<size_t> order(workers.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  if (!affinity.empty()) {
    std::vector<uint64_t> score(workers.size());
    for (size_t i = 0; i < workers.size(); ++i) score[i] = rendezvous(affinity, workers[i].id);
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return score[a] != score[b] ? score[a] > score[b] : workers[a].id < workers[b].id;
    });
    return order;
  }
  // Least loaded by the fraction of sync capacity in use, in eighths: announced loads are up to a
  // heartbeat old (and may still count this API's finished calls), so finer differences are
  // noise and would send every call to one worker until the next heartbeat. Then fewer async
  // sequences (less to preempt); then a per-call random order, so equal workers share the traffic.
  auto fraction = [&](size_t i) {
    int cap = std::max(1, workers[i].capacity);
    return 8 * load_of(workers[i], in_flight[i]) / cap;
  };
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    int fa = fraction(a), fb = fraction(b);
    if (fa != fb) return fa < fb;
    if (workers[a].async_running != workers[b].async_running) {
      return workers[a].async_running < workers[b].async_running;
    }
    return mix64(seed ^ fnv1a(workers[a].id)) < mix64(seed ^ fnv1a(workers[b].id));
  });
  return order;
}

bool has_room(const queue::WorkerInfo& w, int in_flight) {
  return !w.draining && load_of(w, in_flight) < w.capacity;
}

struct WorkerRouter::Attempt {
  WorkerRouter* router;
  std::string worker_id;
  std::string url;
  ~Attempt() {
    std::lock_guard<std::mutex> lock(router->mu_);
    auto it = router->in_flight_.find(worker_id);
    if (it != router->in_flight_.end() && --it->second <= 0) router->in_flight_.erase(it);
  }
};

WorkerRouter::WorkerRouter(RouterOptions options) : options_(std::move(options)) {}

WorkerRouter::~WorkerRouter() = default;

Result<std::vector<queue::WorkerInfo>> WorkerRouter::workers_of(const std::string& model) {
  // Called with mu_ held.
  int64_t now = steady_now_ns();
  ModelView& view = views_[model];
  if (view.fetched_ns != 0 && now - view.fetched_ns < int64_t{options_.refresh_ms} * 1000000) {
    return view.workers;
  }
  Status st = Status::ok();
  if (!registry_) {
    auto r = queue::WorkerRegistry::connect(options_.redis_url, 1000);
    if (r.is_ok()) {
      registry_ = std::move(r).value();
    } else {
      st = r.status();
    }
  }
  if (registry_) {
    Result<std::vector<queue::WorkerInfo>> live = registry_->live(model);
    if (live.is_ok()) {
      view.workers = std::move(live).value();
      view.fetched_ns = now;
      return view.workers;
    }
    st = live.status();
    registry_.reset();
  }
  // The registry is unreachable: a recent view is better than nothing.
  if (view.fetched_ns != 0 && now - view.fetched_ns < int64_t{10000} * 1000000) return view.workers;
  log::warn("router.registry_unavailable", {{"error", st}});
  return unavailable("the worker registry is unavailable: " + st.message());
}

void WorkerRouter::suspect(const std::string& worker_id) {
  std::lock_guard<std::mutex> lock(mu_);
  suspect_until_ns_[worker_id] = steady_now_ns() + int64_t{options_.suspect_ms} * 1000000;
}

Result<std::shared_ptr<WorkerRouter::Attempt>> WorkerRouter::place(
    const SyncCall& call, const std::vector<std::string>& skip) {
  const int64_t deadline =
      steady_now_ns() + (call.reject_if_busy ? 0 : int64_t{call.queue_timeout_ms} * 1000000);
  for (;;) {
    bool any_live = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      HR_ASSIGN_OR_RETURN(std::vector<queue::WorkerInfo> all, workers_of(call.model));
      int64_t now = steady_now_ns();
      std::vector<queue::WorkerInfo> workers;
      std::vector<int> in_flight;
      for (queue::WorkerInfo& w : all) {
        if (w.draining || std::find(skip.begin(), skip.end(), w.id) != skip.end()) continue;
        auto s = suspect_until_ns_.find(w.id);
        if (s != suspect_until_ns_.end()) {
          if (s->second > now) continue;
          suspect_until_ns_.erase(s);
        }
        auto f = in_flight_.find(w.id);
        in_flight.push_back(f == in_flight_.end() ? 0 : f->second);
        workers.push_back(std::move(w));
      }
      any_live = !workers.empty();
      std::vector<size_t> order = route_order(workers, in_flight, call.affinity, mix64(++calls_));
      // With affinity only the owner will do: moving the conversation loses its cached prefix.
      if (!call.affinity.empty() && order.size() > 1) order.erase(order.begin() + 1, order.end());
      for (size_t i : order) {
        if (!has_room(workers[i], in_flight[i])) continue;
        ++in_flight_[workers[i].id];
        return std::shared_ptr<Attempt>(new Attempt{this, workers[i].id, workers[i].url});
      }
    }
    if (call.client_gone && call.client_gone()) {
      routed("client_gone").add();
      return Status(StatusCode::kCancelled, "the client went away while the call waited for room");
    }
    if (steady_now_ns() >= deadline) {
      routed("no_capacity").add();
      return Status(StatusCode::kResourceExhausted,
                    any_live ? "Out of capacity: every worker for " + call.model + " is busy"
                             : "Out of capacity: no worker is serving " + call.model);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

std::string WorkerRouter::body_for(const json& request, const SyncCall& call, bool stream) const {
  return json{{"request", request},
              {"stream", stream},
              {"reject_if_busy", call.reject_if_busy},
              {"queue_timeout_ms", call.queue_timeout_ms}}
      .dump();
}

template <typename T, typename OnOk>
Result<T> WorkerRouter::forward(const SyncCall& call, const std::string& body, OnOk on_ok) {
  std::vector<std::string> skip;
  Status last = Status::ok();
  for (int attempt = 0; attempt < options_.max_attempts; ++attempt) {
    HR_ASSIGN_OR_RETURN(std::shared_ptr<Attempt> a, place(call, skip));
    auto wc = std::make_unique<WorkerCall>(options_, &connections_, call.client_gone);
    Status st = wc->open(a->url, body);
    std::optional<Result<T>> got;
    if (!st.is_ok()) {
      got.emplace(st);
    } else if (wc->status() == 200) {
      got.emplace(on_ok(a, std::move(wc)));
    }
    if (got && !got->is_ok() && got->status().code() == StatusCode::kUnavailable) {
      // Unreachable, or gone mid-answer: nothing reached the client yet, so another worker may
      // answer instead.
      log::warn("router.worker_failed", {{"worker", a->worker_id}, {"error", got->status()}});
      routed("worker_failed").add();
      suspect(a->worker_id);
      connections_.forget(a->url);
      skip.push_back(a->worker_id);
      last = got->status();
      continue;
    }
    if (got) {
      const bool left = !got->is_ok() && got->status().code() == StatusCode::kCancelled;
      routed(got->is_ok() ? "ok" : left ? "client_gone" : "error").add();
      return std::move(*got);
    }
    Result<std::string> text = wc->read_all();
    Status err = status_from_error_body(wc->status(), text.is_ok() ? *text : "");
    // A worker that is stopping hands the call on; so does a full one when the call may wait.
    if (err.code() == StatusCode::kResourceExhausted &&
        (!call.reject_if_busy || (text.is_ok() && retry_elsewhere(*text)))) {
      skip.push_back(a->worker_id);
      last = err;
      continue;
    }
    routed("error").add();
    return err;
  }
  return last.code() == StatusCode::kResourceExhausted
             ? last
             : unavailable("no worker could answer: " + last.message());
}

Result<SyncAnswer> WorkerRouter::run(const json& request, const SyncCall& call) {
  return forward<SyncAnswer>(
      call, body_for(request, call, false),
      [](const std::shared_ptr<Attempt>& a, std::unique_ptr<WorkerCall> wc) -> Result<SyncAnswer> {
        HR_ASSIGN_OR_RETURN(std::string answer, wc->read_all());
        return answer_from_json(json::parse(answer, nullptr, false), a->worker_id);
      });
}

namespace {

// A streamed answer read from a worker's x-ndjson lines.
class RemoteStream final : public SyncStream {
 public:
  RemoteStream(std::shared_ptr<void> attempt, std::unique_ptr<WorkerCall> call, std::string worker)
      : attempt_(std::move(attempt)), call_(std::move(call)), worker_(std::move(worker)) {}

  bool next(std::string* delta) override {
    if (finished_) return false;
    for (;;) {
      size_t nl = pending_.find('\n');
      if (nl != std::string::npos) {
        json line = json::parse(pending_.substr(0, nl), nullptr, false);
        pending_.erase(0, nl + 1);
        if (line.contains("delta") && line["delta"].is_string()) {
          *delta = line["delta"];
          logprobs_ = line.contains("logprobs") && line["logprobs"].is_array()
                          ? std::move(line["logprobs"])
                          : json();
          return true;
        }
        if (line.contains("answer")) {
          Result<SyncAnswer> a = answer_from_json(line["answer"], worker_);
          if (a.is_ok()) {
            answer_ = std::move(a).value();
          } else {
            status_ = a.status();
          }
        } else {
          status_ = status_from_error_body(200, line.dump());
        }
        call_->finish_reading();
        return finish();
      }
      Result<bool> more = call_->read_some(&pending_);
      if (!more.is_ok() || !*more) {
        status_ = unavailable("worker " + worker_ + " stopped before the answer was complete");
        return finish();
      }
    }
  }
  const json& delta_logprobs() const override { return logprobs_; }
  const Status& status() const override { return status_; }
  const SyncAnswer& answer() const override { return answer_; }
  std::string worker() const override { return worker_; }

 private:
  bool finish() {
    finished_ = true;
    call_.reset();     // the connection is closed, or kept for the next call when read to its end
    attempt_.reset();  // the worker's slot is free again
    return false;
  }
  std::shared_ptr<void> attempt_;
  std::unique_ptr<WorkerCall> call_;
  std::string worker_;
  std::string pending_;
  json logprobs_;  // the last delta's
  bool finished_ = false;
  Status status_;
  SyncAnswer answer_;
};

}  // namespace

Result<std::unique_ptr<SyncStream>> WorkerRouter::start_stream(const json& request,
                                                               const SyncCall& call) {
  return forward<std::unique_ptr<SyncStream>>(
      call, body_for(request, call, true),
      [](const std::shared_ptr<Attempt>& a,
         std::unique_ptr<WorkerCall> wc) -> Result<std::unique_ptr<SyncStream>> {
        return std::unique_ptr<SyncStream>(new RemoteStream(a, std::move(wc), a->worker_id));
      });
}

}  // namespace hr::api
