// RetryPacer (base/retry_pacer.h): delays double from the first to the cap with jitter in the
// upper half, start over after a success; warnings come once, then one line per interval counting
// the failures it stands for, and a success after failures says so.
#include "base/retry_pacer.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "base/log.h"

namespace hr {
namespace {

struct CapturedLog {
  CapturedLog() {
    log::set_sink([this](std::string_view l) { lines.emplace_back(l); });
  }
  ~CapturedLog() { log::set_sink(nullptr); }
  std::vector<std::string> lines;
};

TEST(RetryPacerTest, DelaysDoubleWithJitterUpToTheCapAndStartOver) {
  int64_t now = 0;
  RetryPacer p({100, 5000, 10000, [&] { return now; }, 7});
  CapturedLog captured;
  const Status down = unavailable("connection refused");
  int64_t ceiling = 100;
  for (int i = 0; i < 12; ++i) {
    const int64_t d = p.failed("loop.failed", down);
    EXPECT_GE(d, ceiling / 2) << i;
    EXPECT_LE(d, ceiling) << i;
    ceiling = std::min<int64_t>(5000, ceiling * 2);
  }
  EXPECT_EQ(p.current_ceiling_ms(), 5000);
  p.succeeded();
  EXPECT_EQ(p.current_ceiling_ms(), 100);
  EXPECT_LE(p.failed("loop.failed", down), 100);
  // Jitter: two pacers with other seeds do not wait alike every time.
  RetryPacer a({1000, 1000, 10000, [&] { return now; }, 1}),
      b({1000, 1000, 10000, [&] { return now; }, 2});
  int same = 0;
  for (int i = 0; i < 20; ++i) same += a.failed("x", down) == b.failed("x", down);
  EXPECT_LT(same, 5);
}

TEST(RetryPacerTest, WarningsAreRateLimitedAndCounted) {
  int64_t now = 0;
  RetryPacer p({100, 5000, 10000, [&] { return now; }, 3});
  CapturedLog captured;
  const Status down = unavailable("connection refused");
  for (int i = 0; i < 1000; ++i) {  // 1000 failures over 20 s
    p.failed("worker.complete_failed", down);
    now += 20;
  }
  // The first at once, then one per 10 s: at 10 s and at 20 s... (t = 0, 10000, 19980 at most).
  ASSERT_GE(captured.lines.size(), 2u);
  ASSERT_LE(captured.lines.size(), 3u);
  EXPECT_NE(captured.lines[0].find("worker.complete_failed"), std::string::npos);
  EXPECT_NE(captured.lines[0].find("repeated=1"), std::string::npos) << captured.lines[0];
  EXPECT_NE(captured.lines[1].find("repeated=500"), std::string::npos) << captured.lines[1];
  EXPECT_NE(captured.lines[1].find("connection refused"), std::string::npos);
  p.succeeded();
  EXPECT_NE(captured.lines.back().find("worker.complete_failed.recovered"), std::string::npos);
  EXPECT_NE(captured.lines.back().find("failures=1000"), std::string::npos)
      << captured.lines.back();
  // A new run of failures is logged at once again.
  const size_t before = captured.lines.size();
  p.failed("worker.complete_failed", down);
  EXPECT_EQ(captured.lines.size(), before + 1);
  // A success with no failures before says nothing.
  p.succeeded();
  p.succeeded();
  EXPECT_EQ(captured.lines.size(), before + 2);
}

}  // namespace
}  // namespace hr
