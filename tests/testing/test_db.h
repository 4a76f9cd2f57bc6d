// Throwaway databases for tests that need a real Postgres. The server comes from
// HEADROOM_TEST_DATABASE_URL (set by scripts/test.sh); when it is missing the test FAILS rather
// than skips, so a suite without its servers can never pass by accident.
#pragma once

#include <string>

namespace hr::testing {

// The server's admin URL, or "" after recording a test failure.
std::string admin_database_url();
// HEADROOM_TEST_REDIS_URL, or "" after recording a test failure.
std::string redis_url();
// Replaces the database name (path) in a postgresql:// URL.
std::string with_database(const std::string& url, const std::string& name);

// Creates an empty database with a unique name and drops it on destruction.
class TestDatabase {
 public:
  TestDatabase();
  ~TestDatabase();
  TestDatabase(const TestDatabase&) = delete;
  TestDatabase& operator=(const TestDatabase&) = delete;

  bool ok() const { return !url_.empty(); }
  const std::string& url() const { return url_; }
  const std::string& name() const { return name_; }

 private:
  std::string admin_url_;
  std::string name_;
  std::string url_;
};

}  // namespace hr::testing
