#include "base/priority.h"

#if defined(__linux__)
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#endif

namespace hr {

bool lower_thread_priority(int nice) {
  if (nice <= 0) return true;
#if defined(__linux__)
  return setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), nice) == 0;
#else
  return false;
#endif
}

}  // namespace hr
