// Master failover through a real etcd (issue 9 section 4): two `crescent store master` processes campaign, a
// `crescent store node` process follows the leader, the leader is SIGKILLed, a standby leads within
// leader_ttl + 1 s, the node re-mounts with its index, and every object is readable again with its bytes.
#include <gtest/gtest.h>

#include <thread>

#include "common/child_process.h"
#include "store/client.h"
#include "store/leader_election.h"
#include "store_cluster.h"
#include "test_support/etcd_server.h"

namespace crescent::store {
namespace {

using std::chrono::milliseconds;
using test::pattern_bytes;

TEST(StoreFailover, AStandbyLeadsAfterTheLeaderIsKilledAndTheObjectsAreReadableAgain) {
  crescent::test::EtcdServer etcd;
  if (!etcd.skip_reason().empty()) GTEST_SKIP() << etcd.skip_reason();
  ASSERT_TRUE(etcd.error().empty()) << etcd.error();
  crescent::test::TempDir dir("crescent-failover");
  const std::string prefix = "/failover-" + std::to_string(::getpid());
  EtcdStoreOptions etcd_options{etcd.endpoint(), prefix, std::chrono::seconds(1), milliseconds(1000)};
  const ClusterSecret secret = ClusterSecret::generate();
  const std::string secret_file = dir.file("cluster-secret");
  ASSERT_TRUE(secret.write_to(secret_file).ok());

  auto start_master = [&](const std::string& name) {
    auto master =
        ChildProcess::start({CRESCENT_BINARY, "store", "master", "--listen", "127.0.0.1:0", "--metrics", "",
                             "--etcd", etcd.endpoint(), "--etcd-prefix", prefix, "--leader-ttl-s", "1",
                             "--segment-ttl-ms", "3000", "--cluster-secret-file", secret_file},
                            dir.file(name + ".log"));
    EXPECT_TRUE(master.ok()) << master.status().to_string();
    return master.ok() ? std::move(*master) : nullptr;
  };
  auto address_of = [](ChildProcess& p) {
    auto line = p.wait_for_line("store master on ", std::chrono::seconds(20));
    if (!line.ok()) return std::string();
    const size_t at = line->find("on ") + 3;
    return line->substr(at, line->find(' ', at) - at);
  };
  std::unique_ptr<ChildProcess> masters[] = {start_master("a"), nullptr};
  ASSERT_TRUE(masters[0]);
  ASSERT_TRUE(masters[0]->wait_for_line("store master: leading", std::chrono::seconds(10)).ok())
      << masters[0]->log_tail();
  masters[1] = start_master("b");
  ASSERT_TRUE(masters[1]);
  const std::string first = address_of(*masters[0]);
  const std::string second = address_of(*masters[1]);
  ASSERT_FALSE(first.empty());
  ASSERT_FALSE(second.empty());
  Result<std::string> leader = find_leader(etcd_options);
  ASSERT_TRUE(leader.ok()) << leader.status().to_string();
  EXPECT_EQ(*leader, first);

  auto node =
      ChildProcess::start({CRESCENT_BINARY, "store", "node", "--etcd", etcd.endpoint(), "--etcd-prefix",
                           prefix, "--dram", "16MiB", "--name", "failover-node-" + std::to_string(::getpid()),
                           "--metrics", "", "--transports", "tcp", "--cluster-secret-file", secret_file},
                          dir.file("node.log"));
  ASSERT_TRUE(node.ok());
  ASSERT_TRUE((*node)->wait_for_line("store node: segment", std::chrono::seconds(20)).ok())
      << (*node)->log_tail();
  ClientOptions client_options;
  client_options.master.etcd = etcd_options;
  client_options.master.secret = secret;
  client_options.transports = {transfer::TransportKind::kTcp};
  auto client = Client::create(client_options);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  std::vector<std::vector<std::byte>> values;
  for (int i = 0; i < 10; ++i) {
    values.push_back(pattern_bytes(20000 + static_cast<uint64_t>(i), static_cast<uint64_t>(i) + 1));
    ConstBuffer in{values.back().data(), values.back().size()};
    ASSERT_TRUE((*client)->put("ha-" + std::to_string(i), {&in, 1}).ok());
  }
  std::this_thread::sleep_for(milliseconds(500));  // the node's index follows the master's feed every 100 ms

  masters[0]->kill();
  const auto killed = std::chrono::steady_clock::now();
  std::string now_leading;
  while (std::chrono::steady_clock::now() - killed < std::chrono::seconds(5)) {
    Result<std::string> l = find_leader(etcd_options);
    if (l.ok() && *l != first) {
      now_leading = *l;
      break;
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  const auto took = std::chrono::steady_clock::now() - killed;
  ASSERT_EQ(now_leading, second) << masters[1]->log_tail();
  EXPECT_LT(took, std::chrono::seconds(2)) << "leader_ttl 1 s + 1 s";

  // Reads wait out the node's re-mount (the client follows the leader; the node re-mounts with its index).
  for (int i = 0; i < 10; ++i) {
    std::vector<std::byte> out(values[i].size());
    Buffer o{out.data(), out.size()};
    Result<uint64_t> got = Status::internal("not read");
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    do {
      got = (*client)->get("ha-" + std::to_string(i), {&o, 1});
      if (got.ok()) break;
      std::this_thread::sleep_for(milliseconds(50));
    } while (std::chrono::steady_clock::now() < deadline);
    ASSERT_TRUE(got.ok()) << i << ": " << got.status().to_string() << "\n" << (*node)->log_tail();
    EXPECT_EQ(out, values[i]) << i;
  }
  auto stats = (*client)->master().stats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->stats.objects_restored, 10u);
  EXPECT_EQ((*client)->master().address(), second);
}

}  // namespace
}  // namespace crescent::store
