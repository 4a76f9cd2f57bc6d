// The official OpenAI Node SDK end to end against the real product: `headroom serve` with the
// bundled model over a throwaway database and the test Redis, driven by tests/node/openai_batch.mjs
// (upload → batch → poll → output file, compared line by line with the model's reversals). The SDK
// is installed with npm into the build folder on first use. Fails, never skips, without node/npm:
// scripts/setup.sh installs them.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/asio/ip/tcp.hpp>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "base/ids.h"
#include "tests/testing/http_client.h"
#include "tests/testing/process.h"
#include "tests/testing/test_db.h"

namespace hr::workers {
namespace {

namespace fs = std::filesystem;

int free_port() {
  boost::asio::io_context ioc;
  boost::asio::ip::tcp::acceptor a(ioc, {boost::asio::ip::make_address("127.0.0.1"), 0});
  return a.local_endpoint().port();
}

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs `cmd` through the shell; returns its exit code and appends its output to `out`.
int shell(const std::string& cmd, std::string* out) {
  std::string full = cmd + " 2>&1";
  FILE* p = popen(full.c_str(), "r");
  if (p == nullptr) return -1;
  char buf[4096];
  size_t n;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) out->append(buf, n);
  int rc = pclose(p);
  return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

// The SDK in build/tests/node, installed when package.json changed (npm's cache makes it quick).
bool prepare_node_dir(const fs::path& dir, std::string* log) {
  fs::path src = fs::path(HEADROOM_SOURCE_DIR) / "tests/node";
  fs::create_directories(dir);
  bool fresh = read_all(dir / "package.json") == read_all(src / "package.json") &&
               fs::exists(dir / "node_modules/openai/package.json");
  fs::copy_file(src / "openai_batch.mjs", dir / "openai_batch.mjs",
                fs::copy_options::overwrite_existing);
  if (fresh) return true;
  fs::copy_file(src / "package.json", dir / "package.json", fs::copy_options::overwrite_existing);
  return shell("cd '" + dir.string() + "' && npm install --no-audit --no-fund --loglevel=error",
               log) == 0;
}

TEST(OpenAiSdkTest, OfficialNodeSdkRunsABatchEndToEnd) {
  std::string tools;
  ASSERT_EQ(shell("command -v node && command -v npm", &tools), 0)
      << "node and npm are required (scripts/setup.sh installs them): " << tools;
  fs::path node_dir = fs::path(HEADROOM_NODE_DIR);
  std::string npm_log;
  ASSERT_TRUE(prepare_node_dir(node_dir, &npm_log)) << "npm install failed:\n" << npm_log;

  testing::TestDatabase db;
  ASSERT_TRUE(db.ok());
  std::string redis = testing::redis_url();
  ASSERT_FALSE(redis.empty());
  int port = free_port();
  std::string key = "hr_sdk_" + random_hex(16);
  std::string model = "@test/sdk-" + random_hex(4);  // unique: the Redis is shared
  fs::path log_path = node_dir / ("serve-" + std::to_string(port) + ".log");
  std::vector<std::string> args = {
      HEADROOM_BINARY,  "--log-level",
      "warn",           "serve",
      "--model",        std::string(HEADROOM_SOURCE_DIR) + "/models/tiny-reverse",
      "--name",         model,
      "--port",         std::to_string(port),
      "--database-url", db.url(),
      "--redis-url",    redis,
      "--api-key",      key};
  pid_t pid = testing::spawn(args, log_path.string());
  ASSERT_GT(pid, 0);
  bool ready = false;
  for (int i = 0; i < 600 && !ready; ++i) {
    ready = testing::http_call("GET", port, "/readyz").status == 200;
    if (!ready) std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  std::string out;
  int rc = -1;
  if (ready) {
    rc = shell("cd '" + node_dir.string() + "' && HEADROOM_BASE_URL=http://127.0.0.1:" +
                   std::to_string(port) + "/v1 HEADROOM_API_KEY=" + key + " HEADROOM_MODEL='" +
                   model + "' timeout 280 node openai_batch.mjs",
               &out);
  }
  kill(pid, SIGTERM);
  int status = 0;
  waitpid(pid, &status, 0);
  ASSERT_TRUE(ready) << "headroom serve did not become ready:\n" << read_all(log_path);
  EXPECT_EQ(rc, 0) << out << "\nserve log:\n" << read_all(log_path);
  EXPECT_NE(out.find("\"ok\":true"), std::string::npos) << out;
  std::printf("%s", out.c_str());
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "serve did not stop cleanly";
}

}  // namespace
}  // namespace hr::workers
