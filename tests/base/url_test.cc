#include "base/url.h"

#include <gtest/gtest.h>

namespace hr {
namespace {

TEST(UrlTest, ParsesServiceUrls) {
  auto u = parse_url("postgresql://user:p%40ss@db.local:5433/headroom?sslmode=disable");
  ASSERT_TRUE(u.is_ok());
  EXPECT_EQ(u->scheme, "postgresql");
  EXPECT_EQ(u->user, "user");
  EXPECT_EQ(u->password, "p@ss");
  EXPECT_EQ(u->host, "db.local");
  EXPECT_EQ(u->port, 5433);
  EXPECT_EQ(u->path, "/headroom");
  EXPECT_EQ(u->query, "sslmode=disable");
  EXPECT_EQ(u->redacted(), "postgresql://user:***@db.local:5433/headroom?sslmode=disable");

  auto r = parse_url("redis://[::1]:6380/2");
  ASSERT_TRUE(r.is_ok());
  EXPECT_EQ(r->host, "::1");
  EXPECT_EQ(r->port, 6380);
  EXPECT_EQ(r->path, "/2");
}

TEST(UrlTest, RejectsBadUrls) {
  EXPECT_FALSE(parse_url("localhost:5432").is_ok());
  EXPECT_FALSE(parse_url("redis://host:notaport").is_ok());
  EXPECT_FALSE(parse_url("redis://host:70000").is_ok());
  EXPECT_FALSE(parse_url("redis://[::1:6379").is_ok());
  // A scheme is a letter, then letters, digits, '+', '-' or '.' (found by url_ip_fuzz).
  EXPECT_FALSE(parse_url("ht/\x87s://e.com/hook").is_ok());
  EXPECT_FALSE(parse_url("1http://e.com").is_ok());
  EXPECT_FALSE(parse_url("ht tp://e.com").is_ok());
  EXPECT_EQ(parse_url("svn+SSH://e.com").value().scheme, "svn+ssh");
}

}  // namespace
}  // namespace hr
