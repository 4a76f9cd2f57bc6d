// The engine's step loop.
#include "engine/engine.h"

#include <algorithm>

namespace hr::engine {

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength: return "length";
    case FinishReason::kCancelled: return "cancelled";
    case FinishReason::kNone: return "";
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
  return std::unique_ptr<Engine>(new Engine(std::move(backend), std::move(tokenizer), max_len, options));
}

Engine::Engine(std::shared_ptr<Backend> backend, std::shared_ptr<const Tokenizer> tokenizer,
               int max_model_len, EngineOptions options)
    : backend_(std::move(backend)), tokenizer_(std::move(tokenizer)), max_model_len_(max_model_len),
      options_(options), blocks_(backend_->num_kv_blocks(), backend_->block_size()),
      scheduler_(options.scheduler, &blocks_) {}

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
    if (t < 0 || t >= backend_->vocab_size()) return invalid_argument("token id out of range", "prompt");
  }
  if (r.params.max_tokens < 1) return invalid_argument("max_tokens must be at least 1", "max_tokens");
  auto seq = std::make_unique<Sequence>();
  seq->id = next_id_++;
  seq->cls = r.cls;
  seq->priority = r.priority;
  seq->arrival = next_arrival_++;
  seq->tokens = std::move(r.prompt);
  seq->num_prompt = prompt_len;
  seq->params = std::move(r.params);
  seq->rng.seed(seq->params.seed ? *seq->params.seed : std::random_device{}());
  Active a;
  a.on_event = std::move(r.on_event);
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

void Engine::finish(Active& a, FinishReason reason, int32_t token, std::string delta) {
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
  if (a.on_event) a.on_event(ev);
}

bool Engine::advance(Active& a, int32_t token) {
  Sequence& s = *a.seq;
  s.tokens.push_back(token);
  const SamplingParams& p = s.params;
  bool eos = !p.ignore_eos && tokenizer_ &&
             std::find(tokenizer_->eos_ids().begin(), tokenizer_->eos_ids().end(), token) !=
                 tokenizer_->eos_ids().end();
  bool stop_token = std::find(p.stop_token_ids.begin(), p.stop_token_ids.end(), token) !=
                    p.stop_token_ids.end();
  std::string delta;
  if (a.decoder && !eos && !stop_token) delta = a.decoder->push(token);
  if (eos || stop_token) {
    finish(a, FinishReason::kStop, token, a.held);
    return true;
  }
  // Stop strings: emit text only once it cannot be the start of a stop string.
  if (!p.stop.empty()) {
    a.held += delta;
    delta.clear();
    for (const std::string& stop : p.stop) {
      size_t at = a.held.find(stop);
      if (at != std::string::npos) {
        finish(a, FinishReason::kStop, token, a.held.substr(0, at));
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
    std::string rest = delta + a.held + (a.decoder ? a.decoder->flush() : "");
    finish(a, FinishReason::kLength, token, rest);
    return true;
  }
  if (a.on_event) {
    TokenEvent ev;
    ev.id = s.id;
    ev.token = token;
    ev.text_delta = std::move(delta);
    a.on_event(ev);
  }
  return false;
}

Result<StepStats> Engine::step() {
  StepStats stats;
  StepPlan plan = scheduler_.schedule();
  stats.num_preempted = static_cast<int>(plan.preempted.size());
  if (plan.empty()) return stats;
  const int max_blocks = (max_model_len_ + blocks_.block_size() - 1) / blocks_.block_size() + 1;
  const int num_seqs = static_cast<int>(plan.seqs.size());
  token_ids_.clear();
  positions_.clear();
  logits_rows_.clear();
  seq_start_.assign(static_cast<size_t>(num_seqs) + 1, 0);
  block_table_.assign(static_cast<size_t>(num_seqs) * max_blocks, 0);
  for (int i = 0; i < num_seqs; ++i) {
    const ScheduledSeq& ss = plan.seqs[static_cast<size_t>(i)];
    const Sequence& s = *ss.seq;
    seq_start_[static_cast<size_t>(i)] = static_cast<int32_t>(token_ids_.size());
    for (int k = 0; k < ss.num_tokens; ++k) {
      int pos = s.num_computed + k;
      token_ids_.push_back(s.tokens[static_cast<size_t>(pos)]);
      positions_.push_back(pos);
    }
    std::copy(s.blocks.begin(), s.blocks.end(), block_table_.begin() + static_cast<long>(i) * max_blocks);
    if (ss.sample) logits_rows_.push_back(static_cast<int32_t>(token_ids_.size()) - 1);
    (s.num_computed >= s.num_prompt ? stats.num_decode_tokens : stats.num_prefill_tokens) += ss.num_tokens;
  }
  seq_start_[static_cast<size_t>(num_seqs)] = static_cast<int32_t>(token_ids_.size());
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
  const int V = backend_->vocab_size();
  const bool on_device = backend_->samples_on_device();
  if (on_device) {
    // The device samples; each row gets its sequence's parameters and a draw from its generator.
    specs_.clear();
    for (const ScheduledSeq& ss : plan.seqs) {
      if (!ss.sample) continue;
      const SamplingParams& p = ss.seq->params;
      specs_.push_back({p.temperature, p.top_p, p.top_k, ss.seq->rng()});
    }
    sampled_.resize(specs_.size());
    HR_RETURN_IF_ERROR(backend_->forward_sample(in, specs_.data(), sampled_.data()));
  } else {
    logits_.resize(static_cast<size_t>(std::max(1, in.num_logits)) * V);
    HR_RETURN_IF_ERROR(backend_->forward(in, logits_.data()));
  }
  scheduler_.complete(plan);
  stats.num_seqs = num_seqs;
  stats.num_tokens = in.num_tokens;
  int row = 0;
  for (const ScheduledSeq& ss : plan.seqs) {
    if (!ss.sample) continue;
    Sequence& s = *ss.seq;
    int32_t token = on_device ? sampled_[static_cast<size_t>(row++)]
                              : sample_token(&logits_[static_cast<size_t>(row++) * V], V, s.params, s.rng);
    auto it = active_.find(s.id);
    if (advance(it->second, token)) {
      active_.erase(it);
      ++stats.num_finished;
    }
  }
  return stats;
}

}  // namespace hr::engine
