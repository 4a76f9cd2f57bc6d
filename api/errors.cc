// Status → HTTP mapping.
#include "api/errors.h"

namespace hr::api {

int http_status_for(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return 200;
    case StatusCode::kInvalidArgument:
      return 400;
    case StatusCode::kUnauthenticated:
      return 401;
    case StatusCode::kNotFound:
      return 404;
    case StatusCode::kConflict:
      return 409;
    case StatusCode::kFailedPrecondition:
      return 409;
    case StatusCode::kTooLarge:
      return 413;
    case StatusCode::kResourceExhausted:
      return 429;
    case StatusCode::kUnavailable:
      return 503;
    case StatusCode::kDeadlineExceeded:
      return 504;
    case StatusCode::kCancelled:
      return 499;
    case StatusCode::kInternal:
      return 500;
  }
  return 500;
}

int error_code_for(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
      return 1001;
    case StatusCode::kUnauthenticated:
      return 1002;
    case StatusCode::kNotFound:
      return 1004;
    case StatusCode::kConflict:
      return 1009;
    case StatusCode::kFailedPrecondition:
      return 1010;
    case StatusCode::kTooLarge:
      return 1013;
    case StatusCode::kResourceExhausted:
      return 3040;
    case StatusCode::kUnavailable:
      return 1503;
    case StatusCode::kDeadlineExceeded:
      return 1504;
    case StatusCode::kCancelled:
      return 1499;
    case StatusCode::kInternal:
      return 1500;
    case StatusCode::kOk:
      return 0;
  }
  return 1500;
}

namespace {

// `s` with what is not valid UTF-8 replaced by U+FFFD: error messages may quote a client's bytes
// (a path, a query value), and a body holding invalid UTF-8 cannot be printed.
std::string printable(const std::string& s) {
  using nlohmann::json;
  return json::parse(json(s).dump(-1, ' ', false, json::error_handler_t::replace))
      .get<std::string>();
}

}  // namespace

nlohmann::json parse_client_json(std::string_view text, std::string* why) {
  auto refuse = [&](const char* reason) {
    if (why) *why = reason;
    return nlohmann::json(nlohmann::json::value_t::discarded);
  };
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (in_string) {
      if (c == '"') {
        in_string = false;
      } else if (c == '\\') {
        if (text.substr(i + 1, 5) == "u0000") return refuse("holds a NUL character (\\u0000)");
        ++i;  // the escaped character
      }
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > kMaxJsonDepth) return refuse("nests deeper than 64 levels");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (j.is_discarded()) return refuse("is not valid JSON");
  return j;
}

nlohmann::json error_body(const Status& status, std::optional<int> index) {
  nlohmann::json err = {{"code", error_code_for(status.code())},
                        {"type", status_code_name(status.code())},
                        {"message", printable(status.message())}};
  if (!status.field().empty()) err["field"] = printable(status.field());
  if (index) err["index"] = *index;
  return {{"success", false},
          {"errors", nlohmann::json::array({err})},
          {"messages", nlohmann::json::array()},
          {"result", nullptr}};
}

HttpResponse error_response(const Status& st, std::optional<int> index) {
  HttpResponse res = json_response(static_cast<unsigned>(http_status_for(st.code())),
                                   error_body(st, index).dump());
  if (st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kResourceExhausted) {
    res.set(boost::beast::http::field::retry_after, "1");
  }
  return res;
}

HttpResponse ok_response(nlohmann::json result, unsigned status) {
  nlohmann::json body = {{"result", std::move(result)},
                         {"success", true},
                         {"errors", nlohmann::json::array()},
                         {"messages", nlohmann::json::array()}};
  return json_response(status, body.dump());
}

nlohmann::json openai_error_body(const Status& status, std::optional<std::string> code) {
  const char* type = "invalid_request_error";
  switch (status.code()) {
    case StatusCode::kUnauthenticated:
      type = "authentication_error";
      break;
    case StatusCode::kResourceExhausted:
      type = "rate_limit_error";
      break;
    case StatusCode::kUnavailable:
    case StatusCode::kDeadlineExceeded:
    case StatusCode::kInternal:
      type = "server_error";
      break;
    default:
      break;
  }
  if (!code) {
    code = status.code() == StatusCode::kUnauthenticated ? "invalid_api_key"
                                                         : status_code_name(status.code());
  }
  nlohmann::json err = {
      {"message", printable(status.message())},
      {"type", type},
      {"param", status.field().empty() ? nlohmann::json(nullptr)
                                       : nlohmann::json(printable(status.field()))},
      {"code", *code}};
  return {{"error", std::move(err)}};
}

}  // namespace hr::api
