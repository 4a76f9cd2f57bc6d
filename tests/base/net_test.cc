#include "base/net.h"

#include <gtest/gtest.h>

#include "base/hash.h"

namespace hr {
namespace {

IpAddress ip(const char* s) { return parse_ip(s).value(); }

TEST(NetTest, ClassifiesForbiddenRanges) {
  for (const char* a : {"127.0.0.1", "127.9.9.9", "10.1.2.3", "172.16.0.1", "172.31.255.255",
                        "192.168.0.1", "169.254.169.254", "100.64.0.1", "0.0.0.0", "224.0.0.1",
                        "255.255.255.255", "198.18.0.1", "::1", "::", "fe80::1", "fc00::1",
                        "fd00:ec2::254", "ff02::1", "::ffff:127.0.0.1", "::ffff:10.0.0.1",
                        "64:ff9b::a9fe:a9fe", "2002:7f00:1::1", "::127.0.0.1"}) {
    EXPECT_TRUE(forbidden_range(ip(a)).has_value()) << a;
  }
  for (const char* a : {"8.8.8.8", "93.184.216.34", "172.32.0.1", "100.128.0.1", "1.1.1.1",
                        "2606:4700:4700::1111", "::ffff:8.8.8.8", "2002:0808:0808::1"}) {
    EXPECT_FALSE(forbidden_range(ip(a)).has_value()) << a;
  }
  EXPECT_EQ(*forbidden_range(ip("169.254.169.254")), "link-local (cloud metadata)");
}

TEST(NetTest, PolicyAllowsWhatItNames) {
  AddressPolicy none = AddressPolicy::parse({}).value();
  Status st = none.check(ip("127.0.0.1"), "localhost", "webhook_url");
  EXPECT_FALSE(st.is_ok());
  EXPECT_EQ(st.field(), "webhook_url");
  EXPECT_NE(st.message().find("loopback"), std::string::npos);
  EXPECT_TRUE(none.check(ip("8.8.8.8"), "dns.google", "u").is_ok());
  EXPECT_FALSE(none.allows_loopback());

  AddressPolicy loop = AddressPolicy::parse({"loopback"}).value();
  EXPECT_TRUE(loop.allows_loopback());
  EXPECT_TRUE(loop.check(ip("127.0.0.1"), "", "u").is_ok());
  EXPECT_TRUE(loop.check(ip("::1"), "", "u").is_ok());
  EXPECT_TRUE(loop.check(ip("::ffff:127.0.0.1"), "", "u").is_ok());
  EXPECT_FALSE(loop.check(ip("10.0.0.1"), "", "u").is_ok());

  AddressPolicy net = AddressPolicy::parse({"10.1.0.0/16"}).value();
  EXPECT_TRUE(net.check(ip("10.1.200.3"), "", "u").is_ok());
  EXPECT_FALSE(net.check(ip("10.2.0.1"), "", "u").is_ok());
  EXPECT_TRUE(AddressPolicy::parse({"private"}).value().check(ip("192.168.1.1"), "", "u").is_ok());
  EXPECT_FALSE(AddressPolicy::parse({"10.0.0.0/33"}).is_ok());
  EXPECT_FALSE(AddressPolicy::parse({"intranet"}).is_ok());
}

TEST(NetTest, ResolvesAndChecksEveryAddress) {
  AddressPolicy none = AddressPolicy::parse({}).value();
  auto local = resolve_checked("localhost", none, "webhook_url");
  ASSERT_FALSE(local.is_ok());
  EXPECT_EQ(local.status().field(), "webhook_url");
  auto literal = resolve_checked("8.8.8.8", none, "u");
  ASSERT_TRUE(literal.is_ok());
  EXPECT_EQ(literal->size(), 1u);
  auto allowed = resolve_checked("localhost", AddressPolicy::parse({"loopback"}).value(), "u");
  ASSERT_TRUE(allowed.is_ok()) << allowed.status().to_string();
  EXPECT_FALSE(resolve_checked("no-such-host.invalid", none, "u").is_ok());
}

TEST(NetTest, Base64RoundTrips) {
  for (std::string s : std::vector<std::string>{"", "a", "ab", "abc", "abcd", std::string("\0\xff\x10", 3)}) {
    EXPECT_EQ(base64_decode(base64_encode(s)).value(), s);
  }
  EXPECT_FALSE(base64_decode("abc").has_value());
  EXPECT_FALSE(base64_decode("ab!d").has_value());
  EXPECT_FALSE(base64_decode("a=bc").has_value());
}

}  // namespace
}  // namespace hr
