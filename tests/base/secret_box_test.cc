// Secrets at rest: sealing and opening with the process's key (base/secret_box.h).
#include "base/secret_box.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <string>

namespace hr::secrets {
namespace {

// Restores "no key" after each test.
class SecretBoxTest : public ::testing::Test {
 protected:
  void TearDown() override { clear_key(); }
};

TEST_F(SecretBoxTest, SealsAndOpensWithTheKey) {
  set_key(std::string(32, 'k'));
  const std::string secret = "whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=";
  const std::string a = seal(secret);
  const std::string b = seal(secret);
  EXPECT_TRUE(is_sealed(a));
  EXPECT_EQ(a.rfind("hrenc1:", 0), 0u);
  EXPECT_EQ(a.find("c2VjcmV0"), std::string::npos) << "the secret shows through";
  EXPECT_NE(a, b) << "a fresh nonce each time";
  EXPECT_EQ(open(a).value(), secret);
  EXPECT_EQ(open(b).value(), secret);
  EXPECT_EQ(open(seal("")).value(), "");
  // Values stored before there was a key read as they are.
  EXPECT_EQ(open("whsec_plain").value(), "whsec_plain");
}

TEST_F(SecretBoxTest, AnotherKeyOrAnAlteredValueDoesNotOpen) {
  set_key(std::string(32, 'k'));
  std::string sealed = seal("whsec_abc");
  std::string altered = sealed;
  const size_t mid = altered.size() / 2;  // inside the ciphertext, not base64's padding bits
  altered[mid] = altered[mid] == 'A' ? 'B' : 'A';
  EXPECT_EQ(open(altered).status().code(), StatusCode::kInternal);
  EXPECT_EQ(open("hrenc1:not base64!").status().code(), StatusCode::kInternal);
  set_key(std::string(32, 'j'));
  EXPECT_EQ(open(sealed).status().code(), StatusCode::kInternal);
  clear_key();
  EXPECT_FALSE(has_key());
  EXPECT_EQ(open(sealed).status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(seal("whsec_abc"), "whsec_abc") << "without a key, stored as given";
}

TEST_F(SecretBoxTest, KeyFilesHoldSixtyFourHexDigits) {
  const std::string path = ::testing::TempDir() + "secret_box_key";
  const std::string text = new_key_text();
  EXPECT_EQ(text.size(), 64u);
  EXPECT_NE(text, new_key_text());
  std::ofstream(path) << "\n  " << text << "\n";
  ASSERT_TRUE(load_key_file(path).is_ok());
  EXPECT_TRUE(has_key());
  const std::string sealed = seal("x");
  ASSERT_TRUE(load_key_file(path).is_ok());
  EXPECT_EQ(open(sealed).value(), "x");
  std::ofstream(path) << "too short";
  Status bad = load_key_file(path);
  EXPECT_EQ(bad.field(), "secret-key-file");
  EXPECT_NE(bad.message().find("64 hex digits"), std::string::npos);
  EXPECT_EQ(load_key_file(path + ".missing").field(), "secret-key-file");
  std::remove(path.c_str());
}

}  // namespace
}  // namespace hr::secrets
