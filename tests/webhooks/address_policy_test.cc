#include "webhooks/address_policy.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "base/hash.h"

namespace hr::webhooks {
namespace {

IpAddress ip(const char* s) { return parse_ip(s).value(); }

TEST(NetTest, ClassifiesForbiddenRanges) {
  for (const char* a : {"127.0.0.1",
                        "127.9.9.9",
                        "10.1.2.3",
                        "172.16.0.1",
                        "172.31.255.255",
                        "192.168.0.1",
                        "169.254.169.254",
                        "100.64.0.1",
                        "0.0.0.0",
                        "224.0.0.1",
                        "255.255.255.255",
                        "198.18.0.1",
                        "::1",
                        "::",
                        "fe80::1",
                        "fc00::1",
                        "fd00:ec2::254",
                        "ff02::1",
                        "::ffff:127.0.0.1",
                        "::ffff:10.0.0.1",
                        "64:ff9b::a9fe:a9fe",
                        "2002:7f00:1::1",
                        "::127.0.0.1",
                        "::ffff:0:7f00:1",       // IPv4-translated 127.0.0.1
                        "::ffff:0:a00:1",        // ... and 10.0.0.1
                        "64:ff9b:1::a9fe:a9fe",  // local-use NAT64 to 169.254.169.254
                        "2001:0:4136:e378:8000:63bf:3fff:fdd2"}) {  // Teredo
    EXPECT_TRUE(forbidden_range(ip(a)).has_value()) << a;
  }
  for (const char* a : {"8.8.8.8", "93.184.216.34", "172.32.0.1", "100.128.0.1", "1.1.1.1",
                        "2606:4700:4700::1111", "::ffff:8.8.8.8", "2002:0808:0808::1"}) {
    EXPECT_FALSE(forbidden_range(ip(a)).has_value()) << a;
  }
  EXPECT_EQ(*forbidden_range(ip("169.254.169.254")), "link-local (cloud metadata)");
  EXPECT_EQ(*forbidden_range(ip("2001:0:4136:e378:8000:63bf:3fff:fdd2")), "Teredo");
  EXPECT_FALSE(forbidden_range(ip("2001:4860:4860::8888")).has_value());  // public, not Teredo
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

// A lookup that hangs ends at the deadline with an error naming the field (the lookup finishes on
// its own); one that answers in time gives its answer.
TEST(NetTest, ALookupThatHangsEndsAtItsDeadline) {
  const auto t0 = std::chrono::steady_clock::now();
  auto hung = lookup_within("slow.example", "webhook_url", std::chrono::milliseconds(100),
                            [](const std::string&) -> Result<std::vector<IpAddress>> {
                              std::this_thread::sleep_for(std::chrono::seconds(3));
                              return std::vector<IpAddress>{};
                            });
  const auto waited = std::chrono::steady_clock::now() - t0;
  ASSERT_FALSE(hung.is_ok());
  EXPECT_EQ(hung.status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(hung.status().field(), "webhook_url");
  EXPECT_NE(hung.status().message().find("slow.example did not resolve within 100 ms"),
            std::string::npos);
  EXPECT_GE(waited, std::chrono::milliseconds(100));
  EXPECT_LT(waited, std::chrono::seconds(2));
  auto quick =
      lookup_within("dns.google", "u", std::chrono::seconds(5), [](const std::string& host) {
        return Result<std::vector<IpAddress>>(
            std::vector<IpAddress>{ip(host == "dns.google" ? "8.8.8.8" : "0.0.0.0")});
      });
  ASSERT_TRUE(quick.is_ok());
  ASSERT_EQ(quick->size(), 1u);
  EXPECT_EQ((*quick)[0].to_string(), "8.8.8.8");
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

// The product's own services are never targets, whatever the allow-list says: a loopback or
// unspecified service refuses its port on every address that reaches the machine locally, an
// address only itself; other ports stay open, and the refusal does not say which service.
TEST(NetTest, TheProductsOwnServicesAreNeverTargets) {
  AddressPolicy p = AddressPolicy::parse({"private"}).value();  // everything allowed
  p.refuse_services({"127.0.0.1:5432", "[::1]:6379", "10.1.2.3:8080", "0.0.0.0:9000",
                     "localhost:7000", "not-an-endpoint", "h:99999"});
  for (const char* a : {"127.0.0.1", "127.9.9.9", "::1", "0.0.0.0", "::ffff:127.0.0.1", "::"}) {
    Status st = p.check_port(ip(a), 5432, "webhook_url");
    EXPECT_FALSE(st.is_ok()) << a;
    EXPECT_EQ(st.field(), "webhook_url");
    EXPECT_EQ(st.message(),
              "webhook_url points at a port this service itself listens on; webhooks cannot "
              "target it");
    EXPECT_FALSE(p.check_port(ip(a), 6379, "u").is_ok()) << a;
    EXPECT_FALSE(p.check_port(ip(a), 9000, "u").is_ok()) << a;
    EXPECT_FALSE(p.check_port(ip(a), 7000, "u").is_ok()) << a;
    EXPECT_TRUE(p.check_port(ip(a), 5433, "u").is_ok()) << a;
  }
  EXPECT_FALSE(p.check_port(ip("10.1.2.3"), 8080, "u").is_ok());
  EXPECT_TRUE(p.check_port(ip("10.1.2.4"), 8080, "u").is_ok());
  EXPECT_TRUE(p.check_port(ip("10.1.2.3"), 8081, "u").is_ok());
  EXPECT_TRUE(p.check_port(ip("8.8.8.8"), 5432, "u").is_ok());
  // Through resolve_checked, as submits and deliveries check a URL's host and port.
  AddressPolicy loop = AddressPolicy::parse({"loopback"}).value();
  loop.refuse_service("127.0.0.1", 5432);
  EXPECT_FALSE(resolve_checked("localhost", loop, "u", std::chrono::seconds(5), 5432).is_ok());
  EXPECT_TRUE(resolve_checked("localhost", loop, "u", std::chrono::seconds(5), 8000).is_ok());
  EXPECT_TRUE(resolve_checked("localhost", loop, "u").is_ok()) << "no port given: not checked";
}

TEST(NetTest, Base64RoundTrips) {
  for (std::string s :
       std::vector<std::string>{"", "a", "ab", "abc", "abcd", std::string("\0\xff\x10", 3)}) {
    EXPECT_EQ(base64_decode(base64_encode(s)).value(), s);
  }
  EXPECT_FALSE(base64_decode("abc").has_value());
  EXPECT_FALSE(base64_decode("ab!d").has_value());
  EXPECT_FALSE(base64_decode("a=bc").has_value());
}

}  // namespace
}  // namespace hr::webhooks
