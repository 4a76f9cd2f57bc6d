// The multipart/form-data parser: boundaries from Content-Type, CRLF and bare-LF line ends, a
// boundary string inside the data, quoted and encoded file names, and malformed bodies.
#include "api/multipart.h"

#include <gtest/gtest.h>

namespace hr::api {
namespace {

std::string form(const std::string& boundary, const std::string& eol = "\r\n") {
  return "--" + boundary + eol + "Content-Disposition: form-data; name=\"purpose\"" + eol + eol +
         "batch" + eol + "--" + boundary + eol +
         "Content-Disposition: form-data; name=\"file\"; filename=\"in.jsonl\"" + eol +
         "Content-Type: application/jsonl" + eol + eol + "{\"a\":1}\n{\"b\":2}\n" + eol + "--" +
         boundary + "--" + eol;
}

TEST(MultipartTest, BoundaryFromContentType) {
  EXPECT_EQ(multipart_boundary("multipart/form-data; boundary=abc").value(), "abc");
  EXPECT_EQ(multipart_boundary("Multipart/Form-Data;boundary=\"a b;c\"").value(), "a b;c");
  EXPECT_EQ(multipart_boundary("multipart/form-data; charset=utf-8; BOUNDARY=x").value(), "x");
  for (const char* bad :
       {"application/json", "multipart/form-data", "multipart/form-data; boundary=",
        "multipart/form-data; boundary=\"unterminated", "multipart/mixed; boundary=x"}) {
    Result<std::string> r = multipart_boundary(bad);
    ASSERT_FALSE(r.is_ok()) << bad;
    EXPECT_EQ(r.status().field(), "Content-Type");
  }
  std::string long_boundary(71, 'b');
  EXPECT_FALSE(multipart_boundary("multipart/form-data; boundary=" + long_boundary).is_ok());
}

TEST(MultipartTest, ParsesFieldsAndFilesWithCrlf) {
  std::string body = form("XyZ");
  auto parts = parse_multipart(body, "XyZ");
  ASSERT_TRUE(parts.is_ok()) << parts.status().to_string();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].name, "purpose");
  EXPECT_FALSE((*parts)[0].filename.has_value());
  EXPECT_EQ((*parts)[0].data, "batch");
  EXPECT_EQ((*parts)[1].name, "file");
  EXPECT_EQ((*parts)[1].filename, "in.jsonl");
  EXPECT_EQ((*parts)[1].content_type, "application/jsonl");
  EXPECT_EQ((*parts)[1].data, "{\"a\":1}\n{\"b\":2}\n");
  EXPECT_EQ(find_part(*parts, "file"), &(*parts)[1]);
  EXPECT_EQ(find_part(*parts, "nope"), nullptr);
}

TEST(MultipartTest, AcceptsBareLfAndPreambleAndEpilogue) {
  std::string body = "this is a preamble\r\n" + form("b", "\n") + "epilogue";
  auto parts = parse_multipart(body, "b");
  ASSERT_TRUE(parts.is_ok()) << parts.status().to_string();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].data, "batch");
  EXPECT_EQ((*parts)[1].data, "{\"a\":1}\n{\"b\":2}\n");
}

TEST(MultipartTest, BoundaryInsideDataIsData) {
  // The boundary string appears mid-line, and at a line start followed by other characters.
  std::string data = "x--B y\r\n--Bnot-a-delimiter\r\n--B-\r\nend\r\n\r\n";
  std::string body =
      "--B\r\nContent-Disposition: form-data; name=\"file\"; filename=\"f\"\r\n\r\n" + data +
      "\r\n--B--\r\n";
  auto parts = parse_multipart(body, "B");
  ASSERT_TRUE(parts.is_ok()) << parts.status().to_string();
  ASSERT_EQ(parts->size(), 1u);
  EXPECT_EQ((*parts)[0].data, data);
}

TEST(MultipartTest, EmptyDataAndBinaryBytes) {
  std::string binary("a\0b\r\n\xff", 6);
  std::string body =
      "--q\r\nContent-Disposition: form-data; name=\"empty\"\r\n\r\n\r\n"
      "--q\r\nContent-Disposition: form-data; name=\"bin\"\r\n\r\n" +
      binary + "\r\n--q--";
  auto parts = parse_multipart(body, "q");
  ASSERT_TRUE(parts.is_ok()) << parts.status().to_string();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].data, "");
  EXPECT_EQ((*parts)[1].data, binary);
}

TEST(MultipartTest, FileNamesQuotedEscapedAndEncoded) {
  std::string body =
      "--q\r\nContent-Disposition: form-data; name=\"a\"; filename=\"semi;colon "
      "\\\"q\\\".jsonl\"\r\n"
      "\r\nx\r\n--q\r\ncontent-disposition: form-data; name=b; filename=\"fallback.jsonl\"; "
      "filename*=UTF-8''caf%C3%A9.jsonl\r\n\r\ny\r\n--q--\r\n";
  auto parts = parse_multipart(body, "q");
  ASSERT_TRUE(parts.is_ok()) << parts.status().to_string();
  ASSERT_EQ(parts->size(), 2u);
  EXPECT_EQ((*parts)[0].filename, "semi;colon \"q\".jsonl");
  EXPECT_EQ((*parts)[1].name, "b");
  EXPECT_EQ((*parts)[1].filename, "caf\xc3\xa9.jsonl");
}

TEST(MultipartTest, MalformedBodiesNameTheBody) {
  const char* cd = "Content-Disposition: form-data; name=\"f\"";
  std::vector<std::pair<std::string, std::string>> cases = {
      {"no boundary line", "just some text"},
      {"no closing boundary", std::string("--q\r\n") + cd + "\r\n\r\ndata"},
      {"headers never end", std::string("--q\r\n") + cd},
      {"no disposition", "--q\r\nContent-Type: text/plain\r\n\r\nx\r\n--q--"},
      {"no name", "--q\r\nContent-Disposition: form-data; filename=\"a\"\r\n\r\nx\r\n--q--"},
      {"not form-data", "--q\r\nContent-Disposition: attachment; name=\"a\"\r\n\r\nx\r\n--q--"},
      {"header without colon", "--q\r\nbroken header\r\n\r\nx\r\n--q--"},
      {"junk after delimiter", std::string("--qjunk\r\n") + cd + "\r\n\r\nx\r\n--q--"},
  };
  for (const auto& [name, body] : cases) {
    auto r = parse_multipart(body, "q");
    ASSERT_FALSE(r.is_ok()) << name;
    EXPECT_EQ(r.status().field(), "body") << name;
    EXPECT_FALSE(r.status().message().empty());
  }
}

TEST(MultipartTest, NoPartsIsAnEmptyList) {
  auto r = parse_multipart("--q--\r\n", "q");
  ASSERT_TRUE(r.is_ok());
  EXPECT_TRUE(r->empty());
}

}  // namespace
}  // namespace hr::api
