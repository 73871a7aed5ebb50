// A standby Conductor's relay to the leader (serve/leader_forward.h), between two of crescent's own HTTP
// servers on loopback: the "leader" answers as the test scripts it, the "standby" forwards to it.
#include "serve/leader_forward.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

namespace crescent::serve {
namespace {

using ::testing::HasSubstr;
using json = nlohmann::json;

// The scripted leader: /whole answers 429 with Retry-After and what it was sent; /stream writes two events
// and ends, or with `hang_up` writes one and then the test stops the server mid-stream.
class Leader {
 public:
  Leader() {
    auto server = HttpServer::start({.port = 0}, [this](HttpRequest request, HttpResponder responder) {
      if (request.path == "/v1/whole") {
        HttpResponse r;
        r.status = 429;
        r.body = json{{"method", request.method},
                      {"body", request.body},
                      {"authorization", request.header("authorization")}}
                     .dump();
        r.headers.emplace_back("Retry-After", "7");
        return responder.respond(std::move(r));
      }
      if (request.path == "/v1/stream") {
        responder.start_stream();
        responder.write("data: {\"n\":1}\n\n");
        if (hang_up) return;  // the test stops the server now
        std::lock_guard lock(mu_);
        writers_.emplace_back([responder] {
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          responder.write("data: {\"n\":2}\n\n");
          responder.write("data: [DONE]\n\n");
          responder.end();
        });
        return;
      }
      responder.respond({.status = 404, .body = "{}", .headers = {}});
    });
    server_ = std::move(server.value());
  }
  ~Leader() {
    std::lock_guard lock(mu_);
    for (std::thread& t : writers_) t.join();  // before the server their responders belong to goes
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(server_->port()); }
  void stop() { server_->stop(); }
  std::atomic<bool> hang_up{false};

 private:
  std::mutex mu_;
  std::vector<std::thread> writers_;  // under mu_
  std::unique_ptr<HttpServer> server_;
};

// The standby: forwards to `leader_url` (when not empty), else answers 299 "local" itself.
class Standby {
 public:
  Standby() : client_(HttpClient::start()) {
    auto local = [](HttpRequest, HttpResponder responder) {
      responder.respond({.status = 299, .body = "\"local\"", .headers = {}});
    };
    auto server = HttpServer::start({.port = 0}, forward_unless_leading(
                                                     local,
                                                     [this] {
                                                       std::lock_guard lock(mu_);
                                                       return leader_url_;
                                                     },
                                                     *client_));
    server_ = std::move(server.value());
  }
  ~Standby() { server_->stop(); }
  void follow(const std::string& url) {
    std::lock_guard lock(mu_);
    leader_url_ = url;
  }
  int port() const { return server_->port(); }

 private:
  std::unique_ptr<HttpClient> client_;  // outlives the server's handler
  std::unique_ptr<HttpServer> server_;
  std::mutex mu_;
  std::string leader_url_;
};

TEST(LeaderForward, AWholeAnswerComesBackAsTheLeaderGaveIt) {
  Leader leader;
  Standby standby;
  httplib::Client client("127.0.0.1", standby.port());
  client.set_read_timeout(20, 0);
  EXPECT_EQ(client.Post("/v1/whole", "{\"p\":1}", "application/json")->status, 299) << "no leader: local";
  standby.follow(leader.url());
  auto res = client.Post("/v1/whole", {{"Authorization", "Bearer k"}}, "{\"p\":1}", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429);
  EXPECT_EQ(res->get_header_value("Retry-After"), "7");
  const json sent = json::parse(res->body);
  EXPECT_EQ(sent["method"], "POST");
  EXPECT_EQ(sent["body"], "{\"p\":1}");
  EXPECT_EQ(sent["authorization"], "Bearer k") << "the client's key goes along";
  EXPECT_EQ(client.Get("/metrics")->status, 299) << "a standby's own metrics";
}

TEST(LeaderForward, AStreamIsRelayedEventByEventAndEndsCleanlyWhenTheLeaderGoes) {
  Leader leader;
  Standby standby;
  standby.follow(leader.url());
  httplib::Client client("127.0.0.1", standby.port());
  client.set_read_timeout(20, 0);
  auto res = client.Post("/v1/stream", "{}", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
  EXPECT_EQ(res->body, "data: {\"n\":1}\n\ndata: {\"n\":2}\n\ndata: [DONE]\n\n");

  // The leader dies mid-stream: the client still gets a clean end, an error event and [DONE].
  leader.hang_up = true;
  std::string body;
  std::thread stopper([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    leader.stop();
  });
  res = client.Post("/v1/stream", "{}", "application/json");
  stopper.join();
  ASSERT_TRUE(res);
  EXPECT_THAT(res->body, HasSubstr("data: {\"n\":1}\n\n"));
  EXPECT_THAT(res->body, HasSubstr("conductor_failover"));
  EXPECT_TRUE(res->body.ends_with("data: [DONE]\n\n")) << res->body;
}

TEST(LeaderForward, ALeaderThatCannotBeReachedIsA503WithRetryAfter) {
  std::string gone;
  {
    Leader leader;
    gone = leader.url();
    leader.stop();
  }
  Standby standby;
  standby.follow(gone);
  httplib::Client client("127.0.0.1", standby.port());
  auto res = client.Post("/v1/whole", "{}", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(res->get_header_value("Retry-After"), "1");
  EXPECT_EQ(json::parse(res->body)["error"]["code"], "no-leader");
  standby.follow("https://elsewhere");
  res = client.Post("/v1/whole", "{}", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503) << "a URL the relay cannot use is no leader either";
}

}  // namespace
}  // namespace crescent::serve
