// fork + exec for tests.
#include "tests/testing/process.h"

#include <unistd.h>

#include <cstdio>

namespace hr::testing {

pid_t spawn(std::vector<std::string> args, const std::string& stderr_file) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    if (!stderr_file.empty() && std::freopen(stderr_file.c_str(), "w", stderr) == nullptr)
      _exit(126);
    execv(argv[0], argv.data());
    _exit(127);
  }
  return pid;
}

}  // namespace hr::testing
