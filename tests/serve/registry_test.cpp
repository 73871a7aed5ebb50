// The roles started alone, finding each other in etcd (issue 10 §2): `crescent serve conductor --etcd`
// publishes its control endpoint, `serve prefill|decode --etcd` find it there and register under a lease; an
// instance whose lease lapses leaves the Conductor's view (503: no instance) and comes back when it registers
// again.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <signal.h>

#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>

#include "common/child_process.h"
#include "common/etcd_client.h"
#include "common/secret.h"
#include "serve/etcd_registry.h"
#include "test_support/etcd_server.h"
#include "test_support/metrics.h"
#include "test_support/sse.h"
#include "test_support/temp_dir.h"

namespace crescent {
namespace {

using json = nlohmann::json;

int complete(int port) {
  httplib::Client client("127.0.0.1", port);
  client.set_read_timeout(20, 0);
  auto res =
      client.Post("/v1/completions", json{{"model", "mock"}, {"prompt", "hello"}, {"max_tokens", 3}}.dump(),
                  "application/json");
  return res ? res->status : 0;
}

// A completion as a client that honours 503's Retry-After sends it: again after a while, for up to 20 s.
// Returns the last status and body.
std::pair<int, json> complete_retrying(int port, const std::string& prompt) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  for (;;) {
    httplib::Client client("127.0.0.1", port);
    client.set_read_timeout(20, 0);
    auto res =
        client.Post("/v1/completions", json{{"model", "mock"}, {"prompt", prompt}, {"max_tokens", 1}}.dump(),
                    "application/json");
    const int status = res ? res->status : 0;
    if ((status != 503 && status != 0) || std::chrono::steady_clock::now() > deadline) {
      return {status, res ? json::parse(res->body, nullptr, false) : json()};
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

// A store (master and node), etcd's prefix and the members' secret of a cluster whose roles run alone and
// meet in etcd, with 1 prefill and 1 decode instance in its config; it starts Conductors and instances as an
// operator does on each machine.
class EtcdCluster {
 public:
  explicit EtcdCluster(const test::EtcdServer& etcd) : etcd_(etcd) {
    json config = json::parse(std::ifstream(CRESCENT_SOURCE_DIR "/configs/local.json"));
    config["prefill_instances"] = 1;
    config["decode_instances"] = 1;
    // A replay buffer this small holds little of an instance's past: a Conductor that starts later learns
    // the caches from the instances' full reports.
    config["serve"]["kv_event_buffer_batches"] = 2;
    std::ofstream(dir_.file("one.json")) << config.dump();
    // The members' secret, as an operator makes it once for all the roles.
    EXPECT_TRUE(ClusterSecret::generate().write_to(secret()).ok());
    auto master = ChildProcess::start(
        {CRESCENT_BINARY, "store", "master", "--listen", "127.0.0.1:0", "--metrics", "", "--etcd",
         etcd_.endpoint(), "--etcd-prefix", store_prefix_, "--cluster-secret-file", secret()},
        dir_.file("master.log"));
    EXPECT_TRUE(master.ok());
    if (!master.ok()) return;
    master_ = std::move(*master);
    auto master_line = master_->wait_for_line("store master on ", std::chrono::seconds(20));
    EXPECT_TRUE(master_line.ok()) << master_line.status().message();
    if (!master_line.ok()) return;
    EXPECT_TRUE(master_->wait_for_line("store master: leading", std::chrono::seconds(20)).ok());
    const size_t at = master_line->find("on ") + 3;
    master_address_ = master_line->substr(at, master_line->find(' ', at) - at);
    // Everything found in etcd: the leading master, and the transfer metadata (the master's default there).
    auto node = ChildProcess::start(
        {CRESCENT_BINARY, "store", "node", "--etcd", etcd_.endpoint(), "--etcd-prefix", store_prefix_,
         "--dram", "64MiB", "--metrics", "", "--cluster-secret-file", secret()},
        dir_.file("node.log"));
    EXPECT_TRUE(node.ok());
    if (!node.ok()) return;
    node_ = std::move(*node);
    EXPECT_TRUE(node_->wait_for_line("store node: segment", std::chrono::seconds(20)).ok());
  }
  bool ok() const { return node_ != nullptr && !master_address_.empty(); }
  std::string secret() const { return dir_.file("cluster-secret"); }
  std::string file(const std::string& name) const { return dir_.file(name); }

  /// `crescent serve conductor --etcd` (log NAME.log) and its HTTP port (0 when it did not start).
  std::pair<std::unique_ptr<ChildProcess>, int> start_conductor(const std::string& name,
                                                                std::vector<std::string> extra = {}) {
    std::vector<std::string> argv{CRESCENT_BINARY,
                                  "serve",
                                  "conductor",
                                  "--config",
                                  dir_.file("one.json"),
                                  "--port",
                                  "0",
                                  "--control",
                                  "tcp://127.0.0.1:0",
                                  "--etcd",
                                  etcd_.endpoint(),
                                  "--etcd-prefix",
                                  prefix_,
                                  "--cluster-secret-file",
                                  secret()};
    argv.insert(argv.end(), extra.begin(), extra.end());
    auto conductor = ChildProcess::start(argv, dir_.file(name + ".log"));
    EXPECT_TRUE(conductor.ok());
    if (!conductor.ok()) return {};
    auto line = (*conductor)->wait_for_line("conductor: model", std::chrono::seconds(20));
    EXPECT_TRUE(line.ok()) << line.status().message();
    std::smatch m;
    if (!line.ok() || !std::regex_search(*line, m, std::regex(R"(http://127\.0\.0\.1:(\d+))"))) return {};
    return {std::move(*conductor), std::stoi(m[1])};
  }

  /// `crescent serve ROLE --index INDEX --etcd` as an operator starts it on its machine, once ready. No
  /// --conductor: found in etcd. A prefill instance uses the pool; a decode instance only publishes its KV
  /// segment where the store's members look segments up.
  std::unique_ptr<ChildProcess> start_instance(const std::string& role, int index) {
    std::vector<std::string> argv{CRESCENT_BINARY,
                                  "serve",
                                  role,
                                  "--index",
                                  std::to_string(index),
                                  "--config",
                                  dir_.file("one.json"),
                                  "--etcd",
                                  etcd_.endpoint(),
                                  "--etcd-prefix",
                                  prefix_,
                                  "--cluster-secret-file",
                                  secret()};
    // No --store-master: a prefill instance finds the leading store master in etcd too.
    if (role == "prefill") argv.insert(argv.end(), {"--store-etcd-prefix", store_prefix_});
    auto instance = ChildProcess::start(argv, dir_.file(fmt::format("{}-{}.log", role, index)));
    EXPECT_TRUE(instance.ok());
    if (!instance.ok()) return nullptr;
    EXPECT_TRUE((*instance)->wait_for_line("ready", std::chrono::seconds(30)).ok())
        << (*instance)->log_tail();
    return std::move(*instance);
  }
  const std::string& prefix() const { return prefix_; }

 private:
  const test::EtcdServer& etcd_;
  test::TempDir dir_{"crescent-registry"};
  const std::string prefix_ = "/registry-" + std::to_string(::getpid());
  const std::string store_prefix_ = prefix_ + "-store";
  std::unique_ptr<ChildProcess> master_, node_;
  std::string master_address_;
};

TEST(ServeRegistry, InstancesRegisterInEtcdAndOneWhoseLeaseLapsesLeavesTheConductorsView) {
  test::EtcdServer etcd;
  if (!etcd.skip_reason().empty()) GTEST_SKIP() << etcd.skip_reason();
  ASSERT_TRUE(etcd.error().empty()) << etcd.error();
  EtcdCluster cluster(etcd);
  ASSERT_TRUE(cluster.ok());
  const std::string& prefix = cluster.prefix();
  auto [conductor, port] = cluster.start_conductor("conductor");
  ASSERT_GT(port, 0);
  EXPECT_EQ(complete(port), 503) << "no instance is up yet";
  httplib::Client health_client("127.0.0.1", port);
  auto health = health_client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_THAT(health->body, ::testing::HasSubstr("\"prefill_instances_up\":0"));

  std::vector<std::unique_ptr<ChildProcess>> instances;
  for (const char* role : {"prefill", "decode"}) {
    instances.push_back(cluster.start_instance(role, 0));
    ASSERT_NE(instances.back(), nullptr);
  }
  ASSERT_TRUE(conductor->wait_for_line("conductor: prefill-0 up", std::chrono::seconds(30)).ok());
  ASSERT_TRUE(conductor->wait_for_line("conductor: decode-0 up", std::chrono::seconds(30)).ok());
  // Just elected, the Conductor holds requests (503, Retry-After) until it knows prefill-0's cache.
  EXPECT_EQ(complete_retrying(port, "hello").first, 200);
  health = health_client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200) << health->body;

  // Revoke prefill-0's lease behind its back: its key goes, so the Conductor takes it out of its view,
  // although its reports keep coming; then the instance's keepalive finds the lease gone and registers again.
  auto client = EtcdClient::create(etcd.endpoint(), std::chrono::seconds(2)).value();
  auto key = client.get(serve::etcd_instance_key(prefix, "prefill-0"));
  ASSERT_TRUE(key.ok() && key->has_value());
  ASSERT_TRUE(client.revoke_lease((*key)->lease).ok());
  ASSERT_TRUE(
      conductor->wait_for_line("prefill-0 down (its etcd lease lapsed)", std::chrono::seconds(30)).ok())
      << conductor->log_tail();
  // Deadlines are generous (a sanitized build is several times slower): the test waits on conditions.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  int status = 0;
  while ((status = complete(port)) != 200 && std::chrono::steady_clock::now() < deadline) {
    EXPECT_EQ(status, 503);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  EXPECT_EQ(status, 200) << "prefill-0 registered again";
  auto again = client.get(serve::etcd_instance_key(prefix, "prefill-0"));
  ASSERT_TRUE(again.ok() && again->has_value());
  EXPECT_NE((*again)->lease, (*key)->lease);

  // A stopped instance revokes its lease: it leaves the view at once, not after a heartbeat timeout.
  instances[1]->stop();
  ASSERT_TRUE(conductor->wait_for_line("decode-0 down", std::chrono::seconds(30)).ok());
  EXPECT_EQ(complete(port), 503);

  // Issue 25 §1: an instance beyond the config's counts registers and joins the running cluster, and serves.
  auto joined = cluster.start_instance("decode", 5);
  ASSERT_NE(joined, nullptr);
  ASSERT_TRUE(conductor->wait_for_line("conductor: decode-5 joins", std::chrono::seconds(30)).ok())
      << conductor->log_tail();
  ASSERT_TRUE(conductor->wait_for_line("conductor: decode-5 up", std::chrono::seconds(30)).ok())
      << conductor->log_tail();
  EXPECT_EQ(complete_retrying(port, "hello").first, 200) << "decode-5 is the only decode instance";
  // SIGTERM: it drains (nothing here), deregisters and leaves with exit status 0.
  ASSERT_EQ(::kill(joined->pid(), SIGTERM), 0);
  ASSERT_TRUE(conductor->wait_for_line("decode-5 down", std::chrono::seconds(30)).ok());
  for (int i = 0; i < 500 && joined->running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(joined->exited_cleanly()) << joined->log_tail();
  EXPECT_THAT(joined->log_tail(), ::testing::HasSubstr("decode-5: drained; stopping"));
  EXPECT_EQ(complete(port), 503);
}

// Issue 25 §3: two Conductors campaign in etcd; one leads, and the standby answers 503 with Retry-After. The
// leader is killed: the standby leads within leader_ttl + 1 s, the instances follow it there, the stream
// whose connection was to the dead leader ends for its client, and its work on the instances is dropped
// (nothing stays reserved). The new leader learned the prefill instance's whole cache before placing: the
// prompts sent before are placed knowing their prefix (the Conductor's prefix tokens), as before the
// failover.
TEST(ServeRegistry, AStandbyConductorLeadsWhenTheLeaderDiesAndKnowsTheCachesAtOnce) {
  test::EtcdServer etcd;
  if (!etcd.skip_reason().empty()) GTEST_SKIP() << etcd.skip_reason();
  ASSERT_TRUE(etcd.error().empty()) << etcd.error();
  EtcdCluster cluster(etcd);
  ASSERT_TRUE(cluster.ok());
  auto [leader, leader_port] = cluster.start_conductor("conductor-a", {"--leader-ttl-s", "1"});
  ASSERT_GT(leader_port, 0);
  ASSERT_TRUE(leader->wait_for_line("conductor: leading", std::chrono::seconds(10)).ok())
      << leader->log_tail();
  auto [standby, standby_port] = cluster.start_conductor("conductor-b", {"--leader-ttl-s", "1"});
  ASSERT_GT(standby_port, 0);
  std::vector<std::unique_ptr<ChildProcess>> instances;
  for (const char* role : {"prefill", "decode"}) {
    instances.push_back(cluster.start_instance(role, 0));
    ASSERT_NE(instances.back(), nullptr);
  }
  ASSERT_TRUE(leader->wait_for_line("conductor: prefill-0 up", std::chrono::seconds(30)).ok());
  ASSERT_TRUE(leader->wait_for_line("conductor: decode-0 up", std::chrono::seconds(30)).ok());
  // The standby forwards to the leader: answers, /health, and streams come from there.
  EXPECT_EQ(complete_retrying(standby_port, "through the standby").first, 200);
  EXPECT_EQ(httplib::Client("127.0.0.1", standby_port).Get("/health")->status, 200);
  EXPECT_THAT(standby->log_tail(), ::testing::Not(::testing::HasSubstr("conductor: leading")))
      << "one leader at a time";

  constexpr int kPrompts = 6;
  const auto prompt = [](int i) { return std::string(2048, static_cast<char>('a' + i)); };  // 4 blocks each
  for (int i = 0; i < kPrompts; ++i) ASSERT_EQ(complete_retrying(leader_port, prompt(i)).first, 200);
  // The prefill instance found the pool's master in etcd: its prompts' blocks were written there.
  double pool_written = 0;
  for (int i = 0; i < 100 && pool_written <= 0; ++i) {
    pool_written = test::scrape_metric(leader_port, R"(crescent_kv_bytes_moved_total{path="pool_write"})");
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_GT(pool_written, 0);

  // Streams of 300 tokens (~5 s): one to the leader, one through the standby.
  test::StreamedCompletion direct, forwarded;
  const auto open_stream = [](int port, test::StreamedCompletion& out) {
    return std::thread([port, &out] {
      httplib::Client client("127.0.0.1", port);
      client.set_read_timeout(20, 0);
      test::stream_completion(client, "/v1/completions",
                              {{"model", "mock"}, {"prompt", "long"}, {"max_tokens", 300}, {"stream", true}},
                              out);
    });
  };
  std::thread direct_thread = open_stream(leader_port, direct);
  std::thread forwarded_thread = open_stream(standby_port, forwarded);
  for (int i = 0; i < 1000 && (direct.live_tokens < 5 || forwarded.live_tokens < 5); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_GE(direct.live_tokens, 5);
  ASSERT_GE(forwarded.live_tokens, 5) << "a stream relayed through the standby";
  leader->kill();
  const auto killed = std::chrono::steady_clock::now();
  ASSERT_TRUE(standby->wait_for_line("conductor: leading", std::chrono::seconds(10)).ok())
      << standby->log_tail();
  const auto took = std::chrono::steady_clock::now() - killed;
  std::cout << "the standby led " << std::chrono::duration<double>(took).count()
            << " s after the leader's SIGKILL\n";
  // leader_ttl + 1 s, with room for a loaded machine (the log is polled every 10 ms).
  EXPECT_LT(took, std::chrono::seconds(3));
  direct_thread.join();
  forwarded_thread.join();
  EXPECT_FALSE(direct.done) << "its connection was to the dead leader: it closed";
  EXPECT_LT(direct.live_tokens, 300);
  EXPECT_LT(direct.end - killed, std::chrono::seconds(1));
  EXPECT_TRUE(forwarded.done) << "the standby ends the relayed stream cleanly";
  EXPECT_THAT(forwarded.error, ::testing::HasSubstr("leading Conductor's stream ended"));
  EXPECT_LT(forwarded.live_tokens, 300);

  ASSERT_TRUE(standby->wait_for_line("conductor: prefill-0 up", std::chrono::seconds(10)).ok())
      << standby->log_tail();
  ASSERT_TRUE(standby->wait_for_line("conductor: decode-0 up", std::chrono::seconds(10)).ok());
  for (const auto& instance : instances) {
    EXPECT_THAT(instance->log_tail(), ::testing::HasSubstr("following the Conductor at"));
  }
  for (int i = 0; i < kPrompts; ++i) {
    const auto [status, body] = complete_retrying(standby_port, prompt(i) + " again");
    ASSERT_EQ(status, 200) << body.dump();
    EXPECT_EQ(body["usage"]["prompt_tokens_details"]["cached_tokens"], 2048) << i;
  }
  EXPECT_EQ(test::scrape_metric(standby_port, R"(crescent_prefix_tokens_total{source="local"})"),
            kPrompts * 2048)
      << "placed knowing where every prefix is";
  // The dead leader's stream left nothing on the decode instance (the new leader reset it).
  double reserved = -1;
  for (int i = 0;
       i < 100 && (reserved = test::scrape_metric(standby_port, "crescent_decode_kv_reserved_tokens")) != 0;
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_EQ(reserved, 0);
}

}  // namespace
}  // namespace crescent
