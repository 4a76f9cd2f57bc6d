// A checkpoint's files and the page cache, for load benchmarks that compare a cold load with the
// disk's own read rate (pipeline_bench.cc, cuda_load_bench.cc).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace hr::bench {

// The folder's .safetensors files, sorted.
std::vector<std::string> checkpoint_files(const std::string& dir);
// Drops the files' pages from the page cache; returns the fraction of their pages still resident.
double drop_from_page_cache(const std::vector<std::string>& files);
// Reads the files whole, 16 MiB at a time; returns bytes read.
size_t read_whole(const std::vector<std::string>& files);

}  // namespace hr::bench
