#include "base/log.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace hr::log {
namespace {

TEST(LogTest, TextLineIsKeyValueAndQuotesWhenNeeded) {
  std::string line = format_line(Format::kText, Level::kInfo, "batch.submitted",
                                 {{"batch", "abc"}, {"n", 3}, {"msg", "two words"}, {"ok", true}});
  EXPECT_NE(line.find("level=info event=batch.submitted batch=abc n=3 msg=\"two words\" ok=true"),
            std::string::npos)
      << line;
  EXPECT_EQ(line.rfind("ts=", 0), 0u);
  EXPECT_EQ(line.find('\n'), std::string::npos);
}

TEST(LogTest, JsonLineParses) {
  std::string line = format_line(Format::kJson, Level::kWarn, "x",
                                 {{"quote", "a\"b\nc"}, {"ratio", 0.5}, {"count", int64_t{7}}});
  auto j = nlohmann::json::parse(line);
  EXPECT_EQ(j["level"], "warn");
  EXPECT_EQ(j["event"], "x");
  EXPECT_EQ(j["quote"], "a\"b\nc");
  EXPECT_DOUBLE_EQ(j["ratio"].get<double>(), 0.5);
  EXPECT_EQ(j["count"], 7);
}

TEST(LogTest, LevelFilteringAndSink) {
  std::vector<std::string> lines;
  set_sink([&](std::string_view l) { lines.emplace_back(l); });
  set_level(Level::kWarn);
  info("dropped");
  warn("kept");
  set_level(Level::kInfo);
  set_sink(nullptr);
  ASSERT_EQ(lines.size(), 1u);
  EXPECT_NE(lines[0].find("event=kept"), std::string::npos);
}

TEST(LogTest, ParseNames) {
  EXPECT_TRUE(parse_level("debug").is_ok());
  EXPECT_FALSE(parse_level("loud").is_ok());
  EXPECT_EQ(parse_level("loud").status().field(), "log-level");
  EXPECT_TRUE(parse_format("json").is_ok());
  EXPECT_FALSE(parse_format("xml").is_ok());
}

}  // namespace
}  // namespace hr::log
