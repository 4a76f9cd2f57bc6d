// Throwaway test databases.
#include "tests/testing/test_db.h"

#include <gtest/gtest.h>
#include <pqxx/pqxx>

#include <cstdlib>

#include "base/ids.h"

namespace hr::testing {

std::string admin_database_url() {
  const char* url = std::getenv("HEADROOM_TEST_DATABASE_URL");
  if (url == nullptr || *url == '\0') {
    ADD_FAILURE()
        << "HEADROOM_TEST_DATABASE_URL is not set: run the tests through scripts/test.sh, "
           "which starts Postgres and Redis";
    return "";
  }
  return url;
}

std::string redis_url() {
  const char* url = std::getenv("HEADROOM_TEST_REDIS_URL");
  if (url == nullptr || *url == '\0') {
    ADD_FAILURE() << "HEADROOM_TEST_REDIS_URL is not set: run the tests through scripts/test.sh";
    return "";
  }
  return url;
}

std::string with_database(const std::string& url, const std::string& name) {
  size_t scheme = url.find("://");
  size_t slash = url.find('/', scheme == std::string::npos ? 0 : scheme + 3);
  size_t query = url.find('?');
  std::string base = url.substr(0, slash == std::string::npos ? query : slash);
  std::string tail = query == std::string::npos ? "" : url.substr(query);
  return base + "/" + name + tail;
}

TestDatabase::TestDatabase() {
  admin_url_ = admin_database_url();
  if (admin_url_.empty()) return;
  name_ = "t_" + random_hex(8);
  try {
    pqxx::connection c(admin_url_);
    pqxx::nontransaction tx(c);
    tx.exec("CREATE DATABASE " + name_);
  } catch (const std::exception& e) {
    ADD_FAILURE() << "cannot create test database: " << e.what();
    return;
  }
  url_ = with_database(admin_url_, name_);
}

TestDatabase::~TestDatabase() {
  if (url_.empty()) return;
  try {
    pqxx::connection c(admin_url_);
    pqxx::nontransaction tx(c);
    tx.exec("DROP DATABASE IF EXISTS " + name_ + " WITH (FORCE)");
  } catch (const std::exception& e) {
    ADD_FAILURE() << "cannot drop test database " << name_ << ": " << e.what();
  }
}

}  // namespace hr::testing
