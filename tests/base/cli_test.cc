// Precedence: command line > HEADROOM_* environment > config file > default.
#include "base/cli.h"

#include <gtest/gtest.h>

#include <cstdlib>

namespace hr::cli {
namespace {

struct Fixture {
  CLI::App app{"t"};
  CLI::App* sub = nullptr;
  int port = 1;
  std::string url = "default";
  bool flag = false;
  Fixture() {
    sub = app.add_subcommand("api");
    add(*sub, "--port", port, "port");
    add(*sub, "--database-url", url, "db");
    add_flag(*sub, "--verbose-thing", flag, "flag");
  }
  void parse(std::vector<std::string> args) {
    std::reverse(args.begin(), args.end());
    app.parse(args);
  }
};

TEST(CliTest, EnvNames) {
  EXPECT_EQ(env_name("--database-url"), "HEADROOM_DATABASE_URL");
  EXPECT_EQ(env_name("--port"), "HEADROOM_PORT");
}

TEST(CliTest, PrecedenceFlagsOverEnvOverFile) {
  auto file = parse_config_text(
      "# comment\nport = 3\n[api]\ndatabase_url = \"postgresql://f\"\n"
      "verbose-thing = true\n");
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();

  {  // file only
    Fixture f;
    f.parse({"api"});
    ASSERT_TRUE(apply_config_file(f.app, *file).is_ok());
    EXPECT_EQ(f.port, 3);
    EXPECT_EQ(f.url, "postgresql://f");
    EXPECT_TRUE(f.flag);
  }
  {  // env beats file
    setenv("HEADROOM_PORT", "4", 1);
    Fixture f;
    f.parse({"api"});
    ASSERT_TRUE(apply_config_file(f.app, *file).is_ok());
    EXPECT_EQ(f.port, 4);
    unsetenv("HEADROOM_PORT");
  }
  {  // flag beats env and file
    setenv("HEADROOM_PORT", "4", 1);
    Fixture f;
    f.parse({"api", "--port", "5"});
    ASSERT_TRUE(apply_config_file(f.app, *file).is_ok());
    EXPECT_EQ(f.port, 5);
    unsetenv("HEADROOM_PORT");
  }
}

TEST(CliTest, UnknownKeysAndBadValuesAreErrors) {
  Fixture f;
  f.parse({"api"});
  auto unknown = parse_config_text("prot = 3\n");
  ASSERT_TRUE(unknown.is_ok());
  Status st = apply_config_file(f.app, *unknown);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.field(), "prot");

  Fixture g;
  g.parse({"api"});
  auto bad = parse_config_text("port = eighty\n");
  ASSERT_TRUE(bad.is_ok());
  EXPECT_EQ(apply_config_file(g.app, *bad).field(), "port");

  EXPECT_FALSE(parse_config_text("[api\n").is_ok());
  EXPECT_FALSE(parse_config_text("just words\n").is_ok());
}

}  // namespace
}  // namespace hr::cli
