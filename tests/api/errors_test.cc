#include "api/errors.h"

#include <gtest/gtest.h>

#include "http/status.h"
#include "wire/json_text.h"

namespace hr::api {
namespace {

TEST(ErrorsTest, StatusesMapToDocumentedHttpCodes) {
  EXPECT_EQ(http::http_status_for(StatusCode::kInvalidArgument), 400);
  EXPECT_EQ(http::http_status_for(StatusCode::kUnauthenticated), 401);
  EXPECT_EQ(http::http_status_for(StatusCode::kNotFound), 404);
  EXPECT_EQ(http::http_status_for(StatusCode::kConflict), 409);
  EXPECT_EQ(http::http_status_for(StatusCode::kTooLarge), 413);
  EXPECT_EQ(http::http_status_for(StatusCode::kResourceExhausted), 429);
  EXPECT_EQ(http::http_status_for(StatusCode::kUnavailable), 503);
}

TEST(ErrorsTest, BodyNamesFieldAndIndex) {
  auto body = error_body(invalid_argument("role must be one of ...", "messages[0].role"), 7);
  EXPECT_EQ(body["success"], false);
  ASSERT_EQ(body["errors"].size(), 1u);
  EXPECT_EQ(body["errors"][0]["field"], "messages[0].role");
  EXPECT_EQ(body["errors"][0]["index"], 7);
  EXPECT_EQ(body["errors"][0]["code"], 1001);
  EXPECT_EQ(
      error_body(Status(StatusCode::kResourceExhausted, "Out of capacity"))["errors"][0]["code"],
      3040);
}

TEST(ErrorsTest, OpenAiErrorBody) {
  using nlohmann::json;
  json e = openai_error_body(invalid_argument("bad window", "completion_window"));
  EXPECT_EQ(e["error"]["message"], "bad window");
  EXPECT_EQ(e["error"]["type"], "invalid_request_error");
  EXPECT_EQ(e["error"]["param"], "completion_window");
  EXPECT_EQ(e["error"]["code"], "invalid_argument");
  json a = openai_error_body(Status(StatusCode::kUnauthenticated, "invalid API key"));
  EXPECT_EQ(a["error"]["type"], "authentication_error");
  EXPECT_EQ(a["error"]["code"], "invalid_api_key");
  EXPECT_TRUE(a["error"]["param"].is_null());
  EXPECT_EQ(openai_error_body(internal_error("x"))["error"]["type"], "server_error");
  EXPECT_EQ(openai_error_body(not_found("x"), "file_not_found")["error"]["code"], "file_not_found");
  EXPECT_EQ(openai_error_body(Status(StatusCode::kTooLarge, "big"))["error"]["code"], "too_large");
}

// Client JSON nesting deeper than wire::kMaxJsonDepth, or holding NUL in a string, is refused
// before it is parsed; brackets and escapes inside strings do not count, and the text "\\u0000" is
// fine.
TEST(ErrorsTest, ClientJsonIsRefusedTooDeepOrWithNul) {
  auto nested = [](int depth) { return std::string(depth, '[') + std::string(depth, ']'); };
  std::string why;
  EXPECT_FALSE(wire::parse_client_json(nested(wire::kMaxJsonDepth), &why).is_discarded());
  EXPECT_TRUE(wire::parse_client_json(nested(wire::kMaxJsonDepth + 1), &why).is_discarded());
  EXPECT_EQ(why, "nests deeper than 64 levels");
  EXPECT_TRUE(wire::parse_client_json("{\"x\":" + nested(200000) + "}", &why).is_discarded());
  EXPECT_FALSE(wire::parse_client_json("{\"s\": \"" + std::string(100, '[') + "\\\"{\"}", &why)
                   .is_discarded())
      << why;
  EXPECT_TRUE(wire::parse_client_json(R"({"k": "a\u0000b"})", &why).is_discarded());
  EXPECT_EQ(why, "holds a NUL character (\\u0000)");
  nlohmann::json literal = wire::parse_client_json(R"({"k": "a\\u0000b"})", &why);
  ASSERT_FALSE(literal.is_discarded()) << why;
  EXPECT_EQ(literal["k"], "a\\u0000b");
  EXPECT_TRUE(wire::parse_client_json("{", &why).is_discarded());
  EXPECT_EQ(why, "is not valid JSON");
}

// A message quoting a client's bytes that are not UTF-8 still makes a printable body.
TEST(ErrorsTest, BodiesQuotingInvalidUtf8ArePrintable) {
  Status st = invalid_argument("unknown model '\xff\xfe'", "model\xff");
  EXPECT_NE(error_body(st).dump().find("unknown model"), std::string::npos);
  EXPECT_NE(openai_error_body(st).dump().find("unknown model"), std::string::npos);
}

}  // namespace
}  // namespace hr::api
