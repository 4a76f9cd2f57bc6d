// Thread scheduling priority.
#pragma once

namespace hr {

// Raises the calling thread's nice value to `nice` (Linux: per thread; higher is a lower
// priority, which needs no privileges). No-op for nice <= 0. Returns false when the system
// refused.
bool lower_thread_priority(int nice);

}  // namespace hr
