// GPU discovery: skips cleanly without CUDA or a device.
#include "engine/device.h"
#include "engine/gpu_monitor.h"

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

TEST(GpuDeviceTest, NvmlReadsUtilizationAndMemory) {
  auto gpus = list_gpus();
  if (gpus.empty()) {
    // Without a GPU the monitor either cannot load NVML (an unavailable error) or sees no device.
    auto m = GpuMonitor::open();
    if (m.is_ok()) {
      EXPECT_EQ((*m)->num_devices(), 0);
    } else {
      EXPECT_EQ(m.status().code(), StatusCode::kUnavailable);
    }
    GTEST_SKIP() << "no CUDA device present";
  }
  auto m = GpuMonitor::open();
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_GE((*m)->num_devices(), 1);
  auto r = (*m)->read(0);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_GE(r->utilization_percent, 0);
  EXPECT_LE(r->utilization_percent, 100);
  EXPECT_GT(r->memory_total_bytes, 0u);
  EXPECT_LE(r->memory_used_bytes, r->memory_total_bytes);
  EXPECT_EQ((*m)->read(99).status().field(), "device");
}

}  // namespace
}  // namespace hr::engine
