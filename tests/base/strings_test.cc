// Trimming ASCII whitespace.
#include "base/strings.h"

#include <gtest/gtest.h>

namespace hr {
namespace {

TEST(StringsTest, TrimsAsciiWhitespaceOnEitherSide) {
  EXPECT_EQ(trim(" \t\n\v\f\ra b\r\n "), "a b");
  EXPECT_EQ(trim_start("  a  "), "a  ");
  EXPECT_EQ(trim_end("  a  "), "  a");
  EXPECT_EQ(trim(" \n "), "");
  EXPECT_EQ(trim("\xc2\xa0x"), "\xc2\xa0x");  // non-ASCII spaces are kept
}

TEST(StringsTest, ConstantTimeEqualAndCaseInsensitivePrefix) {
  EXPECT_TRUE(constant_time_equal("secret-token", "secret-token"));
  EXPECT_FALSE(constant_time_equal("secret-token", "secret-tokeN"));
  EXPECT_FALSE(constant_time_equal("secret-token", "secret-token2"));
  EXPECT_FALSE(constant_time_equal("", "x"));
  EXPECT_TRUE(constant_time_equal("", ""));
  EXPECT_FALSE(constant_time_equal(std::string_view("a\0", 2), "a"));
  EXPECT_TRUE(starts_with_ignoring_case("BEARER abc", "bearer "));
  EXPECT_TRUE(starts_with_ignoring_case("bEaReR abc", "Bearer "));
  EXPECT_FALSE(starts_with_ignoring_case("Bear", "bearer"));
  EXPECT_FALSE(starts_with_ignoring_case("Basic abc", "bearer "));
}

}  // namespace
}  // namespace hr
