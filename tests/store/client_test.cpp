#include "store/client.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <thread>

#include "store/control_rpc.h"
#include "store/master_client.h"
#include "store_cluster.h"

namespace crescent::store {
namespace {

using std::chrono::milliseconds;
using test::pattern_bytes;
using test::StoreCluster;

ConstBuffer cview(const std::vector<std::byte>& v) {
  return {v.data(), v.size()};
}
Buffer view(std::vector<std::byte>& v) {
  return {v.data(), v.size()};
}

/// A node with 1 MiB of DRAM and a 64 MiB SSD tier in the cluster's directory.
StorageNodeOptions ssd_node_options(StoreCluster& cluster, milliseconds sync_interval) {
  StorageNodeOptions options = cluster.node_options(1 << 20);
  options.ssd_dir = cluster.dir() + "/ssd";
  options.ssd_capacity_bytes = 64 << 20;
  options.sync_interval = sync_interval;
  return options;
}

/// Puts `count` values of 64 KiB as PREFIX-0.. (pattern seeds from `seed`) and returns them; fails the test
/// at the first put that fails (check HasFailure()).
std::vector<std::vector<std::byte>> put_64k_values(Client& client, const std::string& prefix, int count,
                                                   uint64_t seed) {
  std::vector<std::vector<std::byte>> values;
  for (int i = 0; i < count; ++i) {
    values.push_back(pattern_bytes(64 << 10, static_cast<uint64_t>(i) + seed));
    ConstBuffer in = cview(values.back());
    Status put = client.put(prefix + std::to_string(i), {&in, 1});
    if (!put.ok()) {
      ADD_FAILURE() << prefix << i << ": " << put.to_string();
      break;
    }
  }
  return values;
}

TEST(StoreClient, PutThenGetReturnsTheSameBytesFromEveryReplica) {
  StoreCluster cluster(2);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto client = Client::create(cluster.client_options());
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  for (uint64_t size : {1ull, 63ull, 4096ull, 512ull << 10, 3ull << 20}) {
    const std::string key = "value-" + std::to_string(size);
    std::vector<std::byte> value = pattern_bytes(size, size);
    ConstBuffer in = cview(value);
    ASSERT_TRUE((*client)->put(key, {&in, 1}, {.replica_num = 2}).ok()) << size;
    std::vector<std::byte> out(size + 10);
    Buffer o = view(out);
    Result<uint64_t> got = (*client)->get(key, {&o, 1});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(*got, size);
    EXPECT_TRUE(std::equal(value.begin(), value.end(), out.begin())) << size;
  }
  // Scatter and gather: a value written from two buffers, read into three.
  std::vector<std::byte> a = pattern_bytes(1000, 1), b = pattern_bytes(3000, 2);
  ConstBuffer parts[] = {cview(a), cview(b)};
  ASSERT_TRUE((*client)->put("two-parts", parts).ok());
  std::vector<std::byte> x(10), y(2000), z(5000);
  Buffer outs[] = {view(x), view(y), view(z)};
  ASSERT_EQ((*client)->get("two-parts", outs).value(), 4000u);
  std::vector<std::byte> joined;
  for (auto* v : {&x, &y}) joined.insert(joined.end(), v->begin(), v->end());
  joined.insert(joined.end(), z.begin(), z.begin() + 1990);
  std::vector<std::byte> expected = a;
  expected.insert(expected.end(), b.begin(), b.end());
  EXPECT_EQ(joined, expected);
}

TEST(StoreClient, ErrorsAreTheStoreErrors) {
  StoreCluster cluster(2, 1 << 20);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto client = Client::create(cluster.client_options());
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  Client& c = **client;
  std::vector<std::byte> value = pattern_bytes(100, 1), out(100), small(10);
  ConstBuffer in = cview(value);
  Buffer o = view(out), s = view(small);
  EXPECT_EQ(c.get("missing", {&o, 1}).status().code(), StatusCode::kNotFound);
  ASSERT_TRUE(c.put("k", {&in, 1}).ok());
  EXPECT_EQ(c.put("k", {&in, 1}).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(c.get("k", {&s, 1}).status().code(), StatusCode::kInvalidArgument);  // buffer too small
  EXPECT_EQ(c.put("", {&in, 1}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(c.put(std::string(2000, 'k'), {&in, 1}).code(), StatusCode::kInvalidArgument);
  ConstBuffer empty{value.data(), 0};
  EXPECT_EQ(c.put("empty", {&empty, 1}).code(), StatusCode::kInvalidArgument);
  std::vector<std::byte> huge(2 << 20);
  ConstBuffer h = cview(huge);
  Status too_big = c.put("huge", {&h, 1});
  EXPECT_EQ(too_big.code(), StatusCode::kInvalidArgument) << too_big.to_string();
  Status too_many = c.put("r3", {&in, 1}, {.replica_num = 3});
  EXPECT_EQ(too_many.code(), StatusCode::kInvalidArgument) << too_many.to_string();
  EXPECT_TRUE(c.exists("k").value());
  EXPECT_FALSE(c.exists("huge").value());  // nothing half-written
  EXPECT_FALSE(c.exists("r3").value());
  // The failed get above still took a read lease: remove waits for it.
  EXPECT_EQ(c.remove("k").code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(c.put("k2", {&in, 1}).ok());
  EXPECT_TRUE(c.remove("k2").ok());
  EXPECT_EQ(c.remove("k2").code(), StatusCode::kNotFound);
  EXPECT_EQ(c.remove_all().value(), 0u);  // k is leased
  uint64_t used = 0;
  for (const SegmentInfo& seg : cluster.master().master().segments()) used += seg.used_bytes;
  EXPECT_EQ(used, 128u);  // k alone (100 bytes, aligned to 128)
}

TEST(StoreClient, UnknownMasterIsUnavailableWithinTheRetryBudget) {
  ClientOptions options;
  options.master.address = "127.0.0.1:1";  // nothing listens on port 1
  options.master.max_attempts = 2;
  options.master.initial_backoff = milliseconds(10);
  const auto start = std::chrono::steady_clock::now();
  auto client = Client::create(options);
  ASSERT_FALSE(client.ok());
  EXPECT_EQ(client.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(client.status().message().find("127.0.0.1:1"), std::string::npos) << client.status().to_string();
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
}

TEST(StoreClient, BatchCallsAnswerPerKey) {
  StoreCluster cluster(2);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto client = Client::create(cluster.client_options());
  ASSERT_TRUE(client.ok());
  Client& c = **client;
  std::vector<std::vector<std::byte>> values;
  std::vector<std::string> names;
  for (int i = 0; i < 16; ++i) {
    values.push_back(pattern_bytes(1000 + static_cast<uint64_t>(i) * 100, static_cast<uint64_t>(i)));
    names.push_back("batch-" + std::to_string(i));
  }
  std::vector<std::string_view> keys(names.begin(), names.end());
  std::vector<ConstBuffer> in;
  for (auto& v : values) in.push_back(cview(v));
  auto put = c.batch_put(keys, in, {.replica_num = 2});
  ASSERT_TRUE(put.ok());
  for (const Status& s : *put) EXPECT_TRUE(s.ok()) << s.to_string();
  auto again = c.batch_put(std::span(keys).first(2), std::span(in).first(2));
  ASSERT_TRUE(again.ok());
  EXPECT_EQ((*again)[0].code(), StatusCode::kAlreadyExists);

  std::vector<std::string_view> read_keys = keys;
  read_keys.push_back("absent");
  std::vector<std::vector<std::byte>> outs(read_keys.size(), std::vector<std::byte>(4000));
  std::vector<Buffer> out;
  for (auto& o : outs) out.push_back(view(o));
  auto got = c.batch_get(read_keys, out);
  ASSERT_TRUE(got.ok());
  for (size_t i = 0; i < values.size(); ++i) {
    ASSERT_TRUE((*got)[i].ok()) << (*got)[i].status().to_string();
    ASSERT_EQ(*(*got)[i], values[i].size());
    EXPECT_TRUE(std::equal(values[i].begin(), values[i].end(), outs[i].begin())) << i;
  }
  EXPECT_EQ((*got)[16].status().code(), StatusCode::kNotFound);
  auto exists = c.batch_exists(read_keys);
  ASSERT_TRUE(exists.ok());
  EXPECT_TRUE((*exists)[0]);
  EXPECT_FALSE((*exists)[16]);
}

TEST(StoreClient, KvBlocksPutAndLongestPrefixRead) {
  StoreCluster cluster(2);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto client = Client::create(cluster.client_options());
  ASSERT_TRUE(client.ok());
  constexpr uint64_t kBlock = 64 << 10;
  std::vector<BlockKey> keys = {11, 22, 33, 44, 55};
  std::vector<std::vector<std::byte>> blocks;
  std::vector<ConstBuffer> in;
  for (BlockKey k : keys) blocks.push_back(pattern_bytes(kBlock, k));
  for (auto& b : blocks) in.push_back(cview(b));
  // Store blocks 0, 1, 2 and 4: the prefix ends at the missing block 3.
  std::vector<BlockKey> stored = {11, 22, 33, 55};
  std::vector<ConstBuffer> stored_in = {in[0], in[1], in[2], in[4]};
  auto put = (*client)->put_blocks(stored, stored_in);
  ASSERT_TRUE(put.ok());
  auto again = (*client)->put_blocks(std::span(stored).first(1), std::span(stored_in).first(1));
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE((*again)[0].ok());  // already stored counts as success
  std::vector<std::vector<std::byte>> outs(keys.size(), std::vector<std::byte>(kBlock));
  std::vector<Buffer> out;
  for (auto& o : outs) out.push_back(view(o));
  auto read = (*client)->get_prefix(keys, out);
  ASSERT_TRUE(read.ok()) << read.status().to_string();
  EXPECT_EQ(*read, 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(outs[i], blocks[i]) << i;
  EXPECT_EQ(outs[4], std::vector<std::byte>(kBlock));  // past the prefix: untouched
  EXPECT_EQ((*client)->block_key(0xab), "kv/00000000000000ab");
}

/// Every read path with a lease that runs out between the bytes arriving and the check: each fails with
/// kLeaseExpired; the same reads without the delay succeed.
TEST(StoreClient, ReadsFinishedAfterTheLeaseFailOnEveryPath) {
  MasterServerOptions master;
  master.master.lease_ttl = milliseconds(200);
  StoreCluster cluster(1, 16 << 20, master);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  for (auto transport : {transfer::TransportKind::kShm, transfer::TransportKind::kTcp}) {
    SCOPED_TRACE(std::string(transfer::transport_name(transport)));
    bool delay = false;
    ClientOptions options = cluster.client_options();
    options.transports = {transport};
    options.before_lease_check_for_testing = [&delay](std::string_view) {
      if (delay) std::this_thread::sleep_for(milliseconds(250));
    };
    for (bool registered : {false, true}) {
      SCOPED_TRACE(registered ? "registered buffers" : "staged buffers");
      auto client = Client::create(options);
      ASSERT_TRUE(client.ok()) << client.status().to_string();
      Client& c = **client;
      const std::string prefix =
          std::string(transfer::transport_name(transport)) + (registered ? "-r-" : "-s-");
      std::vector<std::byte> value = pattern_bytes(8192, 5);
      ConstBuffer in = cview(value);
      ASSERT_TRUE(c.put(prefix + "k", {&in, 1}).ok());
      std::vector<BlockKey> block = {registered ? 7u : 8u,
                                     transport == transfer::TransportKind::kShm ? 1u : 2u};
      std::vector<ConstBuffer> blocks = {in, in};
      ASSERT_TRUE(c.put_blocks(block, blocks).ok());
      std::vector<std::byte> out(8192), out2(8192);
      if (registered) {
        ASSERT_TRUE(c.register_buffer(out.data(), out.size()).ok());
        ASSERT_TRUE(c.register_buffer(out2.data(), out2.size()).ok());
      }
      Buffer o = view(out), o2 = view(out2);
      std::string key = prefix + "k";
      std::string_view keys[] = {key};
      Buffer prefix_out[] = {o, o2};
      for (bool late : {false, true}) {
        delay = late;
        Result<uint64_t> single = c.get(key, {&o, 1});
        auto batch = c.batch_get(keys, {&o, 1});
        auto prefix_read = c.get_prefix(block, prefix_out);
        ASSERT_TRUE(batch.ok());
        ASSERT_TRUE(prefix_read.ok());
        if (late) {
          EXPECT_EQ(single.status().code(), StatusCode::kLeaseExpired) << single.status().to_string();
          EXPECT_EQ((*batch)[0].status().code(), StatusCode::kLeaseExpired);
          EXPECT_EQ(*prefix_read, 0u);
        } else {
          EXPECT_TRUE(single.ok()) << single.status().to_string();
          EXPECT_TRUE((*batch)[0].ok());
          EXPECT_EQ(*prefix_read, 2u);
          EXPECT_EQ(out, value);
        }
      }
      EXPECT_EQ(c.stats().leases_expired, 4u);  // get, batch_get, and get_prefix's two blocks
      if (registered) {
        EXPECT_EQ(c.stats().staged_bytes, 8192u * 3);  // only the puts were staged
        ASSERT_TRUE(c.unregister_buffer(out.data()).ok());
        ASSERT_TRUE(c.unregister_buffer(out2.data()).ok());
      }
    }
  }
}

TEST(StoreClient, ARestartedMasterIsRebuiltFromTheNodesAndTheBytesAreReadAgain) {
  StoreCluster cluster(2);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto client = Client::create(cluster.client_options());
  ASSERT_TRUE(client.ok());
  std::vector<std::vector<std::byte>> values;
  for (int i = 0; i < 10; ++i) {
    values.push_back(pattern_bytes(5000 + static_cast<uint64_t>(i), static_cast<uint64_t>(i) + 100));
    ConstBuffer in = cview(values.back());
    ASSERT_TRUE((*client)
                    ->put("survivor-" + std::to_string(i), {&in, 1},
                          {.replica_num = 1u + static_cast<uint32_t>(i % 2)})
                    .ok());
  }
  // The nodes learn what they hold from the master's feed (every 100 ms).
  auto indexed = [&] {
    uint64_t n = 0;
    for (auto& node : cluster.nodes()) n += node->indexed_objects();
    return n;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (indexed() < 15 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(milliseconds(20));
  ASSERT_EQ(indexed(), 15u);  // 5 objects with 1 replica, 5 with 2
  ASSERT_TRUE(cluster.restart_master().ok());
  EXPECT_EQ(cluster.master().master().stats().objects, 0u);
  const auto rebuilt_by = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (cluster.master().master().stats().objects < 10 && std::chrono::steady_clock::now() < rebuilt_by) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_EQ(cluster.master().master().stats().objects_restored, 15u);
  for (int i = 0; i < 10; ++i) {
    std::vector<std::byte> out(values[i].size());
    Buffer o = view(out);
    Result<uint64_t> got = (*client)->get("survivor-" + std::to_string(i), {&o, 1});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_EQ(out, values[i]) << i;
  }
  // New puts do not land on restored bytes.
  std::vector<std::byte> fresh = pattern_bytes(60000, 7);
  ConstBuffer in = cview(fresh);
  ASSERT_TRUE((*client)->put("fresh", {&in, 1}, {.replica_num = 2}).ok());
  std::vector<std::byte> out(values[0].size());
  Buffer o = view(out);
  ASSERT_TRUE((*client)->get("survivor-0", {&o, 1}).ok());
  EXPECT_EQ(out, values[0]);
}

// Spills the SSD tier cannot write (its directory went away) are counted and logged, not lost silently.
TEST(StoreClient, SpillsTheSsdTierCannotWriteAreCounted) {
  MasterServerOptions master;
  master.master.lease_ttl = milliseconds(100);
  StoreCluster cluster(0, 0, master);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto node = StorageNode::start(ssd_node_options(cluster, milliseconds(10)));
  ASSERT_TRUE(node.ok()) << node.status().to_string();
  std::filesystem::remove_all(cluster.dir() + "/ssd");  // the disk goes away under the node
  auto client = Client::create(cluster.client_options());
  ASSERT_TRUE(client.ok());
  (void)put_64k_values(**client, "lost-", 40, 1000);  // 2.5 MiB through 1 MiB of DRAM: spills
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while ((*node)->ssd_spill_failures() == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_GT((*node)->ssd_spill_failures(), 0u);
  EXPECT_EQ(cluster.master().master().stats().ssd_used_bytes, 0u);
}

TEST(StoreClient, ObjectsEvictedFromDramLiveOnTheSsdTierAndReadBackIdentical) {
  MasterServerOptions master;
  master.master.lease_ttl = milliseconds(100);  // a read lease keeps a value in DRAM: keep them short here
  StoreCluster cluster(0, 0, master);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  // Orders reach the node within ~10 ms.
  auto node = StorageNode::start(ssd_node_options(cluster, milliseconds(10)));
  ASSERT_TRUE(node.ok()) << node.status().to_string();
  auto client = Client::create(cluster.client_options());
  ASSERT_TRUE(client.ok());
  constexpr int kValues = 40;  // 40 x 64 KiB = 2.5 MiB through 1 MiB of DRAM
  const auto values = put_64k_values(**client, "tiered-", kValues, 1000);
  ASSERT_FALSE(::testing::Test::HasFailure());
  MasterStats stats = cluster.master().master().stats();
  EXPECT_GT(stats.spills, 0u);
  EXPECT_GT(stats.ssd_used_bytes, 0u);
  EXPECT_EQ(stats.objects, static_cast<uint64_t>(kValues));  // none lost
  for (int i = 0; i < kValues; ++i) {  // oldest first: those were spilled, and are loaded back
    std::vector<std::byte> out(64 << 10);
    Buffer o = view(out);
    Result<uint64_t> got = (*client)->get("tiered-" + std::to_string(i), {&o, 1});
    ASSERT_TRUE(got.ok()) << i << ": " << got.status().to_string();
    EXPECT_EQ(out, values[i]) << i;
  }
  EXPECT_GT(cluster.master().master().stats().loads, 0u);

  // A restarted master learns both tiers from the node's re-mount: every value is still there.
  ASSERT_TRUE(cluster.restart_master().ok());
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (cluster.master().master().stats().objects < kValues && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  EXPECT_EQ(cluster.master().master().stats().objects, static_cast<uint64_t>(kValues));
  EXPECT_GT(cluster.master().master().stats().ssd_used_bytes, 0u);
  for (int i = 0; i < kValues; i += 7) {
    std::vector<std::byte> out(64 << 10);
    Buffer o = view(out);
    Result<uint64_t> got = (*client)->get("tiered-" + std::to_string(i), {&o, 1});
    ASSERT_TRUE(got.ok()) << i << ": " << got.status().to_string();
    EXPECT_EQ(out, values[i]) << i;
  }
}

TEST(StoreClient, SlowSsdOrdersDoNotHoldUpRenewals) {
  MasterServerOptions master;
  master.master.lease_ttl = milliseconds(100);
  master.master.segment_ttl = milliseconds(400);  // shorter than one SSD order below
  StoreCluster cluster(0, 0, master);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  StorageNodeOptions node_options = ssd_node_options(cluster, milliseconds(20));
  node_options.ssd_delay_for_testing = milliseconds(700);  // a disk slower than segment_ttl
  auto node = StorageNode::start(node_options);
  ASSERT_TRUE(node.ok()) << node.status().to_string();
  auto client = Client::create(cluster.client_options());
  ASSERT_TRUE(client.ok());
  constexpr int kValues = 20;  // 20 x 64 KiB: past the 95% watermark, so spills are ordered
  const auto values = put_64k_values(**client, "slow-", kValues, 7000);
  ASSERT_FALSE(::testing::Test::HasFailure());
  // Spills take 700 ms each; meanwhile the segment keeps being renewed. Wait for two spills reported written
  // (their SSD copies recorded): that is 1.4 s of file I/O, three and a half segment_ttls.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(8);
  while (cluster.master().master().stats().ssd_used_bytes < 2 * (64 << 10) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(milliseconds(20));
  }
  const MasterStats stats = cluster.master().master().stats();
  EXPECT_GE(stats.ssd_used_bytes, 2u * (64 << 10));
  EXPECT_EQ(stats.segments_expired, 0u);
  EXPECT_EQ(stats.segments, 1u);
  EXPECT_EQ(stats.objects, static_cast<uint64_t>(kValues));
  const uint64_t loads_before = stats.loads;
  for (int i : {0, kValues - 1}) {  // the oldest was spilled (read back through a load), the newest was not
    std::vector<std::byte> out(64 << 10);
    Buffer o = view(out);
    Result<uint64_t> got = (*client)->get("slow-" + std::to_string(i), {&o, 1});
    ASSERT_TRUE(got.ok()) << i << ": " << got.status().to_string();
    EXPECT_EQ(out, values[i]) << i;
  }
  EXPECT_GT(cluster.master().master().stats().loads, loads_before);
}

TEST(StoreClient, MalformedRequestsToTheMasterAreRefusedAndItKeepsServing) {
  StoreCluster cluster(1);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string& address = cluster.master().address();
  const int port = std::stoi(address.substr(address.rfind(':') + 1));
  for (const std::string& junk : {std::string("GET / HTTP/1.1\r\n\r\n"), std::string(4096, '\xff'),
                                  std::string("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") + std::string(100, '\0')}) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(static_cast<uint16_t>(port));
    to.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof(to)), 0);
    (void)::send(fd, junk.data(), junk.size(), MSG_NOSIGNAL);
    ::close(fd);
  }
  // Frames of the control protocol with a method the master does not have, or a body that is not the
  // method's request: an error each, and the connection stays usable.
  ControlChannel channel(address, 1, store_member_key(cluster.secret()));
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  Result<std::string> unknown = channel.call(99, "", deadline);
  EXPECT_EQ(unknown.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(unknown.status().message(), "unknown store master method 99");
  const uint16_t put_start = 5;  // MasterMethod::kPutStart (store/rpc_convert.h)
  Result<std::string> garbage = channel.call(put_start, std::string(64, '\xff'), deadline);
  EXPECT_EQ(garbage.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(garbage.status().message(), "malformed put_start request (64 bytes)");
  // A well-formed call with a value the protocol cannot hold: one clear error, nothing written.
  auto master = MasterClient::connect(cluster.master_options());
  ASSERT_TRUE(master.ok());
  std::vector<std::string_view> keys = {"k"};
  std::vector<uint64_t> sizes = {};  // no size for the key
  auto started = (*master)->put_start(keys, sizes, {}, "");
  ASSERT_TRUE(started.ok());
  EXPECT_EQ((*started)[0].status().code(), StatusCode::kInvalidArgument)
      << (*started)[0].status().to_string();
  EXPECT_EQ(cluster.master().master().stats().puts_started, 0u);
  // And it still serves.
  auto client = Client::create(cluster.client_options());
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  std::vector<std::byte> value = pattern_bytes(100, 3), out(100);
  ConstBuffer in = cview(value);
  Buffer o = view(out);
  ASSERT_TRUE((*client)->put("after-junk", {&in, 1}).ok());
  ASSERT_TRUE((*client)->get("after-junk", {&o, 1}).ok());
  EXPECT_EQ(out, value);
}

TEST(StoreClient, MetricsEndpointsServePrometheusText) {
  StoreCluster cluster(1);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  auto client = Client::create(cluster.client_options());
  ASSERT_TRUE(client.ok());
  std::vector<std::byte> value = pattern_bytes(1000, 1), out(1000);
  ConstBuffer in = cview(value);
  Buffer o = view(out);
  ASSERT_TRUE((*client)->put("m", {&in, 1}).ok());
  ASSERT_TRUE((*client)->get("m", {&o, 1}).ok());
  EXPECT_FALSE((*client)->get("absent", {&o, 1}).ok());
  const std::string& address = cluster.master().metrics_address();
  httplib::Client http("http://" + address);
  auto response = http.Get("/metrics");
  ASSERT_TRUE(response);
  EXPECT_EQ(response->status, 200);
  for (const char* line :
       {"crescent_store_objects 1", "crescent_store_hits_total 1", "crescent_store_misses_total 1",
        "crescent_store_puts_ended_total 1", "crescent_store_used_bytes{tier=\"dram\"} 1024",
        "crescent_store_rpc_latency_seconds_bucket{method=\"put_start\""}) {
    EXPECT_NE(response->body.find(line), std::string::npos) << line << "\n" << response->body;
  }
  httplib::Client node_http("http://" + cluster.nodes()[0]->metrics_address());
  auto node_response = node_http.Get("/metrics");
  ASSERT_TRUE(node_response);
  EXPECT_NE(node_response->body.find("crescent_store_node_capacity_bytes{tier=\"dram\"} 16777216"),
            std::string::npos)
      << node_response->body;
}

}  // namespace
}  // namespace crescent::store
