// HR_CHECK: aborts with file:line and a message when an invariant is broken. Always on, in every
// build type: a broken invariant must never run on silently. Streamable:
//   HR_CHECK(n > 0) << "n=" << n;
#pragma once

#include <sstream>

namespace hr::internal {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* expr);
  [[noreturn]] ~CheckFailure();
  template <typename T>
  CheckFailure& operator<<(const T& v) {
    stream_ << v;
    return *this;
  }

 private:
  std::ostringstream stream_;
};

// Lets `HR_CHECK(x) << ...` be an expression of type void.
struct Voidify {
  void operator&(CheckFailure&) {}
};

}  // namespace hr::internal

#define HR_CHECK(cond) \
  (cond) ? (void)0     \
         : ::hr::internal::Voidify() & ::hr::internal::CheckFailure(__FILE__, __LINE__, #cond)
#define HR_CHECK_OP(a, op, b) HR_CHECK((a)op(b)) << "(" << (a) << " vs " << (b) << ") "
#define HR_CHECK_EQ(a, b) HR_CHECK_OP(a, ==, b)
#define HR_CHECK_NE(a, b) HR_CHECK_OP(a, !=, b)
#define HR_CHECK_LT(a, b) HR_CHECK_OP(a, <, b)
#define HR_CHECK_LE(a, b) HR_CHECK_OP(a, <=, b)
#define HR_CHECK_GT(a, b) HR_CHECK_OP(a, >, b)
#define HR_CHECK_GE(a, b) HR_CHECK_OP(a, >=, b)
