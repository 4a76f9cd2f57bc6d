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

}  // namespace
}  // namespace hr
