// Names and formatting for Status.
#include "base/status.h"

namespace hr {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid_argument";
    case StatusCode::kUnauthenticated:
      return "unauthenticated";
    case StatusCode::kNotFound:
      return "not_found";
    case StatusCode::kConflict:
      return "conflict";
    case StatusCode::kTooLarge:
      return "too_large";
    case StatusCode::kResourceExhausted:
      return "resource_exhausted";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kDeadlineExceeded:
      return "deadline_exceeded";
    case StatusCode::kFailedPrecondition:
      return "failed_precondition";
    case StatusCode::kCancelled:
      return "cancelled";
    case StatusCode::kPermissionDenied:
      return "permission_denied";
    case StatusCode::kInternal:
      return "internal";
  }
  return "unknown";
}

StatusCode status_code_from_name(std::string_view name) {
  for (int c = 0; c <= static_cast<int>(StatusCode::kInternal); ++c) {
    if (name == status_code_name(static_cast<StatusCode>(c))) return static_cast<StatusCode>(c);
  }
  return StatusCode::kInternal;
}

std::string Status::to_string() const {
  if (is_ok()) return "ok";
  std::string s = std::string(status_code_name(code_)) + ": " + message_;
  if (!field_.empty()) s += " (field=" + field_ + ")";
  return s;
}

Status Status::with_context(const std::string& context) const {
  if (is_ok()) return *this;
  return Status(code_, context + ": " + message_, field_);
}

}  // namespace hr
