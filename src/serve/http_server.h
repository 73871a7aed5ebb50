// An asynchronous HTTP/1.1 server (Boost.Beast over Asio) for the Conductor's OpenAI-compatible front end:
// keep-alive, whole responses and server-sent-event streams written from any thread, a client disconnect
// reported to its stream's owner, bounded header and body sizes, and timeouts so a slow client (slowloris)
// cannot hold a connection. One event loop thread serves every connection; handlers must not block it.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"

namespace crescent::serve {

/// A received request: method ("GET", "POST", ...), target path without the query, lower-cased header
/// names, the whole body.
struct HttpRequest {
  std::string method;
  std::string path;
  std::vector<std::pair<std::string, std::string>> headers;
  std::string body;
  /// The value of header `name` (lower case), or empty.
  std::string header(std::string_view name) const;
};

/// A whole response.
struct HttpResponse {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra headers (e.g. Retry-After)
};

/// How a handler answers one request. Copyable handle; every method may be called from any thread, and
/// calls after the connection closed are ignored. Calls on the server's thread (the handler's) take effect
/// at once, so calls made from another thread after them (a stream's writes) come after them. Exactly one of
/// respond() or start_stream() must be called: a request never answered holds its connection until the client
/// gives up.
class HttpResponder {
 public:
  class Session;
  explicit HttpResponder(std::shared_ptr<Session> session) : session_(std::move(session)) {}

  /// Sends a whole response.
  void respond(HttpResponse response) const;
  /// Starts a `text/event-stream` response (chunked); then write() events and end() it. The status line
  /// and headers go out with the first write() or end(): until then respond() may still answer whole
  /// (e.g. a 429 decided after the stream was opened).
  void start_stream() const;
  /// Sends bytes of the stream (e.g. one SSE event).
  void write(std::string bytes) const;
  /// Ends the stream; the connection then serves the client's next request.
  void end() const;
  /// `callback` runs (on the server's thread) if the client goes away before the response ended; at once
  /// if it already has. Used to cancel the request (free its KV, stop decoding).
  void on_disconnect(std::function<void()> callback) const;

 private:
  std::shared_ptr<Session> session_;
};

/// Handles a request; runs on the server's thread and must return quickly (answer later from elsewhere).
using HttpHandler = std::function<void(HttpRequest request, HttpResponder responder)>;

/// Limits and timeouts.
struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                          // 0 picks a free port
  uint64_t body_limit_bytes = 16ull << 20;  // larger bodies: 413
  int header_timeout_ms = 10'000;           // a request's headers and body must arrive within this
  int idle_timeout_ms = 60'000;             // a keep-alive connection with no request is closed after this
  size_t max_connections = 10'000;          // further connections are closed at once (also bounded by the
                                            // process's file descriptor limit: accepts pause while it is hit)
  /// Bytes the bodies of all requests being read may hold together: each counts its Content-Length (or
  /// body_limit_bytes when it is sent chunked) from its headers until it is handled. A request that would
  /// go over is answered 503 with Retry-After before its body is read, and its connection closed.
  uint64_t bodies_limit_bytes = 256ull << 20;
  /// Judges a request on its method, path and headers alone (HttpRequest::body empty), before its body is
  /// read: a response returned answers it at once, the body unread, and closes the connection (401 for a
  /// wrong API key: a client without the key cannot make the server hold its body). Runs on the server's
  /// thread. Empty: every request is read whole.
  std::function<std::optional<HttpResponse>(const HttpRequest& head)> check_head = nullptr;
};

/// The server. Starts listening in start(); stops (closing every connection) in stop() or the destructor.
class HttpServer {
 public:
  ~HttpServer();
  /// Binds and starts the event loop thread. kUnavailable naming host:port when it cannot bind.
  static Result<std::unique_ptr<HttpServer>> start(const HttpServerOptions& options, HttpHandler handler);
  /// The port bound (useful with port 0).
  int port() const;
  /// Closes the listener and every connection; idempotent.
  void stop();
  /// Starts a graceful stop: the listener closes (new connections are refused, so a load balancer tries
  /// another front end), idle keep-alive connections close, a request that arrives on a connection still
  /// open is answered 503 (Retry-After: 1, code "server_shutting_down") and its connection closed, and the
  /// responses under way go on to their end. Wait for responses_in_flight() to reach 0, then stop().
  /// Idempotent; returns once the loop has done it.
  void begin_drain();
  /// Requests handed to the handler (or answered by the server itself) whose response has not been sent
  /// whole yet.
  size_t responses_in_flight() const;
  /// Connections open now.
  size_t connections() const;

  class Impl;

 private:
  explicit HttpServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::serve
