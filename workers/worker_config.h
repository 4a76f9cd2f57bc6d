// Configuration of one worker process: which model it hosts and under what name, and the
// thresholds that decide how much async work it pulls.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "base/status.h"
#include "queue/config.h"

namespace hr::workers {

struct WorkerConfig {
  std::string model_dir = "models/tiny-reverse";  // Hugging Face folder
  std::string model_name = "@hr/tiny-reverse";    // the name clients use
  std::string worker_name;                        // default: host:pid
  int lease_seconds = 30;
  int max_attempts = queue::kDefaultMaxAttempts;  // failed attempts before a request ends failed
  int heartbeat_ms = 1000;
  int reserve_slots = 2;         // sequence slots always kept free for sync bursts
  double max_utilization = 1.0;  // stop pulling above this busy fraction (1: never)
  int drain_seconds = 30;        // SIGTERM: time to finish or release leases
  // A step running longer is stuck (a rank waiting for a peer that never comes, a wedged GPU):
  // the worker hands its work back, aborts the engine's ranks and fails (workers/
  // step_watchdog.h); 0: never; -1: 300 s on a GPU (far above any step's time: a step is bounded
  // by its token budget), never on the CPU backend (nothing there waits on a device, and a large
  // model's step on few cores may take minutes).
  double step_timeout_seconds = -1;
  int max_num_seqs = -1;        // sequences the engine runs at once (-1: 32 on CPU, 256 on a GPU)
  int max_batched_tokens = -1;  // tokens per engine step (-1: 512 on CPU, 2048 on a GPU)
  int max_model_len = 0;        // longest sequence, prompt and answer (0: the model's own)
  int max_pull = 64;            // most requests taken from the queue at once
  int idle_poll_ms = 20;        // an idle worker looks at the queue this often
  int catch_up_poll_ms = 5;     // and at the catch-up stream (queue/stream.h), idle or not
  // Async tokens per step while sync requests run: 0 no cap, -1 auto (8 on the CPU backend, whose
  // step time grows with the tokens in it; no cap on a GPU).
  int async_tokens_with_sync = -1;
  // Async prompt tokens per step while sync requests run (decode tokens not counted): 0 no cap, -1
  // auto (128 on a GPU, where a chunk of queued prompts made the step an arriving sync request
  // waits behind ten times longer than a decode step; no cap on the CPU backend, whose
  // async_tokens_with_sync already holds every async token to 8).
  int async_prefill_with_sync = -1;
  bool sync_prefill_alone = true;  // steps computing a sync prompt carry no async tokens
  // While catch-up requests (queue/stream.h) run, the rest of the queued work waits rather than
  // runs beside them: 1 yes, 0 no, -1 auto (yes on the CPU backend, whose step time grows with
  // the sequences in it; no on a GPU, where they cost the catch-up little).
  int catch_up_alone = -1;
  // Nice value of the engine's threads (step loop and CPU pool): -1 auto (5 on the CPU backend,
  // 0 on a GPU), so that request handling on the same cores preempts the compute at once.
  int engine_nice = -1;
  // Steps carrying async work last about this long at most (from measured step times), so that a
  // sync request arriving after a quiet spell waits little for the step in progress: -1 auto (100
  // ms on the CPU backend, no cap on a GPU, whose steps are short), 0 no cap.
  double async_step_ms = -1;
  // -1: 64 MiB on CPU; on a GPU, 0: a fraction (0.9) of the device memory left after loading.
  int64_t kv_cache_bytes = -1;
  // Ranks of one engine: tensor-parallel ranks per stage, pipeline stages, and expert
  // parallelism (0: the tensor-parallel size when the experts split over it, else 1: sliced).
  int tensor_parallel = 1;
  int pipeline_parallel = 1;
  int expert_parallel = 0;
  // With pipeline stages: even, auto (balanced by measured stage time), or each stage's layers.
  std::string stage_layers = "even";
  std::string device = "cpu";  // cpu | cuda | cuda:N
  // cuda with several tensor-parallel ranks: their GPUs, "0,1,2,3" (empty: the device's index and
  // the ones after it); one index repeated: virtual ranks on that GPU (engine/
  // parallel_cuda_backend.h).
  std::string devices;
  std::string cuda_options;   // CUDA backend settings (engine::parse_cuda_options)
  std::string chat_template;  // override: headroom, llama3, chatml, mistral
  // JSON files of messages ([{"role", "content"}...], a shared system prompt say) whose rendered
  // beginning is a public prefix: its KV blocks are shared by every account (engine::
  // EngineOptions::public_prefixes). Everything else is shared within an account only.
  std::vector<std::string> public_prefixes;

  // This configuration with every -1 ("by device") filled in. The CPU backend's step time grows
  // with the tokens in a step and its threads share the cores with request handling; a GPU's do
  // neither, and a GPU takes many sequences, long steps and its memory's KV cache (the CPU few,
  // short and 64 MiB). The worker keeps the resolved configuration.
  WorkerConfig resolved() const;

  void bind(CLI::App& app);
  [[nodiscard]] Status validate() const;

 private:
  template <typename T>
  T by_device(T value, T on_cpu, T on_gpu) const {
    return value >= 0 ? value : device == "cpu" ? on_cpu : on_gpu;
  }
};

}  // namespace hr::workers
