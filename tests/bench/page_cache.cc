#include "tests/bench/page_cache.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>

namespace hr::bench {

std::vector<std::string> checkpoint_files(const std::string& dir) {
  std::vector<std::string> files;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    if (e.path().extension() == ".safetensors") files.push_back(e.path().string());
  }
  std::sort(files.begin(), files.end());
  return files;
}

double drop_from_page_cache(const std::vector<std::string>& files) {
  size_t pages = 0, resident = 0;
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  for (const std::string& f : files) {
    const int fd = open(f.c_str(), O_RDONLY);
    if (fd < 0) continue;
    fdatasync(fd);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    const off_t size = lseek(fd, 0, SEEK_END);
    if (size > 0) {
      void* map = mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_SHARED, fd, 0);
      if (map != MAP_FAILED) {
        std::vector<unsigned char> in((static_cast<size_t>(size) + page - 1) / page);
        if (mincore(map, static_cast<size_t>(size), in.data()) == 0) {
          pages += in.size();
          for (unsigned char c : in) resident += c & 1;
        }
        munmap(map, static_cast<size_t>(size));
      }
    }
    close(fd);
  }
  return pages ? static_cast<double>(resident) / static_cast<double>(pages) : 0.0;
}

size_t read_whole(const std::vector<std::string>& files) {
  std::vector<char> buf(16u << 20);
  size_t total = 0;
  for (const std::string& f : files) {
    const int fd = open(f.c_str(), O_RDONLY);
    if (fd < 0) continue;
    for (;;) {
      const ssize_t n = read(fd, buf.data(), buf.size());
      if (n <= 0) break;
      total += static_cast<size_t>(n);
    }
    close(fd);
  }
  return total;
}

}  // namespace hr::bench
