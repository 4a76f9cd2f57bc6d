// Retention, deletion, retries and the purge over real HTTP, Postgres and Redis: expiry turns
// polls into a 404 that says when; a running batch cannot be deleted; deleting removes every row
// of the batch; a retry runs exactly the failed, expired and cancelled requests in their order;
// dropping a partition loses no row of a batch that has not expired; and a purge killed half-way
// leaves nothing a poll would show. A test consumer stands in for the workers.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <pqxx/pqxx>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>

#include "base/clock.h"
#include "base/ids.h"
#include "queue/retention.h"
#include "tests/testing/api_harness.h"
#include "tests/testing/process.h"
#include "tests/testing/test_consumer.h"

namespace hr::api {
namespace {

using nlohmann::json;
using testing::ApiHarness;
using testing::Consumer;
using testing::HttpResult;

json reverse(const std::string& text, const std::string& ref = "") {
  json r = {{"messages", {{{"role", "user"}, {"content", "reverse: " + text}}}}, {"max_tokens", 8}};
  if (!ref.empty()) r["external_reference"] = ref;
  return r;
}

// Runs a statement on the harness database; returns the rows it changed or returned.
int64_t exec(ApiHarness& h, const std::string& sql) {
  pqxx::connection c(h.database_url());
  pqxx::nontransaction tx(c);
  pqxx::result r = tx.exec(sql);
  return r.columns() > 0 ? static_cast<int64_t>(r.size()) : static_cast<int64_t>(r.affected_rows());
}

json poll(ApiHarness& h, const std::string& id) {
  HttpResult r = h.get("/v1/async/" + id, h.key_a());
  EXPECT_EQ(r.status, 200) << r.body;
  return r.json()["result"];
}

// Rows the batch still has in each table that holds its data.
std::map<std::string, int64_t> rows_of(ApiHarness& h, const std::string& id) {
  std::string q = "'" + id + "'::uuid";
  return {
      {"batches", h.scalar("SELECT count(*) FROM batches WHERE id = " + q)},
      {"requests", h.scalar("SELECT count(*) FROM requests WHERE batch_id = " + q)},
      {"outbox", h.scalar("SELECT count(*) FROM outbox WHERE batch_id = " + q)},
      {"webhook_deliveries",
       h.scalar("SELECT count(*) FROM webhook_deliveries WHERE batch_id = " + q)},
      {"webhook_attempts", h.scalar("SELECT count(*) FROM webhook_attempts a JOIN "
                                    "webhook_deliveries d ON d.id = a.delivery_id "
                                    "WHERE d.batch_id = " +
                                    q)},
      {"files", h.scalar("SELECT count(*) FROM files f WHERE f.filename LIKE '%" + id + "%'")},
      {"file_chunks", h.scalar("SELECT count(*) FROM file_chunks c JOIN files f ON "
                               "f.id = c.file_id WHERE f.filename LIKE '%" +
                               id + "%'")},
  };
}

// A delivery with one attempt for the batch's completion event, as the webhook deliverer leaves.
void add_delivery(ApiHarness& h, const std::string& id) {
  exec(h,
       "WITH d AS (INSERT INTO webhook_deliveries (event_id, event_type, account_id, batch_id, "
       "url, payload, status, attempts) SELECT gen_random_uuid(), 'batch.completed', "
       "account_id, id, 'http://127.0.0.1:9/hook', '{}', 'delivered', 1 FROM batches "
       "WHERE id = '" +
           id +
           "' RETURNING id) "
           "INSERT INTO webhook_attempts (delivery_id, attempt, started_at, duration_ms, "
           "status_code, outcome) SELECT id, 1, now(), 3, 200, 'delivered' FROM d");
}

void expire(ApiHarness& h, const std::string& id) {
  exec(h, "UPDATE batches SET expires_at = now() - interval '5 seconds' WHERE id = '" + id + "'");
}

TEST(RetentionTest, ExpiryTurnsPollsIntoA404SayingWhen) {
  ApiHarness h([](ApiConfig& c) { c.retention_days = 2; });
  ASSERT_TRUE(h.ok());
  Consumer c(h);
  std::string id = h.submit(json::array({reverse("ab"), reverse("cd")}), h.key_a());
  json polled = poll(h, id);
  EXPECT_NEAR(polled["expires_at"].get<int64_t>(), polled["created_at"].get<int64_t>() + 2 * 86400,
              1);
  c.complete(c.pull(2));
  ASSERT_EQ(poll(h, id)["status"], "completed");

  expire(h, id);
  int64_t expired_at = h.scalar(
      "SELECT floor(extract(epoch FROM expires_at))::bigint FROM "
      "batches WHERE id = '" +
      id + "'");
  HttpResult gone = h.get("/v1/async/" + id, h.key_a());
  EXPECT_EQ(gone.status, 404) << gone.body;
  std::string message = gone.json()["errors"][0]["message"];
  EXPECT_NE(message.find("expired at " + iso8601_utc(expired_at * 1000)), std::string::npos)
      << message;
  EXPECT_EQ(h.post("/v1/async/" + id + "/cancel", "", h.key_a()).status, 404);
  json listed = h.get("/v1/async", h.key_a()).json()["result"]["data"];
  EXPECT_TRUE(listed.empty()) << listed;
  // Another account still learns nothing about it.
  HttpResult other = h.get("/v1/async/" + id, h.key_b());
  EXPECT_EQ(other.status, 404);
  EXPECT_EQ(other.body.find("expired"), std::string::npos) << other.body;

  // A batch still running when its retention ends keeps answering until it ends.
  std::string running = h.submit(json::array({reverse("ef")}), h.key_a());
  expire(h, running);
  EXPECT_EQ(poll(h, running)["status"], "queued");
  c.complete(c.pull(1));
  json ended = poll(h, running);
  EXPECT_EQ(ended["status"], "completed");
  EXPECT_GT(ended["expires_at"].get<int64_t>(), ended["finished_at"].get<int64_t>())
      << "an ended batch keeps its results for a while";

  // The account's own default comes before the server's.
  exec(h, "UPDATE accounts SET retention_seconds = 7200 WHERE name = 'alice'");
  json own = poll(h, h.submit(json::array({reverse("gh")}), h.key_a()));
  EXPECT_NEAR(own["expires_at"].get<int64_t>(), own["created_at"].get<int64_t>() + 7200, 1);
}

TEST(RetentionTest, DeletingARunningBatchIsRefused) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  Consumer c(h);
  std::string id = h.submit(json::array({reverse("ab"), reverse("cd")}), h.key_a());
  HttpResult r = h.del("/v1/async/" + id, h.key_a());
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_NE(r.body.find("queued"), std::string::npos) << r.body;
  c.pull(1);  // one running
  r = h.del("/v1/async/" + id, h.key_a());
  EXPECT_EQ(r.status, 409) << r.body;
  EXPECT_NE(r.body.find("running"), std::string::npos) << r.body;
  EXPECT_EQ(rows_of(h, id)["requests"], 2);
  EXPECT_EQ(poll(h, id)["status"], "running");
  EXPECT_EQ(h.del("/v1/async/" + id, h.key_b()).status, 404);
}

TEST(RetentionTest, DeleteRemovesEveryRowOfTheBatch) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  Consumer c(h);
  std::string id =
      h.submit(json::array({reverse("ab", "one"), reverse("cd", "two"), reverse("ef")}), h.key_a());
  std::string kept = h.submit(json::array({reverse("gh")}), h.key_a());
  std::vector<queue::Lease> leases = c.pull(4);
  ASSERT_EQ(leases.size(), 4u);
  std::vector<queue::Lease> failing;
  std::vector<queue::Lease> succeeding;
  for (const auto& l : leases) {
    (l.ref.batch_id == id && l.ref.idx == 1 ? failing : succeeding).push_back(l);
  }
  c.complete(succeeding);
  c.fail(failing);
  add_delivery(h, id);
  add_delivery(h, kept);
  std::map<std::string, int64_t> before = rows_of(h, id);
  EXPECT_EQ(before["batches"], 1);
  EXPECT_EQ(before["requests"], 3);
  EXPECT_GT(before["outbox"], 0);
  EXPECT_EQ(before["webhook_attempts"], 1);
  std::map<std::string, int64_t> kept_before = rows_of(h, kept);

  HttpResult r = h.del("/v1/async/" + id, h.key_a());
  ASSERT_EQ(r.status, 200) << r.body;
  EXPECT_EQ(r.json()["result"]["deleted"], true);
  EXPECT_EQ(h.get("/v1/async/" + id, h.key_a()).status, 404);
  EXPECT_EQ(h.del("/v1/async/" + id, h.key_a()).status, 404);
  auto purged = c.dispatcher->retain();
  ASSERT_TRUE(purged.is_ok()) << purged.status().to_string();
  EXPECT_EQ(purged->batches_purged, 1);
  for (const auto& [table, n] : rows_of(h, id)) EXPECT_EQ(n, 0) << table;
  EXPECT_EQ(rows_of(h, kept), kept_before);
  EXPECT_EQ(poll(h, kept)["status"], "completed");
}

TEST(RetentionTest, RetryRunsExactlyTheUnsucceededInOrder) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  Consumer c(h);
  json reqs = json::array();
  for (int i = 0; i < 6; ++i)
    reqs.push_back(reverse("w" + std::to_string(i), "ref-" + std::to_string(i)));
  std::string id = h.submit(reqs, h.key_a());
  EXPECT_EQ(h.post("/v1/async/" + id + "/retry", "", h.key_a()).status, 409) << "still queued";
  std::vector<queue::Lease> first = c.pull(3);  // idx 0, 1, 2
  ASSERT_EQ(first.size(), 3u);
  std::sort(first.begin(), first.end(),
            [](const queue::Lease& a, const queue::Lease& b) { return a.ref.idx < b.ref.idx; });
  c.complete({first[0], first[2]});
  c.fail({first[1]});
  ASSERT_EQ(h.post("/v1/async/" + id + "/cancel", "", h.key_a()).status, 200);  // 3, 4, 5
  ASSERT_EQ(poll(h, id)["status"], "cancelled");

  HttpResult r = h.post("/v1/async/" + id + "/retry", "", h.key_a(), {{"Idempotency-Key", "r1"}});
  ASSERT_EQ(r.status, 200) << r.body;
  json retry = r.json()["result"];
  std::string rid = retry["request_id"];
  EXPECT_EQ(retry["retried_from"], id);
  EXPECT_EQ(retry["progress"]["total"], 4);
  EXPECT_EQ(h.post("/v1/async/" + id + "/retry", "", h.key_a(), {{"Idempotency-Key", "r1"}})
                .json()["result"]["request_id"],
            rid)
      << "the same key replays the retry";
  EXPECT_EQ(poll(h, id)["retries"], json::array({rid}));
  // Exactly the failed and cancelled requests, in their order, with their references.
  std::vector<queue::Lease> again = c.pull(10);
  ASSERT_EQ(again.size(), 4u);
  c.complete(again);
  json done = h.get("/v1/async/" + rid, h.key_a()).json()["result"];
  ASSERT_EQ(done["status"], "completed") << done;
  std::vector<std::string> refs;
  for (const json& resp : done["responses"]) refs.push_back(resp["external_reference"]);
  EXPECT_EQ(refs, (std::vector<std::string>{"ref-1", "ref-3", "ref-4", "ref-5"}));
  EXPECT_EQ(done["responses"][0]["result"]["response"], "1w");
  // Everything succeeded this time: nothing left to retry.
  HttpResult nothing = h.post("/v1/async/" + rid + "/retry", "", h.key_a());
  EXPECT_EQ(nothing.status, 409) << nothing.body;
  EXPECT_EQ(h.post("/v1/async/" + id + "/retry", "", h.key_b()).status, 404);

  // A retry may name its own webhook; only webhook fields are taken.
  HttpResult bad = h.post("/v1/async/" + id + "/retry", R"({"model": "other"})", h.key_a());
  EXPECT_EQ(bad.status, 400) << bad.body;
  EXPECT_NE(bad.body.find("model"), std::string::npos) << bad.body;
  HttpResult bad_url =
      h.post("/v1/async/" + id + "/retry", R"({"webhook_url": "ftp://x"})", h.key_a());
  EXPECT_EQ(bad_url.status, 400) << bad_url.body;
  EXPECT_EQ(h.scalar("SELECT count(*) FROM batches WHERE retried_from = '" + id + "'"), 1)
      << "a refused retry makes nothing";

  // Expired requests are retried too.
  HttpResult windowed = h.post(
      "/ai/run/" + h.model() + "?queueRequest=true",
      json{{"requests", {reverse("x", "late")}}, {"completion_window", "1h"}}.dump(), h.key_a());
  std::string late = windowed.json()["result"]["request_id"];
  exec(h,
       "UPDATE batches SET created_at = created_at - interval '2 hours', deadline = deadline - "
       "interval '2 hours' WHERE id = '" +
           late + "'");
  ASSERT_TRUE(c.dispatcher->expire_deadlines().is_ok());
  ASSERT_EQ(poll(h, late)["status"], "expired");
  exec(h,
       "UPDATE batches SET webhook_url = 'http://127.0.0.1:9/old', webhook_events = "
       "'{batch.completed}' WHERE id = '" +
           late + "'");
  json late_retry = h.post("/v1/async/" + late + "/retry", "", h.key_a()).json()["result"];
  std::string late_id = late_retry["request_id"];
  EXPECT_EQ(h.scalar("SELECT count(*) FROM batches WHERE id = '" + late_id +
                     "' AND webhook_url = 'http://127.0.0.1:9/old' AND webhook_events = "
                     "'{batch.completed}'"),
            1)
      << "the webhook defaults to the original's";
  EXPECT_EQ(late_retry["progress"]["total"], 1);
  EXPECT_GT(late_retry["deadline"].get<int64_t>(), late_retry["created_at"].get<int64_t>() + 3000)
      << "the window runs again from the retry";
}

// A UUIDv7 made `ago_s` seconds ago.
std::string uuid_ago(int64_t ago_s) {
  std::string id = new_uuid_v7().to_string();
  char hex[16];
  std::snprintf(
      hex, sizeof hex, "%012llx",
      static_cast<unsigned long long>(SystemClock::instance().now_unix_ms() - ago_s * 1000));
  std::string h(hex);
  return h.substr(0, 8) + "-" + h.substr(8, 4) + id.substr(13);
}

// A batch of `n` ended requests, created `ago_s` seconds ago, expiring in `expires_in_s`
// (negative: already expired), straight into the tables.
std::string old_batch(ApiHarness& h, int64_t ago_s, int n, int64_t expires_in_s,
                      bool finished = true) {
  std::string id = uuid_ago(ago_s);
  exec(h,
       "INSERT INTO batches (id, account_id, model, api_shape, status, num_total, "
       "num_completed, retain_seconds, created_at, finished_at, expires_at) "
       "SELECT '" +
           id + "', id, 'm', 'workers_ai', " + (finished ? "'completed'" : "'running'") + ", " +
           std::to_string(n) + ", " + (finished ? std::to_string(n) : "0") +
           ", 3600, now() - interval '" + std::to_string(ago_s) + " seconds', " +
           (finished ? "now()" : "NULL") + ", now() + interval '" + std::to_string(expires_in_s) +
           " seconds' FROM accounts WHERE name = 'alice'");
  exec(h, "INSERT INTO requests (batch_id, idx, body, status, result) SELECT '" + id +
              "', g, '{}', 'completed', '{\"response\": \"x\"}' FROM generate_series(0, " +
              std::to_string(n - 1) + ") g");
  return id;
}

// The test database's partitions start three hours ago (instead of at the migration's day), so
// that hourly partitions in the past can be filled and closed.
void partitions_from_three_hours_ago(ApiHarness& h) {
  exec(h, "DROP TABLE requests_legacy");
  exec(h, "DELETE FROM request_partitions");
  exec(h,
       "DO $$ BEGIN EXECUTE format('CREATE TABLE requests_seed PARTITION OF requests FOR "
       "VALUES FROM (MINVALUE) TO (%L)', hr_uuid_v7_floor(now() - interval '3 hours')); END $$");
  exec(h,
       "INSERT INTO request_partitions (name, lo_at, hi_at) VALUES ('requests_seed', "
       "'-infinity', now() - interval '3 hours')");
}

TEST(RetentionTest, PartitionDropLosesNoRowOfAnUnexpiredBatch) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  partitions_from_three_hours_ago(h);
  queue::RetentionOptions o;
  o.partition_seconds = 3600;
  o.drop_margin_seconds = 0;
  o.rows_per_chunk = 300;
  pqxx::connection conn(h.database_url());
  auto created = queue::ensure_request_partitions(conn, o);
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  EXPECT_GE(*created, 3);  // the hours since, the current one, and two ahead
  // Two batches in a closed partition: one expired, one not; one running and one fresh elsewhere.
  std::string expired = old_batch(h, 2 * 3600 + 600, 1000, -60);
  std::string live = old_batch(h, 2 * 3600 + 500, 1000, 3600);
  std::string recent = h.submit(json::array({reverse("ab")}), h.key_a());
  std::string running = old_batch(h, 3 * 3600 + 60, 10, -3600, /*finished=*/false);
  std::string p = "(SELECT name FROM request_partitions WHERE lo_at <= hr_uuid_v7_time('" + live +
                  "') AND hr_uuid_v7_time('" + live + "') < hi_at)";
  std::string partition = pqxx::nontransaction(conn).exec1("SELECT " + p)[0].as<std::string>();
  EXPECT_EQ(h.scalar("SELECT count(*) FROM " + partition), 2000);

  // The live neighbour keeps the partition; the expired batch's rows wait for it, then go in
  // chunks, and the live batch loses nothing.
  auto pass = queue::purge_expired(conn, o);
  ASSERT_TRUE(pass.is_ok()) << pass.status().to_string();
  EXPECT_EQ(pass->partitions_dropped, 0);
  EXPECT_EQ(pass->requests_deleted, 0) << "expired rows first wait for their partition";
  o.wait_for_drop_seconds = 0;
  while (h.scalar("SELECT count(*) FROM requests WHERE batch_id = '" + expired + "'") > 0) {
    pass = queue::purge_expired(conn, o);
    ASSERT_TRUE(pass.is_ok()) << pass.status().to_string();
    EXPECT_LE(pass->requests_deleted, o.rows_per_chunk * o.max_row_chunks);
  }
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests WHERE batch_id = '" + live + "'"), 1000);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM batches WHERE id = '" + expired + "'"), 0);

  // Once the last batch expires the partition goes whole; nothing else is touched.
  int64_t others = h.scalar("SELECT count(*) FROM requests") - 1000;
  expire(h, live);
  o.wait_for_drop_seconds = 86400;
  pass = queue::purge_expired(conn, o);
  ASSERT_TRUE(pass.is_ok()) << pass.status().to_string();
  EXPECT_EQ(pass->partitions_dropped, 1);
  EXPECT_EQ(pass->requests_deleted, 0) << "the rows went with the partition";
  EXPECT_GT(pass->bytes_freed, 0);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM pg_class WHERE relname = '" + partition + "'"), 0);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM batches WHERE id = '" + live + "'"), 0);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests"), others);
  EXPECT_EQ(poll(h, recent)["status"], "queued");
  // The partition holding a running batch stays, however old.
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests WHERE batch_id = '" + running + "'"), 10);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM request_partitions WHERE name = 'requests_seed'"), 1);
}

TEST(RetentionTest, RowsCaughtByTheDefaultPartitionMoveIntoTheirOwn) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  partitions_from_three_hours_ago(h);
  // No partition for the last three hours yet: the default catches these.
  std::string early = old_batch(h, 2 * 3600, 50, 3600);
  std::string id = h.submit(json::array({reverse("ab"), reverse("cd")}), h.key_a());
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests_default"), 52);
  queue::RetentionOptions o;
  o.partition_seconds = 3600;
  pqxx::connection conn(h.database_url());
  auto created = queue::ensure_request_partitions(conn, o);
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests_default"), 0);
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests WHERE batch_id = '" + early + "'"), 50);
  Consumer c(h);
  c.complete(c.pull(2));
  EXPECT_EQ(poll(h, id)["status"], "completed");
  // Nothing more to create until time passes.
  auto again = queue::ensure_request_partitions(conn, o);
  ASSERT_TRUE(again.is_ok());
  EXPECT_EQ(*again, 0);
}

// While rows move out of the default partition into their interval's new one, a reader of the
// requests table sees every one of them, before the move or after it, never none: a reader that
// planned the query over the partitions before the attach and read the rows after the move would
// otherwise find them in neither (the mover locks the table against readers while rows move).
TEST(RetentionTest, ReadersSeeEveryRowWhileTheDefaultPartitionsRowsMove) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  partitions_from_three_hours_ago(h);
  const int n = 100000;
  const std::string id = old_batch(h, 2 * 3600, n, 3600);  // caught by the default partition
  ASSERT_EQ(h.scalar("SELECT count(*) FROM requests_default"), n);
  std::atomic<bool> done{false};
  std::atomic<int64_t> reads{0}, wrong{0}, last_wrong{-1};
  auto reader = [&] {
    pqxx::connection c(h.database_url());
    pqxx::nontransaction tx(c);
    while (!done) {
      const int64_t seen =
          tx.exec1("SELECT count(*) FROM requests WHERE batch_id = '" + id + "'")[0].as<int64_t>();
      ++reads;
      if (seen != n) {
        ++wrong;
        last_wrong = seen;
      }
    }
  };
  std::thread r1(reader), r2(reader);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  queue::RetentionOptions o;
  o.partition_seconds = 3600;
  pqxx::connection conn(h.database_url());
  auto created = queue::ensure_request_partitions(conn, o);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  done = true;
  r1.join();
  r2.join();
  ASSERT_TRUE(created.is_ok()) << created.status().to_string();
  EXPECT_EQ(h.scalar("SELECT count(*) FROM requests_default"), 0);
  EXPECT_GT(reads.load(), 4);
  EXPECT_EQ(wrong.load(), 0) << "a read saw " << last_wrong.load() << " rows of " << n;
}

TEST(RetentionTest, APurgeKilledHalfWayLeavesNothingAPollWouldShow) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  Consumer c(h);
  std::string id = h.submit(json::array({reverse("ab")}), h.key_a());
  c.complete(c.pull(1));
  // The batch's partition made now, as the dispatcher would: the dispatcher started below then
  // moves no rows out of the default partition (a reader counting the rows while they move can
  // see none of them, which would end the wait below early).
  {
    pqxx::connection conn(h.database_url());
    auto made = queue::ensure_request_partitions(conn, queue::RetentionOptions{});
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  }
  // Many more rows than one pass removes (20 chunks of 5,000).
  exec(h, "UPDATE batches SET num_total = 300001, num_completed = 300001 WHERE id = '" + id + "'");
  exec(h, "INSERT INTO requests (batch_id, idx, body, status, result) SELECT '" + id +
              "', g, '{}', 'completed', '{\"response\": \"x\"}' FROM generate_series(1, 300000) g");
  ASSERT_EQ(h.scalar("SELECT count(*) FROM requests_default"), 0);
  ASSERT_EQ(h.del("/v1/async/" + id, h.key_a()).status, 200);
  auto dispatcher = [&](const char* purge_interval_ms) {
    return std::vector<std::string>{
        HEADROOM_BINARY,  "--log-level", "warn",        "dispatcher",          "--database-url",
        h.database_url(), "--redis-url", h.redis_url(), "--purge-interval-ms", purge_interval_ms};
  };
  // A dispatcher whose first purge pass (at its start) is its only one for ten minutes: killed
  // once that pass is over, it leaves the purge half done however fast or slow the machine.
  // (Each chunk commits alone, so a kill anywhere in a pass leaves such a state.)
  pid_t pid = testing::spawn(dispatcher("600000"));
  ASSERT_GT(pid, 0);
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
  int64_t left = 0;
  while (std::chrono::steady_clock::now() < until) {
    left = h.scalar("SELECT count(*) FROM requests WHERE batch_id = '" + id + "'");
    if (left <= 300001 - 20 * 5000) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  left = h.scalar("SELECT count(*) FROM requests WHERE batch_id = '" + id + "'");
  ASSERT_EQ(left, 300001 - 20 * 5000) << "one pass removes 20 chunks of 5,000 rows";
  // Half-deleted, and no poll, list or result route shows any of it.
  EXPECT_EQ(h.scalar("SELECT count(*) FROM batches WHERE id = '" + id + "'"), 1);
  EXPECT_EQ(h.get("/v1/async/" + id, h.key_a()).status, 404);
  EXPECT_EQ(h.get("/v1/async/" + id + "?include=partial", h.key_a()).status, 404);
  EXPECT_TRUE(h.get("/v1/async", h.key_a()).json()["result"]["data"].empty());
  EXPECT_EQ(h.post("/v1/async/" + id + "/retry", "", h.key_a()).status, 404);
  // The next purge finishes the job.
  pid = testing::spawn(dispatcher("50"));
  ASSERT_GT(pid, 0);
  until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (std::chrono::steady_clock::now() < until &&
         h.scalar("SELECT count(*) FROM batches WHERE id = '" + id + "'") > 0) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ::kill(pid, SIGTERM);
  ::waitpid(pid, nullptr, 0);
  for (const auto& [table, n] : rows_of(h, id)) EXPECT_EQ(n, 0) << table;
}

}  // namespace
}  // namespace hr::api
