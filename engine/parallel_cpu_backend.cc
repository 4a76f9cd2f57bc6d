// Ranks as threads: sharding at creation, micro-batches, and the stages' hand-offs.
#include "engine/parallel_cpu_backend.h"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "engine/host_sampled_backend.h"
#include "engine/safetensors.h"
#include "engine/stage_calibration.h"

namespace hr::engine {

namespace {

Status check_options(const ParallelCpuOptions& options) {
  if (options.block_size < 1) return invalid_argument("block size must be positive", "block-size");
  if (options.num_threads < 0 || options.num_threads > 256) {
    return invalid_argument("thread count must be 0 (one per core) to 256", "threads");
  }
  if (options.step_groups < 0 || options.step_groups > 64) {
    return invalid_argument("step groups must be 0 (one per stage) to 64", "step-groups");
  }
  if (options.micro_batches < 0 || options.micro_batches > 64) {
    return invalid_argument("micro-batches must be 0 (one per stage) to 64", "micro-batches");
  }
  if (options.balance_batch < 1 || options.balance_batch > 1024) {
    return invalid_argument("the balancing's batch must be 1 to 1024 sequences", "balance-batch");
  }
  if (options.balance_context < 1 || options.balance_context > 65536) {
    return invalid_argument("the balancing's context must be 1 to 65536 tokens", "balance-context");
  }
  if (!(options.balance_prompt_ratio >= 0 && options.balance_prompt_ratio <= 1000)) {
    return invalid_argument("the balancing's prompt tokens per output token must be 0 to 1000",
                            "balance-prompt-ratio");
  }
  return Status::ok();
}

// Whether create() balances the stages it assembled.
bool balances(const ParallelCpuOptions& options) {
  return options.balance_stages && options.degrees.pp > 1 && options.degrees.stage_layers.empty();
}

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

Result<std::unique_ptr<ParallelCpuBackend>> ParallelCpuBackend::create(const ModelWeights& full,
                                                                       ParallelCpuOptions options) {
  const ParallelDegrees d = options.degrees;
  HR_RETURN_IF_ERROR(check_degrees(full.config, d));
  HR_RETURN_IF_ERROR(check_options(options));
  if (full.cpu_packed) return invalid_argument("the parallel CPU backend takes unpacked weights");
  std::vector<ModelWeights> shards;
  for (int stage = 0; stage < d.pp; ++stage) {
    for (int t = 0; t < d.tp; ++t) {
      HR_ASSIGN_OR_RETURN(ModelWeights shard, shard_weights(full, d, stage, t));
      shards.push_back(std::move(shard));
    }
  }
  HR_ASSIGN_OR_RETURN(auto b, assemble(std::move(shards), options));
  if (balances(options)) return balance(std::move(b));
  return b;
}

Result<std::unique_ptr<ParallelCpuBackend>> ParallelCpuBackend::create_from_dir(
    const std::string& dir, ParallelCpuOptions options, LoadStats* stats) {
  HR_ASSIGN_OR_RETURN(ModelConfig config, load_model_config(dir));
  const ParallelDegrees d = options.degrees;
  HR_RETURN_IF_ERROR(check_degrees(config, d));
  HR_RETURN_IF_ERROR(check_options(options));
  HR_ASSIGN_OR_RETURN(auto st, SafetensorsModel::open_dir(dir));
  const int world = d.tp * d.pp;
  std::vector<ModelWeights> shards(static_cast<size_t>(world));
  std::vector<Status> status(static_cast<size_t>(world));
  const auto t0 = std::chrono::steady_clock::now();
  {
    // Every rank reads and packs its own shard at once (on a multi-socket or many-core host the
    // reads and conversions run side by side, as a GPU deployment's ranks load in parallel).
    std::vector<std::thread> loaders;
    for (int i = 0; i < world; ++i) {
      loaders.emplace_back([&, i] {
        auto shard = load_shard(*st, config, d, i / d.tp, i % d.tp);
        if (!shard.is_ok()) {
          status[static_cast<size_t>(i)] = shard.status();
          return;
        }
        shards[static_cast<size_t>(i)] = std::move(shard).value();
        pack_for_cpu(&shards[static_cast<size_t>(i)]);
      });
    }
    for (auto& t : loaders) t.join();
  }
  for (const Status& e : status) HR_RETURN_IF_ERROR(e);
  if (stats) {
    stats->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats->checkpoint_bytes = 0;
    for (const auto& [name, t] : st->tensors()) stats->checkpoint_bytes += t.num_bytes;
    stats->shard_bytes = 0;
    for (const ModelWeights& w : shards) stats->shard_bytes += w.num_bytes();
  }
  HR_ASSIGN_OR_RETURN(auto b, assemble(std::move(shards), options));
  if (balances(options)) return balance(std::move(b));
  return b;
}

Result<std::unique_ptr<ParallelCpuBackend>> ParallelCpuBackend::assemble(
    std::vector<ModelWeights> shards, ParallelCpuOptions options) {
  const ModelConfig& c = shards[0].config;
  const ParallelDegrees d = options.degrees;
  size_t per_block = 0;  // one block's K and V over every rank's layers and KV heads
  for (const ModelWeights& shard : shards) {
    const WeightShard s = shard.shard();
    per_block +=
        2ull * s.num_layers * options.block_size * s.num_kv_heads * c.head_dim * sizeof(float);
  }
  const int num_blocks = static_cast<int>(options.kv_cache_bytes / per_block);
  if (num_blocks < 1) {
    return invalid_argument("KV cache budget of " + std::to_string(options.kv_cache_bytes) +
                                " bytes holds no block (one takes " + std::to_string(per_block) +
                                " over all ranks)",
                            "kv-cache-bytes");
  }
  std::unique_ptr<ParallelCpuBackend> b(
      new ParallelCpuBackend(options, c.vocab_size, c.hidden_size, num_blocks));
  for (int stage = 0; stage < d.pp; ++stage) {
    b->tp_groups_.push_back(ThreadCommunicator::create_group(d.tp));
  }
  for (int t = 0; t < d.tp; ++t) b->pp_groups_.push_back(ThreadCommunicator::create_group(d.pp));
  const int world = d.tp * d.pp;
  const int cores = options.num_threads > 0
                        ? options.num_threads
                        : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  for (int i = 0; i < world; ++i) {
    auto rank = std::make_unique<Rank>();
    rank->stage = i / d.tp;
    rank->tp_rank = i % d.tp;
    rank->pipeline =
        b->pp_groups_[static_cast<size_t>(rank->tp_rank)][static_cast<size_t>(rank->stage)].get();
    rank->weights = std::make_shared<ModelWeights>(std::move(shards[static_cast<size_t>(i)]));
    pack_for_cpu(rank->weights.get());  // in place (a no-op when the loader packed it)
    CpuBackendOptions o;
    o.block_size = options.block_size;
    o.num_threads = std::max(1, cores / world);
    o.thread_nice = options.thread_nice;
    o.num_kv_blocks = num_blocks;
    o.tensor_parallel =
        b->tp_groups_[static_cast<size_t>(rank->stage)][static_cast<size_t>(rank->tp_rank)].get();
    HR_ASSIGN_OR_RETURN(rank->backend, CpuBackend::create(rank->weights, o));
    b->ranks_.push_back(std::move(rank));
  }
  for (auto& rank : b->ranks_) {
    Rank* r = rank.get();
    r->thread = std::thread([self = b.get(), r] { self->rank_loop(r); });
  }
  return b;
}

ParallelCpuBackend::ParallelCpuBackend(ParallelCpuOptions options, int vocab_size, int hidden_size,
                                       int num_blocks)
    : options_(options),
      vocab_size_(vocab_size),
      hidden_size_(hidden_size),
      num_blocks_(num_blocks),
      groups_(step_groups_for(options.step_groups, options.degrees.pp)) {}

ParallelCpuBackend::~ParallelCpuBackend() { stop_ranks(); }

void ParallelCpuBackend::stop_ranks() {
  discard();  // every rank through the queued steps first: none waits for a peer that stopped
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  start_cv_.notify_all();
  for (auto& r : ranks_) {
    if (r->thread.joinable()) r->thread.join();
  }
}

std::vector<ModelWeights> ParallelCpuBackend::take_shards() {
  stop_ranks();
  std::vector<ModelWeights> shards;
  for (auto& r : ranks_) {
    r->backend.reset();  // its hold on the shard goes with it
    shards.push_back(std::move(*r->weights));
    r->weights.reset();
  }
  return shards;
}

std::vector<int> ParallelCpuBackend::stage_layers() const {
  std::vector<int> out;
  for (const auto& r : ranks_) {
    if (r->tp_rank == 0) out.push_back(r->weights->part.num_layers);
  }
  return out;
}

StageCalibration ParallelCpuBackend::calibration() const {
  return {options_.balance_batch, options_.balance_context, options_.balance_prompt_ratio};
}

Result<StageCosts> ParallelCpuBackend::measure_parts() {
  auto timing = [&](bool on) {
    for (auto& r : ranks_) r->backend->time_parts(on);
  };
  // Each stage's parts, as its first tensor-parallel rank timed them.
  auto times = [&] {
    StageCosts costs;
    for (const auto& r : ranks_) {
      if (r->tp_rank != 0) continue;
      const StageCosts& t = r->backend->part_times();
      costs.layer.insert(costs.layer.end(), t.layer.begin(), t.layer.end());
      if (r->stage == 0) costs.first = t.first;
      if (r->stage == options_.degrees.pp - 1) costs.last = t.last;
    }
    return costs;
  };
  return measure_stage_costs(*this, calibration(), timing, times);
}

Result<std::unique_ptr<ParallelCpuBackend>> ParallelCpuBackend::balance(
    std::unique_ptr<ParallelCpuBackend> b) {
  const auto t0 = std::chrono::steady_clock::now();
  const int pp = b->options_.degrees.pp;
  // A cache too small for the calibration's sequences keeps the split as it is.
  if (!calibration_fits(b->calibration(), b->options_.block_size, b->num_blocks_)) return b;
  StageBalance report;
  report.ran = true;
  report.layers_before = b->stage_layers();
  HR_ASSIGN_OR_RETURN(StageCosts costs, b->measure_parts());
  for (int s = 0; s < pp; ++s) {
    report.seconds_before.push_back(stage_cost(costs, report.layers_before, s));
  }
  // Within 5% of the best the layers stay where they are: closer than the timing's noise.
  report.layers_after = balance_stages(costs, pp, report.layers_before, 0.05);
  for (int s = 0; s < pp; ++s) {
    report.predicted_after.push_back(stage_cost(costs, report.layers_after, s));
  }
  if (report.layers_after == report.layers_before) {
    report.calibration_seconds = seconds_since(t0);
    b->balance_ = std::move(report);
    return b;
  }
  // Every rank keeps its tensor-parallel index and stage ends (embedding, final norm, LM head);
  // the layers of each tensor-parallel index move between the stages' shards in order.
  ParallelCpuOptions options = b->options_;
  const int tp = options.degrees.tp;
  std::vector<ModelWeights> shards = b->take_shards();
  b.reset();
  for (int t = 0; t < tp; ++t) {
    std::vector<LayerWeights> layers;
    for (int s = 0; s < pp; ++s) {
      auto& held = shards[static_cast<size_t>(s * tp + t)].layers;
      for (auto& l : held) layers.push_back(std::move(l));
      held.clear();
    }
    for (int s = 0, next = 0; s < pp; ++s) {
      ModelWeights& shard = shards[static_cast<size_t>(s * tp + t)];
      const int n = report.layers_after[static_cast<size_t>(s)];
      shard.part.first_layer = next;
      shard.part.num_layers = n;
      for (int i = 0; i < n; ++i)
        shard.layers.push_back(std::move(layers[static_cast<size_t>(next + i)]));
      next += n;
    }
  }
  options.degrees.stage_layers = report.layers_after;
  HR_ASSIGN_OR_RETURN(auto moved, assemble(std::move(shards), options));
  report.calibration_seconds = seconds_since(t0);
  moved->balance_ = std::move(report);
  return moved;
}

size_t ParallelCpuBackend::weight_bytes() const {
  size_t n = 0;
  for (const auto& r : ranks_) n += r->backend->weight_bytes();
  return n;
}

size_t ParallelCpuBackend::kv_cache_bytes() const {
  size_t n = 0;
  for (const auto& r : ranks_) n += r->backend->kv_cache_bytes();
  return n;
}

// A queued step: its inputs (owned: the caller's arrays are reused for the next step), its
// micro-batches, its logits, and once given, its sampling specs (owned too, with their lists).
struct ParallelCpuBackend::QueuedStep {
  std::vector<int32_t> token_ids, positions, seq_start, block_table, logits_rows;
  StepInput in;
  std::vector<MicroBatch> micro;
  std::vector<float> own_logits;
  float* logits = nullptr;          // [num_logits, vocab]: own_logits, or forward()'s caller's
  std::vector<int32_t> row_inputs;  // each logits row's input token (the penalties)
  bool has_specs = false;
  std::vector<SampleSpec> specs;
  std::vector<PenaltyToken> penalty_tokens;
  std::vector<LogitBias> logit_bias;
  std::vector<uint32_t> masks;
  int finished = 0;  // ranks done with it (guarded by mu_)
  Status status;     // its first error (guarded by mu_)
  bool sampled = false;
  HostSampled tokens;

  // Keeps copies of the specs and of what they point to.
  void keep_specs(const SampleSpec* given, int vocab) {
    const size_t L = static_cast<size_t>(in.num_logits);
    specs.assign(given, given + L);
    const size_t words = (static_cast<size_t>(vocab) + 31) / 32;
    for (const SampleSpec& sp : specs) {
      penalty_tokens.insert(penalty_tokens.end(), sp.penalty_tokens,
                            sp.penalty_tokens + std::max(0, sp.num_penalty_tokens));
      logit_bias.insert(logit_bias.end(), sp.logit_bias,
                        sp.logit_bias + std::max(0, sp.num_logit_bias));
      if (sp.allowed) masks.insert(masks.end(), sp.allowed, sp.allowed + words);
    }
    size_t p = 0, b = 0, m = 0;  // the pointers once the copies stop moving
    for (SampleSpec& sp : specs) {
      sp.penalty_tokens = penalty_tokens.data() + p;
      p += static_cast<size_t>(std::max(0, sp.num_penalty_tokens));
      sp.logit_bias = logit_bias.data() + b;
      b += static_cast<size_t>(std::max(0, sp.num_logit_bias));
      if (sp.allowed) {
        sp.allowed = masks.data() + m;
        m += words;
      }
    }
    has_specs = true;
  }
};

Status ParallelCpuBackend::queue(const StepInput& in, float* logits) {
  auto step = std::make_unique<QueuedStep>();
  QueuedStep& q = *step;
  const size_t T = static_cast<size_t>(in.num_tokens), S = static_cast<size_t>(in.num_seqs);
  q.token_ids.assign(in.token_ids, in.token_ids + T);
  q.positions.assign(in.positions, in.positions + T);
  q.seq_start.assign(in.seq_start, in.seq_start + S + 1);
  q.block_table.assign(in.block_table,
                       in.block_table + S * static_cast<size_t>(in.max_blocks_per_seq));
  q.logits_rows.assign(in.logits_rows, in.logits_rows + std::max(0, in.num_logits));
  q.in = in;
  q.in.token_ids = q.token_ids.data();
  q.in.positions = q.positions.data();
  q.in.seq_start = q.seq_start.data();
  q.in.block_table = q.block_table.data();
  q.in.logits_rows = q.logits_rows.data();
  q.in.fed_rows = nullptr;
  for (int32_t row : q.logits_rows) q.row_inputs.push_back(q.token_ids[static_cast<size_t>(row)]);
  if (logits) {
    q.logits = logits;
  } else {
    q.own_logits.resize(static_cast<size_t>(std::max(1, in.num_logits)) * vocab_size_);
    q.logits = q.own_logits.data();
  }
  int parts = options_.degrees.pp == 1
                  ? 1
                  : (options_.micro_batches > 0 ? options_.micro_batches : options_.degrees.pp);
  // With steps of other sequences in flight (in groups), they fill the stages: a small step goes
  // whole (cut, each part would cost about what the whole does: the weights are read once a
  // part). Alone, it is cut as ever.
  if (groups_ > 1 && !steps_.empty())
    parts = std::max(1, std::min(parts, in.num_tokens / kGroupMicroBatchTokens));
  split_step(q.in, parts, &q.micro);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_.empty()) return internal_error("the ranks were aborted: " + aborted_);
    steps_.push_back(std::move(step));
  }
  start_cv_.notify_all();
  return Status::ok();
}

Status ParallelCpuBackend::wait(QueuedStep* step) {
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return step->finished == static_cast<int>(ranks_.size()); });
  return step->status;
}

Status ParallelCpuBackend::sample(QueuedStep* step) {
  if (step->sampled) return Status::ok();
  HR_RETURN_IF_ERROR(wait(step));
  if (!step->has_specs) return internal_error("a forwarded step waits for its sampling");
  step->tokens = sample_on_host(step->logits, vocab_size_, step->in.num_logits, step->specs.data(),
                                step->row_inputs.data());
  step->sampled = true;
  return Status::ok();
}

void ParallelCpuBackend::pop() {
  std::lock_guard<std::mutex> lock(mu_);
  steps_.pop_front();
  ++first_index_;
}

Status ParallelCpuBackend::forward(const StepInput& in, float* logits) {
  if (in.fed_rows) return invalid_argument("forward() takes no fed rows");
  if (!steps_.empty()) return internal_error("forward() while steps are outstanding");
  // Checked once here, so that no rank stops alone and leaves the others waiting in a collective.
  HR_RETURN_IF_ERROR(check_step(in, {vocab_size_, options_.block_size, num_blocks_}));
  HR_RETURN_IF_ERROR(queue(in, logits));
  Status st = wait(steps_.back().get());
  pop();
  return st;
}

Status ParallelCpuBackend::submit_forward(const StepInput& in) {
  if (static_cast<int>(steps_.size()) >= std::max(2, groups_)) {
    return internal_error(std::to_string(steps_.size()) +
                          " steps are outstanding: collect one first");
  }
  if (forwarded_) return internal_error("a forwarded step waits for its sampling");
  HR_RETURN_IF_ERROR(check_step(
      in, {vocab_size_, options_.block_size, num_blocks_, in.fed_rows ? last_num_logits_ : 0}));
  StepInput resolved = in;
  if (in.fed_rows) {
    // The fed tokens are the newest step's: it is sampled first (waiting for it).
    if (!steps_.empty()) HR_RETURN_IF_ERROR(sample(steps_.back().get()));
    HR_RETURN_IF_ERROR(resolve_fed_tokens(
        in, steps_.empty() ? last_tokens_ : steps_.back()->tokens.tokens, &fed_ids_));
    resolved.token_ids = fed_ids_.data();
    resolved.fed_rows = nullptr;
  }
  HR_RETURN_IF_ERROR(queue(resolved, nullptr));
  last_num_logits_ = std::max(0, in.num_logits);
  forwarded_ = true;
  return Status::ok();
}

Status ParallelCpuBackend::submit_sampling(const SampleSpec* specs) {
  if (!forwarded_) return internal_error("no forwarded step to sample");
  QueuedStep& q = *steps_.back();
  if (q.in.num_logits > 0 && specs == nullptr)
    return invalid_argument("no sampling specs for the logits rows");
  q.keep_specs(specs, vocab_size_);
  forwarded_ = false;
  return Status::ok();
}

Status ParallelCpuBackend::collect(int32_t* tokens, TokenLogprobs* logprobs) {
  if (steps_.empty() || (forwarded_ && steps_.size() == 1))
    return internal_error("no step to collect");
  QueuedStep* oldest = steps_.front().get();
  HR_RETURN_IF_ERROR(sample(oldest));
  hand_out(oldest->tokens, tokens, logprobs);
  last_tokens_ = std::move(oldest->tokens.tokens);
  pop();
  return Status::ok();
}

bool ParallelCpuBackend::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!aborted_.empty()) return true;
    aborted_ = reason.empty() ? "no reason given" : reason;
  }
  // (The groups are made before the backend is handed out and never change after.)
  for (auto* groups : {&tp_groups_, &pp_groups_}) {
    for (auto& group : *groups) {
      for (auto& comm : group) comm->abort(reason);
    }
  }
  return true;
}

void ParallelCpuBackend::discard() {
  for (auto& step : steps_) (void)wait(step.get());  // the ranks may still read them
  std::lock_guard<std::mutex> lock(mu_);
  first_index_ += steps_.size();
  steps_.clear();
  forwarded_ = false;
  last_num_logits_ = 0;  // no step to be fed from
  last_tokens_.clear();
}

void ParallelCpuBackend::rank_loop(Rank* rank) {
  for (uint64_t next = 0;; ++next) {
    QueuedStep* step = nullptr;
    {
      std::unique_lock<std::mutex> lock(mu_);
      start_cv_.wait(lock, [&] { return stop_ || next < first_index_ + steps_.size(); });
      if (stop_) return;
      step = steps_[static_cast<size_t>(next - first_index_)].get();
    }
    Status st = run_rank(rank, step);
    std::lock_guard<std::mutex> lock(mu_);
    if (!st.is_ok() && step->status.is_ok()) step->status = st;
    if (++step->finished == static_cast<int>(ranks_.size())) done_cv_.notify_all();
  }
}

Status ParallelCpuBackend::run_rank(Rank* rank, QueuedStep* step) {
  const int pp = options_.degrees.pp, D = hidden_size_, V = vocab_size_;
  const bool first = rank->stage == 0, last = rank->stage == pp - 1;
  Status result;
  for (const MicroBatch& mb : step->micro) {
    const size_t n = static_cast<size_t>(mb.in.num_tokens) * D;
    rank->hidden.resize(std::max<size_t>(1, n));
    rank->logits.resize(static_cast<size_t>(std::max(1, mb.in.num_logits)) * V);
    // A stage that failed still hands rows on, so that no later stage waits for ever; the step
    // then fails with its error.
    if (!first) {
      Status st = rank->pipeline->recv(rank->hidden.data(), n, rank->stage - 1);
      if (!st.is_ok() && result.is_ok()) result = st;
    }
    if (result.is_ok()) {
      result = rank->backend->forward_part(mb.in, rank->hidden.data(), rank->logits.data());
    }
    if (!last) {
      Status st = rank->pipeline->send(rank->hidden.data(), n, rank->stage + 1);
      if (!st.is_ok() && result.is_ok()) result = st;
    } else if (rank->tp_rank == 0 && result.is_ok()) {
      for (size_t i = 0; i < mb.logits_index.size(); ++i) {
        std::memcpy(step->logits + static_cast<size_t>(mb.logits_index[i]) * V,
                    &rank->logits[i * V], sizeof(float) * V);
      }
    }
  }
  return result;
}

}  // namespace hr::engine
