// Continuous batching: which sequences run in the next step and how many of their tokens.
// A per-step token budget with chunked prefill; two classes, sync before async (async ordered by
// numeric priority, then arrival); when sync needs room, running async sequences are preempted
// (blocks released — full ones stay in the prefix cache — and recomputed later), victims chosen
// lowest priority, latest arrival first. "No room" is a normal outcome. Plain C++; driven by
// the engine's thread.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/block_manager.h"
#include "engine/sampler.h"

namespace hr::engine {

enum class RequestClass { kSync = 0, kAsync = 1 };

struct Sequence {
  int64_t id = 0;
  RequestClass cls = RequestClass::kSync;
  int priority = 0;             // async only: higher runs first
  int64_t arrival = 0;          // admission order
  std::vector<int32_t> tokens;  // prompt, then generated
  int num_prompt = 0;
  int num_computed = 0;  // tokens whose K/V is in the cache
  // Tokens sampled by a step still running (a pipelined engine): they follow `tokens` and are
  // planned at once, fed from the running step's row `pending_row`.
  int num_pending = 0;
  int pending_row = -1;
  std::vector<int> blocks;             // block table
  std::vector<uint64_t> block_hashes;  // of the committed full blocks
  CacheChain cache_chain;              // its blocks' parent hashes: its cache namespace
  int num_cached_prompt = -1;          // prompt tokens found in the prefix cache at first admission
  int num_preemptions = 0;
  bool running = false;
  bool finished = false;
  SamplingParams params;
  std::mt19937_64 rng;
  // With penalties (params.penalties.any()): each token seen, with how often it was generated (0:
  // only in the prompt, listed for repetition_penalty alone), as the backend takes the list; and
  // where each token is in it. The pending tokens are not counted.
  std::vector<PenaltyToken> penalty_list;
  std::unordered_map<int32_t, int32_t> penalty_index;
  // Counts `token` in penalty_list: `generated` more times.
  void note_seen(int32_t token, int generated) {
    auto [it, added] = penalty_index.emplace(token, static_cast<int32_t>(penalty_list.size()));
    if (added) penalty_list.push_back({token, 0});
    penalty_list[static_cast<size_t>(it->second)].count += generated;
  }

  int max_length = 0;  // tokens at most (the engine's max_model_len; 0: no limit)

  int num_generated() const { return static_cast<int>(tokens.size()) - num_prompt; }
  // The pending token ends the sequence by length: planning another step for it is wasted work.
  bool ends_with_pending() const {
    return num_pending > 0 && (num_generated() + num_pending >= params.max_tokens ||
                               (max_length > 0 && length() >= max_length));
  }
  // Tokens known or pending.
  int length() const { return static_cast<int>(tokens.size()) + num_pending; }
};

struct SchedulerConfig {
  int max_num_seqs = 64;
  int max_batched_tokens = 512;
  int max_prefill_chunk = 512;
  // While any sync sequence is running or waiting, async sequences get at most this many tokens
  // per step (0: no cap), so the steps that carry sync tokens stay short. Where step time grows
  // with the tokens in it (compute-bound CPUs), this is what keeps sync latency flat.
  int max_async_tokens_with_sync = 0;
  // While sync requests are present or expected, the async prompt tokens a step computes (and
  // those of sequences recomputed after preemption) come to at most this many (0: no cap); async
  // decode tokens are not counted. Where a step's time is its weights' read until it holds many
  // tokens (a GPU), decoding rows ride along almost free, but a chunk of queued prompts makes the
  // step that an arriving sync request waits behind several times longer.
  int max_async_prefill_with_sync = 0;
  // A step that computes a sync prompt carries no async tokens: the new request's first token
  // comes after one short step.
  bool sync_prefill_alone = false;
  // While async work of a higher priority runs or waits, every running async sequence of a lower
  // priority is preempted, not only those whose slots or blocks it needs, and none waiting
  // starts: where a step's time grows with the sequences in it (the CPU backend), the
  // higher-priority work then runs about as fast as it would alone.
  bool priority_runs_alone = false;
};

struct ScheduledSeq {
  Sequence* seq = nullptr;
  int num_tokens = 0;   // new tokens computed this step
  bool sample = false;  // the step finishes its tokens: sample the next one
};

struct StepPlan {
  std::vector<ScheduledSeq> seqs;
  std::vector<Sequence*> preempted;
  int num_tokens = 0;
  bool empty() const { return seqs.empty(); }
};

struct Headroom {
  int free_seq_slots = 0;
  int free_kv_blocks = 0;
  int total_kv_blocks = 0;
  int token_budget_left = 0;  // in the last planned step
  int waiting_sync = 0;
  int waiting_async = 0;
  int running_sync = 0;
  int running_async = 0;
};

class Scheduler {
 public:
  Scheduler(SchedulerConfig config, BlockManager* blocks);

  void add(Sequence* seq);
  // Plans the next step. Blocks for the planned tokens are allocated.
  StepPlan schedule();
  // After the backend ran `plan`: advances computed counts and caches newly full blocks.
  void complete(const StepPlan& plan);
  // Removes a finished or cancelled sequence and releases its blocks.
  void remove(Sequence* seq);
  Headroom headroom() const;
  bool has_work() const {
    return !running_.empty() || !waiting_sync_.empty() || !waiting_async_.empty();
  }
  const SchedulerConfig& config() const { return config_; }
  // Sync requests are expected soon (they came recently): max_async_tokens_with_sync applies even
  // while none is in the engine, so an arriving one does not wait behind a long async step.
  void set_sync_expected(bool expected) { sync_expected_ = expected; }
  // Async tokens per step at most `tokens`, sync traffic or not (0: no cap): bounds the step that a
  // sync request arriving after a quiet spell waits behind (the caller sizes it from step times).
  void set_async_step_cap(int tokens) { async_step_cap_ = tokens; }
  // Steps of disjoint sequences in flight at once (Backend::step_groups): above 1, a sequence
  // whose token a step in flight samples is left out of the plan (not fed), and a step takes at
  // most its share of the tokens: 1/groups of the steps in flight and what is left to plan for
  // the sequences running and waiting (rounded up), so that the stages' work comes out about
  // even: decoding sequences share out by count (groups of unequal size even out), a long prompt
  // goes in chunks into the steps beside them.
  void set_step_groups(int groups) { step_groups_ = std::max(1, groups); }
  // The tokens of the steps in flight (with step groups), before each schedule().
  void set_tokens_in_flight(int tokens) { tokens_in_flight_ = std::max(0, tokens); }

 private:
  int group_token_share(int top, int async_cap) const;
  bool grow(Sequence* seq, int num_new_tokens, bool allow_self, StepPlan* plan, int* budget);
  Sequence* pick_victim(const Sequence* for_seq, bool allow_self) const;
  void preempt(Sequence* victim, StepPlan* plan, int* budget);

  SchedulerConfig config_;
  bool sync_expected_ = false;
  int async_step_cap_ = 0;
  int step_groups_ = 1;
  int tokens_in_flight_ = 0;
  BlockManager* blocks_;
  std::vector<Sequence*> running_;
  std::deque<Sequence*> waiting_sync_;
  std::vector<Sequence*> waiting_async_;
  int last_budget_left_ = 0;
};

}  // namespace hr::engine
