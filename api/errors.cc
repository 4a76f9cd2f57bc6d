// The API's error bodies and responses.
#include "api/errors.h"

#include "http/status.h"

namespace hr::api {

int error_code_for(StatusCode code) {
  switch (code) {
    case StatusCode::kInvalidArgument:
      return 1001;
    case StatusCode::kUnauthenticated:
      return 1002;
    case StatusCode::kPermissionDenied:
      return 1003;
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

namespace {

// A JSON response with the Status's HTTP code, and Retry-After: 1 when trying again may help.
http::HttpResponse with_status(const Status& st, const nlohmann::json& body) {
  http::HttpResponse res =
      http::json_response(static_cast<unsigned>(http::http_status_for(st.code())), body.dump());
  if (st.code() == StatusCode::kUnavailable || st.code() == StatusCode::kResourceExhausted) {
    res.set(boost::beast::http::field::retry_after, "1");
  }
  return res;
}

}  // namespace

http::HttpResponse error_response(const Status& st, std::optional<int> index) {
  return with_status(st, error_body(st, index));
}

http::HttpResponse openai_error_response(const Status& st) {
  return with_status(st, openai_error_body(st));
}

http::HttpResponse ok_response(nlohmann::json result, unsigned status) {
  nlohmann::json body = {{"result", std::move(result)},
                         {"success", true},
                         {"errors", nlohmann::json::array()},
                         {"messages", nlohmann::json::array()}};
  return http::json_response(status, body.dump());
}

nlohmann::json openai_error_body(const Status& status, std::optional<std::string> code) {
  const char* type = "invalid_request_error";
  switch (status.code()) {
    case StatusCode::kUnauthenticated:
      type = "authentication_error";
      break;
    case StatusCode::kPermissionDenied:
      type = "permission_error";
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
  if (!code && status.code() == StatusCode::kResourceExhausted &&
      status.field() == "service_tier") {
    code = "resource_unavailable";  // a flex call not started in time (OpenAI's code)
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
