// Status and Result<T>: how expected failures (bad input, not found, dependency down, timeout)
// travel between modules. Broken invariants use HR_CHECK (base/check.h) instead; "no room" is a
// normal return value, not a Status. Value types; safe to copy between threads.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>

#include "base/check.h"

namespace hr {

enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // bad input from a caller (400)
  kUnauthenticated,     // missing or invalid credentials (401)
  kNotFound,            // unknown id, or one the caller may not see (404)
  kConflict,            // idempotency or state conflict (409)
  kTooLarge,            // body or batch over a limit (413)
  kResourceExhausted,   // capacity or rate (429)
  kUnavailable,         // a dependency is down; retryable (503)
  kDeadlineExceeded,    // timed out
  kFailedPrecondition,  // the operation does not apply in the current state
  kCancelled,
  kPermissionDenied,  // a known caller that may not do this (403)
  kInternal,          // a bug or an unexpected failure
};

const char* status_code_name(StatusCode code);
// The inverse of status_code_name(); kInternal for an unknown name.
StatusCode status_code_from_name(std::string_view name);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(StatusCode code, std::string message, std::string field = {})
      : code_(code), message_(std::move(message)), field_(std::move(field)) {}

  static Status ok() { return Status(); }

  bool is_ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // The input field at fault (e.g. "requests[3].messages[0].role"), empty when none.
  const std::string& field() const { return field_; }
  // "invalid_argument: message (field=...)".
  std::string to_string() const;
  // Returns a copy whose message is prefixed with `context: `.
  Status with_context(const std::string& context) const;

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
  std::string field_;
};

inline Status invalid_argument(std::string msg, std::string field = {}) {
  return Status(StatusCode::kInvalidArgument, std::move(msg), std::move(field));
}
inline Status not_found(std::string msg) { return Status(StatusCode::kNotFound, std::move(msg)); }
inline Status unavailable(std::string msg) {
  return Status(StatusCode::kUnavailable, std::move(msg));
}
inline Status internal_error(std::string msg) {
  return Status(StatusCode::kInternal, std::move(msg));
}

// A value or a non-OK Status.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    HR_CHECK(!std::get<Status>(v_).is_ok()) << "Result built from an OK status";
  }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  const Status& status() const {
    static const Status kOk;
    return is_ok() ? kOk : std::get<Status>(v_);
  }
  T& value() & {
    HR_CHECK(is_ok()) << status().to_string();
    return std::get<T>(v_);
  }
  const T& value() const& {
    HR_CHECK(is_ok()) << status().to_string();
    return std::get<T>(v_);
  }
  T&& value() && {
    HR_CHECK(is_ok()) << status().to_string();
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace hr

#define HR_CONCAT_INNER(a, b) a##b
#define HR_CONCAT(a, b) HR_CONCAT_INNER(a, b)

// Returns the Status from the enclosing function when `expr` is not OK.
#define HR_RETURN_IF_ERROR(expr)                \
  do {                                          \
    ::hr::Status hr_status_ = (expr);           \
    if (!hr_status_.is_ok()) return hr_status_; \
  } while (0)

// `HR_ASSIGN_OR_RETURN(auto x, f());` unwraps a Result or returns its Status.
#define HR_ASSIGN_OR_RETURN(lhs, expr) \
  HR_ASSIGN_OR_RETURN_IMPL(HR_CONCAT(hr_result_, __LINE__), lhs, expr)
#define HR_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.is_ok()) return tmp.status();         \
  lhs = std::move(tmp).value()
