// Affinity keys of queued requests: alike where the prompts start alike.
#include "api/affinity.h"

#include <gtest/gtest.h>

#include <string>

namespace hr::api {
namespace {

wire::ChatRequest chat(std::vector<std::pair<std::string, std::string>> messages) {
  wire::ChatRequest r;
  for (auto& [role, content] : messages) r.messages.push_back({role, content, {}, std::nullopt});
  return r;
}

TEST(AffinityTest, TheSameSystemPromptIsOneKeyWhateverFollows) {
  const std::string system = "You are a careful translator. " + std::string(600, 's');
  EXPECT_EQ(prefix_affinity(chat({{"system", system}, {"user", "one"}})),
            prefix_affinity(chat({{"system", system}, {"user", "two, and longer"}})));
  EXPECT_NE(prefix_affinity(chat({{"system", system}, {"user", "one"}})),
            prefix_affinity(chat({{"system", system + "!"}, {"user", "one"}})));
  // Every leading system and developer message counts.
  EXPECT_NE(prefix_affinity(chat({{"system", system}, {"developer", "a"}, {"user", "x"}})),
            prefix_affinity(chat({{"system", system}, {"developer", "b"}, {"user", "x"}})));
}

TEST(AffinityTest, ToolsArePartOfTheStart) {
  wire::ChatRequest a = chat({{"user", "what is the weather"}});
  wire::ChatRequest b = chat({{"user", "what time is it"}});
  a.tools.push_back({"get_weather", "the weather", "{\"type\":\"object\"}"});
  b.tools = a.tools;
  EXPECT_EQ(prefix_affinity(a), prefix_affinity(b));
  b.tools[0].parameters = "{\"type\":\"object\",\"properties\":{}}";
  EXPECT_NE(prefix_affinity(a), prefix_affinity(b));
}

TEST(AffinityTest, WithoutASystemPromptTheFirstKibibyteOfTheFirstMessage) {
  const std::string head(kAffinityPrefixBytes, 'h');
  EXPECT_EQ(prefix_affinity(chat({{"user", head + "tail one"}})),
            prefix_affinity(chat({{"user", head + "tail two"}})));
  EXPECT_NE(prefix_affinity(chat({{"user", "short one"}})),
            prefix_affinity(chat({{"user", "short two"}})));
  // A bare prompt is a user message.
  wire::ChatRequest prompt;
  prompt.prompt = "short one";
  EXPECT_EQ(prefix_affinity(prompt), prefix_affinity(chat({{"user", "short one"}})));
  EXPECT_NE(prefix_affinity(chat({{"user", "x"}})), prefix_affinity(chat({{"assistant", "x"}})));
}

TEST(AffinityTest, ASessionIsItsOwnKey) {
  EXPECT_EQ(session_affinity("s-1"), session_affinity("s-1"));
  EXPECT_NE(session_affinity("s-1"), session_affinity("s-2"));
  EXPECT_NE(session_affinity("x"), prefix_affinity(chat({{"user", "x"}})));
}

}  // namespace
}  // namespace hr::api
