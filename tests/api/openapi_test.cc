// The published contract (api/openapi.json, served at /openapi.json without a key) against the
// running API over HTTP: the document served is the one in the tree, and every operation it
// lists is one the API routes (none answers "no route for"), with ids of nothing and empty bodies.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "base/ids.h"
#include "tests/testing/api_harness.h"

namespace hr::api {
namespace {

using nlohmann::json;
using testing::ApiHarness;
using testing::HttpResult;

json document_in_tree() {
  std::ifstream in(std::string(HEADROOM_SOURCE_DIR) + "/api/openapi.json");
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

TEST(OpenApiTest, ServedWithoutAKeyAndEqualToTheTree) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  HttpResult r = h.call("GET", "/openapi.json", "", "", {});
  ASSERT_EQ(r.status, 200) << r.body.substr(0, 200);
  EXPECT_EQ(r.json(), document_in_tree());
  EXPECT_EQ(r.json()["openapi"], "3.1.0");
}

TEST(OpenApiTest, EveryDocumentedOperationIsRouted) {
  ApiHarness h;
  ASSERT_TRUE(h.ok());
  const json doc = document_in_tree();
  int checked = 0;
  for (const auto& [path, item] : doc["paths"].items()) {
    std::string target = path;
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{
             {"{model}", h.model()}, {"{id}", new_uuid_v7().to_string()}}) {
      if (size_t at = target.find(from); at != std::string::npos)
        target.replace(at, from.size(), to);
    }
    for (const auto& [method, operation] : item.items()) {
      std::string verb = method;
      for (char& c : verb) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
      HttpResult r =
          h.call(verb, target, verb == "GET" || verb == "DELETE" ? "" : "{}", h.key_a(), {});
      SCOPED_TRACE(verb + " " + path);
      EXPECT_NE(r.status, 0);
      EXPECT_EQ(r.body.find("no route for"), std::string::npos) << r.status << " " << r.body;
      EXPECT_TRUE(operation.contains("operationId"));
      EXPECT_TRUE(operation["responses"].contains("200")) << "every operation says its answer";
      ++checked;
    }
  }
  EXPECT_GE(checked, 36);
  // And a route that does not exist is told apart (the check above can fail).
  EXPECT_NE(h.call("GET", "/v1/no-such-route", "", h.key_a(), {}).body.find("no route for"),
            std::string::npos);
}

}  // namespace
}  // namespace hr::api
