// The scheduler stepped by hand, asserting each step: admission order, token budget and chunking,
// preemption victims, prefix-cache reuse and headroom.
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <array>
#include <deque>

namespace hr::engine {
namespace {

struct Harness {
  BlockManager blocks;
  Scheduler sched;
  std::vector<std::unique_ptr<Sequence>> seqs;
  int64_t arrival = 0;

  Harness(int num_blocks, int block_size, SchedulerConfig c)
      : blocks(num_blocks, block_size), sched(c, &blocks) {}

  Sequence* add(RequestClass cls, int prompt_len, int priority = 0, int first_token = 1) {
    auto s = std::make_unique<Sequence>();
    s->id = static_cast<int64_t>(seqs.size());
    s->cls = cls;
    s->priority = priority;
    s->arrival = arrival++;
    for (int i = 0; i < prompt_len; ++i) s->tokens.push_back(first_token + i);
    s->num_prompt = prompt_len;
    sched.add(s.get());
    seqs.push_back(std::move(s));
    return seqs.back().get();
  }

  // Plans and completes one step, appending a token to each sequence that sampled.
  StepPlan step() {
    StepPlan p = sched.schedule();
    sched.complete(p);
    for (const auto& s : p.seqs) {
      if (s.sample) s.seq->tokens.push_back(7);
    }
    return p;
  }
};

int tokens_of(const StepPlan& p, const Sequence* s) {
  for (const auto& x : p.seqs) {
    if (x.seq == s) return x.num_tokens;
  }
  return 0;
}

// With two step groups: a step takes half of the tokens left to plan and in flight (rounded up),
// a sync sequence first, a prompt cut to fit; sequences whose token a step in flight samples are
// left out, so the next step takes the others; once the first step's tokens are in, its
// sequences are planned again.
TEST(SchedulerTest, StepGroupsShareTheTokensAndSkipThoseInFlight) {
  Harness h(64, 4, {8, 64, 64});
  h.sched.set_step_groups(2);
  std::vector<Sequence*> async;
  for (int i = 0; i < 4; ++i) async.push_back(h.add(RequestClass::kAsync, 3));
  Sequence* sync = h.add(RequestClass::kSync, 3);
  auto in_flight = [](const StepPlan& p) {
    for (const auto& x : p.seqs) {
      if (x.sample) ++x.seq->num_pending;
    }
  };
  auto arrive = [](const StepPlan& p) {
    for (const auto& x : p.seqs) {
      if (!x.sample) continue;
      --x.seq->num_pending;
      x.seq->tokens.push_back(7);
    }
  };
  StepPlan a = h.sched.schedule();
  h.sched.complete(a);
  in_flight(a);
  EXPECT_EQ(a.num_tokens, 8);  // ceil(15 / 2)
  ASSERT_EQ(a.seqs.size(), 3u);
  EXPECT_EQ(tokens_of(a, sync), 3);
  EXPECT_EQ(tokens_of(a, async[0]), 3);
  EXPECT_EQ(tokens_of(a, async[1]), 2);
  EXPECT_FALSE(a.seqs[2].sample);
  h.sched.set_tokens_in_flight(a.num_tokens);
  StepPlan b = h.sched.schedule();
  h.sched.complete(b);
  in_flight(b);
  ASSERT_EQ(b.seqs.size(), 3u);  // all that is left: 7 of a share of ceil((8 + 7) / 2)
  EXPECT_EQ(tokens_of(b, async[1]), 1);
  EXPECT_EQ(tokens_of(b, async[2]), 3);
  EXPECT_EQ(tokens_of(b, async[3]), 3);
  h.sched.set_tokens_in_flight(a.num_tokens + b.num_tokens);
  EXPECT_TRUE(h.sched.schedule().empty());  // every sequence's token is on the way
  arrive(a);
  h.sched.set_tokens_in_flight(b.num_tokens);
  StepPlan c = h.sched.schedule();
  ASSERT_EQ(c.seqs.size(), 2u);
  EXPECT_EQ(tokens_of(c, sync), 1);
  EXPECT_EQ(tokens_of(c, async[0]), 1);
}

// A long prompt arriving among decoding sequences goes in chunks into both groups' steps, which
// come out about even, rather than into one step that would hold the other stage up.
TEST(SchedulerTest, StepGroupsSpreadALongPromptOverTheSteps) {
  Harness h(256, 4, {16, 512, 512});
  h.sched.set_step_groups(2);
  std::deque<StepPlan> flying;
  // As the engine drives it: the oldest step collected once both groups have one in flight.
  auto next = [&] {
    if (flying.size() >= 2) {
      for (const auto& x : flying.front().seqs) {
        if (!x.sample) continue;
        --x.seq->num_pending;
        x.seq->tokens.push_back(7);
      }
      flying.pop_front();
    }
    int tokens = 0;
    for (const StepPlan& p : flying) tokens += p.num_tokens;
    h.sched.set_tokens_in_flight(tokens);
    StepPlan p = h.sched.schedule();
    h.sched.complete(p);
    for (const auto& x : p.seqs) {
      if (x.sample) ++x.seq->num_pending;
    }
    flying.push_back(p);
    return p;
  };
  for (int i = 0; i < 6; ++i) h.add(RequestClass::kAsync, 1);
  EXPECT_EQ(next().num_tokens, 3);  // half of the six first tokens
  EXPECT_EQ(next().num_tokens, 3);  // the other half
  Sequence* prompt = h.add(RequestClass::kAsync, 300);
  const StepPlan c = next();
  const StepPlan d = next();
  EXPECT_GT(tokens_of(c, prompt), 0);
  EXPECT_GT(tokens_of(d, prompt), 0);
  EXPECT_EQ(tokens_of(c, prompt) + tokens_of(d, prompt), 300);
  EXPECT_TRUE(d.seqs.back().sample);
  EXPECT_EQ(c.num_tokens, 153);  // ceil((3 in flight + 3 decoding + 300) / 2)
  EXPECT_EQ(d.num_tokens, 153);  // the prompt's rest beside the other three
}

// Groups of unequal size (sequences ended in one of them) even out: the next steps take half of
// the sequences each.
TEST(SchedulerTest, StepGroupsOfUnequalSizeEvenOut) {
  Harness h(256, 4, {32, 512, 512});
  std::vector<Sequence*> seqs;
  for (int i = 0; i < 24; ++i) seqs.push_back(h.add(RequestClass::kAsync, 1));
  EXPECT_EQ(h.step().seqs.size(), 24u);  // (one group: every prompt, a token each)
  h.sched.set_step_groups(2);
  // A step of 16 of them in flight (a group that was larger), 8 to plan.
  for (int i = 0; i < 16; ++i) {
    ++seqs[static_cast<size_t>(i)]->num_computed;
    seqs[static_cast<size_t>(i)]->num_pending = 1;
  }
  h.sched.set_tokens_in_flight(16);
  StepPlan a = h.sched.schedule();
  EXPECT_EQ(a.seqs.size(), 8u);
  h.sched.complete(a);
  for (const auto& x : a.seqs) ++x.seq->num_pending;
  // The 16 arrive: the next step takes 12 of them, half of the 24, not all 16.
  for (int i = 0; i < 16; ++i) {
    seqs[static_cast<size_t>(i)]->num_pending = 0;
    seqs[static_cast<size_t>(i)]->tokens.push_back(7);
  }
  h.sched.set_tokens_in_flight(8);
  EXPECT_EQ(h.sched.schedule().seqs.size(), 12u);
}

// Simulates the engine's steps in flight: a planned step's sampling sequences have their token on
// the way until it arrives.
void mark_in_flight(const StepPlan& p) {
  for (const auto& x : p.seqs) {
    if (x.sample) ++x.seq->num_pending;
  }
}

// The share counts only the waiting prompts that admission would take: one whose blocks the cache
// cannot give (free, or held by sequences ranked below it) leaves the decoding sequences' share as
// it was, rather than cutting this step's tokens short for a prompt that cannot start.
TEST(SchedulerTest, StepGroupsShareLeavesOutWaitingPromptsThatCannotStart) {
  auto first_step = [](int num_blocks) {
    Harness h(num_blocks, 4, {16, 64, 64});
    for (int i = 0; i < 8; ++i) h.add(RequestClass::kAsync, 2);
    h.step();  // their prompts: 8 blocks
    h.sched.set_step_groups(2);
    Sequence* prompt = h.add(RequestClass::kAsync, 40);  // needs 10 blocks, ranks last
    const StepPlan p = h.sched.schedule();
    return std::make_pair(p.num_tokens, tokens_of(p, prompt));
  };
  // Room for the prompt: half of the 8 decode tokens and the 40 (ceil(48 / 2)), 16 of them its.
  EXPECT_EQ(first_step(64), std::make_pair(24, 16));
  // A full cache (8 blocks, all held by sequences ranked above it): the prompt cannot start;
  // half of the 8 decode tokens.
  EXPECT_EQ(first_step(8), std::make_pair(4, 0));
}

// A waiting prompt that ranks above running sequences counts with their blocks (admission preempts
// them): it starts within the groups' next two steps even with the cache full.
TEST(SchedulerTest, StepGroupsShareCountsAPromptThatPreemptsItsWayIn) {
  Harness h(8, 4, {16, 64, 64});
  std::vector<Sequence*> low;
  for (int i = 0; i < 8; ++i) low.push_back(h.add(RequestClass::kAsync, 2, /*priority=*/0));
  h.step();  // the cache is full
  h.sched.set_step_groups(2);
  Sequence* high = h.add(RequestClass::kAsync, 6, /*priority=*/1);
  StepPlan a = h.sched.schedule();
  h.sched.complete(a);
  mark_in_flight(a);
  h.sched.set_tokens_in_flight(a.num_tokens);
  StepPlan b = h.sched.schedule();
  EXPECT_EQ(a.num_tokens, 7);  // ceil((8 + 6) / 2)
  EXPECT_EQ(tokens_of(a, high) + tokens_of(b, high), 6);
  EXPECT_FALSE(b.preempted.empty());
}

// Nor a waiting async prompt of a lower priority than the work about (priority_runs_alone), nor
// an async one behind a sync one that admission stops at (its token on the way).
TEST(SchedulerTest, StepGroupsShareLeavesOutWaitingPromptsAdmissionSkips) {
  SchedulerConfig c{4, 64, 64};
  c.priority_runs_alone = true;
  Harness h(64, 4, c);
  for (int i = 0; i < 3; ++i) h.add(RequestClass::kAsync, 2, /*priority=*/1);
  h.step();
  h.sched.set_step_groups(2);
  h.add(RequestClass::kAsync, 40, /*priority=*/0);
  EXPECT_EQ(h.sched.schedule().num_tokens, 2);  // ceil(3 / 2): the low prompt waits
  Harness g(64, 4, {8, 64, 64});
  for (int i = 0; i < 3; ++i) g.add(RequestClass::kAsync, 2);
  g.step();
  g.sched.set_step_groups(2);
  Sequence* sync = g.add(RequestClass::kSync, 6, 0, 100);
  ++sync->num_pending;  // (preempted while its token was on the way)
  g.add(RequestClass::kAsync, 40);
  EXPECT_EQ(g.sched.schedule().num_tokens, 2);
}

TEST(SchedulerTest, SyncIsAdmittedBeforeEarlierAsync) {
  Harness h(64, 4, {8, 10, 10});
  Sequence* a = h.add(RequestClass::kAsync, 8);
  Sequence* s = h.add(RequestClass::kSync, 8);
  StepPlan p = h.step();
  EXPECT_EQ(tokens_of(p, s), 8);  // sync first, whole prompt
  EXPECT_EQ(tokens_of(p, a), 2);  // async gets what is left of the budget
  EXPECT_EQ(p.num_tokens, 10);
  p = h.step();
  EXPECT_EQ(tokens_of(p, s), 1);  // decode
  EXPECT_EQ(tokens_of(p, a), 6);  // rest of the prompt
  EXPECT_TRUE(p.seqs[1].sample);
}

TEST(SchedulerTest, AsyncTokensAreCappedOnlyWhileSyncIsPresent) {
  SchedulerConfig c{16, 64, 64};
  c.max_async_tokens_with_sync = 3;
  Harness h(256, 4, c);
  std::vector<Sequence*> async;
  for (int i = 0; i < 6; ++i) async.push_back(h.add(RequestClass::kAsync, 2));
  StepPlan p = h.step();
  EXPECT_EQ(p.num_tokens, 12);  // no sync: no cap
  Sequence* s = h.add(RequestClass::kSync, 5);
  p = h.step();
  EXPECT_EQ(tokens_of(p, s), 5);
  EXPECT_EQ(p.num_tokens, 5 + 3);  // async decodes capped at 3 tokens
  p = h.step();
  EXPECT_EQ(tokens_of(p, s), 1);
  EXPECT_EQ(p.num_tokens, 1 + 3);
  // The engine reports the held-back budget as headroom, not as used.
  EXPECT_EQ(h.sched.headroom().token_budget_left, 64 - 4);
  // Once the sync sequence is gone the cap lifts, unless sync requests are expected.
  s->finished = true;
  h.sched.remove(s);
  h.sched.set_sync_expected(true);
  EXPECT_EQ(h.step().num_tokens, 3);
  h.sched.set_sync_expected(false);
  EXPECT_EQ(h.step().num_tokens, 6);
}

// The async prompt tokens of a step are capped while sync is about (in pieces over several steps
// for a prompt longer than the cap, several short prompts sharing it); decoding async sequences
// are not held back, and without sync the prompts go in whole.
TEST(SchedulerTest, AsyncPromptTokensAreCappedWhileSyncIsPresent) {
  SchedulerConfig c{16, 64, 64};
  c.max_async_prefill_with_sync = 6;
  Harness h(256, 4, c);
  Sequence* d = h.add(RequestClass::kAsync, 3, 0, 100);  // distinct prompts: no prefix hits
  h.step();                                              // d decodes from here
  Sequence* s = h.add(RequestClass::kSync, 5, 0, 200);
  Sequence* a = h.add(RequestClass::kAsync, 10, 0, 300);
  Sequence* b = h.add(RequestClass::kAsync, 3, 0, 400);
  StepPlan p = h.step();
  EXPECT_EQ(tokens_of(p, s), 5);  // sync prompts are never capped
  EXPECT_EQ(tokens_of(p, d), 1);  // nor async decodes
  EXPECT_EQ(tokens_of(p, a), 6);  // the cap, all of it to the first prompt
  EXPECT_EQ(tokens_of(p, b), 0);
  p = h.step();
  EXPECT_EQ(tokens_of(p, a), 4);  // the rest of a's prompt
  EXPECT_EQ(tokens_of(p, b), 2);  // and what is left of the cap
  EXPECT_EQ(tokens_of(p, d), 1);
  EXPECT_EQ(tokens_of(p, s), 1);
  // Without sync (nor any expected), a long prompt goes in whole.
  s->finished = true;
  h.sched.remove(s);
  Sequence* e = h.add(RequestClass::kAsync, 20, 0, 500);
  p = h.step();
  EXPECT_EQ(tokens_of(p, e), 20);
  EXPECT_EQ(tokens_of(p, b), 1);
  // Expected sync traffic caps them too.
  h.sched.set_sync_expected(true);
  Sequence* f = h.add(RequestClass::kAsync, 20, 0, 600);
  EXPECT_EQ(tokens_of(h.step(), f), 6);
}

// A sequence recomputed after preemption (its prompt and what it had generated) is held to the cap
// as a prompt is, past its prompt too; and no waiting async sequence starts (preempting another
// for its slot) once the cap is spent.
TEST(SchedulerTest, AsyncRecomputeAfterPreemptionIsCappedWhileSyncIsPresent) {
  SchedulerConfig c{2, 64, 64};
  c.max_async_prefill_with_sync = 4;
  Harness h(64, 64, c);  // blocks of 64 tokens: no full block for the prefix cache to give back
  Sequence* a = h.add(RequestClass::kAsync, 4, 0, 100);
  for (int i = 0; i < 8; ++i) h.step();
  ASSERT_EQ(a->tokens.size(), 12u);  // 4 of prompt, 8 generated
  h.sched.set_sync_expected(true);
  h.add(RequestClass::kSync, 3, 0, 200);
  Sequence* s2 = h.add(RequestClass::kSync, 3, 0, 300);
  StepPlan p = h.step();
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0], a);  // the second sync request took its slot
  s2->finished = true;
  h.sched.remove(s2);
  EXPECT_EQ(tokens_of(h.step(), a), 4);  // recomputed within the cap
  EXPECT_EQ(tokens_of(h.step(), a), 4);  // past its prompt, still within it
  p = h.step();
  EXPECT_EQ(tokens_of(p, a), 4);  // the last four, and a token sampled
  EXPECT_TRUE(p.seqs.back().sample);
}

// With every slot taken and the cap spent by a running sequence's prompt, a waiting async
// sequence of a higher priority does not preempt one for a start the cap would refuse it.
TEST(SchedulerTest, NoAsyncSequenceIsPreemptedForAStartTheCapForbids) {
  SchedulerConfig c{2, 64, 64};
  c.max_async_prefill_with_sync = 4;
  Harness h(64, 64, c);
  Sequence* b = h.add(RequestClass::kAsync, 2, 0, 100);
  h.step();  // b decodes from here
  h.sched.set_sync_expected(true);
  Sequence* a = h.add(RequestClass::kAsync, 10, 0, 200);
  EXPECT_EQ(tokens_of(h.step(), a), 4);  // both slots taken, a's prompt within the cap
  Sequence* high = h.add(RequestClass::kAsync, 3, /*priority=*/1, 300);
  const StepPlan p = h.step();
  EXPECT_EQ(tokens_of(p, a), 4);  // the cap, spent
  EXPECT_EQ(tokens_of(p, b), 1);
  EXPECT_TRUE(p.preempted.empty());
  EXPECT_FALSE(high->running);
  EXPECT_TRUE(a->running && b->running);
}

TEST(SchedulerTest, AsyncStepCapHoldsWithOrWithoutSync) {
  SchedulerConfig c{16, 64, 64};
  c.max_async_tokens_with_sync = 5;
  Harness h(256, 4, c);
  Sequence* a = h.add(RequestClass::kAsync, 20, 0, 100);  // distinct prompts: no prefix hits
  Sequence* b = h.add(RequestClass::kAsync, 20, 0, 200);
  h.sched.set_async_step_cap(8);
  StepPlan p = h.step();
  EXPECT_EQ(p.num_tokens, 8);  // no sync, yet the prompts go in chunks within the cap
  EXPECT_EQ(tokens_of(p, a), 8);
  Sequence* s = h.add(RequestClass::kSync, 6, 0, 300);
  p = h.step();
  EXPECT_EQ(tokens_of(p, s), 6);   // sync is never capped
  EXPECT_EQ(p.num_tokens, 6 + 5);  // the smaller of the two caps
  h.sched.set_async_step_cap(0);
  s->finished = true;
  h.sched.remove(s);
  p = h.step();
  EXPECT_EQ(p.num_tokens, 20 - 13 + 20);  // both caps off: the rest of a, all of b
  EXPECT_EQ(tokens_of(p, b), 20);
}

// Three async sequences of priority 0 run a step; then one of priority 1 (a catch-up request)
// arrives. Returns the four.
std::array<Sequence*, 4> three_running_then_higher(Harness& h) {
  Sequence* a = h.add(RequestClass::kAsync, 4);
  Sequence* b = h.add(RequestClass::kAsync, 4);
  Sequence* c = h.add(RequestClass::kAsync, 4);
  h.step();
  return {a, b, c, h.add(RequestClass::kAsync, 4, /*priority=*/1)};
}

TEST(SchedulerTest, HigherPriorityAsyncTakesTheSlotItNeedsOnly) {
  // Three slots, all running async work; one of a higher priority (a catch-up request) arrives.
  Harness h(64, 4, {3, 64, 64});
  auto [a, b, c, high] = three_running_then_higher(h);
  StepPlan p = h.step();
  ASSERT_EQ(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0], c);  // the latest
  EXPECT_EQ(tokens_of(p, high), 4);
  EXPECT_TRUE(a->running && b->running && !c->running);
  // When it ends, the preempted one starts again from its tokens.
  high->finished = true;
  h.sched.remove(high);
  p = h.step();
  EXPECT_TRUE(c->running);
  EXPECT_EQ(tokens_of(p, c), 1);  // its prompt's block is in the prefix cache: its token again
}

TEST(SchedulerTest, WithPriorityRunsAloneLowerAsyncWaitsForHigher) {
  SchedulerConfig cfg{4, 64, 64};
  cfg.priority_runs_alone = true;
  Harness h(64, 4, cfg);
  auto [a, b, c, high] = three_running_then_higher(h);
  StepPlan p = h.step();
  // Every lower one makes room, though a slot was free, and none starts while it runs.
  EXPECT_EQ(p.preempted.size(), 3u);
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_EQ(p.seqs[0].seq, high);
  p = h.step();
  ASSERT_EQ(p.seqs.size(), 1u);
  EXPECT_FALSE(a->running || b->running || c->running);
  // A sync request still runs beside it; when the higher one ends, the rest start again.
  Sequence* s = h.add(RequestClass::kSync, 4, 0, 200);
  p = h.step();
  EXPECT_EQ(tokens_of(p, s), 4);
  EXPECT_EQ(tokens_of(p, high), 1);
  high->finished = true;
  h.sched.remove(high);
  p = h.step();
  EXPECT_TRUE(a->running && b->running && c->running);
  EXPECT_EQ(tokens_of(p, a), 1);
}

TEST(SchedulerTest, SyncPrefillStepCarriesNoAsyncTokens) {
  SchedulerConfig c{16, 64, 4};  // prompts in chunks of 4
  c.sync_prefill_alone = true;
  Harness h(256, 4, c);
  Sequence* a = h.add(RequestClass::kAsync, 2);
  Sequence* b = h.add(RequestClass::kAsync, 2);
  h.step();
  Sequence* s = h.add(RequestClass::kSync, 6);
  StepPlan p = h.step();
  EXPECT_EQ(tokens_of(p, s), 4);  // first chunk of the sync prompt, alone
  EXPECT_EQ(p.num_tokens, 4);
  p = h.step();
  EXPECT_EQ(tokens_of(p, s), 2);  // second chunk, still alone
  EXPECT_EQ(p.num_tokens, 2);
  p = h.step();
  EXPECT_EQ(tokens_of(p, s), 1);  // the sync sequence decodes: async runs with it again
  EXPECT_EQ(tokens_of(p, a), 1);
  EXPECT_EQ(tokens_of(p, b), 1);
}

TEST(SchedulerTest, BudgetAndChunkingPerStep) {
  Harness h(64, 4, {8, 6, 4});
  Sequence* s = h.add(RequestClass::kSync, 10);
  std::vector<int> chunks;
  for (int i = 0; i < 4; ++i) {
    StepPlan p = h.step();
    EXPECT_LE(p.num_tokens, 6);
    chunks.push_back(tokens_of(p, s));
  }
  EXPECT_EQ(chunks, (std::vector<int>{4, 4, 2, 1}));  // chunk limit 4, then the decode
  EXPECT_EQ(s->num_computed, 11);
}

TEST(SchedulerTest, SyncArrivalPreemptsLowestPriorityLatestAsync) {
  // 6 blocks of 4 tokens; three async sequences take 2 blocks each.
  Harness h(6, 4, {8, 64, 64});
  Sequence* low_old = h.add(RequestClass::kAsync, 8, /*priority=*/0);
  Sequence* high = h.add(RequestClass::kAsync, 8, /*priority=*/5);
  Sequence* low_new = h.add(RequestClass::kAsync, 8, /*priority=*/0);
  h.step();
  EXPECT_TRUE(low_old->running && high->running && low_new->running);
  EXPECT_EQ(h.blocks.num_available(), 0);
  Sequence* sync = h.add(RequestClass::kSync, 6, 0, /*first_token=*/100);
  StepPlan p = h.step();
  ASSERT_GE(p.preempted.size(), 1u);
  EXPECT_EQ(p.preempted[0], low_new);  // lowest priority, latest arrival
  EXPECT_TRUE(sync->running);
  EXPECT_EQ(tokens_of(p, sync), 6);
  EXPECT_FALSE(low_new->running);
  EXPECT_EQ(low_new->num_computed, 0);
  EXPECT_EQ(low_new->num_preemptions, 1);
  EXPECT_TRUE(high->running);
}

TEST(SchedulerTest, NoRoomIsNotAnErrorAndHeadroomSaysSo) {
  Harness h(2, 4, {1, 64, 64});
  Sequence* a = h.add(RequestClass::kAsync, 6);
  Sequence* b = h.add(RequestClass::kAsync, 6);
  StepPlan p = h.step();
  EXPECT_EQ(tokens_of(p, a), 6);
  EXPECT_EQ(tokens_of(p, b), 0);  // no free slot: b waits
  Headroom hr = h.sched.headroom();
  EXPECT_EQ(hr.free_seq_slots, 0);
  EXPECT_EQ(hr.waiting_async, 1);
  EXPECT_EQ(hr.running_async, 1);
  EXPECT_EQ(hr.total_kv_blocks, 2);
}

TEST(SchedulerTest, PrefixCacheReusesFullBlocksAndLeavesTheLastToken) {
  Harness h(16, 4, {4, 64, 64});
  Sequence* a = h.add(RequestClass::kSync, 9);
  h.step();
  h.sched.remove(a);  // a's two full blocks stay cached
  EXPECT_EQ(h.blocks.num_cached(), 2);
  Sequence* b = h.add(RequestClass::kSync, 9);  // same tokens
  StepPlan p = h.step();
  EXPECT_EQ(b->num_cached_prompt, 8);
  EXPECT_EQ(tokens_of(p, b), 1);
  Sequence* c = h.add(RequestClass::kSync, 8);  // exactly two blocks: the last must be recomputed
  p = h.step();
  EXPECT_EQ(c->num_cached_prompt, 4);
  EXPECT_EQ(tokens_of(p, c), 4);
}

TEST(BlockManagerTest, LruEvictionOnlyWhenNeeded) {
  BlockManager bm(3, 2);
  std::vector<int32_t> t = {1, 2, 3, 4};
  auto b0 = *bm.allocate();
  auto b1 = *bm.allocate();
  uint64_t h0 = bm.commit_full(b0, 0, t.data());
  bm.commit_full(b1, h0, t.data() + 2);
  bm.release({b0, b1});
  EXPECT_EQ(bm.num_available(), 3);
  EXPECT_EQ(bm.num_cached(), 2);
  auto fresh = bm.allocate();  // the free block first, no eviction
  ASSERT_TRUE(fresh.has_value());
  EXPECT_EQ(bm.num_cached(), 2);
  auto evicting = bm.allocate();  // now the least recently used cached block goes
  ASSERT_TRUE(evicting.has_value());
  EXPECT_EQ(*evicting, b0);
  EXPECT_EQ(bm.num_cached(), 1);
  std::vector<int> blocks;
  std::vector<uint64_t> hashes;
  EXPECT_EQ(bm.acquire_prefix(t, 4, CacheChain::own(0), &blocks, &hashes),
            0);  // the chain starts at the evicted block
}

}  // namespace
}  // namespace hr::engine
