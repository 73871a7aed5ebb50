// Replay against an in-process `crescent serve` (cluster::LocalCluster behind the HTTP server on a free
// port).
#include "serve/replay.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <sys/resource.h>

#include <atomic>
#include <filesystem>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "cluster/report.h"
#include "common/socket_io.h"
#include "engine/engine_core.h"
#include "serve/frontend.h"
#include "test_cluster.h"

namespace crescent::serve {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

ReplayOptions at(int port, double time_scale = 1) {
  ReplayOptions options;
  options.servers = {{.host = "127.0.0.1", .port = port}};
  options.time_scale = time_scale;
  return options;
}

trace::Request request(int64_t at_ms, int64_t input, int64_t output, std::vector<BlockKey> keys) {
  return {
      .timestamp_ms = at_ms, .input_tokens = input, .output_tokens = output, .block_keys = std::move(keys)};
}

TEST(TracePrompt, IsExactlyInputLengthAndTheSameForTheSameIds) {
  const auto a = trace_prompt_tokens(request(0, 1000, 1, {7, 8}), 512, 256);
  const auto b = trace_prompt_tokens(request(0, 600, 1, {7, 9}), 512, 256);
  ASSERT_EQ(a.size(), 1000u);
  ASSERT_EQ(b.size(), 600u);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 512, b.begin()));               // same first id, same block
  EXPECT_FALSE(std::equal(a.begin() + 512, a.begin() + 600, b.begin() + 512));  // different second id
  for (int64_t t : a) EXPECT_TRUE(t >= 0 && t < 256);
  EXPECT_EQ(trace_prompt_tokens(request(0, 10, 1, {7}), 512, 3).size(), 10u);
}

class ReplayTest : public ::testing::Test {
 protected:
  void start(const char* admission, double ttft_slo_s) {
    auto cluster = start_test_cluster(1, admission, ttft_slo_s);
    ASSERT_TRUE(cluster.ok()) << cluster.status().message();
    cluster_ = std::move(*cluster);
    auto server = HttpServer::start({.port = 0}, make_frontend(*cluster_, {}));
    ASSERT_TRUE(server.ok());
    server_ = std::move(*server);
  }
  std::unique_ptr<cluster::LocalCluster> cluster_;
  std::unique_ptr<HttpServer> server_;
};

TEST_F(ReplayTest, MeasuresEveryRequestAndSeesTheSharedPrefix) {
  start("none", 30);
  const std::vector<trace::Request> trace = {request(0, 1100, 6, {1, 2, 3}), request(300, 1100, 4, {1, 2, 4}),
                                             request(310, 40, 1, {5})};
  ReplayOptions options = at(server_->port());
  options.check_mock_output = true;  // and the answers are the mock model's, token for token
  auto replayed = replay(trace, options);
  ASSERT_TRUE(replayed.ok()) << replayed.status().message();
  EXPECT_EQ(replayed->model, "mock");
  EXPECT_EQ(replayed->failed, 0) << replayed->first_error;
  const auto& r = replayed->result.requests;
  ASSERT_EQ(r.size(), 3u);
  for (const auto& o : r) {
    EXPECT_EQ(o.rejected, conductor::RejectReason::kNone);
    EXPECT_GT(o.ttft_s, 0);
    EXPECT_GE(o.finish_s, o.arrival_s + o.ttft_s);
  }
  EXPECT_EQ(r[0].output_tokens, 6);
  EXPECT_GT(r[0].tbt_s, 0);
  EXPECT_NEAR(r[1].arrival_s, 0.3, 0.1);
  EXPECT_EQ(r[0].prefix_hit_tokens, 0);
  EXPECT_EQ(r[1].prefix_hit_tokens, 1024);  // blocks 1 and 2
  EXPECT_EQ(r[2].output_tokens, 1);
  EXPECT_EQ(r[2].tbt_s, 0);  // one token: no gap
}

TEST_F(ReplayTest, RefusalsAreRejectionsWithTheServersReason) {
  start("slo", 1e-6);
  const std::vector<trace::Request> trace = {request(0, 100, 3, {1}), request(0, 100, 3, {2})};
  auto replayed = replay(trace, at(server_->port(), 10));
  ASSERT_TRUE(replayed.ok());
  EXPECT_EQ(replayed->failed, 0);
  for (const auto& o : replayed->result.requests) EXPECT_EQ(o.rejected, conductor::RejectReason::kTtft);
}

// A token's chunk may be empty (crescent holds back a UTF-8 character's first bytes): it still counts as the
// token's arrival; a last chunk without text (only the finish reason) does not.
TEST(Replay, EmptyChunksBeforeTheLastAreTokens) {
  httplib::Server server;
  server.Post("/v1/completions", [](const httplib::Request&, httplib::Response& res) {
    const auto chunk = [](const std::string& text, const char* finish) {
      nlohmann::json c = {{"object", "text_completion"},
                          {"choices", {{{"index", 0}, {"text", text}, {"finish_reason", nullptr}}}}};
      if (finish != nullptr) c["choices"][0]["finish_reason"] = finish;
      return "data: " + c.dump() + "\n\n";
    };
    res.set_content(chunk("", nullptr) + chunk("a", nullptr) + chunk("", nullptr) + chunk("", "length") +
                        "data: [DONE]\n\n",
                    "text/event-stream");
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread serving([&] { server.listen_after_bind(); });
  ReplayOptions options = at(port);
  options.model = "fake";  // (no /v1/models to ask)
  auto replayed = replay(std::vector<trace::Request>{request(0, 10, 3, {1})}, options);
  server.stop();
  serving.join();
  ASSERT_TRUE(replayed.ok()) << replayed.status().message();
  ASSERT_EQ(replayed->failed, 0);
  EXPECT_EQ(replayed->result.requests[0].output_tokens, 3);  // no usage: counted from the chunks
}

// A server that misbehaves cannot hang a replay or take its memory: each request has a deadline, a stream
// may not run past max_tokens or send an endless event, and such requests are failures of their own in the
// report, not refusals; the error says what happened (issue 22 §4). The fake server's behaviour is chosen by
// the prompt's length.
TEST(Replay, AServerThatMisbehavesFailsItsRequestsInTime) {
  std::atomic<bool> stopping{false};
  httplib::Server server;
  server.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
    const size_t kind = nlohmann::json::parse(req.body)["prompt"].size();
    if (kind == 11) {  // never answers
      while (!stopping) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      return;
    }
    res.set_chunked_content_provider("text/event-stream", [&, kind](size_t, httplib::DataSink& sink) {
      if (stopping) return false;
      std::string bytes;
      if (kind == 12) {  // trickles comments: no token, no end
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        bytes = ": still here\n\n";
      } else if (kind == 13) {  // tokens without end
        bytes = "data: " + nlohmann::json{{"choices", {{{"index", 0}, {"text", "x"}}}}}.dump() + "\n\n";
      } else {  // one event that never ends
        bytes = "data: " + std::string(64 << 10, 'x');
      }
      return sink.write(bytes.data(), bytes.size());
    });
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread serving([&] { server.listen_after_bind(); });
  ReplayOptions options = at(port);
  options.model = "fake";
  options.timeout_s = 1;
  const auto replay_of = [&](std::vector<int64_t> inputs) {
    std::vector<trace::Request> trace;
    for (int64_t n : inputs) trace.push_back(request(0, n, 3, {1}));
    return replay(trace, options);
  };
  const auto started = std::chrono::steady_clock::now();
  auto all = replay_of({11, 12, 13, 14});
  const double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::vector<std::pair<std::string, std::string>> errors;  // what each kind alone says
  for (const auto& [input, says] : std::vector<std::pair<int64_t, std::string>>{
           {11, "no whole answer within 1 s"},
           {12, "no whole answer within 1 s"},
           {13, "the stream ran past max_tokens (12 token chunks for 3)"},
           {14, "a stream event longer than 1048576 bytes"}}) {
    auto one = replay_of({input});
    errors.emplace_back(one.ok() ? one->first_error : one.status().message(), says);
  }
  stopping = true;
  server.stop();
  serving.join();
  ASSERT_TRUE(all.ok()) << all.status().message();
  EXPECT_LT(took_s, 10) << "every request ends within its deadline";
  EXPECT_EQ(all->failed, 4);
  for (const auto& o : all->result.requests) {
    EXPECT_TRUE(o.failed);
    EXPECT_EQ(o.rejected, conductor::RejectReason::kNone);
  }
  const cluster::PolicyReport report = cluster::summarize("live", all->result, {});
  EXPECT_EQ(report.failed, 4);
  EXPECT_EQ(report.rejected, 0);
  EXPECT_THAT(cluster::format_table({report}, {}), HasSubstr("failed"));
  const std::string jsonl = cluster::requests_jsonl(all->result, "live");
  EXPECT_THAT(jsonl, HasSubstr("\"outcome\":\"failed\""));
  EXPECT_THAT(jsonl, Not(HasSubstr("\"outcome\":\"rejected\"")));
  for (const auto& [error, says] : errors) EXPECT_THAT(error, HasSubstr(says));
  EXPECT_EQ(all->failures[static_cast<size_t>(FailureClass::kHung)], 2);
  EXPECT_EQ(all->failures[static_cast<size_t>(FailureClass::kMalformed)], 2);
}

// The request timeout holds whatever arrives meanwhile: an error status whose body trickles, or a stream
// whose comments each come just within the client's idle timeout.
TEST(Replay, TheRequestTimeoutHoldsWhateverTheServerTrickles) {
  std::atomic<bool> stopping{false};
  httplib::Server server;
  server.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
    const size_t kind = nlohmann::json::parse(req.body)["prompt"].size();
    if (kind == 31) res.status = 500;
    res.set_chunked_content_provider(
        kind == 31 ? "application/json" : "text/event-stream", [&, kind](size_t, httplib::DataSink& sink) {
          if (stopping) return false;
          std::this_thread::sleep_for(std::chrono::milliseconds(kind == 31 ? 100 : 900));
          const std::string bytes = kind == 31 ? " " : ": still here\n\n";
          return sink.write(bytes.data(), bytes.size());
        });
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread serving([&] { server.listen_after_bind(); });
  ReplayOptions options = at(port);
  options.model = "fake";
  options.timeout_s = 1;
  for (int64_t kind : {31, 32}) {
    const auto started = std::chrono::steady_clock::now();
    auto replayed = replay(std::vector<trace::Request>{request(0, kind, 3, {1})}, options);
    const double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    ASSERT_TRUE(replayed.ok()) << replayed.status().message();
    EXPECT_EQ(replayed->failures[static_cast<size_t>(FailureClass::kHung)], 1)
        << kind << ": " << replayed->first_error;
    EXPECT_THAT(replayed->first_error, HasSubstr("no whole answer within 1 s")) << kind;
    EXPECT_LT(took_s, 2.5) << kind;
  }
  stopping = true;
  server.stop();
  serving.join();
}

// Each way a request can end badly has its class, so a chaos run can tell the endings a client sees at once
// (an HTTP error, an SSE error event, a connection closed or refused) from those no server may give (hung,
// malformed, wrong output). A server that cannot be connected to sends its requests to the next.
TEST(Replay, FailuresAreClassifiedAndAnUnreachableServerIsPassedOver) {
  httplib::Server server;
  server.Post("/v1/completions", [&](const httplib::Request& req, httplib::Response& res) {
    const nlohmann::json body = nlohmann::json::parse(req.body);
    const size_t kind = body["prompt"].size();
    const auto chunk = [](const std::string& text) {
      return "data: " + nlohmann::json{{"choices", {{{"index", 0}, {"text", text}}}}}.dump() + "\n\n";
    };
    if (kind == 21) {
      res.status = 503;
      res.set_content(R"({"error":{"message":"no leader","code":"no-leader"}})", "application/json");
    } else if (kind == 22) {
      res.set_content(chunk("a") + R"(data: {"error":{"message":"instance down"}})"
                                   "\n\ndata: [DONE]\n\n",
                      "text/event-stream");
    } else if (kind == 23) {  // two tokens, then the connection ends without [DONE]
      res.set_content(chunk("a") + chunk("b"), "text/event-stream");
    } else {  // a whole answer: the mock model's for this seed, or not
      const std::string right = [&] {
        std::string t;
        for (int64_t i = 0; i < 3; ++i) t.push_back(static_cast<char>(engine::mock_token(body["seed"], i)));
        return t;
      }();
      const std::string text = kind == 24 ? right : right.substr(0, 2) + (right[2] == 'x' ? "y" : "x");
      res.set_content(chunk(text.substr(0, 1)) + chunk(text.substr(1)) + "data: [DONE]\n\n",
                      "text/event-stream");
    }
  });
  const int port = server.bind_to_any_port("127.0.0.1");
  ASSERT_GT(port, 0);
  std::thread serving([&] { server.listen_after_bind(); });
  ReplayOptions options;
  // The first server listens nowhere (a port just freed): its requests go to the second.
  options.servers = {{.host = "127.0.0.1", .port = net::free_tcp_port()},
                     {.host = "127.0.0.1", .port = port}};
  options.model = "fake";
  options.timeout_s = 5;
  options.check_mock_output = true;
  std::vector<trace::Request> trace;
  for (int64_t n : {21, 22, 23, 24, 24, 25}) trace.push_back(request(0, n, 3, {1}));
  for (size_t i = 0; i < trace.size(); ++i) trace[i].line = static_cast<int64_t>(i + 1);
  auto replayed = replay(trace, options);
  server.stop();
  serving.join();
  ASSERT_TRUE(replayed.ok()) << replayed.status().message();
  const auto failures_of = [&](FailureClass c) { return replayed->failures[static_cast<size_t>(c)]; };
  EXPECT_EQ(failures_of(FailureClass::kHttpError), 1);
  EXPECT_EQ(failures_of(FailureClass::kSseError), 1);
  EXPECT_EQ(failures_of(FailureClass::kConnectionClosed), 1);
  EXPECT_EQ(failures_of(FailureClass::kWrongOutput), 1);
  EXPECT_EQ(failures_of(FailureClass::kConnectionRefused), 0);
  EXPECT_EQ(failures_of(FailureClass::kHung) + failures_of(FailureClass::kMalformed), 0);
  EXPECT_EQ(replayed->failed, 4) << replayed->first_error;
  EXPECT_FALSE(replayed->result.requests[3].failed);
  EXPECT_FALSE(replayed->result.requests[4].failed);

  // With no server to take them, requests are refused connections: failures, not hangs.
  options.servers = {{.host = "127.0.0.1", .port = net::free_tcp_port()}};
  auto nowhere = replay(std::vector<trace::Request>{request(0, 24, 3, {1})}, options);
  ASSERT_TRUE(nowhere.ok());
  EXPECT_EQ(nowhere->failures[static_cast<size_t>(FailureClass::kConnectionRefused)], 1);
}

// A streamed answer of one token, as crescent's front end sends it.
std::string one_token_stream() {
  const nlohmann::json chunk = {{"choices", {{{"index", 0}, {"text", "a"}, {"finish_reason", "length"}}}}};
  const nlohmann::json usage = {{"choices", nlohmann::json::array()},
                                {"usage", {{"prompt_tokens", 1}, {"completion_tokens", 1}}}};
  return "data: " + chunk.dump() + "\n\ndata: " + usage.dump() + "\n\ndata: [DONE]\n\n";
}

// The replay's prompts are built from cached per-block text: the server sees exactly trace_prompt_tokens,
// for whole and partial blocks, shared ids, more tokens than ids, and no ids at all.
TEST(Replay, ThePromptSentIsTracePromptTokens) {
  std::mutex mu;
  std::map<int64_t, nlohmann::json> prompts;  // by max_tokens, which names the request here
  auto server = HttpServer::start({.port = 0}, [&](HttpRequest request, HttpResponder responder) {
    if (request.path != "/v1/completions")
      return responder.respond(
          HttpResponse{.status = 404, .content_type = "text/plain", .body = "", .headers = {}});  // /metrics
    const nlohmann::json body = nlohmann::json::parse(request.body);
    {
      std::lock_guard lock(mu);
      prompts[body["max_tokens"].get<int64_t>()] = body["prompt"];
    }
    responder.start_stream();
    responder.write(one_token_stream());
    responder.end();
  });
  ASSERT_TRUE(server.ok());
  ReplayOptions options = at((*server)->port());
  options.model = "fake";
  options.block_size_tokens = 16;
  options.vocab_size = 1000;
  const std::vector<trace::Request> trace = {
      request(0, 48, 1, {5, 6, 7}),   // whole blocks
      request(0, 40, 2, {5, 6, 8}),   // a partial last block, shared ids
      request(0, 70, 3, {5, 9}),      // more tokens than ids
      request(0, 7, 4, {}),           // no ids
      request(0, 48, 5, {5, 6, 7})};  // the first again, from the cache
  auto replayed = replay(trace, options);
  ASSERT_TRUE(replayed.ok()) << replayed.status().message();
  EXPECT_EQ(replayed->failed, 0) << replayed->first_error;
  ASSERT_EQ(prompts.size(), trace.size());
  for (const trace::Request& r : trace) {
    EXPECT_EQ(prompts[r.output_tokens].get<std::vector<int64_t>>(), trace_prompt_tokens(r, 16, 1000))
        << "request " << r.output_tokens;
  }
}

// One client thread and one event loop thread hold thousands of streams at once (issue 26 §4): the server
// answers none until it holds them all, and the process meanwhile runs a few threads, not one per request.
TEST(Replay, OneEventLoopHoldsThousandsOfStreamsAtOnce) {
  constexpr size_t kStreams = 2000;
  rlimit limit{};
  ASSERT_EQ(getrlimit(RLIMIT_NOFILE, &limit), 0);
  if (limit.rlim_max < 2 * kStreams + 200) {
    GTEST_SKIP() << "the hard limit on open files (" << limit.rlim_max << ") is below " << 2 * kStreams + 200;
  }
  std::mutex mu;
  std::vector<HttpResponder> held;
  std::atomic<int64_t> threads_while_held{-1};
  std::thread answering;
  auto server = HttpServer::start({.port = 0}, [&](HttpRequest request, HttpResponder responder) {
    if (request.path != "/v1/completions")
      return responder.respond(
          HttpResponse{.status = 404, .content_type = "text/plain", .body = "", .headers = {}});  // /metrics
    responder.start_stream();
    std::lock_guard lock(mu);
    held.push_back(responder);
    if (held.size() < kStreams) return;
    answering = std::thread([&] {
      threads_while_held = static_cast<int64_t>(std::distance(
          std::filesystem::directory_iterator("/proc/self/task"), std::filesystem::directory_iterator()));
      for (HttpResponder& r : held) {
        r.write(one_token_stream());
        r.end();
      }
    });
  });
  ASSERT_TRUE(server.ok());
  ReplayOptions options = at((*server)->port());
  options.model = "fake";
  options.timeout_s = 60;
  std::vector<trace::Request> trace;
  for (size_t i = 0; i < kStreams; ++i) trace.push_back(request(0, 8, 1, {static_cast<BlockKey>(i)}));
  auto replayed = replay(trace, options);
  if (answering.joinable()) answering.join();
  ASSERT_TRUE(replayed.ok()) << replayed.status().message();
  EXPECT_EQ(replayed->failed, 0) << replayed->first_error;
  EXPECT_EQ(replayed->max_in_flight, static_cast<int64_t>(kStreams));
  EXPECT_GT(threads_while_held.load(), 0) << "the server never held every stream at once";
  EXPECT_LT(threads_while_held.load(), 64) << "a thread per request?";
  EXPECT_GE(replayed->schedule_lag_max_s, 0);
}

TEST(Replay, AnUnreachableServerIsAnErrorBeforeAnythingIsSent) {
  const std::vector<trace::Request> trace = {request(0, 10, 1, {1})};
  auto replayed = replay(trace, at(1));
  ASSERT_FALSE(replayed.ok());
  EXPECT_EQ(replayed.status().code(), StatusCode::kUnavailable);
  EXPECT_FALSE(replay(trace, at(8000, 0)).ok());
}

}  // namespace
}  // namespace crescent::serve
