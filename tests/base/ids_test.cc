#include "base/ids.h"

#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <thread>

namespace hr {
namespace {

TEST(IdsTest, UuidRoundTripsAndHasVersionBits) {
  for (int i = 0; i < 100; ++i) {
    Uuid a = new_uuid_v7();
    std::string s = a.to_string();
    ASSERT_EQ(s.size(), 36u);
    EXPECT_EQ(s[14], '7');
    EXPECT_TRUE(s[19] == '8' || s[19] == '9' || s[19] == 'a' || s[19] == 'b');
    auto b = parse_uuid(s);
    ASSERT_TRUE(b.is_ok());
    EXPECT_EQ(*b, a);
  }
  EXPECT_EQ(new_uuid_v4().to_string()[14], '4');
}

TEST(IdsTest, V7IsTimeOrderedAcrossMilliseconds) {
  std::string a = new_uuid_v7().to_string();
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  std::string b = new_uuid_v7().to_string();
  EXPECT_LT(a, b);
}

TEST(IdsTest, ParseRejectsMalformed) {
  EXPECT_FALSE(parse_uuid("").is_ok());
  EXPECT_FALSE(parse_uuid("not-a-uuid").is_ok());
  EXPECT_FALSE(parse_uuid("0191b9c8-7d2a-7c3e-9b1a-2f1e4c5d6e7").is_ok());   // 35 chars
  EXPECT_FALSE(parse_uuid("0191b9c8x7d2a-7c3e-9b1a-2f1e4c5d6e7f").is_ok());  // bad dash
  EXPECT_FALSE(parse_uuid("0191b9c8-7d2a-7c3e-9b1a-2f1e4c5d6e7g").is_ok());  // non-hex
  EXPECT_TRUE(parse_uuid("0191B9C8-7D2A-7C3E-9B1A-2F1E4C5D6E7F").is_ok());
}

TEST(IdsTest, RandomHexIsUnique) {
  std::set<std::string> seen;
  for (int i = 0; i < 1000; ++i) {
    std::string h = random_hex(16);
    ASSERT_EQ(h.size(), 32u);
    EXPECT_TRUE(seen.insert(h).second);
  }
}

}  // namespace
}  // namespace hr
