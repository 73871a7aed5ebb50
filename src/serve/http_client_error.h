// What a failed cpp-httplib client exchange means, in words, for the clients of OpenAI-compatible servers in
// serve/ (replay, the HTTP profile target). Includes <httplib.h>: include it from .cpp files only.
#pragma once

#include <fmt/format.h>
#include <httplib.h>

#include <string>

namespace crescent::serve {

/// `error` for the person reading a report (httplib's own names are one word); `timeout_s` is the read
/// timeout the client had, which a Read error means passed without a byte.
inline std::string what_failed(httplib::Error error, double timeout_s) {
  switch (error) {
    case httplib::Error::Connection:
      return "could not connect";
    case httplib::Error::Read:
      return fmt::format("the connection closed, or nothing came for {:g} s", timeout_s);
    case httplib::Error::Write:
      return "the request could not be sent";
    case httplib::Error::ConnectionTimeout:
      return "the connection was not accepted in time";
    default:
      return "the exchange failed";
  }
}

}  // namespace crescent::serve
