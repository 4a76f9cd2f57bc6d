// The failure path of HR_CHECK.
#include "base/check.h"

#include <cstdio>
#include <cstdlib>

namespace hr::internal {

CheckFailure::CheckFailure(const char* file, int line, const char* expr) {
  stream_ << "CHECK failed at " << file << ":" << line << ": " << expr << " ";
}

CheckFailure::~CheckFailure() {
  std::fprintf(stderr, "%s\n", stream_.str().c_str());
  std::fflush(stderr);
  std::abort();
}

}  // namespace hr::internal
