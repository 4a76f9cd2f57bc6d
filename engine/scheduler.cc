// The step scheduler.
#include "engine/scheduler.h"

#include <algorithm>
#include <limits>

#include "base/check.h"

namespace hr::engine {
namespace {

// Lower sorts first = runs first.
bool runs_before(const Sequence* a, const Sequence* b) {
  if (a->cls != b->cls) return a->cls < b->cls;
  if (a->priority != b->priority) return a->priority > b->priority;
  return a->arrival < b->arrival;
}

int blocks_for(int tokens, int block_size) { return (tokens + block_size - 1) / block_size; }

}  // namespace

Scheduler::Scheduler(SchedulerConfig config, BlockManager* blocks)
    : config_(config), blocks_(blocks) {}

void Scheduler::add(Sequence* seq) {
  if (seq->cls == RequestClass::kSync) {
    waiting_sync_.push_back(seq);
  } else {
    waiting_async_.push_back(seq);
  }
}

// The running sequence that ranks last among those ranked after `for_seq` (async before sync,
// then lowest priority, then latest arrival), or `for_seq` itself when allowed and nothing ranks
// lower. Sync sequences are preempted only by earlier sync sequences, when memory is exhausted.
Sequence* Scheduler::pick_victim(const Sequence* for_seq, bool allow_self) const {
  Sequence* victim = nullptr;
  for (Sequence* s : running_) {
    if (s == for_seq) continue;
    if (!runs_before(for_seq, s)) continue;
    if (victim == nullptr || runs_before(victim, s)) victim = s;
  }
  if (victim == nullptr && allow_self && for_seq->running) victim = const_cast<Sequence*>(for_seq);
  return victim;
}

void Scheduler::preempt(Sequence* victim, StepPlan* plan, int* budget) {
  for (auto it = plan->seqs.begin(); it != plan->seqs.end(); ++it) {
    if (it->seq == victim) {
      *budget += it->num_tokens;
      plan->num_tokens -= it->num_tokens;
      plan->seqs.erase(it);
      break;
    }
  }
  blocks_->release(victim->blocks);
  victim->blocks.clear();
  victim->block_hashes.clear();
  victim->num_computed = 0;
  victim->running = false;
  ++victim->num_preemptions;
  running_.erase(std::find(running_.begin(), running_.end(), victim));
  if (victim->cls == RequestClass::kSync) {
    waiting_sync_.push_front(victim);
  } else {
    waiting_async_.push_back(victim);
  }
  plan->preempted.push_back(victim);
}

// Makes room for `n` more tokens of `seq`, preempting lower-ranked async sequences if needed.
bool Scheduler::grow(Sequence* seq, int n, bool allow_self, StepPlan* plan, int* budget) {
  int need = blocks_for(seq->num_computed + n, blocks_->block_size()) -
             static_cast<int>(seq->blocks.size());
  while (need > blocks_->num_available()) {
    Sequence* victim = pick_victim(seq, allow_self);
    if (victim == nullptr) return false;
    preempt(victim, plan, budget);
    if (victim == seq) return false;
  }
  for (int i = 0; i < need; ++i) seq->blocks.push_back(*blocks_->allocate());
  return true;
}

StepPlan Scheduler::schedule() {
  StepPlan plan;
  int budget = config_.max_batched_tokens;
  std::sort(running_.begin(), running_.end(), runs_before);
  std::stable_sort(waiting_async_.begin(), waiting_async_.end(), runs_before);
  // With priority_runs_alone, the highest async priority present: every running async sequence
  // below it makes room, and none waiting below it starts.
  int top = std::numeric_limits<int>::min();
  if (config_.priority_runs_alone) {
    for (const Sequence* s : running_) {
      if (s->cls == RequestClass::kAsync) top = std::max(top, s->priority);
    }
    if (!waiting_async_.empty()) top = std::max(top, waiting_async_.front()->priority);
    // (Lowest first: running_ is sorted, so the ones below `top` are at its end.)
    while (!running_.empty() && running_.back()->cls == RequestClass::kAsync &&
           running_.back()->priority < top) {
      preempt(running_.back(), &plan, &budget);
    }
  }
  bool sync_present = sync_expected_ || !waiting_sync_.empty();
  bool sync_prefill = !waiting_sync_.empty();
  for (const Sequence* seq : running_) {
    if (seq->cls != RequestClass::kSync) continue;
    sync_present = true;
    if (seq->num_computed < seq->num_prompt) sync_prefill = true;
  }
  // The most async tokens a step takes (-1: no cap).
  int async_cap = -1;
  if (sync_present && config_.max_async_tokens_with_sync > 0)
    async_cap = config_.max_async_tokens_with_sync;
  if (async_step_cap_ > 0)
    async_cap = async_cap < 0 ? async_step_cap_ : std::min(async_cap, async_step_cap_);
  // With steps of disjoint sequences in flight: this step's share of the tokens (the rest of the
  // budget is not this step's, but still counts as headroom).
  int not_this_steps = 0;
  if (step_groups_ > 1) {
    not_this_steps = std::max(0, budget - group_token_share(top, async_cap));
    budget -= not_this_steps;
  }
  // The async prompt tokens this step may still take (-1: no cap).
  int async_prefill_left = sync_present && config_.max_async_prefill_with_sync > 0
                               ? config_.max_async_prefill_with_sync
                               : -1;
  auto plan_seq = [&](Sequence* seq, bool was_running) -> bool {
    if (seq->ends_with_pending()) return false;
    if (step_groups_ > 1 && seq->num_pending > 0) return false;
    int remaining = seq->length() - seq->num_computed;
    int n = std::min({remaining, budget, config_.max_prefill_chunk});
    // (Anything but one decode token: a prompt, or a sequence recomputed after preemption.)
    const bool capped_prefill = seq->cls == RequestClass::kAsync && async_prefill_left >= 0 &&
                                (remaining > 1 || seq->num_computed < seq->num_prompt);
    if (capped_prefill) n = std::min(n, async_prefill_left);
    if (n <= 0) return false;
    if (!grow(seq, n, was_running, &plan, &budget)) return false;
    n = std::min(n, budget);  // preemption may not refund, but never overdraw
    if (capped_prefill) async_prefill_left -= n;
    plan.seqs.push_back({seq, n, seq->num_computed + n == seq->length()});
    plan.num_tokens += n;
    budget -= n;
    return true;
  };
  auto admit = [&](Sequence* seq) -> bool {
    if (static_cast<int>(running_.size()) >= config_.max_num_seqs) {
      Sequence* victim = pick_victim(seq, false);
      if (victim == nullptr) return false;
      preempt(victim, &plan, &budget);
    }
    if (seq->num_computed == 0 && seq->blocks.empty()) {
      // Reuse cached full blocks, always leaving the last token to compute (it yields logits).
      int covered = blocks_->acquire_prefix(seq->tokens, static_cast<int>(seq->tokens.size()) - 1,
                                            seq->cache_chain, &seq->blocks, &seq->block_hashes);
      seq->num_computed = covered;
      if (seq->num_cached_prompt < 0) seq->num_cached_prompt = std::min(covered, seq->num_prompt);
    }
    seq->running = true;
    running_.push_back(seq);
    if (!plan_seq(seq, /*was_running=*/false)) {
      // Not even one token fits: back to waiting, keeping nothing.
      running_.pop_back();
      seq->running = false;
      blocks_->release(seq->blocks);
      seq->blocks.clear();
      seq->block_hashes.clear();
      seq->num_computed = 0;
      return false;
    }
    return true;
  };
  int held_back = 0;  // budget kept from async work this step
  for (RequestClass cls : {RequestClass::kSync, RequestClass::kAsync}) {
    if (cls == RequestClass::kAsync) {
      int async_budget = budget;
      // (Only when the sync part planned something: an idle step would make no progress.)
      if (sync_prefill && config_.sync_prefill_alone && !plan.seqs.empty()) async_budget = 0;
      if (async_cap >= 0) async_budget = std::min(async_budget, async_cap);
      held_back = budget - async_budget;
      budget = async_budget;
    }
    std::vector<Sequence*> snapshot = running_;
    for (Sequence* seq : snapshot) {
      if (seq->cls != cls || !seq->running) continue;
      if (budget <= 0) break;
      plan_seq(seq, /*was_running=*/true);
    }
    if (cls == RequestClass::kSync) {
      while (!waiting_sync_.empty() && budget > 0) {
        Sequence* seq = waiting_sync_.front();
        if (seq->num_pending > 0) break;  // preempted while its token is on the way
        // Off the queue before admit(): a running one it preempts goes to the queue's front.
        waiting_sync_.pop_front();
        if (!admit(seq)) {
          waiting_sync_.push_front(seq);
          break;
        }
      }
    } else {
      std::stable_sort(waiting_async_.begin(), waiting_async_.end(), runs_before);
      // (A waiting sequence always has prompt tokens to compute: none starts once the cap is
      // spent, so that none is preempted for it.)
      while (!waiting_async_.empty() && budget > 0 && waiting_sync_.empty() &&
             async_prefill_left != 0) {
        Sequence* seq = waiting_async_.front();
        if (seq->num_pending > 0) break;  // preempted while its token is on the way
        if (seq->priority < top) break;   // priority_runs_alone: not while higher work is about
        waiting_async_.erase(waiting_async_.begin());
        if (!admit(seq)) {
          waiting_async_.insert(waiting_async_.begin(), seq);
          break;
        }
      }
    }
  }
  last_budget_left_ = budget + held_back + not_this_steps;
  return plan;
}

int Scheduler::group_token_share(int top, int async_cap) const {
  // What is left to plan over the groups' next steps: the rest of each running sequence's tokens
  // but those whose token is on the way (their work is the steps in flight's; a prompt counted up
  // to a chunk for each group, so that a long one goes in full chunks), and the prompts of the
  // waiting sequences that admission would take: in its order, stopping where it stops (a
  // sequence whose token is on the way, an async one below `top`, async ones while sync ones
  // still wait), as far as the slots and the cache blocks go, free ones or those of running
  // sequences ranked below it (admission preempts them). Async tokens count up to `async_cap` a
  // step (-1: no cap). (Prompts that cannot start would otherwise swell this step's share.)
  const int64_t per_seq = static_cast<int64_t>(step_groups_) * config_.max_prefill_chunk;
  auto next_tokens = [&](const Sequence* s) -> int64_t {
    if (s->num_pending > 0) return 0;
    return std::clamp<int64_t>(s->length() - s->num_computed, 0, per_seq);
  };
  const int64_t bs = blocks_->block_size();
  int64_t free_blocks = blocks_->num_available();
  int64_t sync_tokens = 0, async_tokens = 0;
  for (const Sequence* s : running_) {
    const int64_t n = next_tokens(s);
    (s->cls == RequestClass::kSync ? sync_tokens : async_tokens) += n;
    // (The blocks its tokens take first: running sequences are planned before waiting ones.)
    free_blocks -= std::max<int64_t>(
        0, (s->num_computed + n + bs - 1) / bs - static_cast<int64_t>(s->blocks.size()));
  }
  // running_ is sorted (runs_before): those a waiting sequence may preempt are a suffix of it.
  const size_t R = running_.size();
  std::vector<int64_t> suffix_blocks(R + 1, 0);
  for (size_t i = R; i-- > 0;)
    suffix_blocks[i] = suffix_blocks[i + 1] + static_cast<int64_t>(running_[i]->blocks.size());
  int64_t slots = config_.max_num_seqs - static_cast<int64_t>(R);
  int64_t preempted_seqs = 0, preempted_blocks = 0;  // taken by the waiting counted so far
  // Counts `s` as admitted; false where admission stops at it.
  auto admitted = [&](const Sequence* s) -> bool {
    if (s->num_pending > 0) return false;
    const size_t first = static_cast<size_t>(
        std::partition_point(running_.begin(), running_.end(),
                             [&](const Sequence* r) { return !runs_before(s, r); }) -
        running_.begin());
    const int64_t victims = static_cast<int64_t>(R - first) - preempted_seqs;
    const int64_t blocks = std::max<int64_t>(0, free_blocks) +
                           std::max<int64_t>(0, suffix_blocks[first] - preempted_blocks);
    if (slots + std::max<int64_t>(0, victims) <= 0 || blocks <= 0) return false;
    const int64_t n = std::min(next_tokens(s), blocks * bs);
    const int64_t need = (n + bs - 1) / bs,
                  from_free = std::min(need, std::max<int64_t>(0, free_blocks));
    free_blocks -= from_free;
    preempted_blocks += need - from_free;
    if (slots > 0) {
      --slots;
    } else {
      ++preempted_seqs;
    }
    (s->cls == RequestClass::kSync ? sync_tokens : async_tokens) += n;
    return true;
  };
  bool sync_all_in = true;
  for (const Sequence* s : waiting_sync_) {
    if (!admitted(s)) {
      sync_all_in = false;
      break;
    }
  }
  for (const Sequence* s : waiting_async_) {
    if (!sync_all_in || s->priority < top || !admitted(s)) break;
  }
  if (async_cap >= 0)
    async_tokens = std::min<int64_t>(async_tokens, int64_t{step_groups_} * async_cap);
  const int64_t wanted = sync_tokens + async_tokens;
  // With the steps in flight, the groups' window: each step's share of it.
  const int64_t window = tokens_in_flight_ + wanted;
  const int64_t share = (window + step_groups_ - 1) / step_groups_;
  return static_cast<int>(std::clamp<int64_t>(share, 1, config_.max_batched_tokens));
}

void Scheduler::complete(const StepPlan& plan) {
  const int bs = blocks_->block_size();
  for (const ScheduledSeq& s : plan.seqs) {
    Sequence* seq = s.seq;
    seq->num_computed += s.num_tokens;
    const int full = std::min(seq->num_computed, static_cast<int>(seq->tokens.size())) / bs;
    while (static_cast<int>(seq->block_hashes.size()) < full) {
      size_t i = seq->block_hashes.size();
      uint64_t parent = seq->cache_chain.parent(i, seq->block_hashes);
      seq->block_hashes.push_back(
          blocks_->commit_full(seq->blocks[i], parent, seq->tokens.data() + i * bs));
    }
  }
}

void Scheduler::remove(Sequence* seq) {
  auto it = std::find(running_.begin(), running_.end(), seq);
  if (it != running_.end()) running_.erase(it);
  auto ws = std::find(waiting_sync_.begin(), waiting_sync_.end(), seq);
  if (ws != waiting_sync_.end()) waiting_sync_.erase(ws);
  auto wa = std::find(waiting_async_.begin(), waiting_async_.end(), seq);
  if (wa != waiting_async_.end()) waiting_async_.erase(wa);
  blocks_->release(seq->blocks);
  seq->blocks.clear();
  seq->running = false;
}

Headroom Scheduler::headroom() const {
  Headroom h;
  h.free_seq_slots = config_.max_num_seqs - static_cast<int>(running_.size());
  h.free_kv_blocks = blocks_->num_available();
  h.total_kv_blocks = blocks_->num_blocks();
  h.token_budget_left = last_budget_left_;
  h.waiting_sync = static_cast<int>(waiting_sync_.size());
  h.waiting_async = static_cast<int>(waiting_async_.size());
  for (const Sequence* s : running_) {
    (s->cls == RequestClass::kSync ? h.running_sync : h.running_async) += 1;
  }
  return h;
}

}  // namespace hr::engine
