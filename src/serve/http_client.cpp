// Requests are written as plain HTTP/1.1 bytes; Beast parses responses, the body through a buffer_body parser
// into one fixed piece buffer per exchange, so a stream's bytes reach on_body as they arrive and nothing
// grows with the body. Every socket, timer and callback runs on the one event loop thread; other threads
// reach an exchange only by posting to it, by id.
//
// An idle pooled connection keeps one read pending (the watch): the server closing it, or sending bytes
// nobody asked for, removes it from the pool at once. When an exchange takes the connection, that pending
// read becomes the first read of its response, so the socket never has two reads in flight and no cancel
// races a close.
#include "serve/http_client.h"

#include <fmt/format.h>

#include <atomic>
#include <boost/asio.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <deque>
#include <limits>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

namespace crescent::serve {

namespace asio = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;

namespace {

// What an idle connection's watch reads at most (the start of a response when the connection is taken).
constexpr size_t kWatchBytes = 512;
// Beast's read of one socket read (read_size's cap): the connection buffer holds a head plus at most this.
constexpr size_t kReadBytes = 64u << 10;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// RFC 9110 §5.6.2: a token (a method, a header name).
bool is_token(std::string_view s) {
  if (s.empty()) return false;
  for (const char c : s) {
    const bool ok = std::isalnum(static_cast<unsigned char>(c)) ||
                    std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
    if (!ok) return false;
  }
  return true;
}

// A header value may not end a line early (header injection) or hold NUL.
bool is_field_value(std::string_view s) {
  return s.find_first_of(std::string_view("\r\n\0", 3)) == std::string_view::npos;
}

// A request target or host: visible ASCII only (no space, no control characters).
bool is_visible(std::string_view s) {
  for (const char c : s) {
    if (static_cast<unsigned char>(c) <= 0x20 || c == 0x7f) return false;
  }
  return true;
}

// "host:port", with an IPv6 address in brackets: the Host header and the pool's key.
std::string host_port(std::string_view host, uint16_t port) {
  return host.find(':') != std::string_view::npos ? fmt::format("[{}]:{}", host, port)
                                                  : fmt::format("{}:{}", host, port);
}

// Seconds as a clock duration; NaN and negatives as 0, and at most 1e9 s (so the cast cannot overflow).
Clock::duration to_duration(double seconds) {
  const double bounded = seconds > 0 ? std::min(seconds, 1e9) : 0.0;
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(bounded));
}

// The head limit Beast takes (32 bits).
uint32_t head_limit_bytes(const HttpClient::Options& options) {
  return static_cast<uint32_t>(
      std::min<size_t>(options.max_response_head_bytes, std::numeric_limits<uint32_t>::max()));
}

// Errors that mean the peer closed or reset the connection (a stale keep-alive connection's symptoms).
bool is_disconnect(const beast::error_code& ec) {
  return ec == asio::error::eof || ec == http::error::end_of_stream || ec == asio::error::connection_reset ||
         ec == asio::error::broken_pipe || ec == asio::error::connection_aborted;
}

}  // namespace

Result<HttpUrl> parse_http_url(std::string_view url) {
  const auto bad = [&](std::string_view why) {
    return Status::invalid_argument(fmt::format("'{}' is not an engine URL: {}", url, why));
  };
  const std::string scheme = lower(url.substr(0, std::min(url.find("://"), url.size())));
  if (url.find("://") == std::string_view::npos) return bad("want http://host[:port][/path]");
  if (scheme == "https") return bad("https is not supported (the HTTP client speaks no TLS); use http://");
  if (scheme != "http") return bad(fmt::format("scheme '{}', want http://", scheme));
  std::string_view rest = url.substr(url.find("://") + 3);
  const size_t authority_end = std::min(rest.find('/'), rest.size());
  std::string_view authority = rest.substr(0, authority_end);
  std::string_view path = rest.substr(authority_end);
  if (authority.find('@') != std::string_view::npos) return bad("user info in the URL is not supported");
  if (path.find_first_of("?#") != std::string_view::npos ||
      authority.find_first_of("?#") != std::string_view::npos)
    return bad("a query or fragment has no place in a base URL");
  if (!is_visible(path)) return bad("spaces or control characters in the path");
  HttpUrl out;
  std::string_view port_text;
  if (!authority.empty() && authority.front() == '[') {
    const size_t close = authority.find(']');
    if (close == std::string_view::npos) return bad("an IPv6 address without its ']'");
    out.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("junk after the IPv6 address");
      port_text = after.substr(1);
      if (port_text.empty()) return bad("an empty port");
    }
    beast::error_code ec;
    asio::ip::make_address_v6(out.host, ec);
    if (ec) return bad(fmt::format("'{}' is not an IPv6 address", out.host));
  } else {
    const size_t colon = authority.find(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_text = authority.substr(colon + 1);
      if (port_text.empty()) return bad("an empty port");
    }
    for (const char c : out.host) {
      if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '.' && c != '_')
        return bad(fmt::format("'{}' is not a host name", out.host));
    }
  }
  if (out.host.empty()) return bad("no host");
  if (!port_text.empty()) {
    uint32_t port = 0;
    for (const char c : port_text) {
      if (c < '0' || c > '9' || port > 65535)
        return bad(fmt::format("port '{}' is not in 1..65535", port_text));
      port = port * 10 + static_cast<uint32_t>(c - '0');
    }
    if (port == 0 || port > 65535) return bad(fmt::format("port '{}' is not in 1..65535", port_text));
    out.port = static_cast<uint16_t>(port);
  }
  while (!path.empty() && path.back() == '/') path.remove_suffix(1);
  out.base_path = std::string(path);
  return out;
}

std::string HttpClientResponse::header(std::string_view name) const {
  for (const auto& [n, v] : headers) {
    if (n == name) return v;
  }
  return "";
}

namespace {

class Exchange;

// One TCP connection to host:port: busy (owned by an exchange) or idle (in the pool, watched).
struct Connection {
  Connection(asio::io_context& io, std::string pool_key, size_t buffer_limit_bytes,
             std::atomic<size_t>& open_count)
      : socket(io), buffer(buffer_limit_bytes), idle_timer(io), key(std::move(pool_key)), open(open_count) {}
  ~Connection() { close(); }

  void count_open() {
    counted = true;
    open.fetch_add(1);
  }
  void close() {
    if (closed) return;
    closed = true;
    in_pool = false;
    beast::error_code ignored;
    socket.shutdown(tcp::socket::shutdown_both, ignored);
    socket.close(ignored);
    idle_timer.cancel();
    if (counted) open.fetch_sub(1);
  }

  tcp::socket socket;
  beast::flat_buffer buffer;  // bytes read and not yet parsed; at most a head plus one read
  asio::steady_timer idle_timer;
  const std::string key;  // host:port
  std::atomic<size_t>& open;
  std::weak_ptr<Exchange> owner;  // empty while idle
  bool counted = false;           // connected: counted in open
  bool closed = false;
  bool in_pool = false;
  bool watching = false;  // the watch's read is in flight
  uint64_t idle_seq = 0;  // which stay in the pool the idle timer belongs to
};

}  // namespace

class HttpClient::Impl {
 public:
  explicit Impl(Options options)
      : options_(options), work_(asio::make_work_guard(io_)), thread_([this] { io_.run(); }) {}
  ~Impl();

  uint64_t send(HttpClientRequest request, HttpClientCallbacks callbacks);
  void cancel(uint64_t id);
  bool on_loop_thread() { return io_.get_executor().running_in_this_thread(); }
  size_t open_connections() const { return open_.load(); }

  // The loop thread's.
  std::shared_ptr<Connection> new_connection(const std::string& key) {
    // Room for a head up to its limit and one read beyond: the parser's header_limit fails first.
    return std::make_shared<Connection>(io_, key, size_t{head_limit_bytes(options_)} + kReadBytes, open_);
  }
  std::shared_ptr<Connection> take_idle(const std::string& key);
  void put_idle(std::shared_ptr<Connection> conn);
  void forget(uint64_t id) { exchanges_.erase(id); }

  asio::io_context io_{1};  // first: destroyed last, after every socket and timer on it
  const Options options_;
  std::atomic<bool> stopping_{false};

 private:
  void watch(const std::shared_ptr<Connection>& conn);
  void drop_idle(const std::shared_ptr<Connection>& conn);

  std::atomic<size_t> open_{0};
  std::atomic<uint64_t> next_id_{1};
  std::unordered_map<uint64_t, std::shared_ptr<Exchange>> exchanges_;              // in flight
  std::unordered_map<std::string, std::deque<std::shared_ptr<Connection>>> idle_;  // newest at the back
  asio::executor_work_guard<asio::io_context::executor_type> work_;
  std::thread thread_;  // last: starts once everything above exists
};

namespace {

// One request and its response, from send() to on_end.
class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  using Parser = http::response_parser<http::buffer_body>;

  Exchange(HttpClient::Impl& client, uint64_t id, HttpClientRequest request, HttpClientCallbacks callbacks)
      : client_(client),
        id_(id),
        request_(std::move(request)),
        callbacks_(std::move(callbacks)),
        timer_(client.io_),
        where_(fmt::format("{} http://{}{}", request_.method, host_port(request_.host, request_.port),
                           request_.target)) {}

  const std::string& where() const { return where_; }

  void start() {
    if (client_.stopping_) {
      finish(Status::cancelled(where_ + ": the HTTP client is shutting down"));
      return;
    }
    if (Status st = build_request(); !st.ok()) {
      finish(st);
      return;
    }
    key_ = host_port(request_.host, request_.port);
    if (auto conn = client_.take_idle(key_)) {
      begin(std::move(conn), /*reused=*/true);
    } else {
      connect();
    }
  }

  // Ends the exchange: closes its connection unless it went back to the pool, and posts on_end (so it runs
  // after whatever callback is running now, and never inside send() or cancel()). Idempotent.
  void finish(Status status) {
    if (done_) return;
    done_ = true;
    ++timer_seq_;
    timer_.cancel();
    if (resolver_) resolver_->cancel();
    if (conn_) {
      conn_->owner.reset();
      conn_->close();
      conn_.reset();
    }
    client_.forget(id_);
    asio::post(client_.io_, [self = shared_from_this(), status = std::move(status)] {
      if (self->callbacks_.on_end) self->callbacks_.on_end(status);
      self->callbacks_ = {};
    });
  }

  // The watch's read on the pooled connection this exchange took completed (bytes are in conn->buffer).
  void on_watch_done(const std::shared_ptr<Connection>& conn, const beast::error_code& ec) {
    if (done_ || conn_ != conn) return;
    if (ec) {
      fail(ec, "reading the response head");
      return;
    }
    read_head();
  }

 private:
  enum class Wait { kConnect, kResponse, kIdle };

  // Checks the request and writes its bytes into wire_.
  Status build_request() {
    const auto bad = [&](std::string_view why) {
      return Status::invalid_argument(where_ + ": " + std::string(why));
    };
    if (!is_token(request_.method))
      return bad(fmt::format("method '{}' is not an HTTP token", request_.method));
    if (request_.host.empty() || !is_visible(request_.host) || request_.host.find('/') != std::string::npos)
      return bad(fmt::format("host '{}' is not a host name or address", request_.host));
    if (request_.port == 0) return bad("port 0");
    if (request_.target.empty() || request_.target.front() != '/' || !is_visible(request_.target))
      return bad("the target must start with '/' and hold no spaces or control characters");
    for (const auto& [name, seconds] :
         {std::pair<const char*, double>{"connect_timeout_s", request_.connect_timeout_s},
          {"response_timeout_s", request_.response_timeout_s},
          {"idle_timeout_s", request_.idle_timeout_s}}) {
      if (!(seconds > 0) || !std::isfinite(seconds) || seconds > 1e9)
        return bad(fmt::format("{} = {} is not a positive number of seconds", name, seconds));
    }
    wire_ = fmt::format("{} {} HTTP/1.1\r\nHost: {}\r\n", request_.method, request_.target,
                        host_port(request_.host, request_.port));
    bool has_content_type = false;
    for (const auto& [name, value] : request_.headers) {
      if (!is_token(name)) return bad(fmt::format("header name '{}' is not an HTTP token", name));
      if (!is_field_value(value)) return bad(fmt::format("header {}'s value holds CR, LF or NUL", name));
      const std::string lower_name = lower(name);
      if (lower_name == "host" || lower_name == "content-length" || lower_name == "transfer-encoding")
        return bad(fmt::format("header {} is set by the client", name));
      if (lower_name == "content-type") has_content_type = true;
      if (lower_name == "connection" && lower(value).find("close") != std::string::npos)
        request_close_ = true;
      wire_ += fmt::format("{}: {}\r\n", name, value);
    }
    if (!request_.body.empty() && !has_content_type) wire_ += "Content-Type: application/json\r\n";
    if (!request_.body.empty() || request_.method == "POST" || request_.method == "PUT" ||
        request_.method == "PATCH") {
      wire_ += fmt::format("Content-Length: {}\r\n", request_.body.size());
    }
    wire_ += "\r\n";
    wire_ += request_.body;
    request_.body = std::string();  // the bytes live in wire_ now
    return Status();
  }

  // Opens a fresh connection (a numeric address directly, a name through the resolver), then begin()s.
  void connect() {
    set_deadline(Wait::kConnect);
    auto conn = client_.new_connection(key_);
    conn->owner = weak_from_this();
    conn_ = conn;
    reused_ = false;
    beast::error_code ec;
    const auto address = asio::ip::make_address(request_.host, ec);
    if (!ec) {
      conn->socket.async_connect(tcp::endpoint(address, request_.port),
                                 [self = shared_from_this(), conn](const beast::error_code& connect_ec) {
                                   self->on_connected(conn, connect_ec);
                                 });
      return;
    }
    if (!resolver_) resolver_.emplace(client_.io_);
    resolver_->async_resolve(
        request_.host, std::to_string(request_.port),
        [self = shared_from_this(), conn](const beast::error_code& resolve_ec,
                                          tcp::resolver::results_type results) {
          if (self->done_ || self->conn_ != conn) return;
          if (resolve_ec) {
            self->finish(Status::unavailable(fmt::format("{}: cannot resolve '{}': {}", self->where_,
                                                         self->request_.host, resolve_ec.message())));
            return;
          }
          asio::async_connect(conn->socket, results,
                              [self, conn](const beast::error_code& connect_ec, const tcp::endpoint&) {
                                self->on_connected(conn, connect_ec);
                              });
        });
  }

  void on_connected(const std::shared_ptr<Connection>& conn, const beast::error_code& ec) {
    if (done_ || conn_ != conn) return;
    if (ec) {
      // After a stale pooled connection the request may have reached the server: the message says so, and
      // ended_before_sending() is false for it.
      finish(Status::unavailable(fmt::format("{}: connect{}: {}", where_,
                                             retried_ ? " (a fresh connection after a stale pooled one)" : "",
                                             ec.message())));
      return;
    }
    conn->count_open();
    beast::error_code ignored;
    conn->socket.set_option(tcp::no_delay(true), ignored);
    begin(conn, /*reused=*/false);
  }

  // Sends the request on `conn` and reads the response at the same time (a server may answer before it has
  // read the whole body: a 413, say).
  void begin(std::shared_ptr<Connection> conn, bool reused) {
    conn->owner = weak_from_this();
    conn_ = conn;
    reused_ = reused;
    write_done_ = false;
    set_deadline(Wait::kResponse);
    asio::async_write(conn->socket, asio::buffer(wire_),
                      [self = shared_from_this(), conn](const beast::error_code& ec, size_t) {
                        if (self->done_ || self->conn_ != conn) return;
                        if (ec) {
                          self->fail(ec, "sending the request");
                          return;
                        }
                        self->write_done_ = true;
                      });
    if (!conn->watching) read_head();  // else the watch's pending read is this response's first
  }

  void read_head() {
    parser_ = std::make_shared<Parser>();
    parser_->header_limit(head_limit_bytes(client_.options_));
    // A stream has no length; its pieces go to on_body as they come. (Not boost::none: Beast 1.74 compares a
    // Content-Length against the empty optional and refuses every body.)
    parser_->body_limit(std::numeric_limits<uint64_t>::max());
    if (request_.method == "HEAD") parser_->skip(true);
    http::async_read_header(
        conn_->socket, conn_->buffer, *parser_,
        [self = shared_from_this(), conn = conn_, parser = parser_](const beast::error_code& ec, size_t) {
          if (self->done_ || self->conn_ != conn) return;
          if (ec) {
            self->fail(ec, "reading the response head");
            return;
          }
          self->on_head_read();
        });
  }

  void on_head_read() {
    const auto& message = parser_->get();
    const int status = message.result_int();
    if (status == 101) {
      finish(Status::invalid_argument(where_ + ": 101 Switching Protocols (the client does not switch)"));
      return;
    }
    if (status >= 100 && status < 200) {  // interim (100 Continue, 103 Early Hints): the response follows
      read_head();
      return;
    }
    head_seen_ = true;
    set_deadline(Wait::kIdle);
    if (callbacks_.on_head) {
      std::vector<std::pair<std::string, std::string>> headers;
      for (const auto& field : message) {
        headers.emplace_back(lower(std::string_view(field.name_string().data(), field.name_string().size())),
                             std::string(field.value()));
      }
      if (!callbacks_.on_head(status, headers)) {
        finish(Status::cancelled(where_ + ": aborted by the on_head callback"));
        return;
      }
      if (done_) return;  // cancel() from the callback
    }
    read_body();
  }

  void read_body() {
    if (parser_->is_done()) {
      done_reading();
      return;
    }
    const size_t piece_bytes = std::max<size_t>(client_.options_.body_piece_bytes, 1);
    if (!piece_) piece_ = std::make_unique<char[]>(piece_bytes);
    // Not eager: an eager parse that has put a chunk's bytes into the piece goes on to the next chunk header,
    // and when that is not all there yet, reads the socket before the piece is delivered. One step at a time,
    // every read ends with what it parsed (a chunk header alone gives an empty piece: the loop goes on).
    auto& body = parser_->get().body();
    body.data = piece_.get();
    body.size = piece_bytes;
    http::async_read_some(conn_->socket, conn_->buffer, *parser_,
                          [self = shared_from_this(), conn = conn_, parser = parser_, piece_bytes](
                              beast::error_code ec, size_t) {
                            if (self->done_ || self->conn_ != conn) return;
                            self->on_body_read(ec, piece_bytes - parser->get().body().size);
                          });
  }

  void on_body_read(beast::error_code ec, size_t piece_size) {
    if (ec == http::error::need_buffer) ec = {};  // the piece is full
    set_deadline(Wait::kIdle);
    if (piece_size > 0) {
      body_bytes_ += piece_size;
      if (callbacks_.on_body && !callbacks_.on_body(std::string_view(piece_.get(), piece_size))) {
        finish(Status::cancelled(where_ + ": aborted by the on_body callback"));
        return;
      }
      if (done_) return;  // cancel() from the callback
    }
    if (ec) {
      fail(ec, "reading the response body");
      return;
    }
    read_body();
  }

  // The whole response arrived: the connection goes back to the pool when the server allows it and nothing of
  // the exchange is left on it.
  void done_reading() {
    const bool reusable = parser_->keep_alive() && parser_->get().version() >= 11 && write_done_ &&
                          !request_close_ && conn_->buffer.size() == 0;
    auto conn = std::move(conn_);
    conn_.reset();
    if (reusable) {
      client_.put_idle(std::move(conn));
    } else {
      conn->owner.reset();
      conn->close();
    }
    finish(Status());
  }

  // The connection failed: a stale pooled one is retried once on a fresh connection when nothing of the
  // response arrived; otherwise the exchange ends with why.
  void fail(const beast::error_code& ec, std::string_view during) {
    if (done_) return;
    const bool nothing_arrived =
        !head_seen_ && conn_->buffer.size() == 0 && !(parser_ && parser_->got_some());
    if (reused_ && !retried_ && nothing_arrived && is_disconnect(ec)) {
      retried_ = true;
      conn_->owner.reset();
      conn_->close();
      conn_.reset();
      connect();
      return;
    }
    const std::string retried = retried_ ? " (on a fresh connection after a stale pooled one)" : "";
    if (ec == http::error::header_limit || (ec == http::error::buffer_overflow && !head_seen_)) {
      finish(
          Status::invalid_argument(fmt::format("{}: the response head is larger than {} bytes "
                                               "(max_response_head_bytes)",
                                               where_, client_.options_.max_response_head_bytes)));
    } else if (is_disconnect(ec) || ec == http::error::partial_message) {
      finish(Status::unavailable(
          head_seen_
              ? fmt::format("{}: the server closed the connection after {} bytes of the body, before its end",
                            where_, body_bytes_)
              : fmt::format("{}: the server closed the connection {}, before the response head{}: {}", where_,
                            during, retried, ec.message())));
    } else if (ec.category() == http::make_error_code(http::error::bad_version).category()) {
      finish(Status::invalid_argument(
          fmt::format("{}: malformed response ({}): {}", where_, during, ec.message())));
    } else {
      finish(Status::unavailable(fmt::format("{}: {}{}: {}", where_, during, retried, ec.message())));
    }
  }

  // Deadlines: one timer per exchange, armed for the earliest deadline and re-armed when it fires early (an
  // idle deadline moved on by a piece), so a piece costs a clock read, not a timer cancel.
  void set_deadline(Wait wait) {
    wait_ = wait;
    const double seconds = wait == Wait::kConnect    ? request_.connect_timeout_s
                           : wait == Wait::kResponse ? request_.response_timeout_s
                                                     : request_.idle_timeout_s;
    deadline_ = Clock::now() + to_duration(seconds);
    if (!timer_armed_ || deadline_ < timer_expiry_) arm_timer();
  }
  void arm_timer() {
    timer_armed_ = true;
    timer_expiry_ = deadline_;
    timer_.expires_at(deadline_);
    timer_.async_wait([self = shared_from_this(), seq = ++timer_seq_](const beast::error_code&) {
      if (self->done_ || seq != self->timer_seq_) return;  // finished, or re-armed since
      self->timer_armed_ = false;
      if (Clock::now() < self->deadline_) {
        self->arm_timer();
        return;
      }
      self->on_deadline();
    });
  }
  void on_deadline() {
    switch (wait_) {
      case Wait::kConnect:
        finish(Status::deadline_exceeded(fmt::format(
            "{}: not connected within {} s (connect_timeout_s){}", where_, request_.connect_timeout_s,
            retried_ ? ", a fresh connection after a stale pooled one" : "")));
        return;
      case Wait::kResponse:
        finish(
            Status::deadline_exceeded(fmt::format("{}: no response head within {} s of sending the request "
                                                  "(response_timeout_s)",
                                                  where_, request_.response_timeout_s)));
        return;
      case Wait::kIdle:
        finish(Status::deadline_exceeded(
            fmt::format("{}: no body bytes for {} s (idle_timeout_s), after {} bytes", where_,
                        request_.idle_timeout_s, body_bytes_)));
        return;
    }
  }

  HttpClient::Impl& client_;
  const uint64_t id_;
  HttpClientRequest request_;
  HttpClientCallbacks callbacks_;
  asio::steady_timer timer_;
  const std::string where_;  // "POST http://host:port/target", for messages
  std::string wire_;         // the request's bytes
  std::string key_;          // host:port
  std::optional<tcp::resolver> resolver_;
  std::shared_ptr<Connection> conn_;
  std::shared_ptr<Parser> parser_;  // shared with the read in flight, which may outlive a retry
  std::unique_ptr<char[]> piece_;   // body_piece_bytes: where the parser puts the body for on_body
  uint64_t body_bytes_ = 0;
  Wait wait_ = Wait::kConnect;
  Clock::time_point deadline_;
  Clock::time_point timer_expiry_;
  uint64_t timer_seq_ = 0;
  bool timer_armed_ = false;
  bool reused_ = false;         // conn_ came from the pool
  bool retried_ = false;        // the one retry after a stale connection is spent
  bool write_done_ = false;     // the whole request is in the socket
  bool head_seen_ = false;      // the final (non-1xx) head arrived
  bool request_close_ = false;  // the request said "Connection: close"
  bool done_ = false;
};

}  // namespace

HttpClient::Impl::~Impl() {
  stopping_ = true;
  asio::post(io_, [this] {
    std::vector<std::shared_ptr<Exchange>> in_flight;
    in_flight.reserve(exchanges_.size());
    for (auto& [id, exchange] : exchanges_) in_flight.push_back(exchange);
    for (auto& exchange : in_flight) {
      exchange->finish(Status::cancelled(exchange->where() + ": the HTTP client is shutting down"));
    }
    for (auto& [key, connections] : idle_) {
      for (auto& conn : connections) conn->close();
    }
    idle_.clear();
  });
  // Closing cancels every pending operation; once the posted on_end calls ran the loop runs out of work.
  work_.reset();
  if (thread_.joinable()) thread_.join();
}

uint64_t HttpClient::Impl::send(HttpClientRequest request, HttpClientCallbacks callbacks) {
  const uint64_t id = next_id_.fetch_add(1);
  // Dispatched: on the loop thread (a callback) it starts now, so a cancel() that follows cannot overtake it.
  asio::dispatch(io_, [this, id, request = std::move(request), callbacks = std::move(callbacks)]() mutable {
    auto exchange = std::make_shared<Exchange>(*this, id, std::move(request), std::move(callbacks));
    exchanges_.emplace(id, exchange);
    exchange->start();
  });
  return id;
}

void HttpClient::Impl::cancel(uint64_t id) {
  asio::dispatch(io_, [this, id] {
    const auto it = exchanges_.find(id);
    if (it == exchanges_.end()) return;
    const std::shared_ptr<Exchange> exchange = it->second;
    exchange->finish(Status::cancelled(exchange->where() + ": cancelled"));
  });
}

std::shared_ptr<Connection> HttpClient::Impl::take_idle(const std::string& key) {
  const auto it = idle_.find(key);
  if (it == idle_.end()) return nullptr;
  std::shared_ptr<Connection> conn = std::move(it->second.back());
  it->second.pop_back();
  if (it->second.empty()) idle_.erase(it);
  conn->in_pool = false;
  conn->idle_timer.cancel();
  return conn;
}

void HttpClient::Impl::put_idle(std::shared_ptr<Connection> conn) {
  conn->owner.reset();
  if (stopping_ || options_.max_idle_per_host == 0 || !(options_.idle_connection_timeout_s > 0)) {
    conn->close();
    return;
  }
  auto& connections = idle_[conn->key];
  conn->in_pool = true;
  const uint64_t seq = ++conn->idle_seq;
  conn->idle_timer.expires_after(to_duration(options_.idle_connection_timeout_s));
  conn->idle_timer.async_wait([this, conn, seq](const beast::error_code&) {
    if (conn->closed || !conn->in_pool || conn->idle_seq != seq) return;  // taken since
    drop_idle(conn);
  });
  watch(conn);
  connections.push_back(std::move(conn));
  while (connections.size() > options_.max_idle_per_host) {
    connections.front()->close();
    connections.pop_front();
  }
}

void HttpClient::Impl::watch(const std::shared_ptr<Connection>& conn) {
  conn->watching = true;
  conn->socket.async_read_some(conn->buffer.prepare(kWatchBytes),
                               [this, conn](const beast::error_code& ec, size_t bytes) {
                                 conn->watching = false;
                                 if (conn->closed) return;
                                 if (!ec) conn->buffer.commit(bytes);
                                 if (auto owner = conn->owner.lock()) {
                                   owner->on_watch_done(conn, ec);
                                   return;
                                 }
                                 // Idle: closed by the server, or bytes nobody asked for. Not reusable.
                                 drop_idle(conn);
                               });
}

void HttpClient::Impl::drop_idle(const std::shared_ptr<Connection>& conn) {
  conn->close();
  const auto it = idle_.find(conn->key);
  if (it == idle_.end()) return;
  std::erase(it->second, conn);
  if (it->second.empty()) idle_.erase(it);
}

std::unique_ptr<HttpClient> HttpClient::start(Options options) {
  return std::unique_ptr<HttpClient>(new HttpClient(std::make_unique<Impl>(options)));
}

HttpClient::HttpClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpClient::~HttpClient() = default;

uint64_t HttpClient::send(HttpClientRequest request, HttpClientCallbacks callbacks) {
  return impl_->send(std::move(request), std::move(callbacks));
}

void HttpClient::cancel(uint64_t id) {
  impl_->cancel(id);
}

size_t HttpClient::open_connections() const {
  return impl_->open_connections();
}

Result<HttpClientResponse> HttpClient::fetch(HttpClientRequest request, size_t max_body_bytes) {
  std::vector<HttpClientRequest> one;
  one.push_back(std::move(request));
  return std::move(fetch_all(std::move(one), max_body_bytes).front());
}

std::vector<Result<HttpClientResponse>> HttpClient::fetch_all(std::vector<HttpClientRequest> requests,
                                                              size_t max_body_bytes) {
  const auto where = [](const HttpClientRequest& r) {
    return fmt::format("{} http://{}{}", r.method, host_port(r.host, r.port), r.target);
  };
  std::vector<Result<HttpClientResponse>> results;
  results.reserve(requests.size());
  if (impl_->on_loop_thread()) {
    for (const HttpClientRequest& r : requests) {
      results.emplace_back(Status::failed_precondition(
          where(r) + ": HttpClient::fetch on the client's own thread would wait for itself"));
    }
    return results;
  }
  struct One {
    Status status;
    Status too_large;
    HttpClientResponse response;  // the loop thread's until it ended
  };
  struct State {
    std::mutex mu;
    std::condition_variable cv;
    size_t remaining = 0;
    std::vector<One> ones;
  };
  auto state = std::make_shared<State>();
  state->remaining = requests.size();
  state->ones.resize(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    One* one = &state->ones[i];
    HttpClientCallbacks callbacks;
    callbacks.on_head = [one](int status, const std::vector<std::pair<std::string, std::string>>& headers) {
      one->response.status = status;
      one->response.headers = headers;
      return true;
    };
    callbacks.on_body = [one, max_body_bytes, at = where(requests[i])](std::string_view piece) {
      if (one->response.body.size() + piece.size() > max_body_bytes) {
        one->too_large = Status::out_of_range(
            fmt::format("{}: the response body is larger than {} bytes", at, max_body_bytes));
        return false;
      }
      one->response.body.append(piece);
      return true;
    };
    callbacks.on_end = [state, one](const Status& status) {
      std::lock_guard lock(state->mu);
      one->status = status;
      --state->remaining;
      state->cv.notify_all();
    };
    send(std::move(requests[i]), std::move(callbacks));
  }
  std::unique_lock lock(state->mu);
  state->cv.wait(lock, [&] { return state->remaining == 0; });  // the requests' timeouts bound this
  for (One& one : state->ones) {
    if (!one.too_large.ok()) {
      results.emplace_back(std::move(one.too_large));
    } else if (!one.status.ok()) {
      results.emplace_back(std::move(one.status));
    } else {
      results.emplace_back(std::move(one.response));
    }
  }
  return results;
}

SseParser::SseParser(std::function<void(std::string_view data)> on_event, size_t max_event_bytes)
    : on_event_(std::move(on_event)), max_event_bytes_(max_event_bytes) {}

Status SseParser::feed(std::string_view bytes) {
  if (!failed_.ok()) return failed_;
  size_t i = 0;
  if (skip_lf_ && !bytes.empty()) {
    skip_lf_ = false;
    if (bytes[0] == '\n') i = 1;
  }
  while (i < bytes.size()) {
    const size_t end = bytes.find_first_of("\r\n", i);
    const std::string_view part =
        bytes.substr(i, end == std::string_view::npos ? std::string_view::npos : end - i);
    if (line_.size() + part.size() + data_.size() > max_event_bytes_) {
      failed_ = Status::out_of_range(
          fmt::format("a server-sent event is larger than {} bytes (max_event_bytes)", max_event_bytes_));
      return failed_;
    }
    if (end == std::string_view::npos) {
      line_.append(part);  // the line goes on in the next piece
      break;
    }
    if (line_.empty()) {
      take_line(part);
    } else {
      line_.append(part);
      take_line(line_);
      line_.clear();
    }
    i = end + 1;
    if (bytes[end] == '\r') {  // "\r\n" is one line end; its '\n' may start the next piece
      if (i < bytes.size()) {
        if (bytes[i] == '\n') ++i;
      } else {
        skip_lf_ = true;
      }
    }
  }
  return Status();
}

void SseParser::take_line(std::string_view line) {
  if (line.empty()) {  // dispatch
    if (data_.empty()) return;
    data_.pop_back();  // the last line's '\n'
    if (on_event_) on_event_(data_);
    data_.clear();
    return;
  }
  if (line.front() == ':') return;  // a comment (keep-alive pings)
  const size_t colon = line.find(':');
  const std::string_view field = line.substr(0, colon);
  if (field != "data") return;  // event, id, retry: not needed by OpenAI-style streams
  std::string_view value = colon == std::string_view::npos ? std::string_view() : line.substr(colon + 1);
  if (!value.empty() && value.front() == ' ') value.remove_prefix(1);
  data_.append(value);
  data_ += '\n';
}

bool ended_before_sending(const Status& status) {
  // The messages connect(), on_connected() and the connect deadline end exchanges with.
  const std::string_view message = status.message();
  // A connect that followed a stale pooled connection: the request was written to that one.
  const auto retried = [](std::string_view m) { return m.find("stale pooled") != std::string_view::npos; };
  switch (status.code()) {
    case StatusCode::kUnavailable:
      return !retried(message) && (message.find(": connect: ") != std::string_view::npos ||
                                   message.find(": cannot resolve '") != std::string_view::npos);
    case StatusCode::kDeadlineExceeded:
      return message.find("(connect_timeout_s)") != std::string_view::npos && !retried(message);
    default:
      return false;
  }
}

}  // namespace crescent::serve
