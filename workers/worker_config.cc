// WorkerConfig flags and validation.
#include "workers/worker_config.h"

#include "base/cli.h"
#include "engine/backend_factory.h"

namespace hr::workers {

void WorkerConfig::bind(CLI::App& app) {
  cli::add(app, "--model", model_dir, "Hugging Face model folder to serve");
  cli::add(app, "--name", model_name, "Model name clients use (e.g. @hr/tiny-reverse)");
  cli::add(app, "--worker-name", worker_name, "Worker identity in leases (default host:pid)");
  cli::add(app, "--lease-seconds", lease_seconds, "Lease length for async requests");
  cli::add(app, "--max-attempts", max_attempts,
           "Failed attempts (errors worth retrying, expired leases) before a request ends failed; "
           "give the dispatcher the same");
  cli::add(app, "--heartbeat-ms", heartbeat_ms, "Registration heartbeat period");
  cli::add(app, "--reserve-slots", reserve_slots, "Sequence slots kept free for sync bursts");
  cli::add(app, "--max-utilization", max_utilization,
           "Stop pulling async work while the device is busier than this fraction (engine "
           "steps, or NVML utilization on a GPU, over ~1 s); 1 never brakes");
  cli::add(app, "--drain-seconds", drain_seconds, "On SIGTERM, time to finish or release leases");
  cli::add(app, "--step-timeout-seconds", step_timeout_seconds,
           "An engine step running longer is taken as stuck: its work goes back to the queue, the "
           "ranks are aborted and the worker exits (0: never; -1: 300 on a GPU, 1800 on the CPU "
           "backend, where a large model's step on few cores may take minutes)");
  cli::add(app, "--max-num-seqs", max_num_seqs,
           "Sequences the engine runs at once (-1: 32 on the CPU backend, 256 on a GPU)");
  cli::add(app, "--max-batched-tokens", max_batched_tokens,
           "Tokens per engine step (-1: 512 on the CPU backend, 2048 on a GPU)");
  cli::add(
      app, "--max-model-len", max_model_len,
      "Longest sequence (prompt and answer) in tokens, below the model's own to keep step inputs "
      "small (0: the model's max_position_embeddings)");
  cli::add(app, "--max-pull", max_pull, "Most requests taken from the queue at once");
  cli::add(app, "--async-tokens-with-sync", async_tokens_with_sync,
           "While sync requests run (or ran in the last 3 s), async sequences get at most this "
           "many tokens per engine "
           "step: keeps those steps short where step time grows with batch size (0: no cap; "
           "-1: 8 on the CPU backend, no cap on a GPU)");
  cli::add(app, "--async-prefill-with-sync", async_prefill_with_sync,
           "While sync requests run (or ran in the last 3 s), async prompts take at most this "
           "many tokens per engine step, decode tokens not counted: keeps the step an arriving "
           "sync request waits behind short (0: no cap; -1: 128 on a GPU, no cap on the CPU "
           "backend)");
  cli::add(app, "--sync-prefill-alone", sync_prefill_alone,
           "Engine steps that compute a sync prompt carry no async tokens (true or false)");
  cli::add(app, "--catch-up-alone", catch_up_alone,
           "While the queued work of an account far behind its share runs, the rest of the "
           "queued work waits (1) or runs beside it (0) (-1: 1 on the CPU backend, 0 on a GPU)");
  cli::add(app, "--async-step-ms", async_step_ms,
           "Steps carrying async work are sized from measured step times to last about this "
           "long, so a sync request arriving after a quiet spell waits little for the step in "
           "progress (0: no cap; -1: 100 on the CPU backend, no cap on a GPU)");
  cli::add(app, "--engine-nice", engine_nice,
           "Nice value (0-19) of the engine's threads, so that request handling sharing their "
           "cores runs first (-1: 5 on the CPU backend, 0 on a GPU)");
  cli::add(app, "--idle-poll-ms", idle_poll_ms,
           "An idle worker looks for async work this often (sync arrivals wake it at once)");
  cli::add(app, "--catch-up-poll-ms", catch_up_poll_ms,
           "A worker looks this often for the queued work of an account far behind its share, "
           "which it starts at once, busy or not (docs/fair-share.md)");
  cli::add(
      app, "--kv-cache-bytes", kv_cache_bytes,
      "KV cache size in bytes (with --device cuda, 0: 90% of the GPU memory left after loading; "
      "-1: 64 MiB on the CPU backend, 0 on a GPU)");
  cli::add(app, "--device", device, "Compute device: cpu, cuda or cuda:N");
  cli::add(app, "--devices", devices,
           "With --device cuda and --tensor-parallel / --pipeline-parallel: the ranks' GPUs, "
           "an index per rank such as 0,1,2,3, stage by stage (default: the device's index and "
           "the ones after it); one index repeated runs virtual ranks on that GPU");
  cli::add(app, "--tensor-parallel", tensor_parallel,
           "Tensor-parallel ranks per pipeline stage (Megatron sharding: attention by heads, "
           "MLPs by rows, the LM head by vocabulary); the CPU backend runs each rank on its "
           "own threads");
  cli::add(app, "--pipeline-parallel", pipeline_parallel,
           "Pipeline stages: contiguous layers each; the engine keeps a step of other sequences "
           "in flight for each stage (on cuda with a GPU a stage), and a step with none beside "
           "it is cut into micro-batches");
  cli::add(app, "--stage-layers", stage_layers,
           "With --pipeline-parallel: even splits the layers as evenly as they go; auto times "
           "every layer and the LM head before serving and moves layers so the slowest stage is "
           "fastest (on cuda the moved shards are read again; docs/parallel-engine.md); or give "
           "each stage's layer count (8,4)");
  cli::add(app, "--expert-parallel", expert_parallel,
           "Mixture-of-experts layers: 1 slices every expert across the tensor-parallel ranks; "
           "the tensor-parallel size gives each rank a share of the experts whole (0: that, "
           "when the experts split evenly, else 1)");
  cli::add(app, "--cuda-options", cuda_options, engine::cuda_options_help());
  cli::add(app, "--chat-template", chat_template,
           "Use a built-in chat template instead of the model's own: headroom, llama3, chatml or "
           "mistral");
  cli::add(app, "--public-prefix", public_prefixes,
           "A JSON file of messages (a shared system prompt) whose prompt prefix every account "
           "may share in the prefix cache; repeatable. Default: prefixes shared within an "
           "account only");
}

Status WorkerConfig::validate() const {
  if (model_dir.empty()) return invalid_argument("--model must name a folder", "model");
  if (model_name.empty()) return invalid_argument("--name must not be empty", "name");
  if (lease_seconds < 2)
    return invalid_argument("--lease-seconds must be at least 2", "lease-seconds");
  if (max_attempts < 1)
    return invalid_argument("--max-attempts must be at least 1", "max-attempts");
  if (heartbeat_ms < 50)
    return invalid_argument("--heartbeat-ms must be at least 50", "heartbeat-ms");
  if (reserve_slots < 0) return invalid_argument("--reserve-slots must be >= 0", "reserve-slots");
  if (max_utilization <= 0 || max_utilization > 1) {
    return invalid_argument("--max-utilization must be in (0, 1]", "max-utilization");
  }
  if (drain_seconds < 0) return invalid_argument("--drain-seconds must be >= 0", "drain-seconds");
  if (!(step_timeout_seconds == -1 ||
        (step_timeout_seconds >= 0 && step_timeout_seconds <= 86400))) {
    return invalid_argument("--step-timeout-seconds must be -1 (by device) or between 0 and 86400",
                            "step-timeout-seconds");
  }
  if (catch_up_alone < -1 || catch_up_alone > 1) {
    return invalid_argument("--catch-up-alone must be -1 (by device), 0 or 1", "catch-up-alone");
  }
  if (async_tokens_with_sync < -1) {
    return invalid_argument("--async-tokens-with-sync must be >= -1", "async-tokens-with-sync");
  }
  if (async_prefill_with_sync < -1) {
    return invalid_argument("--async-prefill-with-sync must be >= -1", "async-prefill-with-sync");
  }
  if (async_step_ms < 0 && async_step_ms != -1) {
    return invalid_argument("--async-step-ms must be -1 (auto), 0 (no cap) or positive",
                            "async-step-ms");
  }
  if (engine_nice < -1 || engine_nice > 19) {
    return invalid_argument("--engine-nice must be -1 (auto) or 0..19", "engine-nice");
  }
  if (idle_poll_ms < 1 || idle_poll_ms > 10000) {
    return invalid_argument("--idle-poll-ms must be 1..10000", "idle-poll-ms");
  }
  if (catch_up_poll_ms < 1 || catch_up_poll_ms > 10000) {
    return invalid_argument("--catch-up-poll-ms must be 1..10000", "catch-up-poll-ms");
  }
  if (max_num_seqs < 1 && max_num_seqs != -1) {
    return invalid_argument("--max-num-seqs must be -1 (by device) or positive", "max-num-seqs");
  }
  if (max_batched_tokens < 1 && max_batched_tokens != -1) {
    return invalid_argument("--max-batched-tokens must be -1 (by device) or positive",
                            "max-batched-tokens");
  }
  if (max_pull < 1) return invalid_argument("--max-pull must be positive", "max-pull");
  if (max_model_len < 0) return invalid_argument("--max-model-len must be >= 0", "max-model-len");
  if (kv_cache_bytes < -1 || (kv_cache_bytes == 0 && device == "cpu")) {
    return invalid_argument(
        "--kv-cache-bytes must be -1 (by device), a size in bytes, or 0 with --device cuda",
        "kv-cache-bytes");
  }
  if (!cuda_options.empty()) {
    if (device == "cpu")
      return invalid_argument("--cuda-options needs --device cuda", "cuda-options");
    HR_RETURN_IF_ERROR(engine::parse_cuda_options(cuda_options).status());
  }
  HR_RETURN_IF_ERROR(engine::check_device(device));
  if (tensor_parallel < 1 || tensor_parallel > 64) {
    return invalid_argument("--tensor-parallel must be 1..64", "tensor-parallel");
  }
  if (pipeline_parallel < 1 || pipeline_parallel > 64) {
    return invalid_argument("--pipeline-parallel must be 1..64", "pipeline-parallel");
  }
  HR_ASSIGN_OR_RETURN(engine::StageLayers stages, engine::parse_stage_layers(stage_layers));
  if (!stages.layers.empty() && static_cast<int>(stages.layers.size()) != pipeline_parallel) {
    return invalid_argument("--stage-layers names " + std::to_string(stages.layers.size()) +
                                " stages for --pipeline-parallel " +
                                std::to_string(pipeline_parallel),
                            "stage-layers");
  }
  if (expert_parallel < 0 || (expert_parallel > 1 && expert_parallel != tensor_parallel)) {
    return invalid_argument("--expert-parallel must be 0 (auto), 1 or the tensor-parallel size",
                            "expert-parallel");
  }
  if (device != "cpu") {
    if (pipeline_parallel > 8) {
      return invalid_argument("the CUDA backend's pipeline stages are 1 to 8", "pipeline-parallel");
    }
    if (tensor_parallel > 8) {
      return invalid_argument("the CUDA backend's tensor-parallel ranks are 1 to 8",
                              "tensor-parallel");
    }
  }
  if (!devices.empty()) {
    if (device == "cpu") return invalid_argument("--devices needs --device cuda", "devices");
    HR_ASSIGN_OR_RETURN(std::vector<int> list, engine::parse_device_list(devices));
    if (static_cast<int>(list.size()) != tensor_parallel * pipeline_parallel) {
      return invalid_argument("--devices names " + std::to_string(list.size()) + " GPUs for " +
                                  std::to_string(tensor_parallel * pipeline_parallel) +
                                  " ranks (--tensor-parallel x --pipeline-parallel)",
                              "devices");
    }
  }
  if (reserve_slots >= resolved().max_num_seqs) {
    return invalid_argument("--reserve-slots must be below --max-num-seqs", "reserve-slots");
  }
  return Status::ok();
}

WorkerConfig WorkerConfig::resolved() const {
  WorkerConfig r = *this;
  r.async_tokens_with_sync = by_device(async_tokens_with_sync, 8, 0);
  r.async_prefill_with_sync = by_device(async_prefill_with_sync, 0, 128);
  r.async_step_ms = by_device(async_step_ms, 100.0, 0.0);
  r.engine_nice = by_device(engine_nice, 5, 0);
  r.catch_up_alone = by_device(catch_up_alone, 1, 0);
  r.max_num_seqs = by_device(max_num_seqs, 32, 256);
  r.max_batched_tokens = by_device(max_batched_tokens, 512, 2048);
  r.kv_cache_bytes = by_device<int64_t>(kv_cache_bytes, 64ll << 20, 0);
  r.step_timeout_seconds = by_device(step_timeout_seconds, 1800.0, 300.0);
  return r;
}

}  // namespace hr::workers
