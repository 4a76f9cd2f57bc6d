// GPU engine benchmark driver (run by scripts/bench_gpu.sh): a Llama-3-8B-shaped model (or with
// --moe, a mixture of experts: moe_run below) with random bf16 weights made on the GPU, run
// through the real engine (scheduler, block manager, CUDA
// backend, on-device sampling). Measures decode tokens/s at several batch sizes after 512-token
// prompts, prefill tokens/s for 2,048-token prompts, and batch-1 memory-bandwidth utilisation
// (weight bytes a decode token reads, i.e. all but the embedding table, over the step time,
// against a device-to-device copy timed in the same run). Prints one JSON object with the figures
// so far after each phase (the last line: all of them, "complete": true); a phase that fails is
// recorded under "errors", the others run all the same, and the exit status is then 1.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>

#include "engine/backend_factory.h"
#include "engine/cuda_backend.h"
#include "engine/cuda_gemm.h"
#include "engine/engine.h"
#include "grammar/json_schema.h"
#include "kernels/fill.cuh"
#include "kernels/gemv.cuh"

using namespace hr::engine;
namespace kernels = hr::kernels;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace {

double secs(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Bytes read plus bytes written per second by a large device-to-device copy (median of 20).
double copy_bandwidth(size_t bytes) {
  void *a = nullptr, *b = nullptr;
  if (cudaMalloc(&a, bytes) != cudaSuccess || cudaMalloc(&b, bytes) != cudaSuccess) return 0;
  cudaMemset(a, 0x5a, bytes);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> ms;
  for (int i = 0; i < 23; ++i) {
    cudaEventRecord(e0);
    cudaMemcpy(b, a, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float t = 0;
    cudaEventElapsedTime(&t, e0, e1);
    if (i >= 3) ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / (ms[ms.size() / 2] / 1e3);
}

std::vector<int32_t> random_prompt(std::mt19937& rng, int len, int vocab) {
  std::vector<int32_t> p(static_cast<size_t>(len));
  for (auto& t : p) t = static_cast<int32_t>(rng() % static_cast<unsigned>(vocab));
  return p;
}

struct DecodeResult {
  double tok_s = 0, step_s = 0;
  double host_s = 0;  // per step: the engine's time outside waiting for the device
};

constexpr int kDecodeWarmup = 3;

// Tokens each of `batch` sequences is given so that all of them decode together for the warm-up
// and `steps` timed steps: early sequences start decoding while later ones are still prefilled in
// chunks, and a few steps to spare.
int decode_tokens_needed(int batch, int prompt_len, int steps, int max_tokens_per_step) {
  const int prefill_steps = (batch * prompt_len + max_tokens_per_step - 1) / max_tokens_per_step;
  return kDecodeWarmup + steps + 6 + prefill_steps;
}

// `batch` prompts, prefilled, then `steps` timed decode steps with every sequence decoding.
// With `profile`, the timed steps run without graphs and their per-phase GPU times are kept there.
// Without `pipeline`, each step's tokens are collected before the next step is planned. `sampling`
// (greedy by default) is every request's: penalties, log probabilities.
hr::Result<DecodeResult> decode_rate(
    std::shared_ptr<CudaBackend> backend, int batch, int prompt_len, int steps,
    int max_tokens_per_step, std::mt19937& rng, json* profile = nullptr, bool pipeline = true,
    int context = 8192, const SamplingParams& sampling = SamplingParams{},
    std::shared_ptr<hr::grammar::CompiledGrammar> constraint = nullptr) {
  EngineOptions eo;
  eo.pipeline = pipeline;
  eo.scheduler.max_num_seqs = batch;
  eo.scheduler.max_batched_tokens = max_tokens_per_step;
  eo.scheduler.max_prefill_chunk = max_tokens_per_step;
  HR_ASSIGN_OR_RETURN(auto engine, Engine::create(backend, nullptr, context, eo));
  const int warmup = kDecodeWarmup;
  for (int i = 0; i < batch; ++i) {
    GenerationRequest r;
    r.prompt = random_prompt(rng, prompt_len, backend->vocab_size());
    r.params = sampling;
    r.params.max_tokens = decode_tokens_needed(batch, prompt_len, steps, max_tokens_per_step);
    // A constrained answer ends with its document, which must not close before the timed steps
    // are over (one ending early leaves no step with the whole batch decoding): the caller's
    // constraint is long enough for that, and the length budget must not cut it short.
    r.params.ignore_eos = constraint == nullptr;
    if (constraint) r.params.max_tokens = 8 * r.params.max_tokens + 2;
    r.constraint = constraint;
    HR_RETURN_IF_ERROR(engine->add(std::move(r)).status());
  }
  int decode_steps = 0, timed = 0;
  double elapsed = 0, host = 0;
  while (engine->has_work()) {
    auto t0 = Clock::now();
    HR_ASSIGN_OR_RETURN(StepStats st, engine->step());
    double dt = secs(t0);
    bool full_decode = st.num_prefill_tokens == 0 && st.num_decode_tokens == batch;
    if (!full_decode) continue;
    if (++decode_steps > warmup && timed < steps) {
      elapsed += dt;
      host += dt - st.wait_ns / 1e9;
      ++timed;
    }
    if (profile && decode_steps == warmup) backend->set_profiling(true);
    if (profile && timed == steps && backend->profiled_steps() > 0) {
      for (const auto& [phase, ms] : backend->profile()) {
        (*profile)[phase] = std::round(ms / backend->profiled_steps() * 1000) / 1000;
      }
      backend->set_profiling(false);
    }
  }
  if (timed == 0) return hr::internal_error("no full decode steps were measured");
  return DecodeResult{batch * timed / elapsed, elapsed / timed, host / timed};
}

// `count` prompts of `len` tokens, one output token each; prompt tokens per second.
hr::Result<double> prefill_rate(std::shared_ptr<CudaBackend> backend, int count, int len,
                                int max_tokens_per_step, std::mt19937& rng) {
  EngineOptions eo;
  eo.scheduler.max_num_seqs = count;
  eo.scheduler.max_batched_tokens = max_tokens_per_step;
  eo.scheduler.max_prefill_chunk = max_tokens_per_step;
  HR_ASSIGN_OR_RETURN(auto engine, Engine::create(backend, nullptr, 8192, eo));
  for (int i = 0; i < count; ++i) {
    GenerationRequest r;
    r.prompt = random_prompt(rng, len, backend->vocab_size());
    r.params.max_tokens = 1;
    r.params.ignore_eos = true;
    HR_RETURN_IF_ERROR(engine->add(std::move(r)).status());
  }
  auto t0 = Clock::now();
  while (engine->has_work()) HR_RETURN_IF_ERROR(engine->step().status());
  return static_cast<double>(count) * len / secs(t0);
}

// Small-batch matrix products at the model's shapes: our GEMV kernel and cuBLASLt, as the fraction
// of the copy bandwidth reached reading the weights (median of 30 runs; weight copies rotated, at
// least `rotate_bytes` of them, so that no run reads from L2).
json gemv_vs_cublaslt(const ModelConfig& c, double bw, size_t rotate_bytes) {
  auto gemm = CublasLtGemm::create(32ull << 20);
  if (!gemm.is_ok()) return json::object();
  const int D = c.hidden_size, F = c.intermediate_size;
  const int shapes[][2] = {
      {c.q_size() + 2 * c.kv_size(), D}, {D, c.q_size()}, {2 * F, D}, {D, F}, {c.vocab_size, D}};
  const char* names[] = {"qkv", "o", "gate_up", "down", "lm_head"};
  json out = json::object();
  size_t max_n = 0, max_k = 0;
  for (const auto& s : shapes) {
    max_n = std::max(max_n, static_cast<size_t>(s[0]));
    max_k = std::max(max_k, static_cast<size_t>(s[1]));
  }
  __nv_bfloat16* x = nullptr;
  float* y = nullptr;
  cudaMalloc(&x, 8 * max_k * 2);
  cudaMalloc(&y, 8 * max_n * 4);
  kernels::fill_uniform_bf16(x, 8 * max_k, 1.0f, 7, nullptr);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  for (int si = 0; si < 5; ++si) {
    const int n = shapes[si][0], k = shapes[si][1];
    const size_t bytes = static_cast<size_t>(n) * k * 2;
    const int copies = static_cast<int>(std::max<size_t>(1, rotate_bytes / bytes + 1));
    std::vector<__nv_bfloat16*> ws(static_cast<size_t>(copies));
    for (auto& w : ws) {
      cudaMalloc(&w, bytes);
      kernels::fill_uniform_bf16(w, bytes / 2, 0.02f, 11, nullptr);
    }
    for (int m : {1, 2, 4, 8}) {
      for (int impl = 0; impl < 2; ++impl) {
        std::vector<float> ms;
        for (int r = 0; r < 33; ++r) {
          __nv_bfloat16* w = ws[static_cast<size_t>(r % copies)];
          cudaEventRecord(e0);
          if (impl == 0) {
            kernels::GemvParams gp;
            gp.w = w;
            gp.m = m;
            gp.n = n;
            gp.k = k;
            gp.x = x;
            gp.y = y;
            kernels::gemv(gp, nullptr);
          } else {
            (void)(*gemm)->run(x, w, y, GemmOut::kF32, m, n, k, nullptr);
          }
          cudaEventRecord(e1);
          cudaEventSynchronize(e1);
          float t = 0;
          cudaEventElapsedTime(&t, e0, e1);
          if (r >= 3) ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        const double frac = bytes / (ms[ms.size() / 2] / 1e3) / bw;
        out[std::string(names[si]) + "_m" + std::to_string(m)][impl == 0 ? "gemv" : "cublaslt"] =
            std::round(frac * 1000) / 1000;
      }
    }
    for (auto* w : ws) cudaFree(w);
  }
  cudaFree(x);
  cudaFree(y);
  return out;
}

// For a profiler (scripts/gpu_check.sh's `profile` stage): the GEMV kernel once per decode shape
// at one and two rows, after one warm-up launch each; nothing timed here.
int gemv_profile_run(const ModelConfig& c) {
  const int D = c.hidden_size, F = c.intermediate_size;
  const int shapes[][2] = {
      {c.q_size() + 2 * c.kv_size(), D}, {D, c.q_size()}, {2 * F, D}, {D, F}, {c.vocab_size, D}};
  const char* names[] = {"qkv", "o", "gate_up", "down", "lm_head"};
  __nv_bfloat16 *x = nullptr, *w = nullptr;
  float* y = nullptr;
  size_t largest = 0, max_n = 0, max_k = 0;
  for (const auto& s : shapes) {
    largest = std::max(largest, static_cast<size_t>(s[0]) * s[1]);
    max_n = std::max(max_n, static_cast<size_t>(s[0]));
    max_k = std::max(max_k, static_cast<size_t>(s[1]));
  }
  if (cudaMalloc(&x, 2 * max_k * 2) != cudaSuccess || cudaMalloc(&w, largest * 2) != cudaSuccess ||
      cudaMalloc(&y, 2 * max_n * 4) != cudaSuccess) {
    std::fprintf(stderr, "gpu_bench: out of memory for the GEMV profile\n");
    return 1;
  }
  kernels::fill_uniform_bf16(x, 2 * max_k, 1.0f, 7, nullptr);
  kernels::fill_uniform_bf16(w, largest, 0.02f, 11, nullptr);
  for (int si = 0; si < 5; ++si) {
    for (int m : {1, 2}) {
      kernels::GemvParams gp;
      gp.w = w;
      gp.m = m;
      gp.n = shapes[si][0];
      gp.k = shapes[si][1];
      gp.x = x;
      gp.y = y;
      for (int rep = 0; rep < 2; ++rep) {
        if (kernels::gemv(gp, nullptr) != cudaSuccess || cudaDeviceSynchronize() != cudaSuccess) {
          std::fprintf(stderr, "gpu_bench: GEMV %s at m=%d failed\n", names[si], m);
          return 1;
        }
      }
      std::printf("gemv %s m=%d: n=%d k=%d\n", names[si], m, gp.n, gp.k);
    }
  }
  cudaFree(x);
  cudaFree(w);
  cudaFree(y);
  return 0;
}

std::vector<int> parse_list(const std::string& s) {
  std::vector<int> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) out.push_back(std::stoi(item));
  return out;
}

// The MoE section (--moe NAME): a mixture-of-experts model of a real shape with random bf16 weights
// (Qwen3-30B-A3B, or Mixtral-8x7B where it fits): decode tokens/s at `batches`, prefill tokens/s,
// the bytes a batch-1 decode token reads (attention, router, its top-k experts, LM head) over the
// step time against the copy bandwidth, where a batch-1 step's time goes, and how evenly the
// random router spreads a prefill's tokens. One JSON line, "moe": {...}.
int moe_run(const std::string& name, ModelConfig c, const std::string& batches, int prompt,
            int steps, int prefill_len, int prefill_count, int max_tokens, int max_seqs,
            size_t kv_cache_mb, size_t copy_mb, int layers, bool decode_only) {
  // The named shapes are the models' own config.json (the fields that set the shape), read by
  // the loader's parser; custom takes the other options' shape with every layer sparse.
  static const std::map<std::string, std::string> kShapes = {
      {"qwen3-30b-a3b",
       R"({"model_type": "qwen3_moe", "vocab_size": 151936, "hidden_size": 2048,
           "intermediate_size": 6144, "num_hidden_layers": 48, "num_attention_heads": 32,
           "num_key_value_heads": 4, "head_dim": 128, "rope_theta": 1000000.0,
           "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
           "norm_topk_prob": true, "decoder_sparse_step": 1, "mlp_only_layers": []})"},
      {"mixtral-8x7b",
       R"({"model_type": "mixtral", "vocab_size": 32000, "hidden_size": 4096,
           "intermediate_size": 14336, "num_hidden_layers": 32, "num_attention_heads": 32,
           "num_key_value_heads": 8, "rope_theta": 1000000.0, "num_local_experts": 8,
           "num_experts_per_tok": 2})"}};
  if (auto shape = kShapes.find(name); shape != kShapes.end()) {
    auto parsed = parse_model_config(shape->second);
    if (!parsed.is_ok()) {
      std::fprintf(stderr, "gpu_bench: %s\n", parsed.status().to_string().c_str());
      return 2;
    }
    c = std::move(parsed).value();
  } else if (name == "custom") {
    c.moe.sparse_layers.assign(static_cast<size_t>(c.num_layers), true);
  } else {
    std::fprintf(stderr, "gpu_bench: --moe takes qwen3-30b-a3b, mixtral-8x7b or custom\n");
    return 2;
  }
  if (layers > 0) c.num_layers = layers;
  if (c.moe.sparse_layers.size() > static_cast<size_t>(c.num_layers))
    c.moe.sparse_layers.resize(static_cast<size_t>(c.num_layers));
  c.max_position_embeddings = 8192;
  const double bw = copy_bandwidth(copy_mb << 20);
  json out = {{"model", name}, {"copy_bytes_per_s", bw}}, errors = json::object();
  auto emit = [&](bool complete) {
    out["errors"] = errors;
    out["complete"] = complete;
    std::printf("%s\n", json{{"moe", out}}.dump().c_str());
    std::fflush(stdout);
  };
  CudaBackendOptions o;
  o.max_num_tokens = max_tokens;
  o.max_num_seqs = max_seqs;
  o.kv_cache_bytes = kv_cache_mb << 20;
  auto made = CudaBackend::create_random(c, 4321, o);
  if (!made.is_ok()) {
    errors["model"] = made.status().to_string();
    std::fprintf(stderr, "gpu_bench: %s\n", made.status().to_string().c_str());
    emit(false);
    return 1;
  }
  std::shared_ptr<CudaBackend> backend = std::move(made).value();
  // A batch-1 decode token reads everything but the embedding table, less the experts it does
  // not use: top_k of num_experts in each MoE layer.
  const size_t expert_bytes = static_cast<size_t>(c.num_layers) * c.moe.num_experts * 3 *
                              c.moe.expert_intermediate_size * c.hidden_size * 2;
  const size_t active = backend->decode_weight_bytes() - expert_bytes +
                        expert_bytes / c.moe.num_experts * c.moe.top_k;
  out["weight_bytes"] = backend->weight_bytes();
  out["active_weight_bytes"] = active;
  out["kv_cache_bytes"] = backend->kv_cache_bytes();
  std::printf("moe %s: %.2f GB of weights, %.2f GB read per batch-1 token\n", name.c_str(),
              backend->weight_bytes() / 1e9, active / 1e9);
  {
    EngineOptions eo;
    eo.scheduler.max_num_seqs = max_seqs;
    eo.scheduler.max_batched_tokens = max_tokens;
    auto engine = Engine::create(backend, nullptr, 8192, eo);
    hr::Status warmed = engine.is_ok() ? (*engine)->warm_up() : engine.status();
    if (!warmed.is_ok()) errors["warm_up"] = warmed.to_string();
  }
  std::mt19937 rng(3);
  json decode = json::object(), step_ms = json::object();
  // Batch 1 with the small-step fusions off (the unfused layer: norms as kernels of their
  // own), first: a profile of this run then ends with the default steps.
  if (const auto bs = parse_list(batches); std::find(bs.begin(), bs.end(), 1) != bs.end()) {
    CudaBackendOptions changed = backend->options();
    const CudaBackendOptions before = changed;
    changed.fused_small_batch = false;
    backend->set_paths(changed);
    auto r = decode_rate(backend, 1, prompt, steps, max_tokens, rng);
    if (r.is_ok())
      out["decode_tok_s_batch1_unfused"] = std::round(r->tok_s * 10) / 10;
    else
      errors["decode batch 1 unfused"] = r.status().to_string();
    backend->set_paths(before);
  }
  for (int b : parse_list(batches)) {
    auto r = decode_rate(backend, b, prompt, steps, max_tokens, rng);
    if (!r.is_ok()) {
      errors["decode batch " + std::to_string(b)] = r.status().to_string();
      continue;
    }
    decode[std::to_string(b)] = std::round(r->tok_s * 10) / 10;
    step_ms[std::to_string(b)] = std::round(r->step_s * 1e5) / 100;
    if (b == 1) {
      out["batch1_active_mbu"] = active / r->step_s / bw;
      out["batch1_floor_tok_s"] = bw / active;
    }
    std::printf("moe decode batch %d: %.1f tok/s (%.2f ms/step)\n", b, r->tok_s, r->step_s * 1e3);
    out["decode_tok_s"] = decode;
    out["decode_step_ms"] = step_ms;
    emit(false);
  }
  if (decode_only) {
    emit(true);
    return errors.empty() ? 0 : 1;
  }
  // Batch 1 other ways: the experts' down product writing their rows for the next norm kernel
  // to add (moe_combine off) where by default it adds them into the residual itself; and the
  // fused steps' kernels launched with programmatic dependence (off by default in those).
  {
    using Tweak = void (*)(CudaBackendOptions&);
    const std::pair<const char*, Tweak> variants[] = {
        {"decode_tok_s_b1_moe_combine_off", [](CudaBackendOptions& o) { o.moe_combine = false; }},
        {"decode_tok_s_b1_programmatic_launch_on",
         [](CudaBackendOptions& o) { o.programmatic_launch = ProgrammaticLaunch::kOn; }},
    };
    for (const auto& [key, tweak] : variants) {
      CudaBackendOptions changed = backend->options();
      const CudaBackendOptions before = changed;
      tweak(changed);
      backend->set_paths(changed);
      auto rr = decode_rate(backend, 1, prompt, steps, max_tokens, rng);
      backend->set_paths(before);
      if (rr.is_ok()) {
        out[key] = std::round(rr->tok_s * 10) / 10;
        std::printf("moe %s: %.1f tok/s\n", key, rr->tok_s);
      } else {
        errors[key] = rr.status().to_string();
      }
    }
    emit(false);
  }
  // The experts' forms against each other where auto picks the grouped GEMM (and at 16): GEMVs,
  // the grouped GEMM, and the grouped GEMM of 64 x 64 warps.
  struct ExpertsForm {
    const char* key;
    MoeExperts how;
    MoeGemmWarps warps;
  };
  for (const ExpertsForm& form :
       {ExpertsForm{"decode_tok_s_experts_gemv", MoeExperts::kGemv, MoeGemmWarps::k32x32},
        ExpertsForm{"decode_tok_s_experts_grouped_gemm", MoeExperts::kGroupedGemm,
                    MoeGemmWarps::k32x32},
        ExpertsForm{"decode_tok_s_experts_grouped_gemm_64x64", MoeExperts::kGroupedGemm,
                    MoeGemmWarps::k64x64},
        ExpertsForm{"decode_tok_s_experts_grouped_gemm_warpgroup", MoeExperts::kGroupedGemm,
                    MoeGemmWarps::kWarpgroup}}) {
    const std::string key = form.key;
    CudaBackendOptions changed = backend->options();
    const CudaBackendOptions before = changed;
    changed.moe_experts = form.how;
    changed.moe_gemm_warps = form.warps;
    backend->set_paths(changed);
    json v = json::object();
    for (int b : parse_list(batches)) {
      if (b < 16) continue;
      auto rr = decode_rate(backend, b, prompt, steps, max_tokens, rng);
      if (!rr.is_ok()) {
        errors[key + " batch " + std::to_string(b)] = rr.status().to_string();
        continue;
      }
      v[std::to_string(b)] = std::round(rr->tok_s * 10) / 10;
    }
    out[key] = v;
    backend->set_paths(before);
  }
  emit(false);
  auto prefill = prefill_rate(backend, 1, prefill_len, max_tokens, rng);  // warm-up
  if (prefill.is_ok()) prefill = prefill_rate(backend, prefill_count, prefill_len, max_tokens, rng);
  // A prefill's milliseconds per step in each phase (kernels launched one by one), and the
  // experts' useful TFLOP/s: 2 x 3 products of dim x ffn for each of a token's top k in every
  // layer, over their time (the tiles' padding rows not counted).
  auto prefill_profile = [&](json* phases, double* experts_tflops) -> hr::Status {
    backend->set_profiling(true);
    auto profiled = prefill_rate(backend, prefill_count, prefill_len, max_tokens, rng);
    *phases = json::object();
    *experts_tflops = 0;
    const int steps = std::max(1, backend->profiled_steps());
    for (const auto& [phase, ms] : backend->profile()) {
      (*phases)[phase] = std::round(ms / steps * 1000) / 1000;
      if (phase == "moe_experts" && ms > 0) {
        const double flops = 6.0 * prefill_count * prefill_len * c.moe.top_k * c.hidden_size *
                             c.moe.expert_intermediate_size * c.num_layers;
        *experts_tflops = flops / (ms * 1e-3) / 1e12;
      }
    }
    backend->set_profiling(false);
    return profiled.status();
  };
  if (prefill.is_ok()) {
    out["prefill_tok_s"] = std::round(*prefill);
    std::printf("moe prefill: %.0f tok/s\n", *prefill);
    json phases;
    double tflops = 0;
    const hr::Status profiled = prefill_profile(&phases, &tflops);
    out["prefill_profile_ms_per_step"] = phases;
    out["prefill_experts_tflops"] = tflops;
    if (!profiled.is_ok()) errors["prefill profile"] = profiled.to_string();
    // The router's logits by the row kernel decode uses, against the tiled product (default).
    CudaBackendOptions rows = backend->options();
    const CudaBackendOptions tiles = rows;
    rows.moe_router_tiles = false;
    backend->set_paths(rows);
    auto by_rows = prefill_rate(backend, prefill_count, prefill_len, max_tokens, rng);
    backend->set_paths(tiles);
    if (by_rows.is_ok()) {
      out["prefill_tok_s_router_rows"] = std::round(*by_rows);
      std::printf("moe prefill, router logits by rows: %.0f tok/s\n", *by_rows);
    } else {
      errors["prefill, router by rows"] = by_rows.status().to_string();
    }
    // The grouped GEMM's other shapes, each with its own share of the step.
    for (const auto& [warps, name] : {std::pair{MoeGemmWarps::k64x64, "64x64"},
                                      std::pair{MoeGemmWarps::kWarpgroup, "warpgroup"}}) {
      CudaBackendOptions other = tiles;
      other.moe_gemm_warps = warps;
      backend->set_paths(other);
      auto rate = prefill_rate(backend, prefill_count, prefill_len, max_tokens, rng);
      json other_phases;
      double other_tflops = 0;
      const hr::Status other_profiled =
          rate.is_ok() ? prefill_profile(&other_phases, &other_tflops) : hr::Status::ok();
      backend->set_paths(tiles);
      const std::string key = std::string("gemm_warps_") + name;
      if (rate.is_ok() && other_profiled.is_ok()) {
        out["prefill_tok_s_" + key] = std::round(*rate);
        out["prefill_profile_ms_per_step_" + key] = other_phases;
        out["prefill_experts_tflops_" + key] = other_tflops;
        std::printf("moe prefill, grouped GEMM %s: %.0f tok/s\n", name, *rate);
      } else {
        errors["prefill, " + key] = (rate.is_ok() ? other_profiled : rate.status()).to_string();
      }
    }
  } else {
    errors["prefill"] = prefill.status().to_string();
  }
  emit(false);
  // Where a decode step's time goes at each batch size (kernels launched one by one).
  json profiles = json::object();
  for (int b : parse_list(batches)) {
    json prof = json::object();
    auto r = decode_rate(backend, b, prompt, 8, max_tokens, rng, &prof);
    if (r.is_ok())
      profiles[std::to_string(b)] = prof;
    else
      errors["decode profile batch " + std::to_string(b)] = r.status().to_string();
  }
  out["decode_profile_ms_per_step"] = profiles;
  // The router's spread over the experts for one prefill step: tokens per expert (max / mean).
  if (backend->set_routing_record(true).is_ok()) {
    auto spread = prefill_rate(backend, 1, std::min(prefill_len, max_tokens), max_tokens, rng);
    auto ids = backend->routing_record(0);
    if (spread.is_ok() && ids.is_ok() && !ids->empty()) {
      std::vector<int> load(static_cast<size_t>(c.moe.num_experts));
      for (int32_t e : *ids) ++load[static_cast<size_t>(e)];
      const double mean = static_cast<double>(ids->size()) / c.moe.num_experts;
      out["layer0_expert_load_max_over_mean"] = *std::max_element(load.begin(), load.end()) / mean;
    }
    (void)backend->set_routing_record(false);
  }
  emit(true);
  return errors.empty() ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  ModelConfig c;
  c.model_type = "llama";
  c.vocab_size = 128256;
  c.hidden_size = 4096;
  c.intermediate_size = 14336;
  c.num_layers = 32;
  c.num_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.max_position_embeddings = 8192;
  c.rope_theta = 500000.0;
  std::string batches = "1,16,64,256";
  int prompt = 512, steps = 32, prefill_len = 2048, prefill_count = 8, max_tokens = 8192;
  size_t copy_mb = 2048, rotate_mb = 400, kv_cache_mb = 0;  // KV: 0, 90% of what is left
  int max_seqs = 256;
  bool gemv_profile = false;
  std::string moe;
  int moe_layers = 0;  // --moe-layers: a named shape with fewer layers (a quick look, profiling)
  bool moe_decode_only = false;
  // The model's shape can be made smaller (a quick run of every phase, as on the CPU stand-in for
  // the CUDA runtime, simt/).
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--layers")
      c.num_layers = std::stoi(v);
    else if (k == "--hidden")
      c.hidden_size = std::stoi(v);
    else if (k == "--intermediate")
      c.intermediate_size = std::stoi(v);
    else if (k == "--heads")
      c.num_heads = std::stoi(v);
    else if (k == "--kv-heads")
      c.num_kv_heads = std::stoi(v);
    else if (k == "--head-dim")
      c.head_dim = std::stoi(v);
    else if (k == "--vocab")
      c.vocab_size = std::stoi(v);
    else if (k == "--copy-mb")
      copy_mb = std::stoul(v);
    else if (k == "--rotate-mb")
      rotate_mb = std::stoul(v);
    else if (k == "--kv-cache-mb")
      kv_cache_mb = std::stoul(v);
    else if (k == "--max-seqs")
      max_seqs = std::stoi(v);
    else if (k == "--batches")
      batches = v;
    else if (k == "--prompt")
      prompt = std::stoi(v);
    else if (k == "--steps")
      steps = std::stoi(v);
    else if (k == "--prefill-prompt")
      prefill_len = std::stoi(v);
    else if (k == "--prefill-count")
      prefill_count = std::stoi(v);
    else if (k == "--max-batched-tokens")
      max_tokens = std::stoi(v);
    else if (k == "--gemv-profile")
      gemv_profile = v == "1";
    else if (k == "--moe")
      moe = v;
    else if (k == "--moe-layers")
      moe_layers = std::stoi(v);
    else if (k == "--moe-decode-only")
      moe_decode_only = v == "1";
    else if (k == "--experts")
      c.moe.num_experts = std::stoi(v);
    else if (k == "--top-k")
      c.moe.top_k = std::stoi(v);
    else if (k == "--expert-intermediate")
      c.moe.expert_intermediate_size = std::stoi(v);
    else {
      std::fprintf(stderr, "unknown option %s\n", k.c_str());
      return 2;
    }
  }
  std::setvbuf(stdout, nullptr, _IOLBF, 0);  // each line out at once, into a pipe too
  if (gemv_profile) return gemv_profile_run(c);
  if (!moe.empty()) {
    return moe_run(moe, c, batches, prompt, steps, prefill_len, prefill_count, max_tokens, max_seqs,
                   kv_cache_mb, copy_mb, moe_layers, moe_decode_only);
  }
  const double bw = copy_bandwidth(copy_mb << 20);
  const json gemv_bw = gemv_vs_cublaslt(c, bw, rotate_mb << 20);
  std::printf("weight-read bandwidth fraction, gemv vs cuBLASLt: %s\n", gemv_bw.dump().c_str());
  // The figures so far go out as one JSON line after each phase, so that a run stopped early
  // (a deadline, a failure) still leaves its last complete line; a failed run is recorded under
  // "errors" and the others go on.
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  json out = {{"device", prop.name}, {"copy_bytes_per_s", bw}, {"weight_read_fraction", gemv_bw}};
  json errors = json::object();
  auto emit = [&](bool complete) {
    // The best batch-1 utilisation over the default and the variants that report one.
    std::string best = "default";
    double best_mbu = out.value("batch1_mbu", 0.0);
    json best_options = out.value("cuda_options", json());
    for (const auto& [key, v] : out.items()) {
      if (key.rfind("decode_tok_s_", 0) == 0 && v.is_object() && v.contains("batch1_mbu") &&
          v["batch1_mbu"].get<double>() > best_mbu) {
        best = key.substr(std::string("decode_tok_s_").size());
        best_mbu = v["batch1_mbu"].get<double>();
        best_options = v.value("cuda_options", json());
      }
    }
    out["best_batch1_mbu"] = {{"setting", best},
                              {"mbu", std::round(best_mbu * 1e4) / 1e4},
                              {"cuda_options", best_options}};
    out["errors"] = errors;
    out["complete"] = complete;
    std::printf("%s\n", out.dump().c_str());
    std::fflush(stdout);
  };
  CudaBackendOptions o;
  o.max_num_tokens = max_tokens;
  o.max_num_seqs = max_seqs;
  o.kv_cache_bytes = kv_cache_mb << 20;
  auto t_load = Clock::now();
  auto made = CudaBackend::create_random(c, 1234, o);
  if (!made.is_ok()) {
    std::fprintf(stderr, "gpu_bench: %s\n", made.status().to_string().c_str());
    errors["model"] = made.status().to_string();
    emit(false);
    return 1;
  }
  std::shared_ptr<CudaBackend> backend = std::move(made).value();
  out["cuda_options"] = describe_cuda_backend_options(backend->options());  // the defaults
  std::printf(
      "model: %d layers, %.2f GB of weights, made in %.1f s; KV cache %.2f GB (%d blocks)\n",
      c.num_layers, backend->weight_bytes() / 1e9, secs(t_load), backend->kv_cache_bytes() / 1e9,
      backend->num_kv_blocks());
  out["weight_bytes"] = backend->weight_bytes();
  out["decode_weight_bytes"] = backend->decode_weight_bytes();
  out["kv_cache_bytes"] = backend->kv_cache_bytes();
  out["kv_cache_tokens"] = static_cast<long>(backend->num_kv_blocks()) * backend->block_size();
  out["free_for_kv_after_load_bytes"] = backend->free_before_kv_bytes();
  out["free_after_kv_bytes"] = backend->free_memory_bytes();
  // Every decode graph the engines below replay, captured up front (as a worker does at start).
  // Should that fail, the runs go on without graphs, and say so.
  {
    EngineOptions eo;
    eo.scheduler.max_num_seqs = o.max_num_seqs;
    eo.scheduler.max_batched_tokens = max_tokens;
    auto engine = Engine::create(backend, nullptr, 8192, eo);
    auto t_warm = Clock::now();
    hr::Status warmed = engine.is_ok() ? (*engine)->warm_up() : engine.status();
    if (warmed.is_ok()) {
      out["graph_warm_up_s"] = std::round(secs(t_warm) * 100) / 100;
      std::printf("decode graphs: %zu captured in %.2f s\n", backend->num_graphs(), secs(t_warm));
    } else {
      std::fprintf(stderr, "gpu_bench: warm-up: %s\n", warmed.to_string().c_str());
      errors["warm_up"] = warmed.to_string();
      CudaBackendOptions without = backend->options();
      without.cuda_graphs = false;
      backend->set_paths(without);
      out["graphs"] = "off: the warm-up failed";
    }
  }
  const size_t graphs_after_warm_up = backend->num_graphs();
  out["graphs_after_warm_up"] = graphs_after_warm_up;
  std::mt19937 rng(99);
  json decode = json::object(), step_ms = json::object(), host_ms = json::object();
  double batch1_step = 0;
  for (int b : parse_list(batches)) {
    auto r = decode_rate(backend, b, prompt, steps, max_tokens, rng);
    if (!r.is_ok()) {
      errors["decode batch " + std::to_string(b)] = r.status().to_string();
      std::fprintf(stderr, "gpu_bench: batch %d: %s\n", b, r.status().to_string().c_str());
      continue;
    }
    decode[std::to_string(b)] = std::round(r->tok_s * 10) / 10;
    step_ms[std::to_string(b)] = std::round(r->step_s * 1e5) / 100;
    host_ms[std::to_string(b)] = std::round(r->host_s * 1e5) / 100;
    if (b == 1) batch1_step = r->step_s;
    std::printf("decode batch %d: %.1f tok/s (%.2f ms/step, %.3f ms of it host work)\n", b,
                r->tok_s, r->step_s * 1e3, r->host_s * 1e3);
  }
  out["decode_tok_s"] = decode;
  out["decode_step_ms"] = step_ms;
  out["decode_host_ms_per_step"] = host_ms;
  out["batch1_mbu"] = batch1_step > 0 ? backend->decode_weight_bytes() / batch1_step / bw : 0.0;
  out["graphs_captured_while_decoding"] =
      static_cast<long>(backend->num_graphs()) - static_cast<long>(graphs_after_warm_up);
  emit(false);
  // Decode tokens/s at the batch sizes `wanted` picks, as {"batch": tok/s}; a failed run is
  // recorded under errors as `key` and its batch.
  auto rates = [&](const std::string& key, const std::string& label,
                   const std::function<bool(int)>& wanted, bool pipeline = true, int context = 8192,
                   const SamplingParams& sampling = SamplingParams{}) {
    json v = json::object();
    for (int b : parse_list(batches)) {
      if (!wanted(b)) continue;
      auto r = decode_rate(backend, b, prompt, steps, max_tokens, rng, nullptr, pipeline, context,
                           sampling);
      if (!r.is_ok()) {
        errors[key + " batch " + std::to_string(b)] = r.status().to_string();
        std::fprintf(stderr, "gpu_bench: batch %d, %s: %s\n", b, label.c_str(),
                     r.status().to_string().c_str());
        continue;
      }
      v[std::to_string(b)] = std::round(r->tok_s * 10) / 10;
      std::printf("decode batch %d, %s: %.1f tok/s (%.2f ms/step, %.3f ms of it host work)\n", b,
                  label.c_str(), r->tok_s, r->step_s * 1e3, r->host_s * 1e3);
    }
    return v;
  };
  // The settings every decode run below starts from: the backend's defaults, less graphs where
  // their warm-up failed.
  const CudaBackendOptions defaults = backend->options();
  using Change = std::function<void(CudaBackendOptions&)>;
  // Under the defaults as `change` leaves them, at the batch sizes up to `max_batch`, stored as
  // decode_tok_s_`key` with the batch-1 bandwidth utilisation (where batch 1 ran) and the setting's
  // --cuda-options; the defaults are back in place afterwards.
  auto variant = [&](const std::string& key, const std::string& label, int max_batch,
                     const Change& change, bool pipeline = true, int context = 8192) {
    CudaBackendOptions changed = defaults;
    change(changed);
    backend->set_paths(changed);
    json v = rates(
        key, label, [&](int b) { return b <= max_batch; }, pipeline, context);
    if (v.contains("1"))
      v["batch1_mbu"] = backend->decode_weight_bytes() * v["1"].get<double>() / bw;
    v["cuda_options"] = describe_cuda_backend_options(backend->options());  // serve --cuda-options
    out["decode_tok_s_" + key] = v;
    backend->set_paths(defaults);
  };
  // First the settings that may change batch-1 utilisation (one and two tokens per step, cheap).
  // By default a fused layer is five kernels: RoPE and the KV write ride in the q/k/v GEMV, and
  // decode splits are merged by the attention kernel's last split. Each undone, and both (seven).
  variant("separate_rope", "RoPE in its own kernel", 2, [](auto& o) { o.fused_rope = false; });
  variant("combine_kernel", "splits merged by a combine kernel", 16,
          [](auto& o) { o.fused_combine = false; });
  variant("more_kernels", "RoPE and the split merge in kernels of their own", 2, [](auto& o) {
    o.fused_rope = false;
    o.fused_combine = false;
  });
  // Each GEMV pulling the start of the next one's weights into L2 as it finishes: 4, 8, 16 MiB.
  for (int mb : {4, 8, 16}) {
    variant("prefetch_" + std::to_string(mb) + "mb",
            std::to_string(mb) + " MiB of the next weights prefetched", 2,
            [mb](auto& o) { o.prefetch_weights_mb = mb; });
  }
  // Programmatic dependent launch always on, and always off (by default it is off for the fused
  // one- and two-token steps only).
  variant("programmatic_launch_on", "programmatic launch on", 16,
          [](auto& o) { o.programmatic_launch = ProgrammaticLaunch::kOn; });
  variant("programmatic_launch_off", "programmatic launch off", 16,
          [](auto& o) { o.programmatic_launch = ProgrammaticLaunch::kOff; });
  // Without the fused small-batch path (separate norm and SiLU kernels), and with cuBLASLt in
  // place of the GEMV kernel.
  variant("unfused_small_batch", "without the fused small-batch path", 2,
          [](auto& o) { o.fused_small_batch = false; });
  variant("cublaslt_only", "cuBLASLt only", 8, [](auto& o) { o.small_batch_gemv = false; });
  emit(false);
  // Prefill, with where its time goes (per-phase GPU milliseconds per step, kernels launched one
  // by one).
  json prefill_profile = json::object();
  auto pre = prefill_rate(backend, 1, prefill_len, max_tokens, rng);  // warm-up
  if (pre.is_ok()) pre = prefill_rate(backend, prefill_count, prefill_len, max_tokens, rng);
  if (pre.is_ok()) {
    out["prefill_tok_s"] = std::round(*pre * 10) / 10;
    std::printf("prefill: %.0f tok/s\n", *pre);
    backend->set_profiling(true);
    auto profiled = prefill_rate(backend, prefill_count, prefill_len, max_tokens, rng);
    for (const auto& [phase, ms] : backend->profile()) {
      prefill_profile[phase] =
          std::round(ms / std::max(1, backend->profiled_steps()) * 1000) / 1000;
    }
    backend->set_profiling(false);
    if (!profiled.is_ok()) errors["prefill profile"] = profiled.status().to_string();
  } else {
    errors["prefill"] = pre.status().to_string();
    std::fprintf(stderr, "gpu_bench: prefill: %s\n", pre.status().to_string().c_str());
  }
  out["prefill_profile_ms_per_step"] = prefill_profile;
  emit(false);
  // Then the settings that matter at every batch size.
  // Decode attention on the prefill kernel's 128-row tiles, and on the CUDA-core decode kernel,
  // instead of the tensor-core decode kernel (16-row tiles, keys shared out among warps).
  variant("prefill_tiles_decode_attention", "decode attention in prefill tiles", 1 << 30,
          [](auto& o) { o.decode_attention = DecodeAttention::kPrefillTiles; });
  variant("cuda_core_attention", "CUDA-core decode attention", 1 << 30,
          [](auto& o) { o.decode_attention = DecodeAttention::kCudaCore; });
  // Without graph replay.
  variant("without_graphs", "without graphs", 16, [](auto& o) { o.cuda_graphs = false; });
  // Host and device in turn: each step's tokens collected before the next step is planned.
  variant(
      "not_pipelined", "steps not pipelined", 1 << 30, [](auto&) {}, /*pipeline=*/false);
  // A context as long as Llama 3.1's (the engine allows 8,193-block tables instead of 513): steps
  // pack and copy only the columns their sequences use, so this should match decode_tok_s.
  variant(
      "131k_context", "131,072-token context", 1 << 30, [](auto&) {}, true, 131072);
  emit(false);
  // What sampling costs beyond greedy, with the default kernels: every request drawing at random
  // with top-p or top-k (a threshold search: a pass over the row's logits per probe, 4 to 20 on
  // normally distributed logits), with all three penalties (repetition over its 512-token prompt:
  // a list of its distinct tokens per row per step), or with 20 alternatives' log probabilities
  // (a search for the 20th, then one pass to gather and rank).
  json extras = json::object();
  SamplingParams top_p;
  top_p.temperature = 0.8f;
  top_p.top_p = 0.95f;
  top_p.seed = 1;
  SamplingParams top_k = top_p;
  top_k.top_p = 1.0f;
  top_k.top_k = 50;
  SamplingParams penalized;
  penalized.penalties = {0.5f, 0.5f, 1.1f};
  SamplingParams top20;
  top20.logprobs = 20;
  for (const auto& [name, params] :
       {std::pair{"temperature_0.8_top_p_0.95", top_p},
        std::pair{"temperature_0.8_top_k_50", top_k}, std::pair{"penalties", penalized},
        std::pair{"top_logprobs_20", top20}}) {
    extras[name] = rates(
        name, name, [](int b) { return b == 1 || b == 256; }, true, 8192, params);
  }
  out["sampling_extras_tok_s"] = extras;
  emit(false);
  // Structured output at batch 1 and 64: every answer constrained to a long JSON string (a mask
  // over the whole vocabulary each step, computed on the host and applied by the sampling kernel;
  // the engine collects each step before planning the next), against the same sampling free. The
  // vocabulary is synthetic (the 256 bytes and random printable strings of 2 to 8 bytes, one stop
  // token): the model's weights are random too.
  {
    std::mt19937 vrng(5);
    std::vector<std::string> bytes;
    for (int b = 0; b < 256; ++b) bytes.push_back(std::string(1, static_cast<char>(b)));
    while (static_cast<int>(bytes.size()) < c.vocab_size) {
      std::string t(2 + vrng() % 7, ' ');
      for (char& ch : t) ch = static_cast<char>(32 + vrng() % 95);
      bytes.push_back(t);
    }
    const int32_t stop = c.vocab_size - 255;
    std::vector<bool> usable(bytes.size(), true);
    usable[static_cast<size_t>(stop)] = false;
    auto vocab = std::make_shared<hr::grammar::Vocabulary>(
        bytes, usable, std::vector<int32_t>{stop}, c.vocab_size);
    SamplingParams sampled;
    sampled.temperature = 0.8f;
    sampled.top_k = 50;
    sampled.seed = 1;
    json structured = json::object();
    for (int b : {1, std::min(64, max_seqs)}) {
      // A JSON string of at least 8 characters per token the timed steps need (a token writes at
      // most 8 bytes): no answer can end before they are over.
      const int min_chars = 8 * decode_tokens_needed(b, prompt, steps, 8192);
      auto nfa = hr::grammar::compile_json_schema(
          nlohmann::ordered_json::parse(R"({"type": "string", "minLength": )" +
                                        std::to_string(min_chars) + "}"),
          "schema");
      auto compiled = std::make_shared<hr::grammar::CompiledGrammar>(nfa.value(), vocab);
      // Each character position of the string is a state of its own: their masks are computed
      // before the timed run, as a long-running service's cache holds the masks of the schemas it
      // sees (the cost of a first visit is the grammar benchmark's, scripts/bench_structured.sh).
      {
        std::vector<uint32_t> mask(static_cast<size_t>(vocab->mask_words()));
        int32_t state = compiled->advance(compiled->start(), '"');
        for (int k = 0; k <= min_chars && state >= 0; ++k) {
          compiled->fill_mask(state, hr::grammar::kNoLimit, mask.data());
          state = compiled->advance(state, 'a');
        }
      }
      auto free_rate =
          decode_rate(backend, b, prompt, steps, max_tokens, rng, nullptr, true, 8192, sampled);
      auto json_rate = decode_rate(backend, b, prompt, steps, max_tokens, rng, nullptr, true, 8192,
                                   sampled, compiled);
      if (!free_rate.is_ok() || !json_rate.is_ok()) {
        errors["structured batch " + std::to_string(b)] =
            (free_rate.is_ok() ? json_rate.status() : free_rate.status()).to_string();
        continue;
      }
      structured["batch" + std::to_string(b)] = {
          {"free_tok_s", free_rate->tok_s},
          {"constrained_tok_s", json_rate->tok_s},
          {"constrained_over_free", json_rate->tok_s / free_rate->tok_s}};
    }
    out["structured_output"] = structured;
  }
  emit(false);
  // Where decode time goes: per-phase GPU milliseconds per step (kernels launched one by one).
  json decode_profile = json::object();
  for (int b : parse_list(batches)) {
    if (b != 1 && b != 256) continue;
    json prof = json::object();
    auto r = decode_rate(backend, b, prompt, 8, max_tokens, rng, &prof);
    if (!r.is_ok()) {
      errors["decode profile batch " + std::to_string(b)] = r.status().to_string();
      continue;
    }
    decode_profile[std::to_string(b)] = prof;
  }
  out["decode_profile_ms_per_step"] = decode_profile;
  emit(true);
  return errors.empty() ? 0 : 1;
}
