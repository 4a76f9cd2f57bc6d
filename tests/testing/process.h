// Child processes for tests that run the real binary: spawn(args) forks and execs args[0] with
// args (optionally sending its stderr to a file); the caller kills and reaps it.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

namespace hr::testing {

// The child's pid, or -1 when fork failed. Everything is prepared before fork(): the child only
// redirects stderr and execs.
pid_t spawn(std::vector<std::string> args, const std::string& stderr_file = "");

}  // namespace hr::testing
