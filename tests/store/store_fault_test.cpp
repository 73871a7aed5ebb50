// Faults and stress (issue 9 section 7): a storage node SIGKILLed mid-run, and many threads putting, getting
// and removing at once. Nodes run as `crescent store node` processes where a crash must be real.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <thread>

#include "common/child_process.h"
#include "store/client.h"
#include "store_cluster.h"

namespace crescent::store {
namespace {

using std::chrono::milliseconds;
using test::pattern_bytes;
using test::StoreCluster;

/// A `crescent store node` process mounted on `master` (16 MiB of DRAM unless `extra` says otherwise, which
/// is appended to its arguments); null (with a test failure) when it did not start.
std::unique_ptr<ChildProcess> start_node_process(const StoreCluster& cluster, const std::string& name,
                                                 const std::vector<std::string>& extra = {},
                                                 const std::string& log_name = "") {
  const std::string master = cluster.master_options().address;
  const std::string log = cluster.dir() + "/" + (log_name.empty() ? name : log_name) + ".log";
  const std::string secret_file = cluster.secret_file();
  std::vector<std::string> argv = {CRESCENT_BINARY,
                                   "store",
                                   "node",
                                   "--master",
                                   master,
                                   "--name",
                                   name,
                                   "--metrics",
                                   "",
                                   "--transports",
                                   "tcp",
                                   "--cluster-secret-file",
                                   secret_file};
  if (std::find(extra.begin(), extra.end(), "--dram") == extra.end())
    argv.insert(argv.end(), {"--dram", "16MiB"});
  argv.insert(argv.end(), extra.begin(), extra.end());
  auto node = ChildProcess::start(argv, log);
  if (!node.ok()) {
    ADD_FAILURE() << node.status().to_string();
    return nullptr;
  }
  auto ready = (*node)->wait_for_line("store node: segment", std::chrono::seconds(30));
  if (!ready.ok()) {
    ADD_FAILURE() << ready.status().to_string();
    return nullptr;
  }
  return std::move(*node);
}

/// A client of `cluster` reaching the node processes over tcp, a transfer failing within 2 s.
Result<std::unique_ptr<Client>> tcp_client(const StoreCluster& cluster) {
  ClientOptions options = cluster.client_options();
  options.transports = {transfer::TransportKind::kTcp};
  options.transfer_timeout = milliseconds(2000);
  return Client::create(options);
}

TEST(StoreFaults, NodeKilledItsSegmentGoesReadsFallBackAndNothingHangs) {
  MasterServerOptions options;
  options.master.segment_ttl = milliseconds(1000);
  options.tick_interval = milliseconds(50);
  StoreCluster cluster(0, 0, options);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string tag = std::to_string(::getpid());
  auto doomed = start_node_process(cluster, "doomed-" + tag);
  auto survivor = start_node_process(cluster, "survivor-" + tag);
  ASSERT_TRUE(doomed && survivor);
  auto client = tcp_client(cluster);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  Client& c = **client;

  const std::string doomed_segment = "doomed-" + tag + "/dram";
  std::vector<std::vector<std::byte>> values;
  for (int i = 0; i < 20; ++i) {
    values.push_back(pattern_bytes(100000 + static_cast<uint64_t>(i), static_cast<uint64_t>(i)));
    ConstBuffer in{values[i].data(), values[i].size()};
    ASSERT_TRUE(c.put("both-" + std::to_string(i), {&in, 1}, {.replica_num = 2}).ok());
    ASSERT_TRUE(c.put("only-" + std::to_string(i), {&in, 1},
                      {.replica_num = 1, .preferred_segment = doomed_segment, .pin = PinKind::kNone})
                    .ok());
  }
  doomed->kill();  // SIGKILL: no unmount, the master learns from the missing renewals
  const auto killed = std::chrono::steady_clock::now();

  // Before the master notices, objects with a live replica read correctly (a failed transfer falls back).
  std::vector<std::byte> out(200000);
  Buffer o{out.data(), out.size()};
  for (int i = 0; i < 20; ++i) {
    const auto start = std::chrono::steady_clock::now();
    Result<uint64_t> got = c.get("both-" + std::to_string(i), {&o, 1});
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5)) << "a read hung";
    ASSERT_TRUE(got.ok()) << i << ": " << got.status().to_string();
    ASSERT_EQ(*got, values[i].size());
    EXPECT_TRUE(std::equal(values[i].begin(), values[i].end(), out.begin())) << i;
    // The object only on the dead node fails (transfer failed, or not found once the segment is gone) in
    // time.
    const auto only_start = std::chrono::steady_clock::now();
    Result<uint64_t> lost = c.get("only-" + std::to_string(i), {&o, 1});
    EXPECT_LT(std::chrono::steady_clock::now() - only_start, std::chrono::seconds(5)) << "a read hung";
    EXPECT_FALSE(lost.ok());
  }
  EXPECT_GT(c.stats().replica_fallbacks, 0u);

  // Within segment_ttl + 1 s the segment is unmounted and its replicas dropped.
  bool unmounted = false;
  while (std::chrono::steady_clock::now() - killed < milliseconds(2000)) {
    const auto segments = cluster.master().master().segments();
    if (std::none_of(segments.begin(), segments.end(),
                     [&](const SegmentInfo& s) { return s.segment == doomed_segment; })) {
      unmounted = true;
      break;
    }
    std::this_thread::sleep_for(milliseconds(20));
  }
  ASSERT_TRUE(unmounted) << "segment still mounted 2 s after its node was killed";
  for (int i = 0; i < 20; ++i) {
    EXPECT_EQ(c.get("only-" + std::to_string(i), {&o, 1}).status().code(), StatusCode::kNotFound);
    Result<uint64_t> got = c.get("both-" + std::to_string(i), {&o, 1});
    ASSERT_TRUE(got.ok()) << got.status().to_string();
    EXPECT_TRUE(std::equal(values[i].begin(), values[i].end(), out.begin())) << i;
  }
  EXPECT_EQ(cluster.master().master().stats().segments_expired, 1u);
}

// Issue 25 §4: a node SIGKILLed and restarted on the same SSD directory under the same name mounts at once
// (its dead segment replaced, not waited out for segment_ttl), and every value that was on its SSD tier is
// read back byte for byte; values that were only in its DRAM are gone.
TEST(StoreFaults, ARestartedNodeReadoptsItsSsdObjects) {
  MasterServerOptions options;  // segment_ttl 10 s: the restart must not wait for it
  options.master.lease_ttl = milliseconds(100);
  options.tick_interval = milliseconds(50);
  StoreCluster cluster(0, 0, options);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string name = "ssd-node-" + std::to_string(::getpid());
  const std::vector<std::string> ssd = {"--dram",         "1MiB", "--ssd", cluster.dir() + "/ssd",
                                        "--ssd-capacity", "64MiB"};
  auto node = start_node_process(cluster, name, ssd, name + "-first");
  ASSERT_TRUE(node);
  auto client = tcp_client(cluster);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  Client& c = **client;
  constexpr int kValues = 40;  // 40 x 64 KiB = 2.5 MiB through 1 MiB of DRAM: the oldest are spilled
  std::vector<std::vector<std::byte>> values;
  for (int i = 0; i < kValues; ++i) {
    values.push_back(pattern_bytes(64 << 10, 500 + static_cast<uint64_t>(i)));
    ConstBuffer in{values.back().data(), values.back().size()};
    ASSERT_TRUE(c.put("v-" + std::to_string(i), {&in, 1}, {}).ok()) << i;
  }
  // Spills finish after the puts: wait until the node has reported them all (the SSD tier's size settles).
  uint64_t ssd_bytes = 0;
  const auto settle = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    std::this_thread::sleep_for(milliseconds(300));
    const uint64_t now_bytes = cluster.master().master().stats().ssd_used_bytes;
    if ((now_bytes == ssd_bytes && now_bytes > 0) || std::chrono::steady_clock::now() > settle) break;
    ssd_bytes = now_bytes;
  }
  const uint64_t on_ssd = ssd_bytes / (64 << 10);
  ASSERT_GE(on_ssd, static_cast<uint64_t>(kValues / 2)) << "too few values were spilled to test";

  node->kill();  // SIGKILL: no unmount, files as they were (kill reaps it)
  const auto restarted_at = std::chrono::steady_clock::now();
  node = start_node_process(cluster, name, ssd, name + "-second");
  ASSERT_TRUE(node);
  EXPECT_LT(std::chrono::steady_clock::now() - restarted_at, std::chrono::seconds(5))
      << "the restart waited for the dead segment's segment_ttl";
  const MasterStats stats = cluster.master().master().stats();
  EXPECT_EQ(stats.segments_replaced, 1u);
  EXPECT_GE(stats.objects_restored, on_ssd);
  EXPECT_EQ(cluster.master().master().segments().size(), 1u);
  EXPECT_EQ(cluster.master().master().stats().ssd_used_bytes, ssd_bytes);
  // Every value the master knows again reads back byte for byte: the SSD ones; the others died with DRAM.
  std::vector<std::byte> out(64 << 10);
  Buffer o{out.data(), out.size()};
  uint64_t read_back = 0;
  for (int i = 0; i < kValues; ++i) {
    Result<uint64_t> got = c.get("v-" + std::to_string(i), {&o, 1});
    if (!got.ok()) {
      EXPECT_EQ(got.status().code(), StatusCode::kNotFound) << i << ": " << got.status().to_string();
      continue;
    }
    EXPECT_EQ(out, values[i]) << i;
    ++read_back;
  }
  EXPECT_EQ(read_back, on_ssd);
  auto adopted = node->wait_for_line("store node: adopted", std::chrono::seconds(1));
  EXPECT_TRUE(adopted.ok()) << node->log_tail();
}

// Issue 22 §4: for up to segment_ttl (10 s) after a node died, puts still chose its segment and failed
// ("segment ... not found"). Now a replica that cannot be written is dropped and its segment reported: the
// put ends with the replicas written, or is placed again on a live segment, and the master chooses the dead
// segment no more, long before segment_ttl unmounts it.
TEST(StoreFaults, PutsRightAfterANodeDiesSucceedOnLiveSegments) {
  MasterServerOptions options;  // segment_ttl 10 s (the default): the dead segment stays mounted throughout
  options.tick_interval = milliseconds(50);
  StoreCluster cluster(0, 0, options);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string tag = std::to_string(::getpid());
  auto doomed = start_node_process(cluster, "doomed-" + tag);
  auto survivor = start_node_process(cluster, "survivor-" + tag);
  ASSERT_TRUE(doomed && survivor);
  auto client = tcp_client(cluster);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  Client& c = **client;
  const std::string doomed_segment = "doomed-" + tag + "/dram";
  const std::vector<std::byte> value = pattern_bytes(100000, 7);
  ConstBuffer in{value.data(), value.size()};
  for (int i = 0; i < 4; ++i) {  // the client has written to both nodes
    ASSERT_TRUE(c.put("warm-" + std::to_string(i), {&in, 1}, {.replica_num = 2}).ok());
  }

  doomed->kill();  // SIGKILL: no unmount; its segment stays mounted for segment_ttl
  const auto killed = std::chrono::steady_clock::now();
  std::vector<std::byte> out(value.size());
  Buffer o{out.data(), out.size()};
  // One replica, and the master asked to put it on the dead node: written on the survivor.
  for (int i = 0; i < 10; ++i) {
    const std::string key = "one-" + std::to_string(i);
    const auto start = std::chrono::steady_clock::now();
    Status put = c.put(key, {&in, 1}, {.replica_num = 1, .preferred_segment = doomed_segment});
    EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2)) << key;
    ASSERT_TRUE(put.ok()) << key << ": " << put.to_string();
    Result<uint64_t> got = c.get(key, {&o, 1});
    ASSERT_TRUE(got.ok()) << key << ": " << got.status().to_string();
    EXPECT_EQ(out, value) << key;
  }
  // Two replicas with one of the two nodes dead: each put ends with the one on the survivor.
  for (int i = 0; i < 10; ++i) {
    const std::string key = "two-" + std::to_string(i);
    Status put = c.put(key, {&in, 1}, {.replica_num = 2});
    ASSERT_TRUE(put.ok()) << key << ": " << put.to_string();
    Result<uint64_t> got = c.get(key, {&o, 1});
    ASSERT_TRUE(got.ok()) << key << ": " << got.status().to_string();
    EXPECT_EQ(out, value) << key;
  }
  const auto elapsed = std::chrono::steady_clock::now() - killed;
  EXPECT_EQ(c.stats().replicas_unwritten, 1u)
      << "only the first put tried the dead segment: the master chose it no more once it was reported";
  const MasterStats stats = cluster.master().master().stats();
  EXPECT_EQ(stats.segments_suspected, 1u);
  EXPECT_EQ(stats.replicas_unwritten, 1u);
  const auto segments = cluster.master().master().segments();
  EXPECT_TRUE(std::any_of(segments.begin(), segments.end(),
                          [&](const SegmentInfo& s) { return s.segment == doomed_segment; }))
      << "all within segment_ttl: the dead segment was still mounted ("
      << std::chrono::duration<double>(elapsed).count() << " s after the kill)";
}

// Without any writer's report, a segment whose node stopped renewing is chosen no more after
// placement_stale_after (1 s), while it stays mounted until segment_ttl (10 s).
TEST(StoreFaults, ASegmentWhoseNodeStoppedRenewingIsNotChosenAfterASecond) {
  MasterServerOptions options;
  options.tick_interval = milliseconds(50);
  StoreCluster cluster(0, 0, options);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  const std::string tag = std::to_string(::getpid());
  auto doomed = start_node_process(cluster, "quiet-" + tag);
  auto survivor = start_node_process(cluster, "alive-" + tag);
  ASSERT_TRUE(doomed && survivor);
  ClientOptions client_options = cluster.client_options();
  client_options.transports = {transfer::TransportKind::kTcp};
  auto client = Client::create(client_options);
  ASSERT_TRUE(client.ok()) << client.status().to_string();
  doomed->kill();
  std::this_thread::sleep_for(milliseconds(1300));
  const std::vector<std::byte> value = pattern_bytes(4096, 3);
  ConstBuffer in{value.data(), value.size()};
  for (int i = 0; i < 10; ++i) {
    Status put = (*client)->put("k" + std::to_string(i), {&in, 1},
                                {.replica_num = 2, .preferred_segment = "quiet-" + tag + "/dram"});
    ASSERT_TRUE(put.ok()) << put.to_string();
  }
  EXPECT_EQ((*client)->stats().replicas_unwritten, 0u) << "the master never gave out the silent segment";
  EXPECT_EQ(cluster.master().master().segments().size(), 2u) << "still mounted (segment_ttl 10 s)";
}

/// Value of `size` bytes for (key id, version): 16-byte header (id, version) then a pattern from both, so a
/// reader can check every byte without knowing what was written last.
std::vector<std::byte> stress_value(uint64_t id, uint64_t version, uint64_t size) {
  std::vector<std::byte> v = pattern_bytes(size, id * 1000003 + version);
  std::memcpy(v.data(), &id, 8);
  std::memcpy(v.data() + 8, &version, 8);
  return v;
}

TEST(StoreStress, ManyThreadsPutGetRemoveWithoutWrongBytesOrLeaks) {
  const char* env = std::getenv("CRESCENT_STORE_STRESS_SECONDS");
  const int seconds = env != nullptr ? std::atoi(env) : 30;
  MasterServerOptions options;
  options.master.lease_ttl = milliseconds(200);
  StoreCluster cluster(2, 32 << 20, options);
  ASSERT_TRUE(cluster.ok()) << cluster.error();
  constexpr int kThreads = 8;
  constexpr uint64_t kKeys = 64;
  std::atomic<uint64_t> wrong{0}, reads{0}, puts{0}, removes{0}, unexpected{0}, leases_expired{0};
  std::atomic<bool> stop{false};
  std::string first_unexpected;
  std::mutex mu;
  auto note = [&](const std::string& what) {
    ++unexpected;
    std::lock_guard<std::mutex> lock(mu);
    if (first_unexpected.empty()) first_unexpected = what;
  };
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ClientOptions client_options = cluster.client_options();
      client_options.staging_bytes = t % 2 == 0 ? (4 << 20) : 0;  // odd threads register buffers per call
      auto client = Client::create(client_options);
      if (!client.ok()) {
        note(client.status().to_string());
        return;
      }
      std::mt19937_64 rng(static_cast<uint64_t>(t) + 1);
      std::vector<std::byte> out(1 << 20);
      uint64_t version = 0;
      while (!stop) {
        const uint64_t id = rng() % kKeys;
        const std::string key = "stress-" + std::to_string(id);
        switch (rng() % 3) {
          case 0: {
            // At least the 16-byte header: a shorter value would be written past its end and read as wrong.
            const uint64_t size = 16 + rng() % ((1 << 20) - 15);
            std::vector<std::byte> value = stress_value(id, static_cast<uint64_t>(t) << 32 | version++, size);
            ConstBuffer in{value.data(), value.size()};
            Status s = (*client)->put(key, {&in, 1}, {.replica_num = 1 + static_cast<uint32_t>(rng() % 2)});
            // Already exists, and no space (64 keys of up to 1 MiB, 2 replicas, leases and 8 puts in flight
            // can fill the 2 x 32 MiB), are answers, not faults.
            if (s.ok()) {
              ++puts;
            } else if (s.code() != StatusCode::kAlreadyExists && s.code() != StatusCode::kNoSpace) {
              note("put: " + s.to_string());
            }
            break;
          }
          case 1: {
            Buffer o{out.data(), out.size()};
            Result<uint64_t> got = (*client)->get(key, {&o, 1});
            if (got.ok()) {
              ++reads;
              uint64_t got_id = 0, got_version = 0;
              std::memcpy(&got_id, out.data(), 8);
              std::memcpy(&got_version, out.data() + 8, 8);
              std::vector<std::byte> expected = stress_value(got_id, got_version, *got);
              if (*got < 16 || got_id != id || !std::equal(expected.begin(), expected.end(), out.begin()))
                ++wrong;
            } else if (got.status().code() == StatusCode::kLeaseExpired) {
              // A read slower than its 200 ms lease (a machine loaded by other jobs): refused, never wrong
              // bytes, which is what the lease check is for.
              ++leases_expired;
            } else if (got.status().code() != StatusCode::kNotFound) {
              note("get: " + got.status().to_string());
            }
            break;
          }
          default: {
            Status s = (*client)->remove(key);
            if (s.ok())
              ++removes;
            else if (s.code() != StatusCode::kNotFound && s.code() != StatusCode::kFailedPrecondition) {
              note("remove: " + s.to_string());
            }
          }
        }
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(seconds));
  stop = true;
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(wrong.load(), 0u);
  EXPECT_EQ(unexpected.load(), 0u) << first_unexpected;
  EXPECT_GT(reads.load(), 0u);
  EXPECT_LE(leases_expired.load(), reads.load()) << "most reads finish within their lease";
  EXPECT_GT(puts.load(), 0u);
  EXPECT_GT(removes.load(), 0u);
  std::this_thread::sleep_for(milliseconds(300));  // the last leases run out
  cluster.master().master().remove_all();
  for (const SegmentInfo& s : cluster.master().master().segments()) {
    EXPECT_EQ(s.used_bytes, 0u) << s.segment;
    EXPECT_EQ(s.replicas, 0u) << s.segment;
  }
  EXPECT_EQ(cluster.master().master().stats().objects, 0u);
  EXPECT_EQ(cluster.master().master().stats().processing_objects, 0u);
}

}  // namespace
}  // namespace crescent::store
