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
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "common/child_process.h"
#include "common/etcd_client.h"
#include "common/secret.h"
#include "serve/etcd_registry.h"
#include "test_support/etcd_server.h"
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

TEST(ServeRegistry, InstancesRegisterInEtcdAndOneWhoseLeaseLapsesLeavesTheConductorsView) {
  test::EtcdServer etcd;
  if (!etcd.skip_reason().empty()) GTEST_SKIP() << etcd.skip_reason();
  ASSERT_TRUE(etcd.error().empty()) << etcd.error();
  test::TempDir dir("crescent-registry");
  json config = json::parse(std::ifstream(CRESCENT_SOURCE_DIR "/configs/local.json"));
  config["prefill_instances"] = 1;
  config["decode_instances"] = 1;
  std::ofstream(dir.file("one.json")) << config.dump();
  const std::string prefix = "/registry-" + std::to_string(::getpid());

  // The members' secret, as an operator makes it once for all the roles.
  const std::string secret = dir.file("cluster-secret");
  ASSERT_TRUE(ClusterSecret::generate().write_to(secret).ok());
  auto master = ChildProcess::start(
      {CRESCENT_BINARY, "store", "master", "--listen", "127.0.0.1:0", "--metrics", "", "--transfer-metadata",
       "dir:" + dir.file("metadata"), "--cluster-secret-file", secret},
      dir.file("master.log"));
  ASSERT_TRUE(master.ok());
  auto master_line = (*master)->wait_for_line("store master on ", std::chrono::seconds(20));
  ASSERT_TRUE(master_line.ok()) << master_line.status().message();
  const size_t at = master_line->find("on ") + 3;
  const std::string master_address = master_line->substr(at, master_line->find(' ', at) - at);
  auto node = ChildProcess::start({CRESCENT_BINARY, "store", "node", "--master", master_address, "--dram",
                                   "64MiB", "--metrics", "", "--cluster-secret-file", secret},
                                  dir.file("node.log"));
  ASSERT_TRUE(node.ok());
  ASSERT_TRUE((*node)->wait_for_line("store node: segment", std::chrono::seconds(20)).ok());

  auto conductor =
      ChildProcess::start({CRESCENT_BINARY, "serve", "conductor", "--config", dir.file("one.json"), "--port",
                           "0", "--control", "tcp://127.0.0.1:0", "--etcd", etcd.endpoint(), "--etcd-prefix",
                           prefix, "--cluster-secret-file", secret},
                          dir.file("conductor.log"));
  ASSERT_TRUE(conductor.ok());
  auto line = (*conductor)->wait_for_line("conductor: model", std::chrono::seconds(20));
  ASSERT_TRUE(line.ok()) << line.status().message();
  std::smatch m;
  ASSERT_TRUE(std::regex_search(*line, m, std::regex(R"(http://127\.0\.0\.1:(\d+))")));
  const int port = std::stoi(m[1]);
  EXPECT_EQ(complete(port), 503) << "no instance is up yet";
  httplib::Client health_client("127.0.0.1", port);
  auto health = health_client.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 503);
  EXPECT_THAT(health->body, ::testing::HasSubstr("\"prefill_instances_up\":0"));

  // An instance as an operator starts it on its machine. No --conductor: found in etcd. A prefill instance
  // uses the pool; a decode instance only publishes its KV segment where the store's members look segments
  // up.
  const auto start_instance = [&](const std::string& role, int index) {
    std::vector<std::string> argv{CRESCENT_BINARY,
                                  "serve",
                                  role,
                                  "--index",
                                  std::to_string(index),
                                  "--config",
                                  dir.file("one.json"),
                                  "--etcd",
                                  etcd.endpoint(),
                                  "--etcd-prefix",
                                  prefix,
                                  "--cluster-secret-file",
                                  secret};
    if (role == "prefill") {
      argv.insert(argv.end(), {"--store-master", master_address});
    } else {
      argv.insert(argv.end(), {"--transfer-metadata", "dir:" + dir.file("metadata")});
    }
    auto instance = ChildProcess::start(argv, dir.file(fmt::format("{}-{}.log", role, index)));
    EXPECT_TRUE(instance.ok());
    if (!instance.ok()) return std::unique_ptr<ChildProcess>();
    EXPECT_TRUE((*instance)->wait_for_line("ready", std::chrono::seconds(30)).ok())
        << (*instance)->log_tail();
    return std::move(*instance);
  };
  std::vector<std::unique_ptr<ChildProcess>> instances;
  for (const char* role : {"prefill", "decode"}) {
    instances.push_back(start_instance(role, 0));
    ASSERT_NE(instances.back(), nullptr);
  }
  ASSERT_TRUE((*conductor)->wait_for_line("conductor: prefill-0 up", std::chrono::seconds(30)).ok());
  ASSERT_TRUE((*conductor)->wait_for_line("conductor: decode-0 up", std::chrono::seconds(30)).ok());
  EXPECT_EQ(complete(port), 200);
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
      (*conductor)->wait_for_line("prefill-0 down (its etcd lease lapsed)", std::chrono::seconds(30)).ok())
      << (*conductor)->log_tail();
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
  ASSERT_TRUE((*conductor)->wait_for_line("decode-0 down", std::chrono::seconds(30)).ok());
  EXPECT_EQ(complete(port), 503);

  // Issue 25 §1: an instance beyond the config's counts registers and joins the running cluster, and serves.
  auto joined = start_instance("decode", 5);
  ASSERT_NE(joined, nullptr);
  ASSERT_TRUE((*conductor)->wait_for_line("conductor: decode-5 joins", std::chrono::seconds(30)).ok())
      << (*conductor)->log_tail();
  ASSERT_TRUE((*conductor)->wait_for_line("conductor: decode-5 up", std::chrono::seconds(30)).ok())
      << (*conductor)->log_tail();
  EXPECT_EQ(complete(port), 200) << "decode-5 is the only decode instance";
  // SIGTERM: it drains (nothing here), deregisters and leaves with exit status 0.
  ASSERT_EQ(::kill(joined->pid(), SIGTERM), 0);
  ASSERT_TRUE((*conductor)->wait_for_line("decode-5 down", std::chrono::seconds(30)).ok());
  for (int i = 0; i < 500 && joined->running(); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  EXPECT_TRUE(joined->exited_cleanly()) << joined->log_tail();
  EXPECT_THAT(joined->log_tail(), ::testing::HasSubstr("decode-5: drained; stopping"));
  EXPECT_EQ(complete(port), 503);
}

}  // namespace
}  // namespace crescent
