// Private service stacks for fault tests.
#include "tests/testing/stack.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <sstream>

namespace hr::testing {
namespace {

std::string services() { return std::string(HEADROOM_SOURCE_DIR) + "/scripts/services.sh"; }

}  // namespace

bool PrivateStack::run(const std::string& cmd) {
  int rc = std::system((cmd + " >/dev/null 2>&1").c_str());
  return rc == 0;
}

PrivateStack::PrivateStack() {
  char tmpl[] = "/tmp/hr-private.XXXXXX";
  if (mkdtemp(tmpl) == nullptr) {
    ADD_FAILURE() << "mkdtemp failed";
    return;
  }
  dir_ = tmpl;
  run("chmod 755 " + dir_);
  if (!run("PG_PORT= REDIS_PORT= " + services() + " start " + dir_)) {
    ADD_FAILURE() << "services.sh start failed in " << dir_;
    return;
  }
  std::ifstream env(dir_ + "/env");
  std::string line;
  while (std::getline(env, line)) {
    auto value = [&](const std::string& key) { return line.substr(line.find('=') + 1); };
    if (line.find("HEADROOM_DATABASE_URL=") != std::string::npos) database_url_ = value("");
    if (line.find("HEADROOM_REDIS_URL=") != std::string::npos) redis_url_ = value("");
  }
  std::ifstream ports(dir_ + "/ports");
  while (std::getline(ports, line)) {
    if (line.rfind("SAVED_REDIS_PORT=", 0) == 0) redis_port_ = line.substr(17);
  }
  ok_ = !database_url_.empty() && !redis_url_.empty();
}

PrivateStack::~PrivateStack() {
  if (dir_.empty()) return;
  run(services() + " stop " + dir_);
  run("rm -rf " + dir_);
}

bool PrivateStack::stop_postgres() {
  return run("runuser -u headroom -- /usr/lib/postgresql/15/bin/pg_ctl -D " + dir_ +
             "/pg/data -m fast -w stop || /usr/lib/postgresql/15/bin/pg_ctl -D " + dir_ +
             "/pg/data -m fast -w stop");
}

bool PrivateStack::start_postgres() { return run(services() + " start " + dir_); }

bool PrivateStack::pause_postgres() {
  return run("p=$(head -1 " + dir_ + "/pg/data/postmaster.pid) && kill -STOP $p $(pgrep -P $p)");
}

bool PrivateStack::resume_postgres() {
  return run("p=$(head -1 " + dir_ + "/pg/data/postmaster.pid) && kill -CONT $(pgrep -P $p) $p");
}

bool PrivateStack::flush_redis() { return run("redis-cli -p " + redis_port_ + " FLUSHALL"); }

bool PrivateStack::restart_redis_empty() {
  run("redis-cli -p " + redis_port_ + " SHUTDOWN NOSAVE");
  run("rm -rf " + dir_ + "/redis");
  return run(services() + " start " + dir_);
}

}  // namespace hr::testing
