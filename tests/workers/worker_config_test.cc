// WorkerConfig: every "by device" setting resolved (a GPU takes many sequences, long steps and its
// memory's KV cache, with no caps for sync latency; the CPU few, short and 64 MiB, with them),
// values given outright kept, and flags that cannot work refused with the flag named.
#include <gtest/gtest.h>

#include <tuple>

#include "workers/worker_config.h"

namespace hr::workers {
namespace {

// The engine sizes a resolved configuration ends with: max_num_seqs, max_batched_tokens,
// kv_cache_bytes, max_model_len, async_tokens_with_sync, async_prefill_with_sync, async_step_ms,
// engine_nice.
using Sizes = std::tuple<int, int, int64_t, int, int, int, double, int>;
Sizes sizes(const WorkerConfig& c) {
  return {c.max_num_seqs,           c.max_batched_tokens,      c.kv_cache_bytes, c.max_model_len,
          c.async_tokens_with_sync, c.async_prefill_with_sync, c.async_step_ms,  c.engine_nice};
}

TEST(WorkerConfigTest, SizesTheEngineByDevice) {
  WorkerConfig cpu;
  EXPECT_EQ(sizes(cpu.resolved()), Sizes(32, 512, 64ll << 20, 0, 8, 0, 100.0, 5));

  for (const char* device : {"cuda", "cuda:1"}) {
    WorkerConfig gpu;
    gpu.device = device;
    // KV cache 0: a fraction of the memory left after loading; async tokens and step time: no
    // cap, but async prompts 128 tokens a step while sync requests run.
    EXPECT_EQ(sizes(gpu.resolved()), Sizes(256, 2048, 0, 0, 0, 128, 0.0, 0)) << device;
  }

  WorkerConfig given;
  given.device = "cuda";
  given.max_num_seqs = 8;
  given.max_batched_tokens = 100;
  given.kv_cache_bytes = 1ll << 30;
  given.max_model_len = 4096;
  given.async_tokens_with_sync = 3;
  given.async_prefill_with_sync = 0;
  given.engine_nice = 7;
  const WorkerConfig kept = given.resolved();
  EXPECT_EQ(sizes(kept), Sizes(8, 100, 1ll << 30, 4096, 3, 0, 0.0, 7));
  EXPECT_EQ(sizes(kept.resolved()), sizes(kept));  // resolving twice changes nothing
}

TEST(WorkerConfigTest, CatchUpWorkRunsAloneOnTheCpuAndBesideOtherWorkOnAGpu) {
  WorkerConfig cpu;
  EXPECT_EQ(cpu.resolved().catch_up_alone, 1);
  WorkerConfig gpu;
  gpu.device = "cuda";
  EXPECT_EQ(gpu.resolved().catch_up_alone, 0);
  gpu.catch_up_alone = 1;
  EXPECT_EQ(gpu.resolved().catch_up_alone, 1);  // given outright: kept
}

// The flag validate() names for a config changed by `change` ("ok" when it accepts it).
template <typename Change>
std::string field_of(Change change) {
  WorkerConfig c;
  change(c);
  const Status st = c.validate();
  return st.is_ok() ? std::string("ok") : st.field();
}

TEST(WorkerConfigTest, RefusesSizesThatCannotWorkNamingTheFlag) {
  EXPECT_EQ(field_of([](WorkerConfig&) {}), "ok");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.max_num_seqs = 0; }), "max-num-seqs");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.max_num_seqs = -2; }), "max-num-seqs");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.max_batched_tokens = 0; }), "max-batched-tokens");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.max_pull = 0; }), "max-pull");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.catch_up_alone = 2; }), "catch-up-alone");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.async_prefill_with_sync = -2; }),
            "async-prefill-with-sync");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.async_prefill_with_sync = 64; }), "ok");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.catch_up_alone = 0; }), "ok");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.catch_up_poll_ms = 0; }), "catch-up-poll-ms");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.max_model_len = -1; }), "max-model-len");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.max_model_len = 1024; }), "ok");
  // 0 means "what the GPU has left": nothing on the CPU backend.
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.kv_cache_bytes = 0; }), "kv-cache-bytes");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.kv_cache_bytes = -2; }), "kv-cache-bytes");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.kv_cache_bytes = 1 << 20; }), "ok");
  // The slots kept for sync bursts are counted against the sequences the device takes.
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.reserve_slots = 40; }), "reserve-slots");
  EXPECT_EQ(field_of([](WorkerConfig& c) {
              c.reserve_slots = 40;
              c.max_num_seqs = 64;
            }),
            "ok");
}

TEST(WorkerConfigTest, RefusesParallelDegreesThatCannotWorkNamingTheFlag) {
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.tensor_parallel = 0; }), "tensor-parallel");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.pipeline_parallel = 0; }), "pipeline-parallel");
  EXPECT_EQ(field_of([](WorkerConfig& c) {
              c.tensor_parallel = 4;
              c.pipeline_parallel = 2;
              c.expert_parallel = 4;
            }),
            "ok");
  EXPECT_EQ(field_of([](WorkerConfig& c) {
              c.tensor_parallel = 4;
              c.expert_parallel = 2;
            }),
            "expert-parallel");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.expert_parallel = -1; }), "expert-parallel");
  for (const char* good : {"auto", "even"}) {
    EXPECT_EQ(field_of([&](WorkerConfig& c) { c.stage_layers = good; }), "ok") << good;
  }
  EXPECT_EQ(field_of([](WorkerConfig& c) {
              c.pipeline_parallel = 2;
              c.stage_layers = "3,1";
            }),
            "ok");
  for (const char* bad : {"3,1,0", "three", "3,,1", "", "0"}) {
    EXPECT_EQ(field_of([&](WorkerConfig& c) {
                c.pipeline_parallel = 3;
                c.stage_layers = bad;
              }),
              "stage-layers")
        << bad;
  }
  EXPECT_EQ(field_of([](WorkerConfig& c) {
              c.pipeline_parallel = 3;
              c.stage_layers = "3,1";  // two counts for three stages
            }),
            "stage-layers");
  EXPECT_EQ(field_of([](WorkerConfig& c) {
              c.tensor_parallel = 2;
              c.devices = "0,1";
            }),
            "devices");  // the CPU backend's ranks are threads
#ifdef HEADROOM_HAVE_CUDA
  auto cuda = [](int tp, const std::string& devices, int pp = 1, int ep = 0) {
    return field_of([&](WorkerConfig& c) {
      c.device = "cuda";
      c.tensor_parallel = tp;
      c.pipeline_parallel = pp;
      c.expert_parallel = ep;
      c.devices = devices;
    });
  };
  EXPECT_EQ(cuda(4, ""), "ok");
  EXPECT_EQ(cuda(4, "0,1,2,3"), "ok");
  EXPECT_EQ(cuda(2, "0,0"), "ok");
  EXPECT_EQ(cuda(2, "0,1,2"), "devices");
  EXPECT_EQ(cuda(2, "0,x"), "devices");
  EXPECT_EQ(cuda(2, "0,"), "devices");
  EXPECT_EQ(cuda(2, "", 2), "ok");
  EXPECT_EQ(cuda(2, "0,0,0,0", 2), "ok");
  EXPECT_EQ(cuda(2, "0,1", 2), "devices");  // 4 ranks
  EXPECT_EQ(cuda(1, "", 16), "pipeline-parallel");
  EXPECT_EQ(field_of([](WorkerConfig& c) {  // (balanced by measured time on the GPUs too)
              c.device = "cuda";
              c.pipeline_parallel = 2;
              c.stage_layers = "auto";
            }),
            "ok");
  EXPECT_EQ(field_of([](WorkerConfig& c) {
              c.device = "cuda";
              c.pipeline_parallel = 2;
              c.stage_layers = "3,1";
            }),
            "ok");
  EXPECT_EQ(cuda(2, "", 1, 2), "ok");
  EXPECT_EQ(cuda(2, "", 1, 4), "expert-parallel");
  EXPECT_EQ(cuda(2, "", 1, 1), "ok");
  EXPECT_EQ(cuda(16, ""), "tensor-parallel");
#endif
}

// A stuck step is watched for on a GPU (a wedged device, a rank waiting for a peer), not on the
// CPU backend, where a large model's step may take minutes and nothing waits on a device.
TEST(WorkerConfigTest, StepsAreWatchedLongerOnTheCpuThanOnAGpu) {
  WorkerConfig cpu;
  EXPECT_EQ(cpu.resolved().step_timeout_seconds, 1800.0);
  WorkerConfig gpu;
  gpu.device = "cuda";
  EXPECT_EQ(gpu.resolved().step_timeout_seconds, 300.0);
  cpu.step_timeout_seconds = 30;
  EXPECT_EQ(cpu.resolved().step_timeout_seconds, 30.0);  // given outright: kept
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.step_timeout_seconds = -2; }), "step-timeout-seconds");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.step_timeout_seconds = 1e12; }),
            "step-timeout-seconds");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.step_timeout_seconds = 0; }), "ok");
}

}  // namespace
}  // namespace hr::workers
