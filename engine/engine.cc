// The engine's step loop.
#include "engine/engine.h"

#include <algorithm>

#include "base/clock.h"

namespace hr::engine {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kLength:
      return "length";
    case FinishReason::kCancelled:
      return "cancelled";
    case FinishReason::kError:
      return "error";
    case FinishReason::kNone:
      return "";
  }
  return "";
}

Result<std::unique_ptr<Engine>> Engine::create(std::shared_ptr<Backend> backend,
                                               std::shared_ptr<const Tokenizer> tokenizer,
                                               int max_position_embeddings, EngineOptions options) {
  if (options.scheduler.max_num_seqs < 1 || options.scheduler.max_batched_tokens < 1 ||
      options.scheduler.max_prefill_chunk < 1) {
    return invalid_argument("scheduler limits must be positive", "max-num-seqs");
  }
  int max_len = options.max_model_len > 0 ? std::min(options.max_model_len, max_position_embeddings)
                                          : max_position_embeddings;
  // No sequence may need more KV than the whole cache: one that did would wait for a block forever
  // (and hold up everything queued behind it). It ends with kLength at this size instead.
  max_len = static_cast<int>(
      std::min<int64_t>(max_len, int64_t{backend->num_kv_blocks()} * backend->block_size()));
  return std::unique_ptr<Engine>(
      new Engine(std::move(backend), std::move(tokenizer), max_len, options));
}

Engine::Engine(std::shared_ptr<Backend> backend, std::shared_ptr<const Tokenizer> tokenizer,
               int max_model_len, EngineOptions options)
    : backend_(std::move(backend)),
      tokenizer_(std::move(tokenizer)),
      max_model_len_(max_model_len),
      options_(options),
      blocks_(backend_->num_kv_blocks(), backend_->block_size()),
      scheduler_(options.scheduler, &blocks_),
      pipeline_(options.pipeline && backend_->pipelined()),
      groups_(options.pipeline ? std::max(1, backend_->step_groups()) : 1) {
  scheduler_.set_step_groups(groups_);
}

Result<int64_t> Engine::add(GenerationRequest r) {
  if (r.prompt.empty()) return invalid_argument("the prompt is empty", "prompt");
  int prompt_len = static_cast<int>(r.prompt.size());
  if (prompt_len >= max_model_len_) {
    return invalid_argument("the prompt has " + std::to_string(prompt_len) +
                                " tokens; the model's context is " + std::to_string(max_model_len_),
                            "messages");
  }
  int max_blocks = blocks_.num_blocks() * blocks_.block_size();
  if (prompt_len + 1 > max_blocks) {
    return invalid_argument("the prompt does not fit in the KV cache", "messages");
  }
  for (int32_t t : r.prompt) {
    if (t < 0 || t >= backend_->vocab_size())
      return invalid_argument("token id out of range", "prompt");
  }
  if (r.params.max_tokens < 1)
    return invalid_argument("max_tokens must be at least 1", "max_tokens");
  auto seq = std::make_unique<Sequence>();
  seq->id = next_id_++;
  seq->cls = r.cls;
  seq->priority = r.priority;
  seq->arrival = next_arrival_++;
  seq->tokens = std::move(r.prompt);
  seq->num_prompt = prompt_len;
  seq->max_length = max_model_len_;
  seq->params = std::move(r.params);
  seq->cache_chain = CacheChain::own(BlockManager::namespace_root(r.cache_namespace));
  // A public prefix: its full blocks (those made of its tokens alone) chain from the public root.
  int public_tokens = 0;
  for (const std::vector<int32_t>& p : options_.public_prefixes) {
    const size_t n = std::min(p.size(), seq->tokens.size());
    const size_t same = static_cast<size_t>(
        std::mismatch(p.begin(), p.begin() + static_cast<ptrdiff_t>(n), seq->tokens.begin()).first -
        p.begin());
    public_tokens = std::max(public_tokens, static_cast<int>(same));
  }
  if (const int shared = public_tokens / blocks_.block_size(); shared > 0) {
    seq->cache_chain.root = CacheChain::kPublicRoot;
    seq->cache_chain.shared_blocks = shared;
  }
  seq->rng.seed(seq->params.seed ? *seq->params.seed : std::random_device{}());
  if (seq->params.penalties.repetition != 1.0f) {
    for (int32_t t : seq->tokens) seq->note_seen(t, 0);
  }
  Active a;
  a.on_event = std::move(r.on_event);
  if (r.constraint) a.matcher = std::make_unique<grammar::Matcher>(std::move(r.constraint));
  if (tokenizer_) a.decoder = std::make_unique<StreamDecoder>(*tokenizer_);
  a.seq = std::move(seq);
  int64_t id = a.seq->id;
  scheduler_.add(a.seq.get());
  active_.emplace(id, std::move(a));
  return id;
}

void Engine::cancel(int64_t id) {
  auto it = active_.find(id);
  if (it == active_.end()) return;
  finish(it->second, FinishReason::kCancelled, -1, "");
  active_.erase(it);
}

void Engine::fail_all(const std::string& error) {
  backend_->discard();
  in_flight_.clear();
  for (auto& [id, a] : active_) {
    a.error = error;
    finish(a, FinishReason::kError, -1, "");
  }
  active_.clear();
  // The steps that failed may have left cached blocks without their K/V: a later request must not
  // reuse them.
  blocks_.forget_cached();
}

void Engine::finish(Active& a, FinishReason reason, int32_t token, std::string delta,
                    const TokenLogprobs* logprobs, int text_bytes) {
  Sequence& s = *a.seq;
  scheduler_.remove(&s);
  s.finished = true;
  TokenEvent ev;
  ev.id = s.id;
  ev.token = token;
  ev.text_delta = std::move(delta);
  ev.finished = true;
  ev.finish_reason = reason;
  ev.usage.prompt_tokens = s.num_prompt;
  ev.usage.completion_tokens = s.num_generated();
  ev.usage.cached_tokens = std::max(0, s.num_cached_prompt);
  ev.error = std::move(a.error);
  ev.logprobs = logprobs;
  ev.text_bytes = text_bytes;
  if (a.on_event) a.on_event(ev);
}

bool Engine::advance(Active& a, int32_t token, const TokenLogprobs* logprobs) {
  Sequence& s = *a.seq;
  s.tokens.push_back(token);
  const SamplingParams& p = s.params;
  if (p.penalties.any()) s.note_seen(token, 1);
  bool eos = !p.ignore_eos && tokenizer_ &&
             std::find(tokenizer_->eos_ids().begin(), tokenizer_->eos_ids().end(), token) !=
                 tokenizer_->eos_ids().end();
  bool stop_token =
      std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) != p.stop_token_ids.end();
  if (a.matcher && !a.matcher->accept(token)) {
    // The mask allowed only what the constraint takes: a backend that sampled outside it failed.
    a.error = "the " + std::string(backend_->name()) + " backend sampled token " +
              std::to_string(token) + ", which the answer's constraint does not allow";
    finish(a, FinishReason::kError, token, "");
    return true;
  }
  std::string delta;
  if (a.decoder && !eos && !stop_token) delta = a.decoder->push(token);
  const int text_bytes = static_cast<int>(delta.size());
  if (eos || stop_token) {
    // What the decoder still holds is part of a character the answer never finished: it ends as
    // U+FFFD, as at max_tokens.
    const std::string flushed = a.decoder ? a.decoder->flush() : "";
    finish(a, FinishReason::kStop, token, a.held + flushed, nullptr,
           static_cast<int>(flushed.size()));
    return true;
  }
  // Stop strings: emit text only once it cannot be the start of a stop string.
  if (!p.stop.empty()) {
    a.held += delta;
    delta.clear();
    for (const std::string& stop : p.stop) {
      size_t at = a.held.find(stop);
      if (at != std::string::npos) {
        finish(a, FinishReason::kStop, token, a.held.substr(0, at), logprobs, text_bytes);
        return true;
      }
    }
    size_t keep = 0;
    for (const std::string& stop : p.stop) {
      for (size_t k = std::min(stop.size() - 1, a.held.size()); k > keep; --k) {
        if (a.held.compare(a.held.size() - k, k, stop, 0, k) == 0) {
          keep = k;
          break;
        }
      }
    }
    delta = a.held.substr(0, a.held.size() - keep);
    a.held.erase(0, a.held.size() - keep);
  }
  if (s.num_generated() >= p.max_tokens || static_cast<int>(s.tokens.size()) >= max_model_len_) {
    const std::string flushed = a.decoder ? a.decoder->flush() : "";
    std::string rest = delta + a.held + flushed;
    finish(a, FinishReason::kLength, token, rest, logprobs,
           text_bytes + static_cast<int>(flushed.size()));
    return true;
  }
  if (a.on_event) {
    TokenEvent ev;
    ev.id = s.id;
    ev.token = token;
    ev.text_delta = std::move(delta);
    ev.text_bytes = text_bytes;
    ev.logprobs = logprobs;
    a.on_event(ev);
  }
  return false;
}

Result<Engine::Submitted> Engine::submit(const StepPlan& plan, StepStats* stats, bool masks_later) {
  // Block tables as wide as this step's longest sequence: a long allowed context costs nothing
  // until some sequence uses it.
  int max_blocks = 1;
  for (const ScheduledSeq& ss : plan.seqs)
    max_blocks = std::max(max_blocks, static_cast<int>(ss.seq->blocks.size()));
  const int num_seqs = static_cast<int>(plan.seqs.size());
  token_ids_.clear();
  positions_.clear();
  logits_rows_.clear();
  fed_rows_.clear();
  specs_.clear();
  penalty_tokens_.clear();
  masks_.clear();
  late_masks_.clear();
  std::vector<std::pair<size_t, size_t>> mask_of;  // (spec index, offset in masks_)
  bool any_fed = false;
  seq_start_.assign(static_cast<size_t>(num_seqs) + 1, 0);
  block_table_.assign(static_cast<size_t>(num_seqs) * max_blocks, 0);
  for (int i = 0; i < num_seqs; ++i) {
    const ScheduledSeq& ss = plan.seqs[static_cast<size_t>(i)];
    Sequence& s = *ss.seq;
    seq_start_[static_cast<size_t>(i)] = static_cast<int32_t>(token_ids_.size());
    for (int k = 0; k < ss.num_tokens; ++k) {
      const int pos = s.num_computed + k;
      if (pos < static_cast<int>(s.tokens.size())) {
        token_ids_.push_back(s.tokens[static_cast<size_t>(pos)]);
        fed_rows_.push_back(-1);
      } else {
        // The token the running step samples for this sequence.
        token_ids_.push_back(0);
        fed_rows_.push_back(s.pending_row);
        any_fed = true;
      }
      positions_.push_back(pos);
    }
    std::copy(s.blocks.begin(), s.blocks.end(),
              block_table_.begin() + static_cast<long>(i) * max_blocks);
    if (ss.sample) {
      logits_rows_.push_back(static_cast<int32_t>(token_ids_.size()) - 1);
      SampleSpec spec;
      spec.temperature = s.params.temperature;
      spec.top_p = s.params.top_p;
      spec.top_k = s.params.top_k;
      spec.random = s.rng();
      spec.logprobs = s.params.logprobs;
      spec.logit_bias = s.params.logit_bias.data();
      spec.num_logit_bias = static_cast<int>(s.params.logit_bias.size());
      if (s.params.penalties.any()) {
        spec.penalties = s.params.penalties;
        // The lists go one after another; pointers are set once the buffer stops moving.
        penalty_tokens_.insert(penalty_tokens_.end(), s.penalty_list.begin(), s.penalty_list.end());
        spec.num_penalty_tokens = static_cast<int>(s.penalty_list.size());
        // The row's input token was sampled by the step still running: counted on the device.
        spec.penalize_input = fed_rows_.back() >= 0;
      }
      if (auto it = active_.find(s.id); it != active_.end() && it->second.matcher && masks_later) {
        late_masks_.push_back({specs_.size(), s.id});
      } else if (it != active_.end() && it->second.matcher) {
        grammar::Matcher& m = *it->second.matcher;
        HR_CHECK(s.num_pending == 0) << "a constrained sequence planned before its token is known";
        const size_t at = masks_.size();
        masks_.resize(at + static_cast<size_t>(m.mask_words()));
        const int remaining = std::min(s.params.max_tokens - s.num_generated(),
                                       max_model_len_ - static_cast<int>(s.tokens.size()));
        m.fill_mask(std::max(1, remaining), masks_.data() + at);
        mask_of.push_back({specs_.size(), at});
      }
      specs_.push_back(spec);
    }
    (s.num_computed >= s.num_prompt ? stats->num_decode_tokens : stats->num_prefill_tokens) +=
        ss.num_tokens;
  }
  seq_start_[static_cast<size_t>(num_seqs)] = static_cast<int32_t>(token_ids_.size());
  size_t listed = 0;
  for (SampleSpec& spec : specs_) {
    if (!spec.penalties.any()) continue;
    spec.penalty_tokens = penalty_tokens_.data() + listed;
    listed += static_cast<size_t>(spec.num_penalty_tokens);
  }
  for (auto [spec, at] : mask_of) specs_[spec].allowed = masks_.data() + at;
  StepInput in;
  in.num_tokens = static_cast<int>(token_ids_.size());
  in.num_seqs = num_seqs;
  in.token_ids = token_ids_.data();
  in.positions = positions_.data();
  in.seq_start = seq_start_.data();
  in.block_table = block_table_.data();
  in.max_blocks_per_seq = max_blocks;
  in.logits_rows = logits_rows_.data();
  in.num_logits = static_cast<int>(logits_rows_.size());
  in.fed_rows = any_fed ? fed_rows_.data() : nullptr;
  if (late_masks_.empty()) {
    HR_RETURN_IF_ERROR(backend_->submit(in, specs_.data()));
  } else {
    HR_RETURN_IF_ERROR(backend_->submit_forward(in));
  }
  stats->num_seqs = num_seqs;
  stats->num_tokens = in.num_tokens;
  Submitted sub;
  sub.seqs = plan.seqs;
  sub.num_tokens = in.num_tokens;
  for (const ScheduledSeq& ss : plan.seqs) {
    sub.ids.push_back(ss.seq->id);
    if (!ss.sample) continue;
    ss.seq->pending_row = static_cast<int>(sub.sampled.size());
    ++ss.seq->num_pending;
    sub.sampled.push_back(ss.seq->id);
  }
  return sub;
}

Status Engine::submit_masks() {
  // Every mask first, then the pointers: masks_ may move as it grows.
  std::vector<std::pair<size_t, size_t>> mask_of;  // (spec index, offset in masks_)
  for (auto [spec, id] : late_masks_) {
    auto it = active_.find(id);
    // A sequence that ended at the step before samples in vain, unconstrained: its token is
    // dropped.
    if (it == active_.end() || !it->second.matcher) continue;
    grammar::Matcher& m = *it->second.matcher;
    const Sequence& s = *it->second.seq;
    const size_t at = masks_.size();
    masks_.resize(at + static_cast<size_t>(m.mask_words()));
    const int remaining = std::min(s.params.max_tokens - s.num_generated(),
                                   max_model_len_ - static_cast<int>(s.tokens.size()));
    m.fill_mask(std::max(1, remaining), masks_.data() + at);
    mask_of.push_back({spec, at});
  }
  for (auto [spec, at] : mask_of) specs_[spec].allowed = masks_.data() + at;
  late_masks_.clear();
  return backend_->submit_sampling(specs_.data());
}

bool Engine::constrained_in_flight() const {
  if (in_flight_.empty()) return false;
  for (int64_t id : in_flight_.back().sampled) {
    auto it = active_.find(id);
    if (it != active_.end() && it->second.matcher) return true;
  }
  return false;
}

void Engine::complete(const Submitted& sub) {
  StepPlan alive;
  for (size_t i = 0; i < sub.seqs.size(); ++i) {
    if (active_.count(sub.ids[i])) alive.seqs.push_back(sub.seqs[i]);
  }
  scheduler_.complete(alive);
}

void Engine::advance_all(const Submitted& sub, StepStats* stats) {
  stats->num_collected_tokens += sub.num_tokens;
  for (size_t row = 0; row < sub.sampled.size(); ++row) {
    auto it = active_.find(sub.sampled[row]);
    if (it == active_.end()) continue;  // finished at the step before, or cancelled
    --it->second.seq->num_pending;
    const int32_t token = sampled_[row];
    if (token < 0 || token >= backend_->vocab_size()) {
      // No token to continue from (a row of NaN logits, say): this sequence ends in an error and
      // the others go on. A step already fed from the row computed for it in vain.
      it->second.error = "the " + std::string(backend_->name()) + " backend gave no valid token (" +
                         std::to_string(token) + "): its logits for this sequence were not finite";
      finish(it->second, FinishReason::kError, -1, "");
      active_.erase(it);
      ++stats->num_finished;
      continue;
    }
    const TokenLogprobs* logprobs =
        it->second.seq->params.logprobs >= 0 ? &sampled_logprobs_[row] : nullptr;
    if (advance(it->second, token, logprobs)) {
      active_.erase(it);
      ++stats->num_finished;
    }
  }
}

Status Engine::recover(Status failure, const Submitted* step) {
  backend_->discard();
  std::vector<const Submitted*> steps;
  for (const Submitted& sub : in_flight_) steps.push_back(&sub);
  if (step) steps.push_back(step);
  for (const Submitted* sub : steps) {
    for (int64_t id : sub->sampled) {
      auto it = active_.find(id);
      if (it == active_.end()) continue;
      Sequence& s = *it->second.seq;
      s.num_pending = 0;
      s.pending_row = -1;
      // A sequence whose every known token is computed has lost the token it was waiting for:
      // compute its last token again to sample it again. (Its other tokens of the dropped steps
      // count as computed: the device that failed to return tokens is trusted with their K/V.)
      s.num_computed = std::min(s.num_computed, static_cast<int>(s.tokens.size()) - 1);
    }
  }
  in_flight_.clear();
  return failure;
}

Status Engine::collect(const Submitted& sub, StepStats* stats) {
  sampled_.resize(sub.sampled.size());
  sampled_logprobs_.resize(sub.sampled.size());
  const int64_t wait_start = steady_now_ns();
  Status collected = backend_->collect(sampled_.data(), sampled_logprobs_.data());
  stats->wait_ns += steady_now_ns() - wait_start;
  return collected;
}

Status Engine::collect_oldest(StepStats* stats) {
  Status collected = collect(in_flight_.front(), stats);
  if (!collected.is_ok()) return recover(collected);
  Submitted done = std::move(in_flight_.front());
  in_flight_.pop_front();
  advance_all(done, stats);
  return Status::ok();
}

Status Engine::collect_for_constraints(StepStats* stats) {
  if (!constrained_in_flight()) return Status::ok();
  return collect_oldest(stats);
}

Result<StepStats> Engine::step_in_groups() {
  StepStats stats;
  // Every group has a step in flight: the oldest one's sequences wait for its tokens.
  if (static_cast<int>(in_flight_.size()) >= groups_) HR_RETURN_IF_ERROR(collect_oldest(&stats));
  // Sequences whose tokens are on the way are left out (Scheduler::set_step_groups): every token
  // planned is known, constrained rows' masks included. The step takes its share of the tokens.
  int tokens_in_flight = 0;
  for (const Submitted& s : in_flight_) tokens_in_flight += s.num_tokens;
  scheduler_.set_tokens_in_flight(tokens_in_flight);
  StepPlan plan = scheduler_.schedule();
  stats.num_preempted = static_cast<int>(plan.preempted.size());
  if (plan.empty()) {
    if (!in_flight_.empty()) HR_RETURN_IF_ERROR(collect_oldest(&stats));
    return stats;
  }
  auto submitted = submit(plan, &stats);
  if (!submitted.is_ok()) return recover(submitted.status());
  complete(*submitted);
  in_flight_.push_back(std::move(submitted).value());
  return stats;
}

Result<StepStats> Engine::step() {
  if (groups_ > 1) return step_in_groups();
  StepStats stats;
  // A constrained sequence's mask needs the token the step in flight samples. A backend that
  // splits its steps runs the next forward pass meanwhile and samples it once the masks are
  // filled from the collected tokens; another waits for that token first (such steps then do not
  // overlap the host's work with the device's).
  const bool masks_later = pipeline_ && backend_->splits_sampling() && constrained_in_flight();
  if (!masks_later) HR_RETURN_IF_ERROR(collect_for_constraints(&stats));
  StepPlan plan = scheduler_.schedule();
  stats.num_preempted = static_cast<int>(plan.preempted.size());
  std::optional<Submitted> cur;
  if (!plan.empty()) {
    auto submitted = submit(plan, &stats, masks_later);
    // The step in flight may be what the failed one was to be fed from: drop it too.
    if (!submitted.is_ok()) return recover(submitted.status());
    cur = std::move(submitted).value();
  }
  if (!pipeline_) {
    if (!cur) return stats;
    Status collected = collect(*cur, &stats);
    if (!collected.is_ok()) return recover(collected, &*cur);
    complete(*cur);
    advance_all(*cur, &stats);
    return stats;
  }
  // Pipelined: `cur` runs after the step in flight, whose tokens are collected now; then `cur`'s
  // tokens are all known to the host (fed ones included) and it can be completed.
  if (!in_flight_.empty()) {
    Status collected = collect(in_flight_.front(), &stats);
    if (!collected.is_ok()) return recover(collected, cur ? &*cur : nullptr);
    Submitted prev = std::move(in_flight_.front());
    in_flight_.pop_front();
    advance_all(prev, &stats);
  }
  if (cur && !late_masks_.empty()) {
    Status sampling = submit_masks();
    if (!sampling.is_ok()) return recover(sampling, &*cur);
  }
  if (cur) {
    complete(*cur);
    in_flight_.push_back(std::move(*cur));
  }
  return stats;
}

}  // namespace hr::engine
