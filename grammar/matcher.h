// One answer's place in its constraint: advanced by each generated token, asked for the mask of
// the tokens allowed next. Owned by the sequence it constrains (one thread).
#pragma once

#include <cstdint>
#include <memory>

#include "grammar/compiled_grammar.h"

namespace hr::grammar {

class Matcher {
 public:
  explicit Matcher(std::shared_ptr<CompiledGrammar> grammar)
      : grammar_(std::move(grammar)), state_(grammar_->start()) {}

  // Takes the next token: false (nothing changes) when the constraint forbids it. A stop token is
  // allowed where the document is complete, and ends it.
  bool accept(int32_t id);
  // The tokens allowed next (CompiledGrammar::fill_mask), `remaining` tokens left.
  void fill_mask(int remaining, uint32_t* mask) {
    grammar_->fill_mask(ended_ ? kDead : state_, remaining, mask);
  }
  // Whether the text so far is a complete document.
  bool complete() { return !ended_ && grammar_->accepting(state_); }
  bool ended() const { return ended_; }
  int mask_words() const { return grammar_->vocabulary().mask_words(); }
  CompiledGrammar& grammar() { return *grammar_; }

 private:
  std::shared_ptr<CompiledGrammar> grammar_;
  int32_t state_;
  bool ended_ = false;
};

}  // namespace hr::grammar
