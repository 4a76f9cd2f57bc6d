// Log probabilities handed out with an answer's text: the entries handed out always spell the text
// sent, whatever the tokens' raw bytes, held-back text or stop strings do.
#include "workers/answer_logprobs.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace hr::workers {
namespace {

wire::TokenLogprob entry(const std::string& token) { return {token, -1.0f, {}}; }

std::vector<std::string> tokens(const std::vector<wire::TokenLogprob>& entries) {
  std::vector<std::string> out;
  for (const wire::TokenLogprob& e : entries) out.push_back(e.bytes);
  return out;
}

using Strings = std::vector<std::string>;

// A decoder that strips the first token's leading space: " Hi" is two bytes of text, not three;
// the last token's entry must not be lost for it.
TEST(AnswerLogprobsTest, AStrippedLeadingSpaceLosesNoEntry) {
  AnswerLogprobs lp(true);
  lp.add(entry(" Hi"), 2, 2, false);
  lp.add(entry("."), 1, 1, false);
  lp.add(std::nullopt, 0, 0, true);  // EOS: no entry of its own
  EXPECT_EQ(tokens(*lp.answer()), (Strings{" Hi", "."}));
}

// A special token has no text: its entry goes out with the next piece of text.
TEST(AnswerLogprobsTest, ATokenWithoutTextGoesWithTheNextText) {
  AnswerLogprobs lp(true);
  lp.add(entry("<|x|>"), 0, 0, false);
  lp.add(entry("Hi"), 2, 2, false);
  EXPECT_EQ(tokens(lp.take()), (Strings{"<|x|>", "Hi"}));
  lp.add(entry("!"), 1, 1, true);
  EXPECT_EQ(tokens(lp.take()), (Strings{"!"}));
}

// The first bytes of a character (no text yet) go with the token that completes it: the worker
// takes entries when a delta brings text, and this token's brings none.
TEST(AnswerLogprobsTest, PartOfACharacterGoesWithTheRest) {
  AnswerLogprobs lp(true);
  lp.add(entry("a"), 1, 1, false);
  EXPECT_EQ(tokens(lp.take()), (Strings{"a"}));
  lp.add(entry("bytes:\\xe2\\x82"), 0, 0, false);
  lp.add(entry("bytes:\\xac"), 3, 3, true);
  EXPECT_EQ(tokens(lp.take()), (Strings{"bytes:\\xe2\\x82", "bytes:\\xac"}));
}

// Stop string "ab" over tokens "xa", "a", "b": "x" goes out, then the held "a" (the end of "xa"),
// then "ab" is found and cut. The text sent is "xa", and the entries spell "xa": the second
// token's "a" never went out.
TEST(AnswerLogprobsTest, TextAStopStringCutTakesItsEntriesWithIt) {
  AnswerLogprobs streamed(true);
  streamed.add(entry("xa"), 2, 1, false);
  EXPECT_TRUE(streamed.take().empty());  // only "x" of it has gone
  streamed.add(entry("a"), 1, 1, false);
  EXPECT_EQ(tokens(streamed.take()), (Strings{"xa"}));
  streamed.add(entry("b"), 1, 0, true);
  EXPECT_TRUE(streamed.take().empty());
  // A stop string that begins inside a token keeps that token: its text partly went out.
  AnswerLogprobs whole(true);
  whole.add(entry("hel"), 3, 3, false);
  whole.add(entry("lo!"), 3, 1, false);  // "l" goes out; "o!" may start the stop string "o!x"
  whole.add(entry("x"), 1, 0, true);     // "o!x" found and cut
  EXPECT_EQ(tokens(*whole.answer()), (Strings{"hel", "lo!"}));
}

// An entry without text at the edge of what has gone waits: stop string "€" over "a" and the
// euro sign's two tokens leaves text "a", and the first half's entry must not have gone out.
// A special token at the very end, with nothing cut, does go.
TEST(AnswerLogprobsTest, AnEntryWithoutTextWaitsForTheTextAfterIt) {
  AnswerLogprobs cut(true);
  cut.add(entry("a"), 1, 1, false);
  cut.add(entry("bytes:\\xe2\\x82"), 0, 0, false);
  EXPECT_EQ(tokens(cut.take()), (Strings{"a"}));
  cut.add(entry("bytes:\\xac"), 3, 0, true);  // "€" is the stop string: cut
  EXPECT_TRUE(cut.take().empty());
  AnswerLogprobs special(true);
  special.add(entry("a"), 1, 1, false);
  special.add(entry("<|x|>"), 0, 0, true);
  EXPECT_EQ(tokens(*special.answer()), (Strings{"a", "<|x|>"}));
}

TEST(AnswerLogprobsTest, NothingWhenNotAskedFor) {
  AnswerLogprobs lp(false);
  lp.add(entry("a"), 1, 1, true);
  EXPECT_TRUE(!lp.answer().has_value());
  EXPECT_TRUE(lp.take().empty());
}

}  // namespace
}  // namespace hr::workers
