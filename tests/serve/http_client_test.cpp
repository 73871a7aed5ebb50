// The HTTP client against real servers on free loopback ports: crescent's own HttpServer for whole responses
// and SSE streams, and raw sockets (RawServer, plain blocking code) for servers that misbehave on purpose.
// Timeouts in the requests are short where a timeout is the point; every wait of the test itself is generous
// (the machine is shared and slow), and nothing asserts how long something took.
#include "serve/http_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <atomic>
#include <boost/asio.hpp>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "serve/http_server.h"

namespace crescent::serve {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr auto kPatience = 30s;  // the longest a test waits for something that should happen at once

// Polls `done` until it holds or kPatience passes; returns whether it held.
bool eventually(const std::function<bool()>& done) {
  const auto give_up = std::chrono::steady_clock::now() + kPatience;
  while (!done()) {
    if (std::chrono::steady_clock::now() > give_up) return false;
    std::this_thread::sleep_for(5ms);
  }
  return true;
}

// A TCP server on a free loopback port that hands each accepted connection to `serve(socket, index)` on a
// thread of its own (index counts connections from 0). The destructor shuts every connection down and joins.
class RawServer {
 public:
  using Serve = std::function<void(tcp::socket& socket, int index)>;
  explicit RawServer(Serve serve)
      : serve_(std::move(serve)), acceptor_(io_, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0)) {
    port_ = acceptor_.local_endpoint().port();
    accept_thread_ = std::thread([this] { accept_loop(); });
  }
  ~RawServer() {
    stopping_ = true;
    {  // wake the blocking accept
      asio::io_context io;
      tcp::socket poke(io);
      boost::system::error_code ignored;
      poke.connect(tcp::endpoint(asio::ip::make_address("127.0.0.1"), port_), ignored);
    }
    accept_thread_.join();
    std::lock_guard lock(mu_);
    for (auto& socket : sockets_) ::shutdown(socket->native_handle(), SHUT_RDWR);  // wakes blocked reads
    for (auto& thread : threads_) thread.join();
  }
  uint16_t port() const { return port_; }
  int accepted() const { return accepted_.load(); }

 private:
  void accept_loop() {
    for (;;) {
      auto socket = std::make_shared<tcp::socket>(io_);
      boost::system::error_code ec;
      acceptor_.accept(*socket, ec);
      if (stopping_ || ec) return;
      const int index = accepted_.fetch_add(1);
      std::lock_guard lock(mu_);
      sockets_.push_back(socket);
      threads_.emplace_back([this, socket, index] {
        serve_(*socket, index);
        ::shutdown(socket->native_handle(),
                   SHUT_RDWR);  // the peer sees the close; the fd closes with the server
      });
    }
  }

  Serve serve_;
  asio::io_context io_;
  tcp::acceptor acceptor_;
  uint16_t port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<int> accepted_{0};
  std::thread accept_thread_;
  std::mutex mu_;
  std::vector<std::shared_ptr<tcp::socket>> sockets_;
  std::vector<std::thread> threads_;
};

// Reads one request (head, and a body by Content-Length) from `socket`; "" when the peer closed first.
// `buffer` keeps bytes read past the request.
std::string read_request(tcp::socket& socket, std::string& buffer) {
  boost::system::error_code ec;
  size_t head_end;
  while ((head_end = buffer.find("\r\n\r\n")) == std::string::npos) {
    char bytes[4096];
    const size_t n = socket.read_some(asio::buffer(bytes), ec);
    if (ec) return "";
    buffer.append(bytes, n);
  }
  size_t body_bytes = 0;
  const std::string head = buffer.substr(0, head_end);
  if (const size_t at = head.find("Content-Length: "); at != std::string::npos) {
    body_bytes = std::stoul(head.substr(at + 16));
  }
  while (buffer.size() < head_end + 4 + body_bytes) {
    char bytes[4096];
    const size_t n = socket.read_some(asio::buffer(bytes), ec);
    if (ec) return "";
    buffer.append(bytes, n);
  }
  std::string request = buffer.substr(0, head_end + 4 + body_bytes);
  buffer.erase(0, request.size());
  return request;
}

void write_all(tcp::socket& socket, std::string_view bytes) {
  boost::system::error_code ignored;
  asio::write(socket, asio::buffer(bytes.data(), bytes.size()), ignored);
}

// Blocks until the peer closes (or the server shuts down).
void wait_for_close(tcp::socket& socket) {
  boost::system::error_code ec;
  char byte;
  while (!ec) socket.read_some(asio::buffer(&byte, 1), ec);
}

std::string ok_response(std::string_view body) {
  return "HTTP/1.1 200 OK\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" + std::string(body);
}

std::unique_ptr<HttpServer> start_server(HttpHandler handler) {
  HttpServerOptions options;
  options.host = "127.0.0.1";
  options.port = 0;
  auto server = HttpServer::start(options, std::move(handler));
  EXPECT_TRUE(server.ok()) << server.status().message();
  return server.ok() ? std::move(*server) : nullptr;
}

HttpClientRequest request_to(uint16_t port, std::string target, std::string method = "GET") {
  HttpClientRequest request;
  request.method = std::move(method);
  request.host = "127.0.0.1";
  request.port = port;
  request.target = std::move(target);
  return request;
}

// What one exchange's callbacks saw; thread-safe.
struct Seen {
  std::mutex mu;
  int status = 0;
  std::vector<std::pair<std::string, std::string>> headers;
  std::vector<std::string> pieces;
  std::string body;
  std::vector<std::string> events;  // the body parsed as SSE
  int ends = 0;
  Status end;
  bool keep_reading = true;  // on_body's answer

  HttpClientCallbacks callbacks() {
    auto sse = std::make_shared<SseParser>([this](std::string_view data) { events.emplace_back(data); });
    HttpClientCallbacks callbacks;
    callbacks.on_head = [this](int s, const std::vector<std::pair<std::string, std::string>>& h) {
      std::lock_guard lock(mu);
      status = s;
      headers = h;
      return true;
    };
    callbacks.on_body = [this, sse](std::string_view piece) {
      std::lock_guard lock(mu);
      pieces.emplace_back(piece);
      body.append(piece);
      EXPECT_TRUE(sse->feed(piece).ok());
      return keep_reading;
    };
    callbacks.on_end = [this](const Status& status) {
      std::lock_guard lock(mu);
      ++ends;
      end = status;
    };
    return callbacks;
  }
  bool ended() {
    std::lock_guard lock(mu);
    return ends > 0;
  }
  size_t event_count() {
    std::lock_guard lock(mu);
    return events.size();
  }
  size_t piece_count() {
    std::lock_guard lock(mu);
    return pieces.size();
  }
};

TEST(HttpClient, FetchesAWholeResponseAndSendsTheRequestAsGiven) {
  auto server = start_server([](HttpRequest request, HttpResponder responder) {
    HttpResponse response;
    response.body = request.method + " " + request.path + " " + request.header("content-type") + " " +
                    request.header("x-test") + " " + request.body;
    response.headers.emplace_back("X-Reply", "yes");
    responder.respond(std::move(response));
  });
  ASSERT_TRUE(server);
  auto client = HttpClient::start();
  HttpClientRequest request = request_to(static_cast<uint16_t>(server->port()), "/v1/echo", "POST");
  request.headers.emplace_back("X-Test", "here");
  request.body = R"({"a":1})";
  auto response = client->fetch(request);
  ASSERT_TRUE(response.ok()) << response.status().message();
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, R"(POST /v1/echo application/json here {"a":1})");
  EXPECT_EQ(response->header("content-type"), "application/json");
  EXPECT_EQ(response->header("x-reply"), "yes");  // names lower-cased

  // A status other than 2xx is a response too.
  auto missing = start_server([](HttpRequest, HttpResponder responder) {
    HttpResponse response;
    response.status = 404;
    response.body = "{}";
    responder.respond(std::move(response));
  });
  auto not_found = client->fetch(request_to(static_cast<uint16_t>(missing->port()), "/nothing"));
  ASSERT_TRUE(not_found.ok()) << not_found.status().message();
  EXPECT_EQ(not_found->status, 404);
}

TEST(HttpClient, ReadsAHeadResponseWithoutABodyAndKeepsTheConnection) {
  auto server = start_server([](HttpRequest, HttpResponder responder) {
    HttpResponse response;
    response.body = "twelve bytes";  // its Content-Length goes out, the body does not
    responder.respond(std::move(response));
  });
  ASSERT_TRUE(server);
  auto client = HttpClient::start();
  auto head = client->fetch(request_to(static_cast<uint16_t>(server->port()), "/x", "HEAD"));
  ASSERT_TRUE(head.ok()) << head.status().message();
  EXPECT_EQ(head->status, 200);
  EXPECT_EQ(head->header("content-length"), "12");
  EXPECT_EQ(head->body, "");
  auto get = client->fetch(request_to(static_cast<uint16_t>(server->port()), "/x"));
  ASSERT_TRUE(get.ok()) << get.status().message();
  EXPECT_EQ(get->body, "twelve bytes");
  EXPECT_EQ(server->connections(), 1u);
}

TEST(HttpClient, FetchOnTheClientsThreadIsRefused) {
  auto server = start_server([](HttpRequest, HttpResponder responder) { responder.respond(HttpResponse{}); });
  ASSERT_TRUE(server);
  std::promise<Status> inner;
  auto client = HttpClient::start();
  HttpClientCallbacks callbacks;
  callbacks.on_end = [&](const Status&) {
    inner.set_value(client->fetch(request_to(static_cast<uint16_t>(server->port()), "/x")).status());
  };
  client->send(request_to(static_cast<uint16_t>(server->port()), "/x"), callbacks);
  auto future = inner.get_future();
  ASSERT_EQ(future.wait_for(kPatience), std::future_status::ready);
  EXPECT_EQ(future.get().code(), StatusCode::kFailedPrecondition);
}

TEST(HttpClient, DeliversAStreamPieceByPieceAsTheServerWritesIt) {
  std::promise<HttpResponder> opened;
  auto server = start_server([&](HttpRequest, HttpResponder responder) {
    responder.start_stream();
    opened.set_value(responder);
  });
  ASSERT_TRUE(server);
  Seen seen;  // before the client: its callbacks may run until the client is gone
  auto client = HttpClient::start();
  client->send(request_to(static_cast<uint16_t>(server->port()), "/v1/completions", "POST"),
               seen.callbacks());
  auto future = opened.get_future();
  ASSERT_EQ(future.wait_for(kPatience), std::future_status::ready);
  HttpResponder responder = future.get();
  responder.write("data: one\n\n");
  // The first event reaches the client while the server has not written the second: nothing waits for the
  // end.
  ASSERT_TRUE(eventually([&] { return seen.event_count() == 1; }));
  EXPECT_FALSE(seen.ended());
  responder.write(": a comment\r\ndata: two\r\ndata: lines\r\n\r\n");
  ASSERT_TRUE(eventually([&] { return seen.event_count() == 2; }));
  responder.end();
  ASSERT_TRUE(eventually([&] { return seen.ended(); }));
  std::lock_guard lock(seen.mu);
  EXPECT_TRUE(seen.end.ok()) << seen.end.message();
  EXPECT_EQ(seen.ends, 1);
  EXPECT_EQ(seen.status, 200);
  EXPECT_THAT(seen.events, ElementsAre("one", "two\nlines"));
  EXPECT_GE(seen.pieces.size(), 2u);
}

TEST(HttpClient, ReusesAKeepAliveConnection) {
  auto server = start_server([](HttpRequest request, HttpResponder responder) {
    HttpResponse response;
    response.body = request.body.empty() ? "get" : request.body;
    responder.respond(std::move(response));
  });
  ASSERT_TRUE(server);
  auto client = HttpClient::start();
  for (int i = 0; i < 5; ++i) {
    HttpClientRequest request =
        request_to(static_cast<uint16_t>(server->port()), "/x", i % 2 ? "POST" : "GET");
    if (i % 2) request.body = "body " + std::to_string(i);
    auto response = client->fetch(request);
    ASSERT_TRUE(response.ok()) << response.status().message();
    EXPECT_EQ(response->body, i % 2 ? "body " + std::to_string(i) : "get");
    EXPECT_EQ(client->open_connections(), 1u);
  }
  EXPECT_EQ(server->connections(), 1u);
}

TEST(HttpClient, RetriesAStalePooledConnectionOnceOnAFreshOne) {
  // Connection 0 answers one request, then closes on reading the next one without answering (as a server does
  // whose keep-alive timeout passed just as the request came); connection 1 answers.
  RawServer server([](tcp::socket& socket, int index) {
    std::string buffer;
    if (index == 0) {
      if (read_request(socket, buffer).empty()) return;
      write_all(socket, ok_response("first"));
      read_request(socket, buffer);
      return;  // closes
    }
    if (read_request(socket, buffer).empty()) return;
    write_all(socket, ok_response("second"));
    wait_for_close(socket);
  });
  auto client = HttpClient::start();
  auto first = client->fetch(request_to(server.port(), "/a"));
  ASSERT_TRUE(first.ok()) << first.status().message();
  EXPECT_EQ(first->body, "first");
  auto second = client->fetch(request_to(server.port(), "/b", "POST"));
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(second->body, "second");
  EXPECT_EQ(server.accepted(), 2);
  EXPECT_EQ(client->open_connections(), 1u);
}

TEST(HttpClient, RetriesAStaleConnectionOnlyOnce) {
  // Connection 0 answers once then closes on the next request; every later connection closes unanswered.
  RawServer server([](tcp::socket& socket, int index) {
    std::string buffer;
    if (read_request(socket, buffer).empty()) return;
    if (index == 0) {
      write_all(socket, ok_response("first"));
      read_request(socket, buffer);
    }
  });
  auto client = HttpClient::start();
  ASSERT_TRUE(client->fetch(request_to(server.port(), "/a")).ok());
  auto second = client->fetch(request_to(server.port(), "/b"));
  ASSERT_FALSE(second.ok());
  EXPECT_EQ(second.status().code(), StatusCode::kUnavailable) << second.status().message();
  EXPECT_THAT(second.status().message(), HasSubstr("fresh connection"));
  std::this_thread::sleep_for(100ms);  // a wrong third attempt would have connected by now
  EXPECT_EQ(server.accepted(), 2);
}

TEST(HttpClient, DoesNotRetryAFailureOnAFreshConnection) {
  RawServer server([](tcp::socket& socket, int) {
    std::string buffer;
    read_request(socket, buffer);  // and close unanswered
  });
  auto client = HttpClient::start();
  auto response = client->fetch(request_to(server.port(), "/a"));
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), StatusCode::kUnavailable) << response.status().message();
  EXPECT_THAT(response.status().message(), HasSubstr("GET http://127.0.0.1:"));
  std::this_thread::sleep_for(100ms);
  EXPECT_EQ(server.accepted(), 1);
  EXPECT_EQ(client->open_connections(), 0u);
}

TEST(HttpClient, DropsAPooledConnectionTheServerCloses) {
  RawServer server([](tcp::socket& socket, int) {
    std::string buffer;
    if (read_request(socket, buffer).empty()) return;
    write_all(socket, ok_response("once"));
    std::this_thread::sleep_for(50ms);  // then closes while the client keeps it idle
  });
  auto client = HttpClient::start();
  ASSERT_TRUE(client->fetch(request_to(server.port(), "/a")).ok());
  EXPECT_TRUE(eventually([&] { return client->open_connections() == 0; }));
  // The next request opens a fresh connection and needs no retry.
  auto again = client->fetch(request_to(server.port(), "/a"));
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(server.accepted(), 2);
}

TEST(HttpClient, ClosesAConnectionIdleInThePoolTooLong) {
  auto server = start_server([](HttpRequest, HttpResponder responder) { responder.respond(HttpResponse{}); });
  ASSERT_TRUE(server);
  HttpClient::Options options;
  options.idle_connection_timeout_s = 0.2;
  auto client = HttpClient::start(options);
  ASSERT_TRUE(client->fetch(request_to(static_cast<uint16_t>(server->port()), "/x")).ok());
  EXPECT_TRUE(eventually([&] { return client->open_connections() == 0; }));  // the server would keep it 60 s
  EXPECT_TRUE(eventually([&] { return server->connections() == 0; }));
}

TEST(HttpClient, ConnectRefusedIsUnavailable) {
  uint16_t port;
  {
    asio::io_context io;
    tcp::acceptor acceptor(io, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
    port = acceptor.local_endpoint().port();
  }  // closed: nothing listens there now
  auto client = HttpClient::start();
  auto response = client->fetch(request_to(port, "/health"));
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(response.status().message(), HasSubstr("connect"));
  EXPECT_EQ(client->open_connections(), 0u);
}

TEST(HttpClient, ResolvesHostNames) {
  auto server = start_server([](HttpRequest, HttpResponder responder) { responder.respond(HttpResponse{}); });
  ASSERT_TRUE(server);
  auto client = HttpClient::start();
  HttpClientRequest request = request_to(static_cast<uint16_t>(server->port()), "/health");
  request.host = "localhost";  // may resolve to ::1 first, refused there; 127.0.0.1 then answers
  auto response = client->fetch(request);
  ASSERT_TRUE(response.ok()) << response.status().message();
  EXPECT_EQ(response->status, 200);

  request.host = "no-such-host.invalid";
  auto unknown = client->fetch(request);
  ASSERT_FALSE(unknown.ok());
  // kUnavailable once the resolver says so; kDeadlineExceeded where it takes longer than connect_timeout_s.
  EXPECT_THAT(unknown.status().code(),
              ::testing::AnyOf(StatusCode::kUnavailable, StatusCode::kDeadlineExceeded))
      << unknown.status().message();
}

TEST(HttpClient, ResponseTimeoutIsDeadlineExceeded) {
  RawServer server([](tcp::socket& socket, int) {
    std::string buffer;
    read_request(socket, buffer);
    wait_for_close(socket);  // never answers
  });
  auto client = HttpClient::start();
  HttpClientRequest request = request_to(server.port(), "/slow");
  request.response_timeout_s = 0.3;
  auto response = client->fetch(request);
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), StatusCode::kDeadlineExceeded);
  EXPECT_THAT(response.status().message(), HasSubstr("response_timeout_s"));
  EXPECT_EQ(client->open_connections(), 0u);
}

// fetch_all asks every server at once: a server that never answers holds all its requests open together (it
// would see one at a time if they were sent in turn), and the answers come back in the requests' order.
TEST(HttpClient, FetchAllAsksEveryServerAtOnceAndAnswersInOrder) {
  std::atomic<int> open{0}, most_open{0};
  RawServer silent([&](tcp::socket& socket, int) {
    std::string buffer;
    read_request(socket, buffer);
    const int now = ++open;
    int seen = most_open.load();
    while (now > seen && !most_open.compare_exchange_weak(seen, now)) {
    }
    wait_for_close(socket);  // never answers
    --open;
  });
  auto answering = start_server([](HttpRequest request, HttpResponder responder) {
    HttpResponse response;
    response.body = request.path;
    responder.respond(std::move(response));
  });
  ASSERT_TRUE(answering);
  const auto port = static_cast<uint16_t>(answering->port());
  auto client = HttpClient::start();
  std::vector<HttpClientRequest> requests;
  for (int i = 0; i < 3; ++i) {
    requests.push_back(request_to(silent.port(), "/hung"));
    requests.back().response_timeout_s = 1;
    requests.push_back(request_to(port, "/answer-" + std::to_string(i)));
  }
  auto answers = client->fetch_all(std::move(requests));
  ASSERT_EQ(answers.size(), 6u);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(answers[2 * i].status().code(), StatusCode::kDeadlineExceeded);
    ASSERT_TRUE(answers[2 * i + 1].ok()) << answers[2 * i + 1].status().message();
    EXPECT_EQ(answers[2 * i + 1]->body, "/answer-" + std::to_string(i));
  }
  EXPECT_EQ(most_open.load(), 3);
  EXPECT_TRUE(client->fetch_all({}).empty());
}

TEST(HttpClient, IdleTimeoutBetweenPiecesIsDeadlineExceeded) {
  std::promise<HttpResponder> opened;
  auto server = start_server([&](HttpRequest, HttpResponder responder) {
    responder.start_stream();
    responder.write("data: first\n\n");  // and nothing more
    opened.set_value(responder);
  });
  ASSERT_TRUE(server);
  Seen seen;  // before the client: its callbacks may run until the client is gone
  auto client = HttpClient::start();
  HttpClientRequest request = request_to(static_cast<uint16_t>(server->port()), "/v1/completions", "POST");
  request.idle_timeout_s = 0.3;
  client->send(request, seen.callbacks());
  ASSERT_TRUE(eventually([&] { return seen.ended(); }));
  std::lock_guard lock(seen.mu);
  EXPECT_EQ(seen.end.code(), StatusCode::kDeadlineExceeded) << seen.end.message();
  EXPECT_THAT(seen.end.message(), HasSubstr("idle_timeout_s"));
  EXPECT_THAT(seen.events, ElementsAre("first"));
}

TEST(HttpClient, CancelMidStreamEndsItAndTheServerSeesTheDisconnect) {
  std::promise<HttpResponder> opened;
  std::promise<void> disconnected;
  auto server = start_server([&](HttpRequest, HttpResponder responder) {
    responder.start_stream();
    responder.on_disconnect([&] { disconnected.set_value(); });
    responder.write("data: first\n\n");
    opened.set_value(responder);
  });
  ASSERT_TRUE(server);
  Seen seen;  // before the client: its callbacks may run until the client is gone
  auto client = HttpClient::start();
  const uint64_t id = client->send(
      request_to(static_cast<uint16_t>(server->port()), "/v1/completions", "POST"), seen.callbacks());
  ASSERT_TRUE(eventually([&] { return seen.event_count() == 1; }));
  client->cancel(id);
  ASSERT_TRUE(eventually([&] { return seen.ended(); }));
  EXPECT_EQ(disconnected.get_future().wait_for(kPatience), std::future_status::ready);
  client->cancel(id);  // ended: a no-op
  opened.get_future().get().write("data: late\n\n");
  std::this_thread::sleep_for(50ms);
  std::lock_guard lock(seen.mu);
  EXPECT_EQ(seen.end.code(), StatusCode::kCancelled) << seen.end.message();
  EXPECT_EQ(seen.ends, 1);
  EXPECT_THAT(seen.events, ElementsAre("first"));
  EXPECT_EQ(client->open_connections(), 0u);  // closed, not pooled
}

TEST(HttpClient, CallbackReturningFalseAbortsAndClosesTheConnection) {
  std::promise<void> disconnected;
  auto server = start_server([&](HttpRequest, HttpResponder responder) {
    responder.start_stream();
    responder.on_disconnect([&] { disconnected.set_value(); });
    responder.write("data: first\n\n");
  });
  ASSERT_TRUE(server);
  Seen seen;  // before the client: its callbacks may run until the client is gone
  auto client = HttpClient::start();
  seen.keep_reading = false;
  client->send(request_to(static_cast<uint16_t>(server->port()), "/v1/completions", "POST"),
               seen.callbacks());
  ASSERT_TRUE(eventually([&] { return seen.ended(); }));
  EXPECT_EQ(disconnected.get_future().wait_for(kPatience), std::future_status::ready);
  std::lock_guard lock(seen.mu);
  EXPECT_EQ(seen.end.code(), StatusCode::kCancelled) << seen.end.message();
  EXPECT_THAT(seen.end.message(), HasSubstr("on_body"));
  EXPECT_EQ(seen.pieces.size(), 1u);
  EXPECT_EQ(client->open_connections(), 0u);
}

TEST(HttpClient, CancelFromItsOwnCallbackEndsOnce) {
  auto server = start_server([&](HttpRequest, HttpResponder responder) {
    responder.start_stream();
    responder.write("data: first\n\n");
  });
  ASSERT_TRUE(server);
  std::atomic<uint64_t> id{0};
  std::atomic<int> ends{0};
  std::atomic<int> pieces{0};
  Status end;
  auto client = HttpClient::start();
  HttpClientCallbacks callbacks;
  callbacks.on_body = [&](std::string_view) {
    ++pieces;
    while (id.load() == 0) std::this_thread::yield();
    client->cancel(id.load());
    return true;
  };
  callbacks.on_end = [&](const Status& status) {
    end = status;
    ++ends;
  };
  id = client->send(request_to(static_cast<uint16_t>(server->port()), "/s", "POST"), callbacks);
  ASSERT_TRUE(eventually([&] { return ends.load() == 1; }));
  std::this_thread::sleep_for(50ms);
  EXPECT_EQ(ends.load(), 1);
  EXPECT_EQ(pieces.load(), 1);
  EXPECT_EQ(end.code(), StatusCode::kCancelled);
}

TEST(HttpClient, AServerClosingMidBodyIsAnError) {
  RawServer server([](tcp::socket& socket, int index) {
    std::string buffer;
    if (read_request(socket, buffer).empty()) return;
    if (index == 0) {
      write_all(socket, "HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n0123456789");
    } else {
      write_all(socket, "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n");
    }
  });
  auto client = HttpClient::start();
  for (const char* expected : {"0123456789", "hello"}) {
    Seen seen;
    client->send(request_to(server.port(), "/x"), seen.callbacks());
    ASSERT_TRUE(eventually([&] { return seen.ended(); }));
    std::lock_guard lock(seen.mu);
    EXPECT_EQ(seen.end.code(), StatusCode::kUnavailable) << seen.end.message();
    EXPECT_THAT(seen.end.message(), HasSubstr("closed the connection"));
    EXPECT_EQ(seen.body, expected);
  }
  EXPECT_EQ(client->open_connections(), 0u);
}

TEST(HttpClient, AnOversizedHeadIsRefused) {
  RawServer server([](tcp::socket& socket, int) {
    std::string buffer;
    if (read_request(socket, buffer).empty()) return;
    write_all(socket,
              "HTTP/1.1 200 OK\r\nX-Big: " + std::string(8192, 'a') + "\r\nContent-Length: 0\r\n\r\n");
    wait_for_close(socket);
  });
  HttpClient::Options options;
  options.max_response_head_bytes = 1024;
  auto client = HttpClient::start(options);
  auto response = client->fetch(request_to(server.port(), "/x"));
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), StatusCode::kInvalidArgument) << response.status().message();
  EXPECT_THAT(response.status().message(), HasSubstr("max_response_head_bytes"));
  EXPECT_EQ(client->open_connections(), 0u);
}

TEST(HttpClient, AMalformedResponseIsInvalidArgument) {
  RawServer server([](tcp::socket& socket, int) {
    std::string buffer;
    if (read_request(socket, buffer).empty()) return;
    write_all(socket, "HTTP/1.1 200 OK\r\nContent-Length: twelve\r\n\r\n");
    wait_for_close(socket);
  });
  auto client = HttpClient::start();
  auto response = client->fetch(request_to(server.port(), "/x"));
  ASSERT_FALSE(response.ok());
  EXPECT_EQ(response.status().code(), StatusCode::kInvalidArgument) << response.status().message();
}

TEST(HttpClient, KeepsHttp10AndConnectionCloseAndUntilCloseResponsesOutOfThePool) {
  RawServer server([](tcp::socket& socket, int index) {
    std::string buffer;
    if (read_request(socket, buffer).empty()) return;
    if (index == 0)
      write_all(socket, "HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 2\r\n\r\nhi");
    if (index == 1) write_all(socket, "HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi");
    if (index == 2) {
      write_all(socket, "HTTP/1.1 200 OK\r\n\r\nuntil close");  // no length: the close ends the body
      return;
    }
    wait_for_close(socket);  // the client, not the server, must close these
  });
  auto client = HttpClient::start();
  for (const char* expected : {"hi", "hi", "until close"}) {
    auto response = client->fetch(request_to(server.port(), "/x"));
    ASSERT_TRUE(response.ok()) << response.status().message();
    EXPECT_EQ(response->body, expected);
    EXPECT_EQ(client->open_connections(), 0u);
  }
  EXPECT_EQ(server.accepted(), 3);
}

TEST(HttpClient, SkipsInterimResponses) {
  RawServer server([](tcp::socket& socket, int) {
    std::string buffer;
    if (read_request(socket, buffer).empty()) return;
    write_all(socket, "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 201 Created\r\nContent-Length: 4\r\n\r\ndone");
    wait_for_close(socket);
  });
  auto client = HttpClient::start();
  auto response = client->fetch(request_to(server.port(), "/x", "POST"));
  ASSERT_TRUE(response.ok()) << response.status().message();
  EXPECT_EQ(response->status, 201);
  EXPECT_EQ(response->body, "done");
}

TEST(HttpClient, FetchBoundsTheBody) {
  auto server = start_server([](HttpRequest, HttpResponder responder) {
    HttpResponse response;
    response.body = std::string(100'000, 'x');
    responder.respond(std::move(response));
  });
  ASSERT_TRUE(server);
  auto client = HttpClient::start();
  auto whole = client->fetch(request_to(static_cast<uint16_t>(server->port()), "/big"));
  ASSERT_TRUE(whole.ok()) << whole.status().message();
  EXPECT_EQ(whole->body.size(), 100'000u);
  auto bounded = client->fetch(request_to(static_cast<uint16_t>(server->port()), "/big"), 1000);
  ASSERT_FALSE(bounded.ok());
  EXPECT_EQ(bounded.status().code(), StatusCode::kOutOfRange) << bounded.status().message();
}

TEST(HttpClient, RefusesAMalformedRequest) {
  auto client = HttpClient::start();
  const auto refused = [&](const std::function<void(HttpClientRequest&)>& spoil) {
    HttpClientRequest request = request_to(1, "/x", "POST");
    spoil(request);
    auto response = client->fetch(request);
    EXPECT_FALSE(response.ok());
    return response.status().code();
  };
  EXPECT_EQ(refused([](auto& r) { r.headers.emplace_back("X-A", "a\r\nInjected: yes"); }),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(refused([](auto& r) { r.headers.emplace_back("Bad Name", "a"); }), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused([](auto& r) { r.headers.emplace_back("content-length", "3"); }),
            StatusCode::kInvalidArgument);
  EXPECT_EQ(refused([](auto& r) { r.target = "v1/x"; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused([](auto& r) { r.target = "/a b"; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused([](auto& r) { r.port = 0; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused([](auto& r) { r.method = "GE T"; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(refused([](auto& r) { r.idle_timeout_s = 0; }), StatusCode::kInvalidArgument);
  EXPECT_EQ(client->open_connections(), 0u);
}

TEST(HttpClient, DestructionCancelsWhatIsInFlight) {
  auto server = start_server([&](HttpRequest, HttpResponder responder) {
    responder.start_stream();
    responder.write("data: first\n\n");
  });
  ASSERT_TRUE(server);
  Seen streaming;
  auto client = HttpClient::start();
  client->send(request_to(static_cast<uint16_t>(server->port()), "/s", "POST"), streaming.callbacks());
  ASSERT_TRUE(eventually([&] { return streaming.event_count() == 1; }));
  client.reset();
  std::lock_guard lock(streaming.mu);
  EXPECT_EQ(streaming.ends, 1);
  EXPECT_EQ(streaming.end.code(), StatusCode::kCancelled) << streaming.end.message();
}

TEST(HttpClient, CarriesTwoHundredConcurrentStreams) {
  constexpr int kStreams = 200;
  constexpr int kEvents = 5;
  std::mutex mu;
  std::vector<std::pair<std::string, HttpResponder>> opened;  // (path, responder)
  auto server = start_server([&](HttpRequest request, HttpResponder responder) {
    responder.start_stream();
    std::lock_guard lock(mu);
    opened.emplace_back(request.path, responder);
  });
  ASSERT_TRUE(server);
  std::vector<std::unique_ptr<Seen>> seen;
  auto client = HttpClient::start();
  for (int i = 0; i < kStreams; ++i) {
    seen.push_back(std::make_unique<Seen>());
    client->send(request_to(static_cast<uint16_t>(server->port()), "/stream/" + std::to_string(i), "POST"),
                 seen.back()->callbacks());
  }
  ASSERT_TRUE(eventually([&] {
    std::lock_guard lock(mu);
    return opened.size() == kStreams;
  }));
  EXPECT_EQ(client->open_connections(), static_cast<size_t>(kStreams));
  for (int k = 0; k < kEvents; ++k) {
    for (auto& [path, responder] : opened) {
      responder.write("data: " + path.substr(8) + "-" + std::to_string(k) + "\n\n");
    }
  }
  for (auto& [path, responder] : opened) responder.end();
  for (int i = 0; i < kStreams; ++i) {
    ASSERT_TRUE(eventually([&] { return seen[i]->ended(); })) << "stream " << i;
    std::lock_guard lock(seen[i]->mu);
    EXPECT_TRUE(seen[i]->end.ok()) << seen[i]->end.message();
    std::vector<std::string> expected;
    for (int k = 0; k < kEvents; ++k) expected.push_back(std::to_string(i) + "-" + std::to_string(k));
    EXPECT_EQ(seen[i]->events, expected);
  }
  // Done: the pool keeps at most max_idle_per_host of them.
  EXPECT_EQ(client->open_connections(), HttpClient::Options().max_idle_per_host);
}

TEST(ParseHttpUrl, SplitsHostPortAndBase) {
  auto plain = parse_http_url("http://engine-1:8000");
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(plain->host, "engine-1");
  EXPECT_EQ(plain->port, 8000);
  EXPECT_EQ(plain->base_path, "");
  auto based = parse_http_url("HTTP://10.0.0.7/api/");
  ASSERT_TRUE(based.ok()) << based.status().message();
  EXPECT_EQ(based->host, "10.0.0.7");
  EXPECT_EQ(based->port, 80);
  EXPECT_EQ(based->base_path, "/api");
  auto v6 = parse_http_url("http://[::1]:9000/x");
  ASSERT_TRUE(v6.ok()) << v6.status().message();
  EXPECT_EQ(v6->host, "::1");
  EXPECT_EQ(v6->port, 9000);
  EXPECT_EQ(v6->base_path, "/x");
}

TEST(ParseHttpUrl, RefusesWhatItCannotServe) {
  auto https = parse_http_url("https://engine:8000");
  ASSERT_FALSE(https.ok());
  EXPECT_THAT(https.status().message(), HasSubstr("https is not supported"));
  EXPECT_THAT(https.status().message(), HasSubstr("https://engine:8000"));
  for (const char* url : {"engine:8000", "ftp://engine", "http://", "http://:80", "http://engine:0",
                          "http://engine:65536", "http://engine:", "http://engine:8x", "http://u@engine",
                          "http://engine/?q", "http://[::1", "http://[nope]:80", "http://eng ine"}) {
    auto parsed = parse_http_url(url);
    EXPECT_FALSE(parsed.ok()) << url;
    if (!parsed.ok()) {
      EXPECT_EQ(parsed.status().code(), StatusCode::kInvalidArgument) << url;
      EXPECT_THAT(parsed.status().message(), HasSubstr(url));
    }
  }
}

std::vector<std::string> sse_events(const std::vector<std::string_view>& pieces, Status* status = nullptr) {
  std::vector<std::string> events;
  SseParser parser([&](std::string_view data) { events.emplace_back(data); });
  for (const auto piece : pieces) {
    Status st = parser.feed(piece);
    if (!st.ok()) {
      if (status) *status = st;
      break;
    }
  }
  return events;
}

TEST(SseParser, SplitAtEveryByteGivesTheSameEvents) {
  const std::string stream =
      ": ping\r\n\r\ndata: {\"a\":1}\r\n\r\ndata:x\ndata:  y\n\nevent: e\nid: 7\ndata: [DONE]\n\ndata\n\n"
      "data: cr\rdata: only\r\rretry: 5\n\ndata: partial";
  const std::vector<std::string> expected = {R"({"a":1})", "x\n y", "[DONE]", "", "cr\nonly"};
  EXPECT_EQ(sse_events({stream}), expected);
  for (size_t cut = 0; cut <= stream.size(); ++cut) {
    const std::string_view s(stream);
    EXPECT_EQ(sse_events({s.substr(0, cut), s.substr(cut)}), expected) << "cut at " << cut;
  }
  std::vector<std::string_view> bytes;
  for (size_t i = 0; i < stream.size(); ++i) bytes.push_back(std::string_view(stream).substr(i, 1));
  EXPECT_EQ(sse_events(bytes), expected);
}

TEST(SseParser, AnEventWithOnlyAnEmptyDataLineIsAnEmptyEvent) {
  // "data" alone adds an empty line to the data: the event is dispatched with "" (WHATWG), unlike an event
  // with no data field at all, which is not.
  EXPECT_EQ(sse_events({"data\n\nevent: x\n\n"}), std::vector<std::string>{""});
}

TEST(SseParser, BoundsAnEventsSize) {
  const std::string big = "data: " + std::string(100, 'x') + "\n\n";
  std::vector<std::string> events;
  SseParser parser([&](std::string_view data) { events.emplace_back(data); }, 64);
  EXPECT_TRUE(parser.feed("data: small\n\n").ok());
  Status failed = parser.feed(big);
  EXPECT_EQ(failed.code(), StatusCode::kOutOfRange);
  EXPECT_EQ(parser.feed("data: small\n\n").code(), StatusCode::kOutOfRange);  // stays failed
  EXPECT_EQ(events, std::vector<std::string>{"small"});
  // Also across pieces and lines: many small data lines add up.
  SseParser lines([&](std::string_view) {}, 64);
  Status st;
  for (int i = 0; i < 20 && st.ok(); ++i) st = lines.feed("data: 12345\n");
  EXPECT_EQ(st.code(), StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace crescent::serve
