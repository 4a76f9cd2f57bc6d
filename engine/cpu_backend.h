// The CPU backend: the reference implementation every GPU kernel is checked against. fp32
// throughout; every product runs our panel kernels (cpu_gemm.h) on weights packed for them, split
// over a small fork-join pool that also runs attention and elementwise work. The paged KV cache is
// one host allocation per layer for K and for V. A mixture-of-experts layer routes in fp32
// (moe_routing.h), then runs each chosen expert once for all of the step's tokens routed to it,
// and adds each token's weighted outputs in expert order. forward() is called by one thread at a
// time.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <vector>

#include "engine/backend.h"
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
};

class CpuBackend final : public Backend {
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
  [[nodiscard]] Status forward(const StepInput& in, float* logits) override;
  // Samples on the host: apply_penalties, then sample_token(logits, vocab, spec) (and
  // token_logprobs where asked).
  [[nodiscard]] Status submit(const StepInput& in, const SampleSpec* specs) override;
  [[nodiscard]] Status collect(int32_t* tokens, TokenLogprobs* logprobs) override;
  void discard() override { outstanding_.clear(); }
  bool pipelined() const override { return options_.pipelined; }
  // Called after each MoE layer's routing with the step's choices ([num_tokens, top_k] experts and
  // weights, valid during the call): for tests.
  using RoutingObserver =
      std::function<void(int layer, int num_tokens, const int32_t* experts, const float* weights)>;
  void set_routing_observer(RoutingObserver f) { routing_observer_ = std::move(f); }

 private:
  CpuBackend(std::shared_ptr<const ModelWeights> weights, CpuBackendOptions options,
             int num_blocks);
  // y[m, n] = x[m, k] · w[n, k]^T (+ y when accumulate), w packed (cpu_gemm.h).
  void matmul(const float* x, const float* w, float* y, int m, int n, int k, bool accumulate);
  // Layer `li`'s experts on the normalised rows h_ [T, D], their weighted sum added to x_.
  void moe(const LayerWeights& L, int li, int T);

  std::shared_ptr<const ModelWeights> weights_;
  CpuBackendOptions options_;
  int num_blocks_;
  ThreadPool pool_;
  std::vector<float> rope_inv_freq_;  // [head_dim / 2]
  std::vector<std::vector<float>>
      k_cache_;  // per layer: [num_blocks, block_size, kv_heads, head_dim]
  std::vector<std::vector<float>> v_cache_;  // same
  // Activation scratch, grown to the largest step seen.
  std::vector<float> x_, h_, qkv_, attn_, gu_, act_, final_;
  // MoE scratch: router logits [T, E], choices [T, top_k], the rows routed to one expert, and
  // each (token, choice)'s expert output [T, top_k, D].
  std::vector<float> router_logits_, route_weights_, expert_in_, expert_gu_, expert_act_,
      expert_out_;
  std::vector<int32_t> route_ids_;
  std::vector<std::vector<int32_t>> routed_;
  RoutingObserver routing_observer_;
  // submit(): logits, fed token ids, the last submitted step's tokens, and the uncollected steps.
  std::vector<float> logits_;
  std::vector<int32_t> fed_ids_;
  std::vector<int32_t> last_tokens_;
  // A submitted step's tokens, and their log probabilities where asked for (-1 in `asked`: not).
  struct Sampled {
    std::vector<int32_t> tokens;
    std::vector<TokenLogprobs> logprobs;
    std::vector<int> asked;
  };
  std::deque<Sampled> outstanding_;
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
