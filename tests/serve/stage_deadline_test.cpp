// An instance that heartbeats but never answers must not hang its requests (issue 22 §4). A real
// `crescent serve conductor` process, and in place of its two instances two members of the cluster (they
// hold its secret) that report their load every 50 ms like any instance but carry out no order: whatever
// stage a request reaches, it ends at that stage's deadline with 503 (or, once it streamed, an SSE error
// event and [DONE]), its instances are told to drop it, and the failure is counted. Members are trusted
// only with their own requests: tokens from the wrong instance or a replaced incarnation are dropped.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <fstream>
#include <functional>
#include <initializer_list>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <sstream>
#include <thread>
#include <zmq.hpp>

#include "cluster/cluster_config.h"
#include "common/child_process.h"
#include "common/secret.h"
#include "serve/instance_wire.h"
#include "serve/members_only.h"
#include "test_support/metrics.h"
#include "test_support/sse.h"
#include "test_support/temp_dir.h"

namespace crescent {
namespace {

using json = nlohmann::json;
using serve::InstanceMessage;
using Clock = std::chrono::steady_clock;
using Kind = InstanceMessage::Kind;

// A member of the cluster under an instance's name: it says hello, reports its load every 50 ms and records
// the orders the Conductor sends, but answers only what answer() returns for an order, after `delay`.
class SilentInstance {
 public:
  using Answer = std::function<std::vector<InstanceMessage>(const InstanceMessage& order)>;

  SilentInstance(const std::string& control, const ClusterSecret& secret, serve::InstanceRole role,
                 int64_t kv_capacity_tokens)
      : role_(role),
        kv_capacity_tokens_(kv_capacity_tokens),
        thread_([this, control, secret] { run(control, secret); }) {}
  ~SilentInstance() {
    stopping_ = true;
    thread_.join();
  }

  /// From now on each order gets `answer(order)` back, `delay` after it arrived (none: silence).
  void answer_with(Answer answer, std::chrono::milliseconds delay) {
    std::lock_guard lock(mu_);
    answer_ = std::move(answer);
    delay_ = delay;
  }
  /// The first order of `kind` about `request_id` (any request when 0, but not one of `seen`) received within
  /// `timeout`.
  std::optional<InstanceMessage> wait_for(Kind kind, uint64_t request_id, std::chrono::milliseconds timeout,
                                          const std::vector<uint64_t>& seen = {}) {
    const auto until = Clock::now() + timeout;
    while (Clock::now() < until) {
      {
        std::lock_guard lock(mu_);
        for (const InstanceMessage& m : orders_) {
          if (m.kind != kind || (request_id != 0 && m.request_id != request_id)) continue;
          if (std::find(seen.begin(), seen.end(), m.request_id) == seen.end()) return m;
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return std::nullopt;
  }

 private:
  InstanceMessage report(Kind kind) const {
    InstanceMessage m;
    m.kind = kind;
    m.role = role_;
    m.index = 0;
    m.incarnation = 1;
    if (role_ == serve::InstanceRole::kDecode) {
      m.load.kv_capacity_tokens = kv_capacity_tokens_;
      m.kv_capacity_tokens = kv_capacity_tokens_;
    }
    return m;
  }

  void run(const std::string& control, const ClusterSecret& secret) {
    zmq::context_t context;
    zmq::socket_t dealer(context, zmq::socket_type::dealer);
    dealer.set(zmq::sockopt::routing_id, fmt::format("{}-0#1", serve::to_string(role_)));
    dealer.set(zmq::sockopt::linger, 0);
    serve::make_member_client(dealer, secret);
    dealer.connect(control);
    const auto send = [&](const InstanceMessage& m) {
      (void)dealer.send(zmq::buffer(serve::encode(m)), zmq::send_flags::dontwait);
    };
    send(report(Kind::kHello));
    auto next_report = Clock::now();
    std::vector<std::pair<Clock::time_point, InstanceMessage>> later;  // answers due
    while (!stopping_) {
      zmq::pollitem_t item{dealer.handle(), 0, ZMQ_POLLIN, 0};
      zmq::poll(&item, 1, std::chrono::milliseconds(5));
      zmq::message_t frame;
      while (dealer.recv(frame, zmq::recv_flags::dontwait)) {
        auto m = serve::decode_instance_message(frame.to_string_view());
        if (!m.ok()) continue;
        std::lock_guard lock(mu_);
        orders_.push_back(*m);
        if (!answer_) continue;
        for (InstanceMessage& a : answer_(*m)) later.emplace_back(Clock::now() + delay_, std::move(a));
      }
      const auto now = Clock::now();
      if (now >= next_report) {  // the heartbeat goes on whatever happens to requests
        send(report(Kind::kLoad));
        next_report += std::chrono::milliseconds(50);
      }
      for (auto it = later.begin(); it != later.end();) {
        if (it->first > now) {
          ++it;
          continue;
        }
        send(it->second);
        it = later.erase(it);
      }
    }
  }

  const serve::InstanceRole role_;
  const int64_t kv_capacity_tokens_;
  std::mutex mu_;
  std::vector<InstanceMessage> orders_;
  Answer answer_;
  std::chrono::milliseconds delay_{0};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// What a prefill instance reports about `order`'s request: one message of each of `kinds`, in order (the
// first token is 'A'); nothing about an order that is not a prefill.
std::vector<InstanceMessage> prefill_reports(const InstanceMessage& order,
                                             std::initializer_list<Kind> kinds) {
  std::vector<InstanceMessage> out;
  if (order.kind != Kind::kPrefill) return out;
  for (Kind kind : kinds) {
    InstanceMessage m;
    m.kind = kind;
    m.request_id = order.request_id;
    if (kind == Kind::kFirstToken) m.first_token = 'A';
    out.push_back(m);
  }
  return out;
}

struct Reply {
  int status = 0;
  json body;
  double seconds = 0;
};

Reply complete(int port, const std::string& prompt) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(30, 0);
  const auto start = Clock::now();
  auto res =
      client.Post("/v1/completions", json{{"model", "mock"}, {"prompt", prompt}, {"max_tokens", 4}}.dump(),
                  "application/json");
  Reply r;
  r.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  if (!res) return r;
  r.status = res->status;
  r.body = json::parse(res->body, nullptr, false);
  return r;
}

// A streamed completion: its chunks with text, the error event's code, whether [DONE] came, how long.
struct Streamed {
  int status = 0;
  int chunks = 0;
  std::string text;  // the chunks' text, in order
  std::string error_code;
  bool done = false;
  double seconds = 0;
  std::string raw;  // every byte of the body, for messages
};

Streamed stream(int port, const std::string& prompt) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(30, 0);
  const json body = {{"model", "mock"}, {"prompt", prompt}, {"max_tokens", 4}, {"stream", true}};
  Streamed out;
  const auto start = Clock::now();
  const test::SseReply reply = test::post_sse(client, "/v1/completions", body.dump());
  out.seconds = std::chrono::duration<double>(Clock::now() - start).count();
  out.status = reply.status;
  out.raw = reply.raw;
  for (const std::string& event : reply.events) {
    if (event == "[DONE]") {
      out.done = true;
      continue;
    }
    const json chunk = json::parse(event, nullptr, false);
    if (chunk.contains("error")) {
      out.error_code = chunk["error"].value("code", "");
    } else {
      ++out.chunks;
      out.text += chunk["choices"][0].value("text", "");
    }
  }
  return out;
}

// Sends `message` once on a connection of its own as the cluster member `routing_id` ("decode-0#0"), as a
// process that already said hello would (none is sent); waits until it is flushed.
void send_as(const std::string& control, const ClusterSecret& secret, const std::string& routing_id,
             const InstanceMessage& message) {
  zmq::context_t context;
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::routing_id, routing_id);
  dealer.set(zmq::sockopt::linger, 2000);
  serve::make_member_client(dealer, secret);
  dealer.connect(control);
  (void)dealer.send(zmq::buffer(serve::encode(message)), zmq::send_flags::none);
}

// A `crescent serve conductor` of one prefill and one decode instance, with a secret of its own, whose stage
// deadlines are `floor_s` (factor 1), in `dir`: its config and secret files, HTTP port and control endpoint.
struct StartedConductor {
  std::string config_file, secret_file;
  ClusterSecret secret = ClusterSecret::generate();
  std::unique_ptr<ChildProcess> process;
  int port = 0;
  std::string control;
};
// nullopt (and a test failure saying why) when it did not start.
std::optional<StartedConductor> start_conductor(const test::TempDir& dir, double floor_s) {
  StartedConductor c;
  json config = json::parse(std::ifstream(CRESCENT_SOURCE_DIR "/configs/local.json"));
  config["prefill_instances"] = 1;
  config["decode_instances"] = 1;
  config["serve"]["stage_timeout_floor_s"] = floor_s;
  config["serve"]["stage_timeout_factor"] = 1;
  c.config_file = dir.file("one.json");
  std::ofstream(c.config_file) << config.dump();
  c.secret_file = dir.file("cluster-secret");
  if (Status written = c.secret.write_to(c.secret_file); !written.ok()) {
    ADD_FAILURE() << written.to_string();
    return std::nullopt;
  }
  auto process =
      ChildProcess::start({CRESCENT_BINARY, "serve", "conductor", "--config", c.config_file, "--port", "0",
                           "--control", "tcp://127.0.0.1:0", "--cluster-secret-file", c.secret_file},
                          dir.file("conductor.log"));
  if (!process.ok()) {
    ADD_FAILURE() << process.status().to_string();
    return std::nullopt;
  }
  c.process = std::move(*process);
  auto line = c.process->wait_for_line("which connect to", std::chrono::seconds(30));
  std::smatch port, control;
  if (!line.ok() || !std::regex_search(*line, port, std::regex(R"(http://127\.0\.0\.1:(\d+))")) ||
      !std::regex_search(*line, control, std::regex(R"(which connect to (tcp://127\.0\.0\.1:\d+))"))) {
    ADD_FAILURE() << "the Conductor did not say where it listens: "
                  << (line.ok() ? *line : line.status().message()) << c.process->log_tail();
    return std::nullopt;
  }
  c.port = std::stoi(port[1]);
  c.control = control[1];
  return c;
}

TEST(StageDeadlines, AnInstanceThatHeartbeatsButNeverAnswersFailsItsRequestsAtEachStagesDeadline) {
  test::TempDir dir("crescent-deadlines");
  // A short prompt's stages are predicted to take milliseconds: each deadline is about the floor.
  constexpr double kFloorS = 2.0;
  constexpr double kLateS = 1.5;  // how late past its deadline a request may end on a loaded machine
  auto started = start_conductor(dir, kFloorS);
  ASSERT_TRUE(started.has_value());
  auto parsed = cluster::load_cluster_config(started->config_file, 512);
  ASSERT_TRUE(parsed.ok()) << parsed.status().to_string();
  const ClusterSecret& secret = started->secret;
  const int port = started->port;
  const std::string& control = started->control;
  std::unique_ptr<ChildProcess>& conductor = started->process;

  SilentInstance prefill(control, secret, serve::InstanceRole::kPrefill, 0);
  SilentInstance decode(control, secret, serve::InstanceRole::kDecode,
                        cluster::decode_kv_capacity_tokens(*parsed));
  ASSERT_TRUE(conductor->wait_for_line("conductor: decode-0 up", std::chrono::seconds(10)).ok());
  ASSERT_TRUE(conductor->wait_for_line("conductor: prefill-0 up", std::chrono::seconds(10)).ok());
  std::vector<uint64_t> seen;  // requests of the earlier steps

  // 1. Queued and never started: 503 queue_timeout at the deadline; both instances told to drop it.
  const Reply queued = complete(port, "never started");
  EXPECT_EQ(queued.status, 503) << queued.body.dump();
  EXPECT_EQ(queued.body["error"]["code"], "queue_timeout") << queued.body.dump();
  EXPECT_GE(queued.seconds, kFloorS);
  EXPECT_LT(queued.seconds, kFloorS + kLateS) << "it ends at its deadline (checked every 20 ms)";
  auto placed = prefill.wait_for(Kind::kPrefill, 0, std::chrono::seconds(1));
  ASSERT_TRUE(placed.has_value());
  seen.push_back(placed->request_id);
  EXPECT_TRUE(prefill.wait_for(Kind::kCancel, placed->request_id, std::chrono::seconds(1)).has_value())
      << "the prefill instance is told to drop it";
  EXPECT_TRUE(decode.wait_for(Kind::kExpect, placed->request_id, std::chrono::seconds(1)).has_value());
  EXPECT_TRUE(decode.wait_for(Kind::kCancel, placed->request_id, std::chrono::seconds(1)).has_value())
      << "its decode reservation is freed";

  // 2. Started half a second after it was placed (well before its queue deadline), never finished: 503
  // prefill_timeout, the deadline counted from the start.
  prefill.answer_with(
      [](const InstanceMessage& order) { return prefill_reports(order, {Kind::kPrefillStart}); },
      std::chrono::milliseconds(500));
  const Reply prefilling = complete(port, "never finished");
  EXPECT_EQ(prefilling.status, 503) << prefilling.body.dump();
  EXPECT_EQ(prefilling.body["error"]["code"], "prefill_timeout") << prefilling.body.dump();
  EXPECT_GE(prefilling.seconds, 0.5 + kFloorS);
  EXPECT_LT(prefilling.seconds, 0.5 + kFloorS + kLateS);
  placed = prefill.wait_for(Kind::kPrefill, 0, std::chrono::seconds(1), seen);
  ASSERT_TRUE(placed.has_value());
  seen.push_back(placed->request_id);
  EXPECT_TRUE(prefill.wait_for(Kind::kCancel, placed->request_id, std::chrono::seconds(1)).has_value());
  EXPECT_TRUE(decode.wait_for(Kind::kKvComing, placed->request_id, std::chrono::seconds(1)).has_value());
  EXPECT_TRUE(decode.wait_for(Kind::kCancel, placed->request_id, std::chrono::seconds(1)).has_value());

  // 3. Streamed: its first token went out, its KV never reaches decode: the stream ends with the error
  // event and [DONE] (the fake decode instance never reports its own KV timeout either).
  prefill.answer_with(
      [](const InstanceMessage& order) {
        return prefill_reports(order, {Kind::kPrefillStart, Kind::kFirstToken});
      },
      std::chrono::milliseconds(0));
  const Streamed streamed = stream(port, "never handed off");
  EXPECT_EQ(streamed.status, 200);
  EXPECT_EQ(streamed.chunks, 1) << "the first token streamed: " << streamed.raw;
  EXPECT_EQ(streamed.error_code, "kv_handoff_timeout");
  EXPECT_TRUE(streamed.done);
  EXPECT_GE(streamed.seconds, kFloorS);
  EXPECT_LT(streamed.seconds, kFloorS + kLateS);
  placed = prefill.wait_for(Kind::kPrefill, 0, std::chrono::seconds(1), seen);
  ASSERT_TRUE(placed.has_value());
  EXPECT_TRUE(decode.wait_for(Kind::kCancel, placed->request_id, std::chrono::seconds(1)).has_value());

  seen.push_back(placed->request_id);

  // 4. Decoding, on a decode instance that stops stepping: its first decode token streams, then nothing:
  // the error event decode_timeout a floor after that token. Meanwhile two members try to put words in its
  // mouth: prefill-0 (the genuine member, in the wrong role) sends a decode step for it, and a stopped
  // incarnation of decode-0 (#0, replaced by #1) sends one too. Neither is heard: only "AB" streams.
  const auto tokens_for = [](uint64_t id, int64_t token) {
    InstanceMessage step;
    step.kind = Kind::kTokens;
    step.request_ids = {id};
    step.tokens = {token};
    return step;
  };
  prefill.answer_with(
      [&](const InstanceMessage& order) {
        auto out = prefill_reports(order, {Kind::kPrefillStart, Kind::kFirstToken, Kind::kPrefillDone});
        if (!out.empty()) out.push_back(tokens_for(order.request_id, 'P'));  // not_placed_here
        return out;
      },
      std::chrono::milliseconds(0));
  decode.answer_with(
      [&](const InstanceMessage& order) {
        std::vector<InstanceMessage> out;
        if (order.kind == Kind::kKvArrived) out.push_back(tokens_for(order.request_id, 'B'));
        return out;
      },
      std::chrono::milliseconds(0));
  std::thread stale([&] {
    auto arrived = decode.wait_for(Kind::kKvArrived, 0, std::chrono::seconds(5), seen);
    if (arrived) send_as(control, secret, "decode-0#0", tokens_for(arrived->request_id, 'S'));
  });
  const Streamed decoding = stream(port, "decode stops");
  stale.join();
  EXPECT_EQ(decoding.status, 200);
  EXPECT_EQ(decoding.text, "AB") << "the first token and the one decode step, nothing forged: "
                                 << decoding.raw;
  EXPECT_EQ(decoding.error_code, "decode_timeout") << decoding.raw;
  EXPECT_TRUE(decoding.done);
  EXPECT_GE(decoding.seconds, kFloorS);
  EXPECT_LT(decoding.seconds, kFloorS + kLateS);
  placed = prefill.wait_for(Kind::kPrefill, 0, std::chrono::seconds(1), seen);
  ASSERT_TRUE(placed.has_value());
  EXPECT_TRUE(decode.wait_for(Kind::kCancel, placed->request_id, std::chrono::seconds(1)).has_value());
  EXPECT_EQ(test::scrape_metric(port, "crescent_control_messages_dropped_total{reason=\"not_placed_here\"}"),
            1);
  EXPECT_EQ(
      test::scrape_metric(port, "crescent_control_messages_dropped_total{reason=\"stale_incarnation\"}"), 1);

  // Counted by reason; the instances, which heartbeat, stay up, and nothing is left in flight.
  for (const char* reason : {"queue_timeout", "prefill_timeout", "kv_handoff_timeout", "decode_timeout"}) {
    EXPECT_EQ(
        test::scrape_metric(port, fmt::format("crescent_requests_failed_total{{reason=\"{}\"}}", reason)), 1)
        << reason;
  }
  EXPECT_EQ(test::scrape_metric(port, "crescent_instances_up{role=\"prefill\"}"), 1);
  EXPECT_EQ(test::scrape_metric(port, "vllm:num_requests_running{model_name=\"mock\"}"), 0);
  EXPECT_TRUE(conductor->wait_for_line("failed at a stage deadline", std::chrono::seconds(1)).ok());
}

// The room a decode instance reserved for a request dropped before its KV arrived stays out of use while the
// request's prefill instance may still be writing there (stopped, then resumed before the drop reached it:
// the chaos run's KV-overwrite race, docs/serving.md): a real decode instance, a real Conductor, and a
// prefill member that starts every prompt and never finishes. Its first request is dropped at its prefill
// deadline, and the next one gets other room; once the prefill member says it writes no more of the first
// (kKvWritesEnded), the Conductor tells the decode instance (kRoomFree) and a third request reuses the room.
TEST(StageDeadlines, ADroppedRequestsRoomIsUsedAgainOnlyOnceItsPrefillInstanceWritesNoMoreThere) {
  test::TempDir dir("crescent-held-room");
  auto started = start_conductor(dir, 1.0);
  ASSERT_TRUE(started.has_value());
  const ClusterSecret& secret = started->secret;
  const std::string& secret_file = started->secret_file;
  const int port = started->port;
  const std::string& control = started->control;
  std::unique_ptr<ChildProcess>& conductor = started->process;
  auto decode = ChildProcess::start(
      {CRESCENT_BINARY, "serve", "decode", "--index", "0", "--config", started->config_file, "--conductor",
       control, "--transfer-metadata", "dir:" + dir.file("metadata"), "--cluster-secret-file", secret_file},
      dir.file("decode.log"));
  ASSERT_TRUE(decode.ok()) << decode.status().to_string();
  SilentInstance prefill(control, secret, serve::InstanceRole::kPrefill, 0);
  // Every prompt starts; a cancel is answered "I write no more there" only once `writes_ended` is set.
  std::atomic<bool> writes_ended{false};
  prefill.answer_with(
      [&](const InstanceMessage& order) {
        std::vector<InstanceMessage> out = prefill_reports(order, {Kind::kPrefillStart});
        if (order.kind == Kind::kCancel && writes_ended) {
          InstanceMessage ended;
          ended.kind = Kind::kKvWritesEnded;
          ended.request_id = order.request_id;
          out.push_back(ended);
        }
        return out;
      },
      std::chrono::milliseconds(0));
  ASSERT_TRUE(conductor->wait_for_line("conductor: decode-0 up", std::chrono::seconds(20)).ok())
      << conductor->log_tail();
  ASSERT_TRUE(conductor->wait_for_line("conductor: prefill-0 up", std::chrono::seconds(10)).ok());

  std::vector<uint64_t> seen;
  // Sends a prompt that times out in prefill; returns the room its decode instance reserved (kKvTarget).
  const auto dropped_room = [&](const std::string& prompt) -> std::optional<InstanceMessage> {
    const Reply reply = complete(port, prompt);
    EXPECT_EQ(reply.status, 503) << reply.body.dump();
    EXPECT_EQ(reply.body["error"]["code"], "prefill_timeout") << reply.body.dump();
    auto target = prefill.wait_for(Kind::kKvTarget, 0, std::chrono::seconds(2), seen);
    if (!target) return target;
    seen.push_back(target->request_id);
    // Its cancel reached the prefill member (answered as writes_ended said then).
    EXPECT_TRUE(prefill.wait_for(Kind::kCancel, target->request_id, std::chrono::seconds(2)).has_value());
    return target;
  };
  const std::string prompt(4000, 'p');  // a few blocks of room
  const auto first = dropped_room(prompt + "1");
  ASSERT_TRUE(first.has_value()) << (*decode)->log_tail();
  const auto second = dropped_room(prompt + "2");
  ASSERT_TRUE(second.has_value());
  const auto overlaps = [](const InstanceMessage& a, const InstanceMessage& b) {
    return a.offset_bytes < b.offset_bytes + b.length_bytes &&
           b.offset_bytes < a.offset_bytes + a.length_bytes;
  };
  EXPECT_FALSE(overlaps(*first, *second)) << "the first request's room was given to the second at "
                                          << second->offset_bytes << " while its prefill could still write";

  // From now on the prefill member answers a cancel "I write no more there": the third request's room is
  // freed with its drop (kRoomFree), and the fourth gets it; the first two stay held (nobody said so of
  // them).
  writes_ended = true;
  const auto third = dropped_room(prompt + "3");
  ASSERT_TRUE(third.has_value());
  EXPECT_FALSE(overlaps(*third, *first) || overlaps(*third, *second));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the Conductor relays it to decode
  const auto fourth = dropped_room(prompt + "4");
  ASSERT_TRUE(fourth.has_value());
  EXPECT_TRUE(overlaps(*fourth, *third))
      << "the third request's room, freed, was not used again: the fourth "
      << "got " << fourth->offset_bytes << ", the third had " << third->offset_bytes;
  EXPECT_FALSE(overlaps(*fourth, *first) || overlaps(*fourth, *second));
  (*decode)->stop(std::chrono::seconds(10));
  conductor->stop(std::chrono::seconds(10));
}

}  // namespace
}  // namespace crescent
