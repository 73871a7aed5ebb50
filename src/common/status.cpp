#include "common/status.h"

namespace crescent {

const char* status_code_name(StatusCode code) {
  switch (code) {
    case StatusCode::kOk:
      return "ok";
    case StatusCode::kInvalidArgument:
      return "invalid argument";
    case StatusCode::kNotFound:
      return "not found";
    case StatusCode::kIoError:
      return "io error";
    case StatusCode::kOutOfRange:
      return "out of range";
    case StatusCode::kInternal:
      return "internal";
    case StatusCode::kAlreadyExists:
      return "already exists";
    case StatusCode::kFailedPrecondition:
      return "failed precondition";
    case StatusCode::kUnavailable:
      return "unavailable";
    case StatusCode::kDeadlineExceeded:
      return "deadline exceeded";
    case StatusCode::kLeaseExpired:
      return "lease expired";
    case StatusCode::kNoSpace:
      return "no space";
    case StatusCode::kTransferFailed:
      return "transfer failed";
    case StatusCode::kPermissionDenied:
      return "permission denied";
    case StatusCode::kCancelled:
      return "cancelled";
  }
  return "unknown";
}

}  // namespace crescent
