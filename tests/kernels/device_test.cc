// GPU discovery: skips cleanly without CUDA or a device.
#include "engine/device.h"

#include <gtest/gtest.h>

namespace hr::engine {
namespace {

TEST(GpuDeviceTest, ListsDevicesWithMemory) {
  if (!cuda_compiled()) GTEST_SKIP() << "CUDA backend not compiled in";
  auto gpus = list_gpus();
  if (gpus.empty()) GTEST_SKIP() << "no CUDA device present";
  for (const auto& g : gpus) {
    EXPECT_FALSE(g.name.empty());
    EXPECT_GE(g.compute_major, 7);
    EXPECT_GT(g.total_memory_bytes, 0u);
    EXPECT_LE(g.free_memory_bytes, g.total_memory_bytes);
  }
}

}  // namespace
}  // namespace hr::engine
