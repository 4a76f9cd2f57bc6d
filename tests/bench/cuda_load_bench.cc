// CUDA load benchmark driver (scripts/gpu_check.sh's `load` stage): how fast a checkpoint reaches
// the GPU against the disk's own read rate, the goal being a cold load bound by the drive.
//   --model DIR [--rounds 2] [--tp 2,4] [--kv-cache-mb 256] [--device 0]
// Each round, the checkpoint's files dropped from the page cache (posix_fadvise DONTNEED; the
// fraction still resident is reported) before each cold figure: the files read whole (the disk's
// sequential rate), one rank's load (CudaBackend::create_from_dir: bf16 straight to the device),
// each tensor-parallel degree's ranks (virtual ranks on the one GPU, every rank reading its shard
// on a thread of its own: ParallelCudaBackend::create_from_dir); then the one rank's load again
// from the page cache (the upload's own rate). Medians over the rounds, the figures taking turns
// in each. The last line of output is one JSON object; the exit status is 1 when a load failed.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "engine/cuda_backend.h"
#include "engine/parallel_cuda_backend.h"
#include "engine/safetensors.h"
#include "tests/bench/page_cache.h"

using namespace hr::engine;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream in(s);
  std::string item;
  while (std::getline(in, item, ',')) {
    if (!item.empty()) out.push_back(std::stoi(item));
  }
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir, tps = "2,4";
  int rounds = 2, device = 0;
  size_t kv_mb = 256;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i], v = argv[i + 1];
    if (k == "--model")
      dir = v;
    else if (k == "--rounds")
      rounds = std::max(1, std::stoi(v));
    else if (k == "--tp")
      tps = v;
    else if (k == "--kv-cache-mb")
      kv_mb = std::stoul(v);
    else if (k == "--device")
      device = std::stoi(v);
  }
  if (dir.empty()) {
    std::fprintf(stderr, "usage: %s --model DIR [--rounds N] [--tp 2,4] [--kv-cache-mb MB]\n",
                 argv[0]);
    return 2;
  }
  const std::vector<std::string> files = hr::bench::checkpoint_files(dir);
  size_t bytes = 0;
  {
    auto st = SafetensorsModel::open_dir(dir);
    if (!st.is_ok()) {
      std::fprintf(stderr, "%s\n", st.status().to_string().c_str());
      return 1;
    }
    for (const auto& [name, t] : (*st)->tensors()) bytes += t.num_bytes;
  }
  CudaBackendOptions o;
  o.device = device;
  o.kv_cache_bytes = kv_mb << 20;  // (the weights are what is timed)
  o.max_num_seqs = 8;
  o.max_num_tokens = 256;
  json errors = json::object();
  // Seconds from the call to a backend ready to step (its GPU memory freed before the next).
  auto one_rank = [&]() -> double {
    const auto t = Clock::now();
    auto b = CudaBackend::create_from_dir(dir, o);
    const double s = std::chrono::duration<double>(Clock::now() - t).count();
    if (!b.is_ok()) {
      errors["one rank"] = b.status().to_string();
      return -1;
    }
    return s;
  };
  auto ranks = [&](int tp) -> double {
    const auto t = Clock::now();
    auto b = ParallelCudaBackend::create_from_dir(dir, std::vector<int>(tp, device), o);
    const double s = std::chrono::duration<double>(Clock::now() - t).count();
    if (!b.is_ok()) {
      errors["tp" + std::to_string(tp)] = b.status().to_string();
      return -1;
    }
    return s;
  };
  std::map<std::string, std::vector<double>> s;
  std::vector<double> resident;
  for (int r = 0; r < rounds; ++r) {
    resident.push_back(hr::bench::drop_from_page_cache(files));
    const auto t0 = Clock::now();
    const size_t read = hr::bench::read_whole(files);
    s["disk_read"].push_back(read > 0 ? std::chrono::duration<double>(Clock::now() - t0).count()
                                      : -1);
    hr::bench::drop_from_page_cache(files);
    s["one_rank_cold"].push_back(one_rank());
    for (int tp : parse_list(tps)) {
      hr::bench::drop_from_page_cache(files);
      s["tp" + std::to_string(tp) + "_virtual_ranks_cold"].push_back(ranks(tp));
    }
    s["one_rank_warm"].push_back(one_rank());
  }
  json out = {{"model", dir},
              {"checkpoint_bytes", bytes},
              {"rounds", rounds},
              {"resident_after_drop", resident}};
  const double disk_s = median(s["disk_read"]);
  const double disk = disk_s > 0 ? bytes / disk_s / 1e9 : 0;
  for (const auto& [name, seconds] : s) {
    out["seconds"][name] = seconds;
    const double m = median(seconds);
    out["gbs"][name] = m > 0 ? bytes / m / 1e9 : 0;
    if (name != "disk_read" && disk > 0 && m > 0) out["over_disk"][name] = bytes / m / 1e9 / disk;
  }
  out["disk_cold_read_gbs"] = disk;
  out["errors"] = errors;
  std::printf("%s\n", out.dump().c_str());
  return errors.empty() ? 0 : 1;
}
