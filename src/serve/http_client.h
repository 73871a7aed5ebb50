// An asynchronous HTTP/1.1 client (Boost.Beast over Asio) for relaying OpenAI-API requests to inference
// engines crescent does not own (vLLM-like servers): one event loop thread runs every exchange, so thousands
// of Server-Sent-Events streams can be in flight without a thread each. Keep-alive connections are pooled per
// host:port and reused; every wait (connect, response headers, each piece of the body) has a deadline; the
// response's head is bounded and its body goes to the caller piece by piece as it arrives, never buffered
// whole. Plain http:// only (no TLS). Beast stays in http_client.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace crescent::serve {

/// Where an engine listens, from "http://host[:port][/base]".
struct HttpUrl {
  std::string host;       // a name, an IPv4 address, or an IPv6 address without its brackets ("::1")
  uint16_t port = 80;     // 80 when the URL names none
  std::string base_path;  // "" or "/base" without a trailing '/': requests go to base_path + "/v1/..."
};

/// Splits an engine's URL. kInvalidArgument naming the URL when it is not http:// with a host and an optional
/// port in 1..65535 (an https:// URL is refused as such: the client speaks no TLS; user info, a query or a
/// fragment are refused too).
Result<HttpUrl> parse_http_url(std::string_view url);

/// One request to send.
struct HttpClientRequest {
  std::string method = "POST";  // an HTTP token: "GET", "POST", ...; a HEAD response is read without a body
  std::string host;             // a name (resolved asynchronously) or a numeric IPv4/IPv6 address
  uint16_t port = 0;            // REQUIRES: > 0
  std::string target;           // origin form, starting with '/': "/v1/completions"
  /// Extra headers. Host and Content-Length are the client's (giving either, or Transfer-Encoding, is
  /// kInvalidArgument); Content-Type defaults to application/json when the body is not empty; a
  /// "Connection: close" here keeps the connection out of the pool.
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;                // sent with Content-Length (also 0 for POST, PUT and PATCH)
  double connect_timeout_s = 2;    // resolving the host and the TCP connect, per attempt
  double response_timeout_s = 30;  // from sending the request until the response's headers have arrived
  double idle_timeout_s = 30;      // the longest wait for the next piece of the body (a stream's next event)
};

/// What the caller hears of one exchange. Each runs on the client's thread: keep them short, never block
/// (hand work elsewhere). Any may be empty. A callback may call send() and cancel(), also for its own
/// exchange.
struct HttpClientCallbacks {
  /// The response's status and headers (names lower-cased), once; not called for 1xx interim responses.
  /// Returning false aborts the exchange: its connection is closed and on_end(kCancelled) follows.
  std::function<bool(int status, const std::vector<std::pair<std::string, std::string>>& headers)> on_head;
  /// The next piece of the body as it arrived (Content-Length, chunked with the chunk framing removed, or
  /// until the server closes), 0 or more times, in order, each at most Options::body_piece_bytes; `piece` is
  /// valid during the call only. Returning false aborts as on_head does.
  std::function<bool(std::string_view piece)> on_body;
  /// The exchange ended, exactly once and always last (also when send() refused the request at once):
  ///   ok                  the whole response arrived (its connection went back to the pool if reusable);
  ///   kUnavailable        the host did not resolve, the connect was refused or reset, or the server closed
  ///                       the connection before the response ended;
  ///   kDeadlineExceeded   a timeout passed; the message names which (connect_timeout_s, response_timeout_s,
  ///                       idle_timeout_s);
  ///   kCancelled          cancel(), the client's destruction, or a callback that returned false;
  ///   kInvalidArgument    the request was malformed (a bad header, target, port or timeout), or the response
  ///                       was (bad framing, a head over Options::max_response_head_bytes, 101 Switching
  ///                       Protocols).
  /// Messages start with "METHOD http://host:port/target: ".
  std::function<void(const Status& status)> on_end;
};

/// Whether an exchange that ended with `status` (on_end's) never reached the server: its host did not
/// resolve, or the TCP connect failed or timed out (connect_timeout_s), so nothing of the request was sent
/// and sending it elsewhere cannot run it twice.
bool ended_before_sending(const Status& status);

/// A whole response, from HttpClient::fetch().
struct HttpClientResponse {
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;  // names lower-cased
  std::string body;
  /// The value of the first header `name` (lower case), or empty.
  std::string header(std::string_view name) const;
};

/// The client: runs exchanges on its own event loop thread and keeps idle keep-alive connections per
/// host:port (at most Options::max_idle_per_host each, for at most Options::idle_connection_timeout_s),
/// reusing the most recently used first. A reused connection the server turns out to have closed (it was
/// stale: reset, or closed before anything of the response arrived) is retried once on a fresh connection; a
/// failure on a fresh connection is not retried. (So a request can reach a server twice when it closed the
/// connection after reading it without answering: true of any HTTP client that retries stale keep-alive
/// connections.) A connection goes back to the pool only after a whole response that allows keep-alive: never
/// after an HTTP/1.0 response, "Connection: close", a body read until close, an abort, a cancel or an error.
/// Thread-safe: send(), cancel(), fetch() and open_connections() may be called from any thread (fetch() not
/// from the client's own thread). Connections to one host:port are not limited: each exchange without an idle
/// connection opens one.
class HttpClient {
 public:
  struct Options {
    size_t max_idle_per_host = 64;  // idle connections kept per host:port; the oldest closes beyond; 0: none
    double idle_connection_timeout_s = 60;  // an idle connection unused this long is closed; <= 0: none kept
    size_t max_response_head_bytes = 64 << 10;  // status line and headers; larger: kInvalidArgument
    /// The largest piece on_body gets: the buffer each exchange holds while it reads a body.
    size_t body_piece_bytes = 16 << 10;
  };

  /// Starts the event loop thread.
  static std::unique_ptr<HttpClient> start(Options options);
  static std::unique_ptr<HttpClient> start() { return start(Options()); }
  /// Cancels every exchange in flight (each gets on_end(kCancelled)), closes every connection and joins the
  /// thread. REQUIRES: not called on the client's thread (from a callback), and no other thread calls in.
  ~HttpClient();

  /// Starts an exchange and returns its id (for cancel(); ids start at 1 and are never reused). A malformed
  /// request is answered through on_end(kInvalidArgument) like any failure, never inside send(). Called from
  /// another thread, the exchange's callbacks may begin before send() returns there (a callback that needs
  /// the id must wait for it); called from a callback, none of them runs before send() returns. After the
  /// client's destructor began (a callback sending during shutdown): on_end(kCancelled).
  uint64_t send(HttpClientRequest request, HttpClientCallbacks callbacks);
  /// Aborts exchange `id`: its connection is closed (never returned to the pool) and on_end(kCancelled)
  /// follows unless the exchange already ended. No-op for an unknown or finished id. Takes effect on the
  /// client's thread: a piece already being delivered finishes first.
  void cancel(uint64_t id);

  /// Sends `request` and waits for the whole response (bounded by the request's timeouts), for simple calls:
  /// health checks, /metrics scrapes, startup checks. Any status (404, 500) is a response; errors are
  /// on_end's, and kOutOfRange when the body exceeds `max_body_bytes`. kFailedPrecondition on the client's
  /// own thread (it would wait for itself).
  Result<HttpClientResponse> fetch(HttpClientRequest request, size_t max_body_bytes = 16 << 20);
  /// fetch() of every request at once, waiting for them all: the results in the requests' order, the whole
  /// wait bounded by the slowest request's timeouts (polling many engines, one of them hung).
  std::vector<Result<HttpClientResponse>> fetch_all(std::vector<HttpClientRequest> requests,
                                                    size_t max_body_bytes = 16 << 20);

  /// Connections open now (busy and idle; counted from the completed TCP connect to the close), for metrics
  /// and tests.
  size_t open_connections() const;

  class Impl;

 private:
  explicit HttpClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// Splits a byte stream of Server-Sent Events (WHATWG HTML §9.2, "text/event-stream") into events, fed in
/// pieces as they arrive: a piece may end anywhere, also between a "\r" and its "\n". Lines end with "\n",
/// "\r\n" or "\r"; lines starting with ':' are comments; an event is dispatched at an empty line when it has
/// data, as its "data" lines' values joined by '\n' (one space after "data:" dropped). "event", "id" and
/// "retry" fields are ignored (OpenAI-style streams carry everything in data); a partial event when the
/// stream ends is dropped, as the standard says. Not thread-safe.
class SseParser {
 public:
  /// `on_event` gets each event's data, valid during the call only. An event (its data and the line being
  /// read) larger than `max_event_bytes` is an error.
  explicit SseParser(std::function<void(std::string_view data)> on_event, size_t max_event_bytes = 1 << 20);

  /// Parses the next bytes, calling on_event for each event they complete. kOutOfRange when an event grows
  /// past max_event_bytes; the parser then stays failed (every later feed() returns the same error).
  Status feed(std::string_view bytes);

 private:
  void take_line(std::string_view line);

  std::function<void(std::string_view)> on_event_;
  size_t max_event_bytes_;
  std::string line_;      // the line read so far when a piece ended inside it
  std::string data_;      // the event's data lines so far, each followed by '\n'
  bool skip_lf_ = false;  // the last piece ended with '\r': a '\n' starting the next one ends no line
  Status failed_;
};

}  // namespace crescent::serve
