// The inference engine: requests in, tokens out. Each step() plans a batch with the scheduler,
// runs it on the backend, samples, streams text deltas through callbacks, and finishes requests
// on EOS, stop tokens, stop strings or max_tokens. Owned and driven by one thread (the worker's
// step loop); the callbacks run on that thread.
#pragma once

#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "engine/backend.h"
#include "engine/block_manager.h"
#include "engine/scheduler.h"
#include "engine/tokenizer.h"
#include "grammar/compiled_grammar.h"
#include "grammar/matcher.h"

namespace hr::engine {

// kError: the backend gave no valid token for the sequence (its logits were not finite); the
// final event's `error` says so.
enum class FinishReason { kNone, kStop, kLength, kCancelled, kError };
const char* finish_reason_name(FinishReason r);

struct Usage {
  int prompt_tokens = 0;
  int completion_tokens = 0;
  int cached_tokens = 0;
};

struct TokenEvent {
  int64_t id = 0;
  int32_t token = -1;      // -1 for the final event of a cancelled request
  std::string text_delta;  // complete UTF-8, stop strings removed
  // The bytes of text this token decoded to, before any was held back for a stop string (and with
  // what the decoder had left, at a final event by length): text_delta adds up to the sum of
  // these, less what a stop string cut off (or, for a cancelled request, what was held back). 0 for
  // a token without text of its own (a special token, or the first bytes of a character that a
  // later token completes).
  int text_bytes = 0;
  bool finished = false;
  FinishReason finish_reason = FinishReason::kNone;
  Usage usage;        // filled on the final event
  std::string error;  // with FinishReason::kError
  // With SamplingParams::logprobs >= 0: the token's log probabilities, valid during the callback.
  // Not given for a token that ends the answer without being part of it (EOS, a stop token).
  const TokenLogprobs* logprobs = nullptr;
};

struct GenerationRequest {
  std::vector<int32_t> prompt;
  SamplingParams params;
  RequestClass cls = RequestClass::kSync;
  int priority = 0;
  // Whose request it is (an account): cached prompt blocks are shared only among requests of one
  // namespace, so that no one learns from cache hits (cached_tokens, latency) what another has
  // sent. Empty: the shared namespace.
  std::string cache_namespace;
  // Structured output: the answer is a document of this constraint (each step's tokens masked to
  // those it allows, the stop token only where the document is complete). Null: free text.
  std::shared_ptr<grammar::CompiledGrammar> constraint;
  std::function<void(const TokenEvent&)> on_event;
};

struct EngineOptions {
  SchedulerConfig scheduler;
  int max_model_len = 0;  // 0: the model's max_position_embeddings
  // With a pipelined backend (Backend::pipelined), plan and submit step N+1 before collecting step
  // N, so that the host's work overlaps the device's: sequences sampled in step N are planned with
  // their next token fed on the device. A sequence that finishes at step N has had one more token
  // computed in step N+1, which is dropped. With a backend that runs steps of disjoint sequences
  // at once (Backend::step_groups), keep that many in flight instead, none fed from another.
  bool pipeline = true;
  // Prompt beginnings the operator made public (tokens: a shared system prompt as the chat
  // template renders it): a prompt that starts with one shares that prefix's full KV blocks with
  // every account's; what follows stays the account's own (CacheChain). Nothing else is shared
  // across accounts.
  std::vector<std::vector<int32_t>> public_prefixes;
};

// A step() submits one step and, when pipelined, collects the one before (with steps of disjoint
// sequences in flight, the oldest, once as many are in flight as the backend runs at once, or
// when nothing is left to plan): the counts describe the step submitted; num_collected_tokens and
// num_finished the steps collected (those whose device time the call waited for).
struct StepStats {
  int num_seqs = 0;
  int num_tokens = 0;
  int num_prefill_tokens = 0;
  int num_decode_tokens = 0;
  int num_preempted = 0;
  int num_finished = 0;
  int num_collected_tokens = 0;
  // Time step() spent waiting in the backend's collect() for the device: the rest of a call is
  // host work (planning, packing, queueing, token handling).
  int64_t wait_ns = 0;
};

class Engine {
 public:
  // `tokenizer` may be null (then no text deltas or stop strings).
  [[nodiscard]] static Result<std::unique_ptr<Engine>> create(
      std::shared_ptr<Backend> backend, std::shared_ptr<const Tokenizer> tokenizer,
      int max_position_embeddings, EngineOptions options);

  // Queues a request; its id. Errors for an empty or too long prompt (naming the field).
  [[nodiscard]] Result<int64_t> add(GenerationRequest request);
  // Finishes the request now (its final event says kCancelled). Unknown ids are ignored.
  void cancel(int64_t id);
  // Ends every request now with kError and `error` (the engine cannot go on: its device keeps
  // failing), dropping any step under way.
  void fail_all(const std::string& error);
  // Runs one step; an empty plan (nothing to do) is not an error. After a failed step, the steps
  // under way are dropped and every sequence is planned again from the tokens the host has (a
  // token lost with a failed step is computed and sampled again).
  [[nodiscard]] Result<StepStats> step();
  bool has_work() const { return scheduler_.has_work() || !in_flight_.empty(); }
  // Lets the backend prepare for this engine's steps before serving (the CUDA backend captures
  // its decode graphs). Call with no step under way.
  [[nodiscard]] Status warm_up() { return backend_->warm_up(max_blocks_per_seq()); }
  // Whether steps are pipelined (EngineOptions::pipeline and a pipelined backend).
  bool pipelined() const { return pipeline_; }
  // Steps of disjoint sequences kept in flight (EngineOptions::pipeline and the backend's
  // step_groups()); 1: one step, or two with the next fed from the first.
  int step_groups() const { return groups_; }
  Headroom headroom() const { return scheduler_.headroom(); }
  // See Scheduler::set_sync_expected.
  void set_sync_expected(bool expected) { scheduler_.set_sync_expected(expected); }
  // See Scheduler::set_async_step_cap.
  void set_async_step_cap(int tokens) { scheduler_.set_async_step_cap(tokens); }
  const BlockManager& blocks() const { return blocks_; }
  const Backend& backend() const { return *backend_; }
  // From any thread, while a step may be blocked: Backend::abort (the engine is lost after it).
  bool abort_backend(const std::string& reason) { return backend_->abort(reason); }
  int num_active() const { return static_cast<int>(active_.size()); }
  // The longest sequence, prompt and answer, in tokens.
  int context_length() const { return max_model_len_; }

 private:
  struct Active {
    std::unique_ptr<Sequence> seq;
    std::function<void(const TokenEvent&)> on_event;
    std::unique_ptr<StreamDecoder> decoder;
    std::string held;   // text held back: it may be the start of a stop string
    std::string error;  // why it ends with kError
    std::unique_ptr<grammar::Matcher> matcher;  // a constrained answer's place in its document
  };
  // A submitted step: its plan (pointers valid only while the id is active), in logits-row order
  // the ids of the sequences it samples, and its token count.
  struct Submitted {
    std::vector<ScheduledSeq> seqs;
    std::vector<int64_t> ids;
    std::vector<int64_t> sampled;
    int num_tokens = 0;
  };
  Engine(std::shared_ptr<Backend> backend, std::shared_ptr<const Tokenizer> tokenizer,
         int max_model_len, EngineOptions options);
  // The widest block table a step may have: room for the longest sequence.
  int max_blocks_per_seq() const {
    return (max_model_len_ + blocks_.block_size() - 1) / blocks_.block_size() + 1;
  }
  // Builds the plan's inputs and submits them; marks the sampled sequences' tokens pending. With
  // `masks_later`, constrained rows get no mask yet and only the forward pass is submitted:
  // submit_masks() submits the sampling once the tokens they follow are known.
  [[nodiscard]] Result<Submitted> submit(const StepPlan& plan, StepStats* stats,
                                         bool masks_later = false);
  // The token masks of the rows submit() left (from their matchers as they are now), and the
  // step's sampling.
  [[nodiscard]] Status submit_masks();
  // Whether the step in flight samples a token that a constrained sequence waits for.
  bool constrained_in_flight() const;
  // step() with steps of disjoint sequences in flight (groups_ > 1).
  [[nodiscard]] Result<StepStats> step_in_groups();
  // Collects the oldest step in flight and advances its sequences (recovering on failure).
  [[nodiscard]] Status collect_oldest(StepStats* stats);
  // The scheduler's complete() for the step's sequences that are still active.
  void complete(const Submitted& sub);
  // Appends the collected tokens (sampled_) to the sequences still active.
  void advance_all(const Submitted& sub, StepStats* stats);
  // Waits for `sub`'s tokens into sampled_ (the wait counted in stats->wait_ns).
  [[nodiscard]] Status collect(const Submitted& sub, StepStats* stats);
  // Collects the step in flight (pipelined), when a constrained sequence waits for its token: its
  // next mask depends on it.
  [[nodiscard]] Status collect_for_constraints(StepStats* stats);
  // After a failure: drops every step in flight and `step` (not null: one submitted but no longer
  // in flight), and plans their sequences from what the host knows.
  Status recover(Status failure, const Submitted* step = nullptr);
  // Appends the sampled token (its log probabilities, when asked for, in `logprobs`); returns
  // true when the request finished.
  bool advance(Active& a, int32_t token, const TokenLogprobs* logprobs);
  void finish(Active& a, FinishReason reason, int32_t token, std::string delta,
              const TokenLogprobs* logprobs = nullptr, int text_bytes = 0);

  std::shared_ptr<Backend> backend_;
  std::shared_ptr<const Tokenizer> tokenizer_;
  int max_model_len_;
  EngineOptions options_;
  BlockManager blocks_;
  Scheduler scheduler_;
  std::unordered_map<int64_t, Active> active_;
  int64_t next_id_ = 1;
  int64_t next_arrival_ = 0;
  // Step buffers, reused.
  bool pipeline_;
  int groups_;
  // Submitted, not collected, oldest first: at most one when pipelined, groups_ with groups.
  std::deque<Submitted> in_flight_;
  std::vector<int32_t> token_ids_, positions_, seq_start_, block_table_, logits_rows_, fed_rows_;
  std::vector<SampleSpec> specs_;
  std::vector<PenaltyToken> penalty_tokens_;  // the specs' penalty lists, one after another
  std::vector<uint32_t> masks_;               // the specs' token masks, one after another
  // Rows whose masks wait for the step in flight: (spec index, sequence id).
  std::vector<std::pair<size_t, int64_t>> late_masks_;
  std::vector<int32_t> sampled_;
  std::vector<TokenLogprobs> sampled_logprobs_;
};

}  // namespace hr::engine
