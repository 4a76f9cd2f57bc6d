// Our Jinja interpreter against @huggingface/jinja (the interpreter transformers.js uses, run by
// node) on real chat templates (tests/data/chat_templates, with their sources) over conversations
// with system prompts, several turns, tools, assistant tool calls and tool results, and non-ASCII
// text (tests/data/chat_conversations.json). Every render must give the same text, and a template
// that fails in one must fail in the other. Needs node and npm (scripts/setup.sh installs them).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "engine/jinja/template.h"

namespace hr::engine::jinja {
namespace {

using nlohmann::json;
using ojson = nlohmann::ordered_json;

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The first place two texts differ, with some context, for failure messages.
std::string first_difference(const std::string& a, const std::string& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  const size_t from = i > 40 ? i - 40 : 0;
  return "at byte " + std::to_string(i) + ":\n  ours:      " + json(a.substr(from, 100)).dump() +
         "\n  reference: " + json(b.substr(from, 100)).dump();
}

TEST(JinjaCrosscheckTest, RendersRealTemplatesExactlyAsTheReference) {
  const std::string source = HEADROOM_SOURCE_DIR;
  const std::string prefix = HEADROOM_NODE_PREFIX;
  const std::string templates = source + "/tests/data/chat_templates";
  const std::string conversations_file = source + "/tests/data/chat_conversations.json";
  ASSERT_EQ(
      std::system((source + "/tests/scripts/npm_prefix.sh " + prefix + " @huggingface/jinja@0.5.11")
                      .c_str()),
      0)
      << "npm install failed (node and npm are needed: scripts/setup.sh)";
  const std::string out =
      ::testing::TempDir() + "jinja_crosscheck_" + std::to_string(::getpid()) + ".json";
  const std::string cmd = "node " + source + "/tests/node/jinja_crosscheck.mjs " + prefix + " " +
                          templates + " " + conversations_file + " " + out;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const json reference = json::parse(read_file(out), nullptr, false);
  std::remove(out.c_str());
  ASSERT_TRUE(reference.is_array());

  std::map<std::string, ojson> contexts;
  for (const ojson& c : ojson::parse(read_file(conversations_file))) {
    contexts[c["name"].get<std::string>()] = c["context"];
  }
  std::map<std::string, Result<Template>> parsed;
  std::set<std::string> rendered;  // templates with at least one render
  std::set<std::string> differing;
  int renders = 0, both_failed = 0;
  for (const json& r : reference) {
    const std::string file = r["template"], conversation = r["conversation"];
    auto it = parsed.find(file);
    if (it == parsed.end()) {
      it = parsed.emplace(file, Template::parse(read_file(templates + "/" + file))).first;
    }
    Result<std::string> ours = it->second.is_ok() ? it->second->render(contexts.at(conversation))
                                                  : Result<std::string>(it->second.status());
    if (r["ok"].get<bool>()) {
      ++renders;
      rendered.insert(file);
      if (!ours.is_ok()) {
        differing.insert(file);
        ADD_FAILURE() << file << " / " << conversation
                      << ": the reference renders, ours fails: " << ours.status().to_string();
      } else if (*ours != r["text"].get<std::string>()) {
        differing.insert(file);
        ADD_FAILURE() << file << " / " << conversation << ": different text "
                      << first_difference(*ours, r["text"].get<std::string>());
      }
    } else {
      ++both_failed;
      if (ours.is_ok()) {
        differing.insert(file);
        ADD_FAILURE() << file << " / " << conversation << ": the reference fails ("
                      << r["error"].get<std::string>() << "), ours renders";
      }
    }
  }
  std::printf(
      "jinja crosscheck: %zu templates, %d renders compared, %d failing in both, %zu "
      "templates differing\n",
      parsed.size(), renders, both_failed, differing.size());
  EXPECT_TRUE(differing.empty());
  EXPECT_GE(rendered.size(), 40u);  // templates with at least one rendered conversation
  EXPECT_GE(renders, 200);
}

}  // namespace
}  // namespace hr::engine::jinja
