// The etcd-backed MetadataService against a real etcd: one server per test suite (test_support/etcd_server.h:
// /usr/bin/etcd on free ports in a temporary directory), one key prefix per test. The tests reach etcd
// directly through a minimal HTTP client of their own to set up what the service must cope with (revoked
// leases, corrupt values) without trusting the code under test.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "test_support/etcd_server.h"
#include "transfer/metadata.h"

namespace crescent {
// Prints a Status as its message in gtest failures (instead of its bytes).
void PrintTo(const Status& status, std::ostream* os) {
  *os << status.to_string();
}
}  // namespace crescent

namespace crescent::transfer {
namespace {

using nlohmann::json;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

using test::free_ports;
using test::http_request;

std::string base64(std::string_view bytes) {
  static constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  std::string out;
  for (size_t i = 0; i < bytes.size(); i += 3) {
    uint32_t chunk = static_cast<uint8_t>(bytes[i]) << 16;
    if (i + 1 < bytes.size()) chunk |= static_cast<uint8_t>(bytes[i + 1]) << 8;
    if (i + 2 < bytes.size()) chunk |= static_cast<uint8_t>(bytes[i + 2]);
    out += kAlphabet[(chunk >> 18) & 63];
    out += kAlphabet[(chunk >> 12) & 63];
    out += i + 1 < bytes.size() ? kAlphabet[(chunk >> 6) & 63] : '=';
    out += i + 2 < bytes.size() ? kAlphabet[chunk & 63] : '=';
  }
  return out;
}

SegmentDescriptor descriptor(std::string name, std::string engine, uint64_t length_bytes = 1 << 20) {
  SegmentDescriptor d;
  d.name = std::move(name);
  d.engine = std::move(engine);
  d.host_id = "node-7/boot-3f2a";
  d.length_bytes = length_bytes;
  d.transports = {{"tcp", {{"host", "10.0.0.7"}, {"port", 40123}}},
                  {"shm", {{"path", "/dev/shm/crescent-kv"}, {"offsets", {0, 4096, 1u << 20}}}},
                  {"ucx", {{"worker_address", "AAEC/w=="}, {"rkeys", {{"0", "cmtleQ=="}}}}}};
  return d;
}

/// Polls `done` every 50 ms until it holds or `limit` passes; the time it took, or nullopt on timeout.
template <typename Predicate>
std::optional<Clock::duration> wait_until(Predicate done, Clock::duration limit) {
  const auto start = Clock::now();
  while (Clock::now() - start < limit) {
    if (done()) return Clock::now() - start;
    std::this_thread::sleep_for(50ms);
  }
  return std::nullopt;
}

MATCHER(IsOk, "is ok") {
  return arg.ok();
}

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

class EtcdMetadataTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { etcd_ = std::make_unique<test::EtcdServer>(); }
  static void TearDownTestSuite() { etcd_.reset(); }

  void SetUp() override {
    if (!etcd_->skip_reason().empty()) GTEST_SKIP() << etcd_->skip_reason();
    ASSERT_TRUE(etcd_->error().empty()) << etcd_->error();
    prefix_ =
        std::string("/crescent-test/") + ::testing::UnitTest::GetInstance()->current_test_info()->name();
  }

  std::string endpoint() const { return etcd_->endpoint(); }

  EtcdOptions options(std::chrono::seconds ttl = 2s) const {
    return {.endpoint = endpoint(), .prefix = prefix_, .lease_ttl = ttl, .request_timeout = 2000ms};
  }

  /// A new service on this test's prefix; nullptr (and a failure) if it cannot be created.
  std::shared_ptr<MetadataService> service(std::chrono::seconds ttl = 2s) const {
    auto r = make_etcd_metadata(options(ttl));
    EXPECT_TRUE(r.ok()) << r.status().message();
    return r.ok() ? *r : nullptr;
  }

  /// Calls etcd's gateway directly.
  json etcd(const std::string& path, const json& body) const {
    return json::parse(http_request(etcd_->client_port(), "POST", path, body.dump()), nullptr, false);
  }
  void raw_put(const std::string& key, const std::string& value) const {
    etcd("/v3/kv/put", {{"key", base64(key)}, {"value", base64(value)}});
  }
  /// The lease `key` is attached to; 0 when the key is absent.
  int64_t raw_lease(const std::string& key) const {
    json reply = etcd("/v3/kv/range", {{"key", base64(key)}});
    if (!reply.contains("kvs")) return 0;
    return std::stoll(reply["kvs"][0].value("lease", "0"));
  }
  void raw_revoke(int64_t lease) const { etcd("/v3/lease/revoke", {{"ID", std::to_string(lease)}}); }

  static inline std::unique_ptr<test::EtcdServer> etcd_;

  std::string prefix_;
};

// Issue 25 §4: an engine restarted under its name (a store node or an instance with a fixed name) takes
// back the claim its dead predecessor on this host left, with the segments under it, instead of failing
// until that claim's lease runs out; a claim of a live process, or of another host, is not taken.
TEST_F(EtcdMetadataTest, AClaimLeftByADeadProcessOfThisHostIsTakenAtOnce) {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  const pid_t dead = fork();
  if (dead == 0) _exit(0);
  ASSERT_GT(dead, 0);
  ASSERT_EQ(waitpid(dead, nullptr, 0), dead);  // a pid that ran on this host and is gone
  // Each owner's keys under a lease of its own with a minute left.
  auto new_lease = [&] { return etcd("/v3/lease/grant", {{"TTL", 60}}).value("ID", "0"); };
  auto put_leased = [&](const std::string& key, const json& value, const std::string& lease) {
    etcd("/v3/kv/put", {{"key", base64(key)}, {"value", base64(value.dump())}, {"lease", lease}});
  };
  const std::string lease = new_lease(), live_lease = new_lease(), far_lease = new_lease();
  ASSERT_NE(lease, "0");
  put_leased(prefix_ + "/engines/store-a", {{"engine", "store-a"}, {"pid", dead}, {"host", host}}, lease);
  put_leased(prefix_ + "/segments/store-a/dram", descriptor("store-a/dram", "store-a").to_json(), lease);
  put_leased(prefix_ + "/engines/live-b", {{"engine", "live-b"}, {"pid", getppid()}, {"host", host}},
             live_lease);
  put_leased(prefix_ + "/engines/far-c", {{"engine", "far-c"}, {"pid", dead}, {"host", "another-host"}},
             far_lease);

  auto restarted = service();
  ASSERT_TRUE(restarted);
  const auto start = Clock::now();
  ASSERT_THAT(restarted->claim_engine("store-a"), IsOk());
  EXPECT_LT(Clock::now() - start, 2s);
  EXPECT_THAT(restarted->publish(descriptor("store-a/dram", "store-a")), IsOk());
  EXPECT_NE(raw_lease(prefix_ + "/engines/store-a"), std::stoll(lease));
  Status live = restarted->claim_engine("live-b");
  EXPECT_EQ(live.code(), StatusCode::kAlreadyExists) << live.to_string();
  EXPECT_EQ(restarted->claim_engine("far-c").code(), StatusCode::kAlreadyExists);
}

TEST_F(EtcdMetadataTest, EngineClaimIsExclusiveAcrossInstances) {
  auto a = service();
  auto b = service();
  ASSERT_TRUE(a && b);
  ASSERT_THAT(a->claim_engine("prefill-0"), IsOk());
  EXPECT_EQ(a->claim_engine("prefill-0").code(), StatusCode::kAlreadyExists);
  Status taken = b->claim_engine("prefill-0");
  EXPECT_EQ(taken.code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(taken.message(), HasSubstr("engine 'prefill-0' is already claimed"));
  EXPECT_THAT(taken.message(), HasSubstr("pid " + std::to_string(getpid())));
  EXPECT_THAT(b->claim_engine("decode-0"), IsOk());

  ASSERT_THAT(a->release_engine("prefill-0"), IsOk());
  EXPECT_THAT(b->claim_engine("prefill-0"), IsOk());
  EXPECT_THAT(a->release_engine("never-claimed"), IsOk());
  EXPECT_EQ(a->claim_engine("").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a->claim_engine("bad\nname").code(), StatusCode::kInvalidArgument);
}

TEST_F(EtcdMetadataTest, ConcurrentClaimsOfOneNameHaveOneWinner) {
  std::vector<std::shared_ptr<MetadataService>> services;
  for (int i = 0; i < 4; ++i) services.push_back(service());
  std::atomic<int> winners = 0;
  std::atomic<int> refused = 0;
  std::vector<std::thread> threads;
  for (auto& s : services) {
    threads.emplace_back([&, s] {
      Status st = s->claim_engine("contended");
      if (st.ok()) ++winners;
      if (st.code() == StatusCode::kAlreadyExists) ++refused;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(winners, 1);
  EXPECT_EQ(refused, 3);
}

TEST_F(EtcdMetadataTest, PublishedDescriptorRoundTripsToOtherInstances) {
  auto owner = service();
  auto peer = service();
  ASSERT_TRUE(owner && peer);
  ASSERT_THAT(owner->claim_engine("prefill-0"), IsOk());
  const SegmentDescriptor published = descriptor("prefill-0/kv", "prefill-0", 64ull << 30);
  ASSERT_THAT(owner->publish(published), IsOk());

  auto found = peer->lookup("prefill-0/kv");
  ASSERT_TRUE(found.ok()) << found.status().message();
  EXPECT_EQ(found->name, published.name);
  EXPECT_EQ(found->engine, published.engine);
  EXPECT_EQ(found->host_id, published.host_id);
  EXPECT_EQ(found->length_bytes, 64ull << 30);
  EXPECT_EQ(found->transports, published.transports);

  // Republishing one's own segment replaces it.
  ASSERT_THAT(owner->publish(descriptor("prefill-0/kv", "prefill-0", 4096)), IsOk());
  EXPECT_EQ(peer->lookup("prefill-0/kv")->length_bytes, 4096u);

  Result<SegmentDescriptor> missing = peer->lookup("nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(missing.status().message(),
              HasSubstr("segment 'nope' not found in etcd at " + endpoint() + " under '" + prefix_ + "'"));
}

TEST_F(EtcdMetadataTest, PublishRequiresAClaimedEngine) {
  auto a = service();
  auto b = service();
  ASSERT_TRUE(a && b);
  ASSERT_THAT(b->claim_engine("theirs"), IsOk());
  Status st = a->publish(descriptor("s", "theirs"));
  EXPECT_EQ(st.code(), StatusCode::kFailedPrecondition);
  EXPECT_THAT(st.message(), HasSubstr("engine 'theirs'"));
  EXPECT_EQ(a->publish(descriptor("s", "nobody")).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(a->lookup("s").status().code(), StatusCode::kNotFound);
  ASSERT_THAT(a->claim_engine("mine"), IsOk());
  EXPECT_EQ(a->publish(descriptor("", "mine")).code(), StatusCode::kInvalidArgument);
}

TEST_F(EtcdMetadataTest, SegmentOfAnotherEngineIsRefused) {
  auto a = service();
  auto b = service();
  ASSERT_TRUE(a && b);
  ASSERT_THAT(a->claim_engine("e1"), IsOk());
  ASSERT_THAT(b->claim_engine("e2"), IsOk());
  ASSERT_THAT(a->publish(descriptor("shared", "e1")), IsOk());

  Status st = b->publish(descriptor("shared", "e2", 7));
  EXPECT_EQ(st.code(), StatusCode::kAlreadyExists);
  EXPECT_THAT(st.message(), HasSubstr("by engine 'e1'"));
  // Also when both engines are claimed by the same instance.
  ASSERT_THAT(a->claim_engine("e3"), IsOk());
  EXPECT_EQ(a->publish(descriptor("shared", "e3", 7)).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(b->lookup("shared")->engine, "e1");
  EXPECT_EQ(b->lookup("shared")->length_bytes, 1u << 20);
}

TEST_F(EtcdMetadataTest, WithdrawRemovesOnlyOwnSegments) {
  auto a = service();
  auto b = service();
  ASSERT_TRUE(a && b);
  ASSERT_THAT(a->claim_engine("e"), IsOk());
  ASSERT_THAT(a->publish(descriptor("s1", "e")), IsOk());
  ASSERT_THAT(a->publish(descriptor("s2", "e")), IsOk());

  Status foreign = b->withdraw("s1");
  EXPECT_EQ(foreign.code(), StatusCode::kNotFound);
  EXPECT_THAT(foreign.message(), HasSubstr("'s1' is not published by this process"));
  EXPECT_THAT(b->lookup("s1").status(), IsOk());

  ASSERT_THAT(a->withdraw("s1"), IsOk());
  EXPECT_EQ(b->lookup("s1").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(a->withdraw("s1").code(), StatusCode::kNotFound);
  EXPECT_THAT(b->lookup("s2").status(), IsOk());
}

TEST_F(EtcdMetadataTest, ListSegmentsIsSortedAndLimitedToThePrefix) {
  auto a = service();
  ASSERT_TRUE(a);
  EXPECT_THAT(a->list_segments().value(), IsEmpty());
  ASSERT_THAT(a->claim_engine("e"), IsOk());
  for (const char* name : {"c", "a", "b/kv", "a0"}) ASSERT_THAT(a->publish(descriptor(name, "e")), IsOk());

  // Neighbours that a sloppy prefix scan would include.
  auto sibling = make_etcd_metadata({.endpoint = endpoint(), .prefix = prefix_ + "x", .lease_ttl = 2s});
  ASSERT_TRUE(sibling.ok());
  ASSERT_THAT((*sibling)->claim_engine("e"), IsOk());
  ASSERT_THAT((*sibling)->publish(descriptor("zz", "e")), IsOk());
  raw_put(prefix_ + "/segments0", "{}");
  raw_put(prefix_ + "/segmentsX/y", "{}");

  auto names = a->list_segments();
  ASSERT_TRUE(names.ok()) << names.status().message();
  EXPECT_THAT(*names, ElementsAre("a", "a0", "b/kv", "c"));
  EXPECT_THAT((*sibling)->list_segments().value(), ElementsAre("zz"));

  // A trailing '/' in the prefix names the same keys.
  auto slashed = make_etcd_metadata({.endpoint = endpoint() + "/", .prefix = prefix_ + "/", .lease_ttl = 2s});
  ASSERT_TRUE(slashed.ok());
  EXPECT_THAT((*slashed)->list_segments().value(), ElementsAre("a", "a0", "b/kv", "c"));
}

TEST_F(EtcdMetadataTest, ReleaseRemovesClaimAndItsSegments) {
  auto a = service();
  auto b = service();
  ASSERT_TRUE(a && b);
  ASSERT_THAT(a->claim_engine("e"), IsOk());
  ASSERT_THAT(a->claim_engine("other"), IsOk());
  ASSERT_THAT(a->publish(descriptor("e/1", "e")), IsOk());
  ASSERT_THAT(a->publish(descriptor("e/2", "e")), IsOk());
  ASSERT_THAT(a->publish(descriptor("other/1", "other")), IsOk());

  ASSERT_THAT(a->release_engine("e"), IsOk());
  EXPECT_EQ(b->lookup("e/1").status().code(), StatusCode::kNotFound);
  EXPECT_EQ(b->lookup("e/2").status().code(), StatusCode::kNotFound);
  EXPECT_THAT(b->list_segments().value(), ElementsAre("other/1"));
  EXPECT_EQ(raw_lease(prefix_ + "/engines/e"), 0);  // key gone
  EXPECT_EQ(a->publish(descriptor("e/3", "e")).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(a->withdraw("e/1").code(), StatusCode::kNotFound);
  ASSERT_THAT(b->claim_engine("e"), IsOk());
  EXPECT_THAT(b->publish(descriptor("e/1", "e")), IsOk());
}

TEST_F(EtcdMetadataTest, DestructionRevokesTheLease) {
  auto a = service(30s);  // a TTL long enough that only the revoke can explain the keys' disappearance
  auto b = service();
  ASSERT_TRUE(a && b);
  ASSERT_THAT(a->claim_engine("e"), IsOk());
  ASSERT_THAT(a->publish(descriptor("s", "e")), IsOk());
  a.reset();
  EXPECT_EQ(b->lookup("s").status().code(), StatusCode::kNotFound);
  EXPECT_THAT(b->claim_engine("e"), IsOk());
}

TEST_F(EtcdMetadataTest, DescriptorsExpireOneTtlAfterTheOwnerDies) {
  const EtcdOptions owner_options = options(2s);
  int ready[2];
  ASSERT_EQ(pipe(ready), 0);
  pid_t owner = fork();  // no service (hence no thread) exists yet in this process
  ASSERT_GE(owner, 0);
  if (owner == 0) {
    close(ready[0]);
    auto meta = make_etcd_metadata(owner_options);
    bool ok = meta.ok() && (*meta)->claim_engine("owner").ok() &&
              (*meta)->publish(descriptor("owner/kv", "owner")).ok();
    char byte = ok ? '1' : '0';
    (void)!write(ready[1], &byte, 1);
    pause();  // the keepalive thread runs on until SIGKILL: an owner dying without cleaning up
    _exit(0);
  }
  close(ready[1]);
  char byte = 0;
  (void)!read(ready[0], &byte, 1);
  close(ready[0]);
  auto observer = service();
  if (byte != '1' || !observer) {
    kill(owner, SIGKILL);
    waitpid(owner, nullptr, 0);
    FAIL() << "the owner process could not claim and publish";
  }

  // Alive, its keepalives hold the lease beyond the TTL.
  std::this_thread::sleep_for(2500ms);
  EXPECT_THAT(observer->lookup("owner/kv").status(), IsOk());

  kill(owner, SIGKILL);
  waitpid(owner, nullptr, 0);
  auto gone = wait_until(
      [&] { return observer->lookup("owner/kv").status().code() == StatusCode::kNotFound; }, 2s + 3s);
  ASSERT_TRUE(gone.has_value()) << "descriptor still present 5 s after its owner died";
  // The last keepalive was at most ttl/3 before the kill; expiry comes a TTL after it, not at once.
  EXPECT_GT(seconds(*gone), 1.0);
  EXPECT_THAT(observer->claim_engine("owner"), IsOk());
}

TEST_F(EtcdMetadataTest, ClaimsAreRestoredWhenTheLeaseIsLost) {
  auto a = service(2s);
  auto b = service();
  ASSERT_TRUE(a && b);
  ASSERT_THAT(a->claim_engine("e"), IsOk());
  ASSERT_THAT(a->publish(descriptor("e/kv", "e")), IsOk());
  const int64_t lease = raw_lease(prefix_ + "/engines/e");
  ASSERT_NE(lease, 0);
  raw_revoke(lease);  // as if etcd had been unreachable for longer than the TTL
  EXPECT_EQ(b->lookup("e/kv").status().code(), StatusCode::kNotFound);

  // The keepalive thread notices within ttl/3 and re-creates the keys under a new lease.
  auto restored = wait_until([&] { return b->lookup("e/kv").ok(); }, 3s);
  ASSERT_TRUE(restored.has_value());
  const int64_t new_lease = raw_lease(prefix_ + "/engines/e");
  EXPECT_NE(new_lease, 0);
  EXPECT_NE(new_lease, lease);
  EXPECT_THAT(a->publish(descriptor("e/kv2", "e")), IsOk());
  EXPECT_EQ(b->claim_engine("e").code(), StatusCode::kAlreadyExists);
}

TEST_F(EtcdMetadataTest, ClaimTakenByAnotherOwnerAfterLeaseLossIsDropped) {
  auto a = service(30s);  // keepalive tick every 10 s: only the failed publish below can trigger the check
  auto b = service();
  ASSERT_TRUE(a && b);
  ASSERT_THAT(a->claim_engine("e"), IsOk());
  ASSERT_THAT(a->publish(descriptor("e/kv", "e")), IsOk());
  raw_revoke(raw_lease(prefix_ + "/engines/e"));
  ASSERT_THAT(b->claim_engine("e"), IsOk());  // free now: someone else takes the name

  Status st = a->publish(descriptor("e/kv2", "e"));
  EXPECT_EQ(st.code(), StatusCode::kUnavailable);
  EXPECT_THAT(st.message(), HasSubstr("lease not found"));
  auto dropped = wait_until(
      [&] { return a->publish(descriptor("e/kv3", "e")).code() == StatusCode::kFailedPrecondition; }, 3s);
  EXPECT_TRUE(dropped.has_value());
  EXPECT_EQ(a->withdraw("e/kv").code(), StatusCode::kNotFound);
  EXPECT_THAT(b->publish(descriptor("e/kv", "e")), IsOk());
  EXPECT_EQ(b->lookup("e/kv")->engine, "e");
}

TEST_F(EtcdMetadataTest, CorruptValuesAreInvalidArgument) {
  auto a = service();
  ASSERT_TRUE(a);
  raw_put(prefix_ + "/segments/garbage", "not json {");
  raw_put(prefix_ + "/segments/partial", R"({"name":"partial"})");
  raw_put(prefix_ + "/segments/renamed", descriptor("other", "e").to_json().dump());

  auto garbage = a->lookup("garbage");
  EXPECT_EQ(garbage.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(garbage.status().message(), HasSubstr("segment 'garbage' in etcd at " + endpoint()));
  EXPECT_THAT(garbage.status().message(), HasSubstr("not JSON"));
  auto partial = a->lookup("partial");
  EXPECT_EQ(partial.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(partial.status().message(), HasSubstr("'engine'"));
  auto renamed = a->lookup("renamed");
  EXPECT_EQ(renamed.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(renamed.status().message(), HasSubstr("segment 'other'"));
}

TEST_F(EtcdMetadataTest, ConcurrentEnginesShareOneInstance) {
  auto shared = service();
  auto reader = service();
  ASSERT_TRUE(shared && reader);
  constexpr int kEngines = 4;
  constexpr int kSegments = 4;
  std::vector<std::thread> threads;
  std::atomic<int> failures = 0;
  for (int e = 0; e < kEngines; ++e) {
    threads.emplace_back([&, e] {
      const std::string engine = "engine-" + std::to_string(e);
      if (!shared->claim_engine(engine).ok()) ++failures;
      for (int s = 0; s < kSegments; ++s) {
        const std::string name = engine + "/seg-" + std::to_string(s);
        if (!shared->publish(descriptor(name, engine)).ok()) ++failures;
        if (!reader->lookup(name).ok()) ++failures;
        if (!shared->list_segments().ok()) ++failures;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(reader->list_segments()->size(), static_cast<size_t>(kEngines * kSegments));
}

TEST(EtcdMetadataOptions, UnreachableEndpointIsUnavailableQuickly) {
  const int closed_port = free_ports(1)[0];  // nothing listens there
  const std::string endpoint = "http://127.0.0.1:" + std::to_string(closed_port);
  const auto start = Clock::now();
  auto r = make_etcd_metadata({.endpoint = endpoint, .request_timeout = 500ms});
  EXPECT_LT(seconds(Clock::now() - start), 1.0);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr(endpoint));
}

TEST(EtcdMetadataOptions, SilentServerTimesOutAsUnavailable) {
  // A socket that listens but never answers: connect succeeds, the read must time out.
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 4), 0);
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string endpoint = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  const auto start = Clock::now();
  auto r = make_etcd_metadata({.endpoint = endpoint, .request_timeout = 300ms});
  const double elapsed = seconds(Clock::now() - start);
  close(fd);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(r.status().message(), HasSubstr(endpoint));
  EXPECT_GE(elapsed, 0.25);
  EXPECT_LT(elapsed, 2.0);
}

TEST(EtcdMetadataOptions, MalformedSettingsAreInvalidArgument) {
  for (const char* endpoint :
       {"127.0.0.1:2379", "ftp://127.0.0.1:2379", "http://", "http://:2379", "http://127.0.0.1:99999",
        "http://127.0.0.1:port", "http://127.0.0.1:2379/v3", "http://[::1", "http://::1:2379"}) {
    auto r = make_etcd_metadata({.endpoint = endpoint});
    ASSERT_FALSE(r.ok()) << endpoint;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << endpoint;
    EXPECT_THAT(r.status().message(), HasSubstr(std::string("'") + endpoint + "'"));
  }
  auto zero_ttl = make_etcd_metadata({.lease_ttl = 0s});
  EXPECT_EQ(zero_ttl.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(zero_ttl.status().message(), HasSubstr("lease_ttl"));
  EXPECT_EQ(make_etcd_metadata({.request_timeout = 0ms}).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace crescent::transfer
