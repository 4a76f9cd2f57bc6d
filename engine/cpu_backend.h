// The CPU backend: the reference implementation every GPU kernel is checked against. fp32
// throughout; every product runs our panel kernels (cpu_gemm.h) on weights packed for them, split
// over a small fork-join pool that also runs attention and elementwise work. The paged KV cache is
// one host allocation per layer for K and for V. A mixture-of-experts layer routes in fp32
// (moe_routing.h), then runs each chosen expert once for all of the step's tokens routed to it,
// and adds each token's weighted outputs in expert order. forward() is called by one thread at a
// time.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine/backend.h"
#include "engine/communicator.h"
#include "engine/host_sampled_backend.h"
#include "engine/stage_balance.h"
#include "engine/thread_pool.h"
#include "engine/weights.h"

namespace hr::engine {

struct CpuBackendOptions {
  int block_size = 16;
  size_t kv_cache_bytes = 64ull << 20;
  int num_threads = 0;  // 0: one per core
  int thread_nice = 0;  // nice value of the pool's threads (base/priority.h)
  // submit() still computes the step before it returns, but the backend says it is pipelined, so
  // that the engine plans each step before collecting the previous one (and feeds tokens through
  // StepInput::fed_rows) exactly as it does on a GPU: the CPU tests of that path.
  bool pipelined = false;
  // KV blocks; 0: as many as kv_cache_bytes holds (a parallel engine gives its ranks one count).
  int num_kv_blocks = 0;
  // The stage's tensor-parallel group, for weights that are one rank's shard with tp > 1
  // (weight_shard.h): the o and down projections' partial sums are all-reduced through it, and
  // the LM head's slices of the logits gathered.
  Communicator* tensor_parallel = nullptr;
};

class CpuBackend final : public HostSampledBackend {
 public:
  // Uses packed weights as they are (pack_for_cpu below); packs a private copy of unpacked ones.
  [[nodiscard]] static Result<std::unique_ptr<CpuBackend>> create(
      std::shared_ptr<const ModelWeights> weights, CpuBackendOptions options);

  const char* name() const override { return "cpu"; }
  int vocab_size() const override { return weights_->config.vocab_size; }
  int block_size() const override { return options_.block_size; }
  int num_kv_blocks() const override { return num_blocks_; }
  size_t weight_bytes() const override { return weights_->num_bytes(); }
  size_t kv_cache_bytes() const override;
  [[nodiscard]] Status forward(const StepInput& in, float* logits) override {
    return forward_part(in, nullptr, logits);
  }
  // The step through the layers these weights hold (ModelWeights::shard): from the token ids on
  // the first pipeline stage, else from hidden [num_tokens, D] (the previous stage's output);
  // then on the last stage the logits (all of them, gathered from the tensor-parallel ranks),
  // else the layers' output to hidden.
  [[nodiscard]] Status forward_part(const StepInput& in, float* hidden, float* logits);
  bool pipelined() const override { return options_.pipelined; }
  // Called after each MoE layer's routing with the step's choices ([num_tokens, top_k] experts and
  // weights, valid during the call): for tests.
  using RoutingObserver =
      std::function<void(int layer, int num_tokens, const int32_t* experts, const float* weights)>;
  void set_routing_observer(RoutingObserver f) { routing_observer_ = std::move(f); }
  // Where forward_part's time went since time_parts(true), in seconds of wall time: each held
  // layer's (a tensor-parallel rank's waits in its all-reduces included), the embedding's (first
  // stage) and the final norm and LM head's (last stage). Off unless asked for; read between
  // steps: the parallel backend balances its pipeline stages by it.
  const StageCosts& part_times() const { return part_times_; }
  // Clears the part times and starts (or stops) timing the steps that follow.
  void time_parts(bool on);

 private:
  CpuBackend(std::shared_ptr<const ModelWeights> weights, CpuBackendOptions options,
             int num_blocks);
  // y[m, n] = x[m, k] · w[n, k]^T (+ y when accumulate), w packed (cpu_gemm.h).
  void matmul(const float* x, const float* w, float* y, int m, int n, int k, bool accumulate);
  // y[T, D] = x · w^T added to the residual x_: directly with one rank, through an all-reduce of
  // the ranks' partial products with several.
  [[nodiscard]] Status row_parallel(const float* x, const float* w, int T, int k);
  // Adds out_ [T, D] (each rank's partial sums) to x_ once all-reduced.
  [[nodiscard]] Status add_reduced(int T);
  // The model's layer `layer` (local index `li`): its experts on the normalised rows h_ [T, D],
  // their weighted sum added to x_.
  [[nodiscard]] Status moe(const LayerWeights& L, int layer, int T);
  // The last stage's logits rows: the final norm, the LM head (this rank's vocabulary, gathered).
  [[nodiscard]] Status lm_head(const StepInput& in, float* logits);

  std::shared_ptr<const ModelWeights> weights_;
  WeightShard shard_;
  CpuBackendOptions options_;
  int num_blocks_;
  ThreadPool pool_;
  std::vector<float> rope_inv_freq_;  // [head_dim / 2]
  std::vector<std::vector<float>>
      k_cache_;  // per layer: [num_blocks, block_size, kv_heads, head_dim]
  std::vector<std::vector<float>> v_cache_;  // same
  // Activation scratch, grown to the largest step seen.
  std::vector<float> x_, h_, qkv_, attn_, gu_, act_, final_;
  // Partial sums before the all-reduce, and the LM head's slices ([L, ceil(V / tp)] per rank).
  std::vector<float> out_, local_logits_, gathered_logits_;
  // MoE scratch: router logits [T, E], choices [T, top_k], the rows routed to one expert, and
  // each (token, choice)'s expert output [T, top_k, D].
  std::vector<float> router_logits_, route_weights_, expert_in_, expert_gu_, expert_act_,
      expert_out_;
  std::vector<int32_t> route_ids_;
  std::vector<std::vector<int32_t>> routed_;
  RoutingObserver routing_observer_;
  StageCosts part_times_;
  bool time_parts_ = false;
};

// Packs the matrices in place for the CPU backend (ModelWeights::cpu_packed), one at a time (the
// memory it adds is one matrix at a time). Packed weights serve only the CPU backend.
void pack_for_cpu(ModelWeights* w);

// Reference ops shared with the kernel tests.
void rms_norm(const float* x, const float* w, int n, float eps, float* out);
void apply_rope(float* vec, int head_dim, int position, const float* inv_freq);
// One query head's causal attention over positions [0, pos] of a paged cache whose slots hold
// kv_size floats ([slots, kv_heads, head_dim]); `scores` is scratch. Writes head_dim outputs.
void attend(const float* q, const float* k_cache, const float* v_cache,
            const int32_t* block_table_row, int block_size, int kv_size, int kv_head, int head_dim,
            int pos, float scale, std::vector<float>& scores, float* out);
// SwiGLU's activation for one row: out[i] = silu(gate_up[i]) * gate_up[ffn + i].
void silu_mul(const float* gate_up, int ffn, float* out);

}  // namespace hr::engine
