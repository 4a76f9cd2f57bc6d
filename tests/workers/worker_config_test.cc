// WorkerConfig: every "by device" setting resolved (a GPU takes many sequences, long steps and its
// memory's KV cache, with no caps for sync latency; the CPU few, short and 64 MiB, with them),
// values given outright kept, and flags that cannot work refused with the flag named.
#include <gtest/gtest.h>

#include "workers/worker_config.h"

namespace hr::workers {
namespace {

TEST(WorkerConfigTest, SizesTheEngineByDevice) {
  WorkerConfig cpu;
  const WorkerConfig on_cpu = cpu.resolved();
  EXPECT_EQ(on_cpu.max_num_seqs, 32);
  EXPECT_EQ(on_cpu.max_batched_tokens, 512);
  EXPECT_EQ(on_cpu.kv_cache_bytes, 64ll << 20);
  EXPECT_EQ(on_cpu.max_model_len, 0);
  EXPECT_EQ(on_cpu.async_tokens_with_sync, 8);
  EXPECT_EQ(on_cpu.async_step_ms, 100.0);
  EXPECT_EQ(on_cpu.engine_nice, 5);

  for (const char* device : {"cuda", "cuda:1"}) {
    WorkerConfig gpu;
    gpu.device = device;
    const WorkerConfig on_gpu = gpu.resolved();
    EXPECT_EQ(on_gpu.max_num_seqs, 256) << device;
    EXPECT_EQ(on_gpu.max_batched_tokens, 2048) << device;
    EXPECT_EQ(on_gpu.kv_cache_bytes, 0) << device;  // a fraction of the memory left after loading
    EXPECT_EQ(on_gpu.async_tokens_with_sync, 0) << device;  // no cap
    EXPECT_EQ(on_gpu.async_step_ms, 0.0) << device;
    EXPECT_EQ(on_gpu.engine_nice, 0) << device;
  }

  WorkerConfig given;
  given.device = "cuda";
  given.max_num_seqs = 8;
  given.max_batched_tokens = 100;
  given.kv_cache_bytes = 1ll << 30;
  given.max_model_len = 4096;
  given.async_tokens_with_sync = 3;
  given.engine_nice = 7;
  const WorkerConfig kept = given.resolved();
  EXPECT_EQ(kept.max_num_seqs, 8);
  EXPECT_EQ(kept.max_batched_tokens, 100);
  EXPECT_EQ(kept.kv_cache_bytes, 1ll << 30);
  EXPECT_EQ(kept.max_model_len, 4096);
  EXPECT_EQ(kept.async_tokens_with_sync, 3);
  EXPECT_EQ(kept.engine_nice, 7);
  EXPECT_EQ(kept.resolved().max_num_seqs, 8);  // resolving twice changes nothing
}

TEST(WorkerConfigTest, RefusesSizesThatCannotWorkNamingTheFlag) {
  auto field_of = [](auto change) {
    WorkerConfig c;
    change(c);
    const Status st = c.validate();
    return st.is_ok() ? std::string("ok") : st.field();
  };
  EXPECT_EQ(field_of([](WorkerConfig&) {}), "ok");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.max_num_seqs = 0; }), "max-num-seqs");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.max_num_seqs = -2; }), "max-num-seqs");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.max_batched_tokens = 0; }), "max-batched-tokens");
  EXPECT_EQ(field_of([](WorkerConfig& c) { c.max_pull = 0; }), "max-pull");
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

}  // namespace
}  // namespace hr::workers
