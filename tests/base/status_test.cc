#include "base/status.h"

#include <gtest/gtest.h>

namespace hr {
namespace {

Result<int> half(int x) {
  if (x % 2 != 0) return invalid_argument("odd", "x");
  return x / 2;
}

Status quarter(int x, int* out) {
  HR_ASSIGN_OR_RETURN(int h, half(x));
  HR_ASSIGN_OR_RETURN(*out, half(h));
  return Status::ok();
}

TEST(StatusTest, OkAndErrorsFormat) {
  EXPECT_TRUE(Status::ok().is_ok());
  Status s = invalid_argument("bad thing", "requests[2].role");
  EXPECT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(s.to_string(), "invalid_argument: bad thing (field=requests[2].role)");
  EXPECT_EQ(s.with_context("submit").message(), "submit: bad thing");
  EXPECT_EQ(s.with_context("submit").field(), "requests[2].role");
}

TEST(StatusTest, ResultPropagates) {
  int out = 0;
  EXPECT_TRUE(quarter(8, &out).is_ok());
  EXPECT_EQ(out, 2);
  Status st = quarter(6, &out);
  EXPECT_EQ(st.code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(st.field(), "x");
}

TEST(StatusDeathTest, ValueOfErrorAborts) {
  Result<int> r = invalid_argument("nope");
  EXPECT_DEATH((void)r.value(), "CHECK failed");
}

}  // namespace
}  // namespace hr
