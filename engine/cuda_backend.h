// The CUDA backend: bf16 weights and paged KV cache in GPU memory, fp32 residual stream and
// accumulation, cuBLASLt GEMMs, and our kernels (kernels/) for the embedding gather, fused
// residual-add + RMSNorm, RoPE + KV write, paged attention (tiled prefill, split-K decode),
// SiLU-and-multiply and sampling. Each step's host inputs travel in one pinned buffer and one copy;
// with submit() only token ids come back. Pipelined: submit() returns once the step is queued, and
// two staging slots let step N+1 be packed while step N runs (its fed tokens read on the device).
// One stream; calls from one thread at a time.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine/attention_plan.h"
#include "engine/backend.h"
#include "engine/cuda_gemm.h"
#include "engine/device_communicator.h"
#include "engine/rank_threads.h"
#include "engine/stage_balance.h"
#include "engine/weights.h"
#include "kernels/gemv.cuh"
#include "kernels/moe.cuh"
#include "kernels/sampling.cuh"

namespace hr::engine {

// When kernels launch with programmatic dependent launch (kernels/launch.cuh). On an H100, on
// slows the fused one- and two-token steps by ~2%; at 16 tokens on and kAuto are even and off is
// ~2% slower (docs/gpu-performance.md).
enum class ProgrammaticLaunch { kAuto, kOn, kOff };  // kAuto: on except for fused small steps

// How a MoE layer's experts run (kernels/moe.cuh): kAuto takes GEMVs for steps of up to 16 tokens
// (8 where the grouped GEMM is on warpgroups) and the grouped GEMM above.
enum class MoeExperts { kAuto, kGemv, kGroupedGemm };
// The grouped GEMM's warp tiles (kernels/moe.cuh, MoeKernel): 32 rows x 32 columns, eight warps a
// block; or all 64 rows x 64 weight columns, four a block; or a warpgroup a tile with Hopper's
// wgmma (refused on other GPUs). kAuto: the warpgroup where the device runs it (a Hopper GPU and
// a build with sm_90a code), else 32x32. On an H200, Qwen3-30B-A3B's 8,192-token prefill steps
// ran 12% faster on warpgroups than with 32x32 warps, and its decode 17-22% faster at batch
// 64 and 256 (64x64: within 1% of 32x32; docs/gpu-performance.md).
enum class MoeGemmWarps { kAuto, k32x32, k64x64, kWarpgroup };

// One GPU a rank (engine/parallel_cuda_backend.h): the ranks' collectives and hand-offs over
// NCCL, or over peer pointers (engine/peer_communicator.h: our kernels, the layer boundary one
// launch; every device must reach every other's memory).
enum class RankCollectives { kNccl, kPeer };

struct CudaBackendOptions {
  int device = 0;
  int block_size = 16;
  size_t kv_cache_bytes = 0;       // 0: kv_cache_fraction of the memory left after weights
  double kv_cache_fraction = 0.9;  // of free device memory once weights and buffers are in place
  int max_num_tokens = 8192;       // tokens per step (activation buffers are sized for it)
  int max_num_seqs = 256;          // sequences per step
  bool cuda_graphs = true;         // replay captured graphs for decode steps
  bool small_batch_gemv = true;    // our GEMV kernel for steps of up to 2 tokens, else cuBLASLt
  DecodeAttention decode_attention = DecodeAttention::kTensorCore;  // decoding tokens' attention
  bool fused_small_batch = true;  // decode steps of 1-2 tokens: norms and SiLU folded into GEMVs
  bool fused_rope = true;         // ... and RoPE with the KV write folded into the q/k/v GEMV
  bool fused_combine = true;      // split decodes merged by their last split, not a combine kernel
  // A tensor-parallel rank's layer boundaries (its o and down products' partial sums, the
  // residual add and the next norm) as one launch, where its communicator has it
  // (DeviceCommunicator::fuses_layer_boundary: virtual ranks); else the all-reduce and the add
  // and norm apart.
  bool fused_all_reduce = true;
  RankCollectives rank_collectives = RankCollectives::kNccl;
  // Pipeline stages (engine/parallel_cuda_backend.h): a step of at least micro_batch_tokens
  // tokens a part is cut into this many micro-batches (0: one per stage with a GPU a rank, none
  // on virtual ranks), so that while stage s runs one, stage s - 1 runs the next; smaller steps
  // go whole (a part re-reads the stage's weights, which only pays once its products are bound by
  // arithmetic, not memory).
  int micro_batches = 0;
  int micro_batch_tokens = 128;
  // Pipeline stages: steps of disjoint sequences in flight at once (Backend::step_groups), so
  // that with a GPU a stage every stage has a step to run, whatever the batch; 0: one per stage
  // with a GPU a rank unless micro_batches is given, else 1 (virtual ranks, whose stages take
  // turns on one stream). With more than one, steps go whole (not cut into micro-batches), and a
  // rank keeps staging slots for that many whole steps (two at least).
  int step_groups = 0;
  // The parts a step may be submitted in (submit_part): staging slots for that many per step.
  int max_step_parts = 1;
  ProgrammaticLaunch programmatic_launch = ProgrammaticLaunch::kAuto;
  // Fused small-batch steps: each GEMV's last wave, as it finishes, pulls the first this-many MiB
  // of the next GEMV's weights into L2, so that memory stays busy across kernel boundaries (0:
  // off).
  int prefetch_weights_mb = 0;
  MoeExperts moe_experts = MoeExperts::kAuto;
  MoeGemmWarps moe_gemm_warps = MoeGemmWarps::kAuto;
  // Steps of kMoeTiledRouteTokens tokens or more (long prefill) take the router's logits as a
  // tiled product (kernels/moe.cuh, MoeRouteParams::tiled); off: the row kernel smaller steps use.
  bool moe_router_tiles = true;
  // Fused small steps: a MoE layer's down product adds its k rows per token into the residual
  // stream (kernels/moe.cuh, MoeExpertsParams::resid_out), so that the next layer's input norm
  // folds into its q/k/v product; off: the rows go to the norm kernel, which adds them.
  bool moe_combine = true;
  // A tensor-parallel rank (engine/parallel_cuda_backend.h), built from a shard of the weights
  // (weight_shard.h): the ranks' collectives (all-reduces of the o and down products' partial
  // sums and of the experts' outputs, the LM head's vocabulary slices gathered); with virtual
  // ranks on one device, the turns their threads take and the stream they share (not owned).
  // The fused small-batch path, which adds products into the residual stream as they are made,
  // is not taken by a rank. Null for a backend that holds the whole model.
  DeviceCommunicator* tensor_parallel = nullptr;
  RankThreads* turns = nullptr;
  cudaStream_t stream = nullptr;
};

class CudaBackend final : public Backend {
 public:
  // Uploads `weights` (converted to bf16): the whole model, or a rank's shard (weight_shard.h;
  // options.tensor_parallel set when it has tensor-parallel peers). A pipeline stage's shard
  // holds its layers only, the embedding on the first stage and the final norm and LM head on the
  // last: a later stage's step starts from the residual stream the stage before left
  // (stage_hidden()), an earlier stage's step ends there, and only the last stage samples (its
  // tokens handed back to the first for fed rows: sampled_tokens()). Errors name the option at
  // fault or the CUDA call.
  [[nodiscard]] static Result<std::unique_ptr<CudaBackend>> create(const ModelWeights& weights,
                                                                   CudaBackendOptions options);
  // Uploads the Hugging Face folder's safetensors weights straight to the device as bf16 (norms
  // and biases fp32), without an fp32 copy on the host. Errors name the tensor or option.
  [[nodiscard]] static Result<std::unique_ptr<CudaBackend>> create_from_dir(
      const std::string& dir, CudaBackendOptions options);
  // A model of `config`'s shape with uniform random bf16 weights made on the GPU (benchmarks).
  [[nodiscard]] static Result<std::unique_ptr<CudaBackend>> create_random(
      const ModelConfig& config, uint64_t seed, CudaBackendOptions options);
  ~CudaBackend() override;

  const char* name() const override { return "cuda"; }
  int vocab_size() const override { return config_.vocab_size; }
  int block_size() const override { return options_.block_size; }
  int num_kv_blocks() const override { return num_blocks_; }
  size_t weight_bytes() const override { return weight_bytes_; }
  // Weight bytes one decode token reads: everything but the embedding table (one row of it is
  // gathered), unless the table is also the LM head.
  size_t decode_weight_bytes() const {
    const size_t table = static_cast<size_t>(config_.vocab_size) * config_.hidden_size * 2;
    return config_.tie_word_embeddings ? weight_bytes_ : weight_bytes_ - table;
  }
  size_t kv_cache_bytes() const override;
  [[nodiscard]] Status forward(const StepInput& in, float* logits) override;
  [[nodiscard]] Status submit(const StepInput& in, const SampleSpec* specs) override;
  [[nodiscard]] Status collect(int32_t* tokens, TokenLogprobs* logprobs) override;
  void discard() override;
  bool pipelined() const override { return true; }
  // The split step (structured output's overlap): the forward pass queued (a decode step as a
  // graph without sampling), then the sampling kernel with the specs' parameters and masks
  // copied after it.
  bool splits_sampling() const override { return true; }
  [[nodiscard]] Status submit_forward(const StepInput& in) override;
  [[nodiscard]] Status submit_sampling(const SampleSpec* specs) override;
  // A step cut into micro-batches (engine/micro_batches.h) for pipeline stages: part `index` of
  // `count` (at most options.max_step_parts), submitted in order, each outstanding on its own
  // (collect() gives each part's tokens) in staging slots of its own. The last stage samples each
  // part apart and places its tokens at `first_logit` of the step's; the step's fed rows read the
  // whole step before's tokens, which the last part then replaces (sampled_tokens(), what a
  // later step's fed rows read). `step_logits`: the whole step's logits rows.
  struct StepPart {
    int index = 0, count = 1;
    int first_logit = 0, step_logits = 0;
  };
  [[nodiscard]] Status submit_part(const StepInput& part, const SampleSpec* specs,
                                   const StepPart& where);
  // Captures the decode graphs of every graph batch size (both staging slots) for block tables up
  // to `max_blocks_per_seq` wide, so that none is captured while serving. A step's narrower tables
  // are copied into the graphs' pitch, its columns alone.
  [[nodiscard]] Status warm_up(int max_blocks_per_seq) override;
  // Decode steps replay graphs captured for these batch sizes, padded up to the next one: 1, 2, 4,
  // then multiples of 8 up to 256 and of 16 beyond (capped at max_num_seqs and max_num_tokens).
  int graph_batch_size(int batch) const;
  size_t num_graphs() const { return graphs_.size(); }
  const ModelConfig& config() const { return config_; }  // a stage's: its layers only
  const WeightShard& shard() const { return shard_; }
  // A pipeline stage's hand-offs (engine/parallel_cuda_backend.h), device buffers on stream():
  // the residual stream, [rows, hidden] fp32, which a step of a later stage starts from and a
  // step of an earlier stage leaves after its last layer; and the [rows] tokens the last stage
  // sampled, which the first stage's fed rows read.
  float* stage_hidden() { return x_; }
  int32_t* sampled_tokens() { return tokens_; }
  cudaStream_t stream() const { return stream_; }
  // The rows a step enqueues: its tokens and logits rows, a decode step's padded to the batch
  // size of its graph.
  struct StepRows {
    int tokens = 0, logits = 0;
  };
  StepRows step_rows(const StepInput& in) const;
  // Whether a step would be taken (the checks a submit makes before it enqueues anything).
  [[nodiscard]] Status check_input(const StepInput& in) const { return check_bounds(in, -1); }
  // For benchmarks: every path of `o` (graphs, GEMV, fused steps, decode attention, programmatic
  // launch, prefetch), effective from the next step; captured graphs are dropped. What was sized
  // and allocated at creation stays.
  void set_paths(CudaBackendOptions o) {
    o.device = options_.device;
    o.block_size = options_.block_size;
    o.kv_cache_bytes = options_.kv_cache_bytes;
    o.kv_cache_fraction = options_.kv_cache_fraction;
    o.max_num_tokens = options_.max_num_tokens;
    o.max_num_seqs = options_.max_num_seqs;
    o.max_step_parts = options_.max_step_parts;  // (the slots are sized for it)
    o.micro_batches = options_.micro_batches;
    o.micro_batch_tokens = options_.micro_batch_tokens;
    o.step_groups = options_.step_groups;  // (so are the whole steps' slots)
    options_ = o;
    clear_graphs();
  }
  // MoE models: each step's expert choices per MoE layer, kept on the device while recording is
  // on (tests and benchmarks: where the GPU's routing left the CPU's, and how evenly the experts
  // are loaded). routing_record(layer) waits for the stream and returns the last step's
  // [tokens, top_k] choices of that layer.
  [[nodiscard]] Status set_routing_record(bool on);
  [[nodiscard]] Result<std::vector<int32_t>> routing_record(int layer);
  // Per-phase GPU time (ms summed over the steps run since profiling was turned on; graphs are
  // not used meanwhile), for benchmarks.
  void set_profiling(bool on);
  const std::map<std::string, double>& profile() const { return profile_; }
  // Where the steps' GPU time went since time_parts(true), in seconds: each held layer's (a
  // tensor-parallel rank's collectives included), the embedding's and what follows the last layer
  // (the final norm, LM head and sampling; a stage's last add). Graphs are not used meanwhile;
  // read between steps: the parallel backend balances its pipeline stages by it.
  const StageCosts& part_times() const { return part_times_; }
  // Clears the part times and starts (or stops) timing the steps that follow (and profiling).
  void time_parts(bool on);
  int profiled_steps() const { return profiled_steps_; }
  const CudaBackendOptions& options() const { return options_; }
  // Device memory free once weights and buffers were in place (what the KV cache was cut from),
  // and free after the KV cache too.
  size_t free_before_kv_bytes() const { return free_before_kv_; }
  // The step's buffers allocated at start (activations, logits, routing, partials; not the KV
  // cache, the weights or cuBLASLt's workspace): what engine/memory_plan.h plans.
  size_t buffer_bytes() const { return buffer_bytes_; }
  size_t free_memory_bytes() const { return free_after_init_; }

 private:
  struct Layer {
    __nv_bfloat16* wqkv = nullptr;       // [Q + 2 KV, D]
    float* bqkv = nullptr;               // [Q + 2 KV] or null
    __nv_bfloat16* wo = nullptr;         // [D, Q]
    __nv_bfloat16* w_gate_up = nullptr;  // [2 F, D]
    __nv_bfloat16* w_down = nullptr;     // [D, F]
    float* input_norm = nullptr;         // [D]
    float* post_norm = nullptr;          // [D]
    float* q_norm = nullptr;             // [head_dim] (qk_norm models)
    float* k_norm = nullptr;             // [head_dim]
    // MoE layers (F: the experts' intermediate size):
    float* router = nullptr;                   // [E, D] fp32
    __nv_bfloat16* experts_gate_up = nullptr;  // [E, 2 F, D]
    __nv_bfloat16* experts_down = nullptr;     // [E, D, F]
  };
  struct StepLayout;  // offsets of one step's inputs in the staging buffers
  // One step's packed inputs (a pinned host buffer and its device copy, grown on demand), the host
  // copy of its sampled tokens, and an event recorded after that copy.
  struct Slot {
    char* host = nullptr;
    char* dev = nullptr;
    size_t bytes = 0;
    // The step's penalty and logit-bias lists (sampling.cuh), apart: rows point at them, graphs
    // do not.
    char* list_host = nullptr;
    char* list_dev = nullptr;
    size_t list_bytes = 0;
    int32_t* host_tokens = nullptr;                   // pinned [max_num_seqs]
    kernels::TokenLogprobs* host_logprobs = nullptr;  // pinned [max_num_seqs]
    // A part's slot (submit_part) on the last stage: its sampled tokens on the device [S] (a
    // whole step's are tokens_).
    int32_t* tokens = nullptr;
    std::vector<int> asked;  // the step's rows' SampleSpec::logprobs; empty when none asked
    cudaEvent_t done = nullptr;
    int num_logits = 0;
  };

  CudaBackend(const ModelConfig& config, CudaBackendOptions options);
  // A pipeline stage's model: its layers alone (layer i is the model's first_layer + i), its
  // head apart from the embedding.
  static ModelConfig stage_config(const ModelConfig& c, const WeightShard& s);
  [[nodiscard]] Status check_options() const;
  [[nodiscard]] Status open_device();
  [[nodiscard]] Status allocate_weights();
  [[nodiscard]] Status upload(void* dst, const std::vector<float>& src, bool bf16);
  // The device matrix or vector that a checkpoint tensor's slot lives in.
  void* slot_data(WeightSlot slot, int layer) const;
  [[nodiscard]] Status fill_random(uint64_t seed);
  [[nodiscard]] Status init_runtime();
  [[nodiscard]] Status alloc(void** p, size_t bytes, const char* what);
  // The slot the next whole step packs into: the first after the last whole step's, in turn,
  // that no outstanding or forwarded step holds.
  int free_slot() const;
  // Whole steps outstanding (in the first whole_slots_ slots).
  size_t whole_steps_outstanding() const {
    return static_cast<size_t>(std::count_if(outstanding_.begin(), outstanding_.end(),
                                             [&](int slot) { return slot < whole_slots_; }));
  }
  // A whole step may be submitted (else an error saying so).
  [[nodiscard]] Status check_whole_slot_free() const;
  // Validates the step, packs its inputs into `slot`, and enqueues the whole forward pass up to
  // the logits (and the sampled tokens when `specs` is given): replaying a captured graph for
  // decode steps.
  [[nodiscard]] Status enqueue(const StepInput& in, const SampleSpec* specs, int slot,
                               StepLayout* layout = nullptr);
  // After a step is enqueued into `slot`: its tokens' (and asked log probabilities') copy to the
  // host, the slot's event, and the step outstanding.
  [[nodiscard]] Status finish_submit(int slot, int num_logits, const SampleSpec* specs);
  // Packs the sampling parameters of `num_logits` rows into the slot's staging buffers at
  // lay.sample_params (lists and masks into its list buffers, copied at once).
  [[nodiscard]] Status pack_sampling(const SampleSpec* specs, int num_logits,
                                     const int32_t* logits_rows, Slot& slot, const StepLayout& lay);
  // The step's sizes against the options, and check_step (engine/backend.h).
  [[nodiscard]] Status check_bounds(const StepInput& in, int real_seqs) const;
  // Validation, attention planning, and the packed inputs' copy to the device. Sequences from
  // `real_seqs` on are padding (graph_batch_size), which alone may use the scratch block.
  [[nodiscard]] Status prepare(const StepInput& in, const SampleSpec* specs, bool graph_shape,
                               int slot, int real_seqs, StepLayout* lay);
  // A uniform decode step of `in.num_seqs` real sequences padded with `pad` more, each decoding
  // token 0 at position 0 into the scratch block, greedily; the result points into pad_*.
  StepInput pad_decode_step(const StepInput& in, const SampleSpec* specs, int pad,
                            const SampleSpec** padded_specs);
  // Replaces the slot's buffers with ones of `bytes` (after the stream is idle; drops the graphs).
  [[nodiscard]] Status grow_slot(Slot& slot, size_t bytes);
  // Room for `bytes` of sampling lists in the slot (after the steps queued before finish).
  [[nodiscard]] Status grow_lists(Slot& slot, size_t bytes);
  // Frees a pinned host buffer and its device twin and allocates both at `bytes`, once the steps
  // queued before have finished; *size is 0 until both allocations succeed.
  [[nodiscard]] Status regrow(char** host, char** dev, size_t* size, size_t bytes,
                              const char* what);
  // Replays the decode graph of the prepared step's shape, capturing it first if needed.
  [[nodiscard]] Status launch_graph(const StepLayout& lay, int slot, bool sample);
  // Ends the stream's capture and instantiates what it recorded, unless recording failed
  // (`recorded`, returned then).
  [[nodiscard]] Result<cudaGraphExec_t> end_capture(Status recorded);
  // launch_graph for virtual ranks taking turns on one stream (options_.turns).
  [[nodiscard]] Status launch_shared_graph(const StepLayout& lay, int slot, bool sample,
                                           const std::tuple<int, bool, int, int>& key);
  // The device pitch of a graph step's block tables `cols` wide: the warmed-up width, so that one
  // graph per batch size serves every step, or past it the next power of two.
  int graph_table_width(int cols) const;
  // Every kernel of the step, reading the packed inputs of `slot` (capturable: no host
  // synchronisation); the sampled tokens to tokens_, or to a part's slot's own.
  [[nodiscard]] Status launch_step(const StepLayout& lay, int slot, bool sample);
  int32_t* sampled_into(int slot) {
    int32_t* own = slots_[static_cast<size_t>(slot)].tokens;
    return own ? own : tokens_;
  }
  // A CUDA call's error as a Status naming `op` and the device.
  [[nodiscard]] Status check_cuda(const char* op, cudaError_t e) const;
  // Whether an m x k product runs as the GEMV kernel (else cuBLASLt).
  bool gemv_product(int m, int k) const;
  // Chooses the cuBLASLt algorithms a step of T tokens and L logits rows uses (before a capture).
  [[nodiscard]] Status plan_gemms(int T, int L);
  // y = x · w^T: the GEMV kernel for few rows, cuBLASLt otherwise.
  [[nodiscard]] Status matmul(const __nv_bfloat16* x, const __nv_bfloat16* w, void* y, GemmOut out,
                              int m, int n, int k);
  // GEMVs with the input RMS-normalised from the residual stream's sums of squares (optionally
  // writing SwiGLU's activation), and with a residual update as output (see kernels/gemv.cuh).
  // `next`: what the GEMV pulls into L2 for the kernels after it (GemvParams::prefetch).
  using Ahead = std::array<kernels::GemvPrefetch, 2>;
  [[nodiscard]] Status gemv_normed(const float* resid, const float* sumsq, const float* norm_weight,
                                   float eps, const __nv_bfloat16* w, void* y, bool y_bf16, int m,
                                   int n, int k, bool swiglu = false, const Ahead& next = {});
  [[nodiscard]] Status gemv_residual(const __nv_bfloat16* x, const __nv_bfloat16* w,
                                     const float* resid_in, float* resid_out, float* sumsq, int m,
                                     int n, int k, const Ahead& next = {});
  // The first prefetch_weights_mb MiB of matrix w [rows, k] (half of it from the start of each
  // half when `halves`: SwiGLU's gate and up rows are read from both starts at once); none when
  // prefetching is off.
  Ahead ahead(const __nv_bfloat16* w, int rows, int k, bool halves = false) const;
  // Every sequence decodes one token and is sampled.
  static bool uniform_decode(const StepInput& in);
  // True for steps a graph can replay (uniform decodes).
  bool graph_step(const StepInput& in) const;
  void clear_graphs();
  // Profiling: records an event closing `phase` (a no-op unless profiling).
  void mark(const char* phase);
  void collect_marks();

  // A rank's shard: the LM head rows it holds, padded to the even share the gather moves.
  int head_rows() const;
  // All-reduces a rank's partial sums (nothing for the whole model).
  [[nodiscard]] Status reduce_partials(float* data, size_t n);
  // The LM head's logits slices of every rank, side by side in logits_ (a rank's step).
  [[nodiscard]] Status gather_logits(int num_logits);

  ModelConfig config_;  // a rank's: its heads, KV heads and MLP rows (rank_config)
  CudaBackendOptions options_;
  WeightShard shard_;
  cudaStream_t stream_ = nullptr;
  bool owns_stream_ = true;
  std::unique_ptr<CublasLtGemm> gemm_;
  std::vector<void*> allocations_;
  size_t weight_bytes_ = 0;
  size_t buffer_bytes_ = 0;
  size_t free_before_kv_ = 0;
  size_t free_after_init_ = 0;
  int num_sms_ = 0;
  bool warpgroup_gemm_ = false;  // the device runs the warpgroup grouped GEMM (moe_gemm_warps=auto)
  // The fused small-batch GEMVs (and their prefetch ranges) need hidden, query and MLP sizes that
  // are multiples of 8; other models take the unfused path.
  bool fused_shapes_ = false;
  int num_blocks_ = 0;  // KV blocks the engine may use; one more, the scratch block, is padding's
  int max_partials_ = 0;

  __nv_bfloat16* embed_ = nullptr;    // [V, D]
  __nv_bfloat16* lm_head_ = nullptr;  // [V, D] (embed_ when tied)
  float* final_norm_ = nullptr;       // [D]
  float* inv_freq_ = nullptr;         // [head_dim / 2]
  std::vector<Layer> layers_;
  std::vector<__nv_bfloat16*> k_cache_,
      v_cache_;  // per layer: [num_blocks * block_size, KV_heads, hd]

  // Activations, sized for max_num_tokens (T) and max_num_seqs (S) rows.
  float* x_ = nullptr;      // [T, D] residual stream
  float* x2_ = nullptr;     // [kGemvMaxFusedRows, D] its other half in the fused path
  float* sumsq_ = nullptr;  // [2 layers, kGemvMaxFusedRows] residual rows' sums of squares, then
  int32_t* head_counters_ = nullptr;  // [heads + kv heads] the fused q/k/v GEMV's (GemvRope)
  size_t sumsq_bytes_ = 0;
  float* delta_ = nullptr;            // [T, D] o_proj / down_proj output
  __nv_bfloat16* h_ = nullptr;        // [T, D] normalised
  float* qkv_ = nullptr;              // [T, Q + 2 KV]
  __nv_bfloat16* q_ = nullptr;        // [T, Q] rotated queries
  __nv_bfloat16* attn_ = nullptr;     // [T, Q]
  __nv_bfloat16* gate_up_ = nullptr;  // [T, 2 F]
  __nv_bfloat16* act_ = nullptr;      // [T, F]
  __nv_bfloat16* final_ = nullptr;    // [S, D]
  float* logits_ = nullptr;           // [S, V]
  float* head_logits_ = nullptr;      // a rank's [S, head_rows()]
  float* gathered_logits_ = nullptr;  // a rank's [tp, S, head_rows()]
  int32_t* tokens_ = nullptr;         // [S]
  int32_t* input_ids_ = nullptr;      // [T]: each token row's input token as the embedding read it
  kernels::TokenLogprobs* logprobs_ = nullptr;  // [S]
  float* partial_out_ = nullptr;                // [max_partials, num_heads, head_dim]
  float* partial_ml_ = nullptr;                 // [max_partials, num_heads, 2]
  int32_t* combine_counters_ = nullptr;  // [max_partials / 2, num_kv_heads], zero between launches
  // MoE layers' step buffers, sized for max_num_tokens (kernels/moe.cuh).
  struct MoeBuffers {
    float* logits = nullptr;      // [T, E] router logits
    int32_t* topk_ids = nullptr;  // [T, top_k]
    float* topk_weights = nullptr;
    kernels::MoeLayout layout;
    int32_t* route_counter = nullptr;  // [1] zero between launches (moe_route's last block)
    __nv_bfloat16* act = nullptr;      // [capacity, expert F]
    float* out = nullptr;  // [T, top_k, D]: the next residual add sums each token's rows
  } moe_;
  // Layer li's routing from the residual rows `resid` (normalised in fp32 by the post-attention
  // norm), and its experts on the normalised rows h_: written here into `normed_out` when given,
  // else already there. Its outputs go to moe_.out.
  // With `add.out` set (a fused step's), the experts' down product writes the residual update
  // add.out = add.in + the k rows (MoeExpertsParams::resid_out) rather than moe_.out's rows.
  struct MoeResidual {
    const float* in = nullptr;
    float* out = nullptr;
    float* sumsq = nullptr;
  };
  [[nodiscard]] Status moe_layer(const Layer& W, int li, int T, const float* resid,
                                 __nv_bfloat16* normed_out, const MoeResidual& add);
  int32_t* routing_record_ = nullptr;  // [layers, max_num_tokens, top_k], once asked for
  bool recording_routing_ = false;
  int routing_record_tokens_ = 0;  // the last step's

  // Whole steps' slots, so that step N+1 is packed while step N reads its own inputs (two, or
  // options_.step_groups); then the parts' (submit_part): max_step_parts for each of two steps.
  int whole_slots_ = 2;
  std::vector<Slot> slots_;
  int whole_slot_ = 1;              // the slot of the last whole step
  int part_half_ = 1;               // the parts' half of their slots the last step took
  int part_prev_logits_ = 0;        // while a step's parts go in: the step before's logits rows
  int32_t* part_tokens_ = nullptr;  // the last stage's [S]: a step's parts' tokens, placed
  // A padded decode step's inputs.
  std::vector<int32_t> pad_ids_, pad_positions_, pad_seq_start_, pad_table_, pad_rows_, pad_fed_;
  std::vector<SampleSpec> pad_specs_;
  std::deque<int> outstanding_;  // slots of submitted, uncollected steps, oldest first
  // A step whose forward pass is queued and whose sampling is not (submit_forward).
  struct Forwarded {
    bool pending = false;
    int slot = 0;
    int num_logits = 0;
    size_t sample_params = 0;  // the layout's offset
    std::vector<int32_t> logits_rows;
  } forwarded_;
  int prev_num_logits_ = 0;   // rows of the last submitted step (what fed_rows may name)
  AttentionPlan plan_;        // reused each step
  int warm_table_width_ = 0;  // the widest block tables warm_up() captured graphs for
  // Decode graphs by (batch size, sampled on device, block-table pitch, slot); with virtual
  // ranks, the last rank's hold every rank's step and the others' are null.
  using GraphKey = std::tuple<int, bool, int, int>;
  std::map<GraphKey, cudaGraphExec_t> graphs_;
  bool profiling_ = false;
  std::vector<cudaEvent_t> mark_events_;
  std::vector<std::string> mark_names_;
  size_t num_marks_ = 0;
  std::map<std::string, double> profile_;
  int profiled_steps_ = 0;
  bool timing_parts_ = false;
  StageCosts part_times_;
};

}  // namespace hr::engine
