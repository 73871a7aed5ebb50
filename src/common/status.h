// Errors as values: Status for operations that return nothing, Result<T> for those that return a T.
// No exceptions cross a component's public API; a Status's message names what is wrong (file:line, field,
// value).
#pragma once

#include <cassert>
#include <string>
#include <utility>
#include <variant>

namespace crescent {

/// Broad class of an error; the message carries the detail.
enum class StatusCode {
  kOk = 0,
  kInvalidArgument,     // bad input: a trace line, a config value, a flag
  kNotFound,            // a named thing (file, preset, policy) does not exist
  kIoError,             // the OS refused a read or write
  kOutOfRange,          // a value outside what the model or cluster can represent
  kInternal,            // a broken invariant: a bug in crescent
  kAlreadyExists,       // a name or memory range is taken (a segment name, an overlapping region)
  kFailedPrecondition,  // the object is not in a state that allows this (freeing a batch still in flight)
  kUnavailable,         // a peer or path cannot be reached now; retrying later may work
  kDeadlineExceeded,    // a timeout passed before the operation finished
  kLeaseExpired,        // a store read whose lease ran out before its bytes arrived: the bytes are not valid
  kNoSpace,             // the store has no room for a value even after evicting what it may evict
  kTransferFailed,      // bytes could not be moved to or from a segment (its owner died, a path failed)
  kPermissionDenied,    // the peer is not a member of this cluster (common/member_handshake.h)
  kCancelled,           // the caller (or the owner's shutdown) abandoned the operation; keep last (wire checks)
};

/// "ok", "invalid argument", "not found", ... (lower case, for messages and wire formats).
const char* status_code_name(StatusCode code);

/// Outcome of an operation: ok, or a code and a human-readable message.
class Status {
 public:
  /// An ok status.
  Status() = default;
  Status(StatusCode code, std::string message) : code_(code), message_(std::move(message)) {}

  static Status ok_status() { return Status(); }
  static Status invalid_argument(std::string m) { return {StatusCode::kInvalidArgument, std::move(m)}; }
  static Status not_found(std::string m) { return {StatusCode::kNotFound, std::move(m)}; }
  static Status io_error(std::string m) { return {StatusCode::kIoError, std::move(m)}; }
  static Status out_of_range(std::string m) { return {StatusCode::kOutOfRange, std::move(m)}; }
  static Status internal(std::string m) { return {StatusCode::kInternal, std::move(m)}; }
  static Status already_exists(std::string m) { return {StatusCode::kAlreadyExists, std::move(m)}; }
  static Status failed_precondition(std::string m) { return {StatusCode::kFailedPrecondition, std::move(m)}; }
  static Status unavailable(std::string m) { return {StatusCode::kUnavailable, std::move(m)}; }
  static Status deadline_exceeded(std::string m) { return {StatusCode::kDeadlineExceeded, std::move(m)}; }
  static Status lease_expired(std::string m) { return {StatusCode::kLeaseExpired, std::move(m)}; }
  static Status no_space(std::string m) { return {StatusCode::kNoSpace, std::move(m)}; }
  static Status transfer_failed(std::string m) { return {StatusCode::kTransferFailed, std::move(m)}; }
  static Status permission_denied(std::string m) { return {StatusCode::kPermissionDenied, std::move(m)}; }
  static Status cancelled(std::string m) { return {StatusCode::kCancelled, std::move(m)}; }

  bool ok() const { return code_ == StatusCode::kOk; }
  StatusCode code() const { return code_; }
  /// The message alone (empty when ok).
  const std::string& message() const { return message_; }
  /// "OK" or the message; what a CLI prints after "error: ".
  std::string to_string() const { return ok() ? "OK" : message_; }

 private:
  StatusCode code_ = StatusCode::kOk;
  std::string message_;
};

/// A T or the Status saying why there is none. REQUIRES: a Result built from a Status is built from a non-ok
/// one.
template <typename T>
class Result {
 public:
  Result(T value)
      : v_(std::move(value)) {}  // NOLINT(google-explicit-constructor): returning a T reads naturally
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    assert(!std::get<Status>(v_).ok());
  }

  bool ok() const { return std::holds_alternative<T>(v_); }
  /// The error; an ok Status when this holds a value.
  Status status() const { return ok() ? Status() : std::get<Status>(v_); }

  /// REQUIRES: ok().
  T& value() & { return std::get<T>(v_); }
  const T& value() const& { return std::get<T>(v_); }
  T&& value() && { return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  std::variant<T, Status> v_;
};

}  // namespace crescent

/// Returns the Status of `expr` from the enclosing function when it is not ok.
#define CRESCENT_RETURN_IF_ERROR(expr) \
  do {                                 \
    ::crescent::Status _st = (expr);   \
    if (!_st.ok()) return _st;         \
  } while (0)
