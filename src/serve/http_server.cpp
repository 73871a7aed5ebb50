// Beast parses requests; responses are written as plain HTTP/1.1 bytes (status line, headers, body, or
// chunked encoding for streams) from a per-connection queue, so a stream's events can be queued from any
// thread without a serializer per event. Every socket operation runs on the one event loop thread; other
// threads reach a connection only by posting to it, and a connection that closed ignores what arrives.
#include "serve/http_server.h"

#include <fmt/format.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <future>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "serve/openai_api.h"

namespace crescent::serve {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;

namespace {

// A connection that queues more than this (a client not reading its stream) is closed.
constexpr size_t kMaxQueuedBytes = 8u << 20;
constexpr uint32_t kHeaderLimitBytes = 16u << 10;

std::string status_line(int status) {
  const auto reason = http::obsolete_reason(static_cast<http::status>(status));
  return fmt::format("HTTP/1.1 {} {}\r\n", status, std::string_view(reason.data(), reason.size()));
}

}  // namespace

// What connections share with the server and with responders on other threads.
struct HttpServerShared {
  asio::io_context io{1};
  std::atomic<bool> stopped{false};
  bool draining = false;  // the loop thread's: begin_drain() was called
  HttpServerOptions options;
  HttpHandler handler;
  std::atomic<size_t> connections{0};
  std::atomic<size_t> responses_in_flight{0};
  uint64_t body_bytes_reserved =
      0;  // the loop thread's: what requests being read may hold (bodies_limit_bytes)
};

namespace {

// A request's method, target path (no query) and headers (names lower-cased); no body.
HttpRequest head_of(const http::request<http::string_body>& message) {
  HttpRequest request;
  request.method = std::string(message.method_string());
  const std::string_view target(message.target().data(), message.target().size());
  request.path = std::string(target.substr(0, target.find('?')));
  for (const auto& field : message) {
    std::string name(field.name_string());
    for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    request.headers.emplace_back(std::move(name), std::string(field.value()));
  }
  return request;
}

}  // namespace

class HttpResponder::Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket socket, std::shared_ptr<HttpServerShared> shared)
      : shared_(std::move(shared)), socket_(std::move(socket)), timer_(shared_->io) {
    shared_->connections.fetch_add(1);
  }
  ~Session() {
    response_done();
    release_body_bytes();
    shared_->connections.fetch_sub(1);
  }

  HttpServerShared& shared() { return *shared_; }

  // Waits for the next request's first bytes, at most the idle timeout.
  void await_request() {
    state_ = State::kAwaiting;
    arm_timer(shared_->options.idle_timeout_ms);
    if (!reading_) read_some();
  }

  // Closes an idle connection (waiting for its next request, nothing of it received): a drain's first step.
  void close_if_idle() {
    if (state_ == State::kAwaiting && buffer_.size() == 0) close();
  }

  void close() {
    if (state_ == State::kClosed) return;
    const bool unfinished = state_ == State::kHandling || state_ == State::kStreaming;
    state_ = State::kClosed;
    response_done();
    beast::error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_both, ignored);
    socket_.close(ignored);
    timer_.cancel();
    release_body_bytes();
    if (!writing_) {  // else the write in flight owns out_.front(): its completion clears the queue
      out_.clear();
      queued_bytes_ = 0;
    }
    if (unfinished && on_disconnect_) std::exchange(on_disconnect_, nullptr)();
  }

  // The responder's operations, on the event loop thread.
  void respond(HttpResponse r) {
    // A stream whose headers have not gone out yet may still be answered whole (a refusal).
    if (state_ != State::kHandling && !(state_ == State::kStreaming && stream_headers_pending_)) return;
    stream_headers_pending_ = false;
    std::string head = status_line(r.status);
    head += fmt::format("Content-Type: {}\r\nContent-Length: {}\r\n", r.content_type, r.body.size());
    for (const auto& [name, value] : r.headers) head += fmt::format("{}: {}\r\n", name, value);
    head += keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n";
    if (!head_request_) head += r.body;  // a HEAD answer has the headers only
    state_ = State::kFinishing;
    queue(std::move(head));
  }
  void start_stream() {
    if (state_ != State::kHandling) return;
    state_ = State::kStreaming;
    if (http10_) keep_alive_ = false;  // the close ends an HTTP/1.0 stream
    stream_headers_pending_ = true;  // sent with the first bytes, so a refusal can still be a whole response
    // Notices a client that goes away mid-stream (not when it already sent its next request: that waits).
    if (!reading_ && buffer_.size() == 0) read_some();
  }
  void write(std::string bytes) {
    if (state_ != State::kStreaming || bytes.empty()) return;
    send_stream_headers();
    // HTTP/1.0 has no chunked encoding: the bytes go as they are and the close ends the body.
    queue(http10_ ? std::move(bytes) : fmt::format("{:x}\r\n", bytes.size()) + bytes + "\r\n");
  }
  void end() {
    if (state_ != State::kStreaming) return;
    send_stream_headers();
    state_ = State::kFinishing;
    if (http10_) {
      if (!writing_) write_next();  // nothing more to send: finishing closes the connection
      return;
    }
    queue("0\r\n\r\n");
  }
  void send_stream_headers() {
    if (!stream_headers_pending_) return;
    stream_headers_pending_ = false;
    if (http10_) {
      queue(status_line(200) +
            "Content-Type: text/event-stream\r\nCache-Control: no-cache\r\nConnection: close\r\n\r\n");
      return;
    }
    queue(status_line(200) +
          "Content-Type: text/event-stream\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n" +
          (keep_alive_ ? "Connection: keep-alive\r\n\r\n" : "Connection: close\r\n\r\n"));
  }
  void set_on_disconnect(std::function<void()> callback) {
    if (state_ == State::kClosed) {
      callback();
      return;
    }
    on_disconnect_ = std::move(callback);
  }

 private:
  enum class State { kAwaiting, kReading, kHandling, kStreaming, kFinishing, kClosed };

  // A request is being answered: counted in responses_in_flight until response_done().
  void enter_handling() {
    state_ = State::kHandling;
    if (!counted_) {
      counted_ = true;
      shared_->responses_in_flight.fetch_add(1);
    }
  }
  void response_done() {
    if (counted_) {
      counted_ = false;
      shared_->responses_in_flight.fetch_sub(1);
    }
  }

  void arm_timer(int ms) {
    timer_.expires_after(std::chrono::milliseconds(ms));
    timer_.async_wait([weak = weak_from_this()](beast::error_code ec) {
      if (ec) return;
      if (auto self = weak.lock()) self->close();  // idle, or a request too slow to arrive (slowloris)
    });
  }

  // One read of whatever the client sends: the start of a request, or (mid-stream) nothing until it closes.
  void read_some() {
    reading_ = true;
    auto space = buffer_.prepare(16u << 10);
    socket_.async_read_some(space, [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->reading_ = false;
      if (ec) {
        self->close();
        return;
      }
      self->buffer_.commit(n);
      self->on_bytes();
    });
  }

  void on_bytes() {
    if (state_ == State::kAwaiting) {
      read_request();
    }
    // Otherwise the bytes are a pipelined request, kept in the buffer for after this response; reading
    // stops until then (a client that pipelines is not watched for a disconnect meanwhile).
  }

  void read_request() {
    state_ = State::kReading;
    arm_timer(shared_->options.header_timeout_ms);
    parser_.emplace();
    parser_->body_limit(shared_->options.body_limit_bytes);
    parser_->header_limit(kHeaderLimitBytes);
    http::async_read_header(
        socket_, buffer_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) {
          if (ec || self->parser_->is_done()) {
            self->on_request(ec);
            return;
          }
          if (!self->admit_body()) return;
          // A client that sent "Expect: 100-continue" (curl does above 1 KiB) waits for this before the body.
          const auto expect = self->parser_->get()[http::field::expect];
          if (self->parser_->get().version() >= 11 && beast::iequals(expect, "100-continue") &&
              self->parser_->content_length().value_or(0) <= self->shared_->options.body_limit_bytes) {
            static const std::string kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
            asio::async_write(self->socket_, asio::buffer(kContinue), [self](beast::error_code wec, size_t) {
              if (wec) {
                self->close();
                return;
              }
              self->read_body();
            });
            return;
          }
          self->read_body();
        });
  }

  // Between a request's headers and its body: the head check (check_head) and room among the bodies being
  // read (bodies_limit_bytes). False: the request was answered and its connection closes.
  bool admit_body() {
    const HttpServerOptions& options = shared_->options;
    if (options.check_head) {
      if (std::optional<HttpResponse> answer = options.check_head(head_of(parser_->get()))) {
        keep_alive_ = false;  // its body is not read: the connection cannot serve another request
        head_request_ = parser_->get().method() == http::verb::head;
        enter_handling();
        respond(std::move(*answer));
        return false;
      }
    }
    const uint64_t bytes = std::min<uint64_t>(parser_->content_length().value_or(options.body_limit_bytes),
                                              options.body_limit_bytes);
    if (shared_->body_bytes_reserved + bytes > options.bodies_limit_bytes) {
      refuse_for_now("server_busy",
                     "the server is reading as many request bodies as it holds at once; try again shortly");
      return false;
    }
    body_bytes_reserved_ = bytes;
    shared_->body_bytes_reserved += bytes;
    return true;
  }

  void release_body_bytes() {
    shared_->body_bytes_reserved -= body_bytes_reserved_;
    body_bytes_reserved_ = 0;
  }

  void read_body() {
    http::async_read(socket_, buffer_, *parser_,
                     [self = shared_from_this()](beast::error_code ec, size_t) { self->on_request(ec); });
  }

  void on_request(beast::error_code ec) {
    if (state_ == State::kClosed) return;
    timer_.cancel();
    if (ec == http::error::body_limit || ec == http::error::header_limit ||
        ec == http::error::buffer_overflow) {
      const bool body = ec == http::error::body_limit;
      reject(body ? 413 : 431,
             body ? fmt::format("request body larger than {} bytes", shared_->options.body_limit_bytes)
                  : std::string("request headers too large"));
      return;
    }
    if (ec) {
      if (ec != http::error::end_of_stream && ec != asio::error::eof &&
          ec != asio::error::operation_aborted && ec != asio::error::connection_reset) {
        reject(400, fmt::format("malformed HTTP request: {}", ec.message()));
      } else {
        close();
      }
      return;
    }
    auto message = parser_->release();
    keep_alive_ = message.keep_alive();
    http10_ = message.version() < 11;
    head_request_ = message.method() == http::verb::head;
    HttpRequest request = head_of(message);
    request.body = std::move(message.body());
    enter_handling();
    on_disconnect_ = nullptr;
    if (shared_->draining) {
      refuse_for_now("server_shutting_down",
                     "this server is shutting down; send the request again (to another server, or later)");
      release_body_bytes();
      return;
    }
    // Watch the connection while the request is handled: a client that leaves before its answer (streamed or
    // not) cancels its request.
    if (!reading_ && buffer_.size() == 0) read_some();
    shared_->handler(std::move(request), HttpResponder(shared_from_this()));
    release_body_bytes();  // the handler has read the body (and dropped it, or kept what it took)
  }

  // Answers 503 with Retry-After: 1 and error `code` (the server cannot take the request now; another try
  // may succeed) and closes the connection.
  void refuse_for_now(std::string code, std::string message) {
    keep_alive_ = false;
    enter_handling();
    ApiError error;
    error.http_status = 503;
    error.type = "server_error";
    error.code = std::move(code);
    error.message = std::move(message);
    HttpResponse response;
    response.status = 503;
    response.body = to_json(error).dump();
    response.headers.emplace_back("Retry-After", "1");
    respond(std::move(response));
  }

  // Answers a request that could not be read with `status` and closes the connection.
  void reject(int status, std::string message) {
    keep_alive_ = false;
    enter_handling();
    ApiError error;
    error.http_status = status;
    error.message = std::move(message);
    HttpResponse response;
    response.status = status;
    response.body = to_json(error).dump();
    respond(std::move(response));
  }

  void queue(std::string bytes) {
    if (state_ == State::kClosed) return;
    queued_bytes_ += bytes.size();
    if (queued_bytes_ > kMaxQueuedBytes) {
      close();  // the client does not read what it asked for
      return;
    }
    out_.push_back(std::move(bytes));
    if (!writing_) write_next();
  }

  void write_next() {
    if (out_.empty() || state_ == State::kClosed) {
      if (writing_) timer_.cancel();
      writing_ = false;
      if (state_ == State::kFinishing) finished();
      return;
    }
    writing_ = true;
    // A client that does not read what it asked for is cut off after the idle timeout without progress.
    arm_timer(shared_->options.idle_timeout_ms);
    asio::async_write(socket_, asio::buffer(out_.front()),
                      [self = shared_from_this()](beast::error_code ec, size_t) {
                        if (ec || self->state_ == State::kClosed) {
                          self->writing_ = false;
                          self->out_.clear();
                          self->queued_bytes_ = 0;
                          self->close();
                          return;
                        }
                        self->queued_bytes_ -= self->out_.front().size();
                        self->out_.pop_front();
                        self->write_next();
                      });
  }

  // The response is out: serve the next request, or close.
  void finished() {
    on_disconnect_ = nullptr;
    response_done();
    if (!keep_alive_ || shared_->stopped || shared_->draining) {
      close();
      return;
    }
    if (buffer_.size() > 0 && !reading_) {
      read_request();  // pipelined
    } else {
      await_request();  // a read still pending from the stream continues as the wait for the next request
    }
  }

  std::shared_ptr<HttpServerShared>
      shared_;  // first: destroyed last, after the socket and timer using its loop
  tcp::socket socket_;
  asio::steady_timer timer_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  State state_ = State::kAwaiting;
  bool reading_ = false;
  bool writing_ = false;
  bool keep_alive_ = true;
  bool http10_ = false;        // the request was HTTP/1.0: no chunked streams, no 100 Continue
  bool head_request_ = false;  // a HEAD request: headers only
  bool stream_headers_pending_ = false;
  bool counted_ = false;  // in shared_->responses_in_flight
  std::deque<std::string> out_;
  size_t queued_bytes_ = 0;
  uint64_t body_bytes_reserved_ = 0;  // this request's share of shared_->body_bytes_reserved
  std::function<void()> on_disconnect_;
};

namespace {

// Runs `fn(session)` on the event loop (a closed session ignores it): at once when called there (a
// handler), else posted. Not posted from the loop itself: Asio keeps what a handler posts in a queue private
// to its thread until the handler returns, and calls posted meanwhile from another thread (the cluster's
// first tokens) would overtake it (a write before its start_stream is dropped). The posted call holds the
// session, so a response given before the handler returns outlives the handler's responder.
template <typename Fn>
void run_on_loop(const std::shared_ptr<HttpResponder::Session>& session, Fn fn) {
  if (!session || session->shared().stopped) return;
  asio::dispatch(session->shared().io, [session, fn = std::move(fn)]() mutable { fn(*session); });
}

}  // namespace

std::string HttpRequest::header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (n == name) return v;
  }
  return "";
}

void HttpResponder::respond(HttpResponse response) const {
  run_on_loop(session_, [r = std::move(response)](Session& s) mutable { s.respond(std::move(r)); });
}
void HttpResponder::start_stream() const {
  run_on_loop(session_, [](Session& s) { s.start_stream(); });
}
void HttpResponder::write(std::string bytes) const {
  run_on_loop(session_, [b = std::move(bytes)](Session& s) mutable { s.write(std::move(b)); });
}
void HttpResponder::end() const {
  run_on_loop(session_, [](Session& s) { s.end(); });
}
void HttpResponder::on_disconnect(std::function<void()> callback) const {
  run_on_loop(session_, [c = std::move(callback)](Session& s) mutable { s.set_on_disconnect(std::move(c)); });
}

class HttpServer::Impl {
 public:
  explicit Impl(std::shared_ptr<HttpServerShared> shared)
      : shared_(std::move(shared)), acceptor_(shared_->io) {}

  Status listen() {
    beast::error_code ec;
    const auto address = asio::ip::make_address(shared_->options.host, ec);
    if (ec) {
      return Status::invalid_argument(
          fmt::format("--host '{}' is not an IP address: {}", shared_->options.host, ec.message()));
    }
    const tcp::endpoint endpoint(address, static_cast<unsigned short>(shared_->options.port));
    const std::string where = fmt::format("{}:{}", shared_->options.host, shared_->options.port);
    if (acceptor_.open(endpoint.protocol(), ec); ec)
      return Status::unavailable(fmt::format("http: open {}: {}", where, ec.message()));
    acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
    if (acceptor_.bind(endpoint, ec); ec)
      return Status::unavailable(fmt::format("http: bind {}: {}", where, ec.message()));
    if (acceptor_.listen(asio::socket_base::max_listen_connections, ec); ec)
      return Status::unavailable(fmt::format("http: listen {}: {}", where, ec.message()));
    port_ = acceptor_.local_endpoint().port();
    accept();
    thread_ = std::thread([this] { shared_->io.run(); });
    return Status();
  }

  void stop() {
    if (shared_->stopped.exchange(true)) return;
    asio::post(shared_->io, [this] {
      close_listener();
      for (auto& [raw, weak] : sessions_) {
        if (auto s = weak.lock()) s->close();
      }
      sessions_.clear();
    });
    // Closing cancels every pending operation; the loop then runs out of work and returns.
    if (thread_.joinable()) thread_.join();
  }

  void begin_drain() {
    if (shared_->stopped) return;
    std::promise<void> done;
    asio::post(shared_->io, [this, &done] {
      shared_->draining = true;
      close_listener();
      for (auto& [raw, weak] : sessions_) {
        if (auto s = weak.lock()) s->close_if_idle();
      }
      done.set_value();
    });
    done.get_future().wait();
  }

  int port() const { return port_; }
  size_t connections() const { return shared_->connections.load(); }
  size_t responses_in_flight() const { return shared_->responses_in_flight.load(); }

 private:
  // No more connections: the acceptor closes (its pending accept ends aborted) and a retry waiting is off.
  void close_listener() {
    beast::error_code ignored;
    acceptor_.close(ignored);
    accept_retry_.cancel();
  }

  void accept() {
    acceptor_.async_accept([this](beast::error_code ec, tcp::socket socket) {
      // closed by stop() or begin_drain()
      if (ec == asio::error::operation_aborted || shared_->stopped || shared_->draining) return;
      if (ec) {
        // Out of file descriptors, say: try again shortly rather than never accept again.
        accept_retry_.expires_after(std::chrono::milliseconds(100));
        accept_retry_.async_wait([this](beast::error_code wait_ec) {
          if (!wait_ec && !shared_->stopped && !shared_->draining) accept();
        });
        return;
      }
      if (shared_->connections.load() >= shared_->options.max_connections) {
        beast::error_code ignored;
        socket.close(ignored);
      } else {
        socket.set_option(tcp::no_delay(true));
        auto session = std::make_shared<HttpResponder::Session>(std::move(socket), shared_);
        // Forget closed sessions now and then, so the registry stays the size of the open ones.
        if (sessions_.size() > 2 * shared_->connections.load() + 64) {
          std::erase_if(sessions_, [](const auto& entry) { return entry.second.expired(); });
        }
        sessions_[session.get()] = session;
        session->await_request();
      }
      accept();
    });
  }

  std::shared_ptr<HttpServerShared> shared_;
  tcp::acceptor acceptor_;
  asio::steady_timer accept_retry_{shared_->io};
  std::thread thread_;
  int port_ = 0;
  std::unordered_map<HttpResponder::Session*, std::weak_ptr<HttpResponder::Session>> sessions_;  // loop only
};

Result<std::unique_ptr<HttpServer>> HttpServer::start(const HttpServerOptions& options, HttpHandler handler) {
  auto shared = std::make_shared<HttpServerShared>();
  shared->options = options;
  shared->handler = std::move(handler);
  auto impl = std::make_unique<Impl>(shared);
  CRESCENT_RETURN_IF_ERROR(impl->listen());
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(impl)));
}

HttpServer::HttpServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpServer::~HttpServer() {
  stop();
}
int HttpServer::port() const {
  return impl_->port();
}
void HttpServer::stop() {
  impl_->stop();
}
size_t HttpServer::connections() const {
  return impl_->connections();
}
void HttpServer::begin_drain() {
  impl_->begin_drain();
}
size_t HttpServer::responses_in_flight() const {
  return impl_->responses_in_flight();
}

}  // namespace crescent::serve
