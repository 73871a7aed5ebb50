// EtcdClient against a real etcd (test_support/etcd_server.h: one server per suite, one key prefix per
// test), and its endpoint parsing and encoding helpers without one.
#include "common/etcd_client.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "test_support/etcd_server.h"

namespace crescent {
// Prints a Status as its message in gtest failures (instead of its bytes).
void PrintTo(const Status& status, std::ostream* os) {
  *os << status.to_string();
}
}  // namespace crescent

namespace crescent {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

MATCHER(IsOk, "is ok") {
  return arg.ok();
}

class EtcdClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { etcd_ = std::make_unique<test::EtcdServer>(); }
  static void TearDownTestSuite() { etcd_.reset(); }

  void SetUp() override {
    if (!etcd_->skip_reason().empty()) GTEST_SKIP() << etcd_->skip_reason();
    ASSERT_TRUE(etcd_->error().empty()) << etcd_->error();
    prefix_ = std::string("/crescent-client-test/") +
              ::testing::UnitTest::GetInstance()->current_test_info()->name() + "/";
    auto client = EtcdClient::create(etcd_->endpoint(), 2000ms);
    ASSERT_TRUE(client.ok()) << client.status().message();
    client_.emplace(std::move(*client));
  }

  /// `name` under this test's prefix.
  std::string key(const std::string& name) const { return prefix_ + name; }

  /// A lease long enough that only a revoke ends it within a test.
  int64_t grant() const {
    auto lease = client_->grant_lease(30s);
    EXPECT_TRUE(lease.ok()) << lease.status().message();
    return lease.ok() ? *lease : 0;
  }

  static inline std::unique_ptr<test::EtcdServer> etcd_;

  std::string prefix_;
  std::optional<EtcdClient> client_;
};

TEST_F(EtcdClientTest, CreateIfAbsentCreatesThenRefusesWithTheExistingValue) {
  const std::string k = key("leader");
  auto absent = client_->get(k);
  ASSERT_TRUE(absent.ok()) << absent.status().message();
  EXPECT_FALSE(absent->has_value());

  auto created = client_->create_if_absent(k, "10.0.0.1:7000", 0);
  ASSERT_TRUE(created.ok()) << created.status().message();
  EXPECT_TRUE(*created);

  std::optional<EtcdKeyValue> existing;
  auto again = client_->create_if_absent(k, "10.0.0.2:7000", 0, &existing);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_FALSE(*again);
  ASSERT_TRUE(existing.has_value());
  EXPECT_EQ(existing->value, "10.0.0.1:7000");
  EXPECT_EQ(existing->lease, 0);
  EXPECT_FALSE(client_->create_if_absent(k, "10.0.0.3:7000", 0).value());  // without `existing` too

  auto got = client_->get(k);
  ASSERT_TRUE(got.ok()) << got.status().message();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->value, "10.0.0.1:7000");
  EXPECT_EQ((*got)->lease, 0);
  EXPECT_GT((*got)->mod_revision, 0);
  EXPECT_EQ((*got)->create_revision, (*got)->mod_revision);  // never overwritten

  // Keys and values are bytes: NULs, 0xff and an empty value survive the gateway's base64.
  const std::string bytes("\0\xff\x01z", 4);
  ASSERT_TRUE(client_->create_if_absent(key(bytes), bytes, 0).value());
  EXPECT_EQ(client_->get(key(bytes))->value().value, bytes);
  ASSERT_TRUE(client_->create_if_absent(key("empty"), "", 0).value());
  auto empty = client_->get(key("empty"));
  ASSERT_TRUE(empty.ok() && empty->has_value());
  EXPECT_EQ((*empty)->value, "");
}

TEST_F(EtcdClientTest, RevokedLeaseTakesItsKeysAndEndsKeepAlive) {
  const int64_t lease = grant();
  ASSERT_NE(lease, 0);
  const std::string k = key("leader");
  ASSERT_TRUE(client_->create_if_absent(k, "me", lease).value());
  EXPECT_EQ(client_->get(k)->value().lease, lease);

  auto alive = client_->keep_alive(lease);
  ASSERT_TRUE(alive.ok()) << alive.status().message();
  EXPECT_TRUE(*alive);

  ASSERT_THAT(client_->revoke_lease(lease), IsOk());
  auto gone = client_->get(k);
  ASSERT_TRUE(gone.ok()) << gone.status().message();
  EXPECT_FALSE(gone->has_value());
  auto dead = client_->keep_alive(lease);
  ASSERT_TRUE(dead.ok()) << dead.status().message();
  EXPECT_FALSE(*dead);
  EXPECT_TRUE(client_->create_if_absent(k, "someone else", 0).value());  // the name is free again
}

TEST_F(EtcdClientTest, DeleteIfLeaseRefusesAnotherLease) {
  const int64_t mine = grant();
  const int64_t theirs = grant();
  ASSERT_TRUE(mine != 0 && theirs != 0);
  const std::string k = key("leader");
  ASSERT_TRUE(client_->create_if_absent(k, "them", theirs).value());

  auto refused = client_->delete_if_lease(k, mine);
  ASSERT_TRUE(refused.ok()) << refused.status().message();
  EXPECT_FALSE(*refused);
  EXPECT_FALSE(client_->delete_if_lease(k, 0).value());  // 0 means "no lease", which is not this key's
  EXPECT_EQ(client_->get(k)->value().value, "them");

  EXPECT_TRUE(client_->delete_if_lease(k, theirs).value());
  EXPECT_FALSE(client_->get(k)->has_value());
  EXPECT_FALSE(client_->delete_if_lease(k, theirs).value());  // absent

  // Lease 0 matches keys without a lease, and still not an absent one.
  ASSERT_TRUE(client_->create_if_absent(k, "nobody's", 0).value());
  EXPECT_FALSE(client_->delete_if_lease(k, mine).value());
  EXPECT_TRUE(client_->delete_if_lease(k, 0).value());
  EXPECT_FALSE(client_->delete_if_lease(k, 0).value());

  EXPECT_THAT(client_->revoke_lease(mine), IsOk());
  EXPECT_THAT(client_->revoke_lease(theirs), IsOk());
}

TEST_F(EtcdClientTest, LeaseNotFoundIsUnavailableAndRunsTheCallback) {
  EtcdClient client = *client_;
  int lost = 0;
  client.set_lease_lost_callback([&] { ++lost; });
  const int64_t lease = grant();
  ASSERT_NE(lease, 0);
  ASSERT_THAT(client.revoke_lease(lease), IsOk());
  EXPECT_EQ(lost, 0);

  auto put = client.create_if_absent(key("leader"), "me", lease);
  ASSERT_FALSE(put.ok());
  EXPECT_EQ(put.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(put.status().message(), HasSubstr("requested lease not found"));
  EXPECT_THAT(put.status().message(), HasSubstr(etcd_->endpoint()));
  EXPECT_EQ(lost, 1);
  EXPECT_FALSE(client.keep_alive(lease).value());  // an answer, not an error: no callback
  EXPECT_FALSE(client.get(key("leader"))->has_value());
  EXPECT_EQ(lost, 1);
  EXPECT_EQ(client.revoke_lease(lease).code(), StatusCode::kUnavailable);  // already gone
  EXPECT_EQ(lost, 2);
}

TEST_F(EtcdClientTest, ListKeysIsLimitedToThePrefix) {
  for (const char* name : {"c", "a", "b/x", "a0"})
    ASSERT_TRUE(client_->create_if_absent(key(name), "", 0).value());
  // Neighbours that a sloppy prefix scan would include: the prefix without its '/', then '0' (= '/' + 1).
  const std::string bare = prefix_.substr(0, prefix_.size() - 1);
  ASSERT_TRUE(client_->create_if_absent(bare, "", 0).value());
  ASSERT_TRUE(client_->create_if_absent(bare + "0", "", 0).value());

  auto keys = client_->list_keys(prefix_);
  ASSERT_TRUE(keys.ok()) << keys.status().message();
  EXPECT_THAT(*keys, ElementsAre(key("a"), key("a0"), key("b/x"), key("c")));
  EXPECT_THAT(client_->list_keys(key("nothing")).value(), ElementsAre());
}

TEST_F(EtcdClientTest, TransactionReportsTheFailureBranch) {
  const std::string k = key("k");
  ASSERT_TRUE(client_->create_if_absent(k, "v", 0).value());
  auto txn = client_->transaction({EtcdClient::compare_absent(k)}, {EtcdClient::delete_op(k)},
                                  {EtcdClient::range_op(k)});
  ASSERT_TRUE(txn.ok()) << txn.status().message();
  EXPECT_FALSE(txn->succeeded);
  auto kv = EtcdClient::first_kv(txn->response(0));
  ASSERT_TRUE(kv.ok() && kv->has_value());
  EXPECT_EQ((*kv)->value, "v");
  EXPECT_EQ(txn->response(1), nlohmann::json::object());  // no such op
}

TEST(EtcdClientOffline, UnreachableEndpointIsUnavailable) {
  const std::string endpoint = "http://127.0.0.1:" + std::to_string(test::free_ports(1)[0]);  // nobody there
  auto client = EtcdClient::create(endpoint, 500ms);
  ASSERT_TRUE(client.ok()) << client.status().message();  // create does not contact etcd
  EXPECT_EQ(client->endpoint(), endpoint);

  auto got = client->get("/k");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kUnavailable);
  EXPECT_THAT(got.status().message(), HasSubstr("etcd at " + endpoint + " cannot be reached"));
  EXPECT_EQ(client->grant_lease(5s).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(client->keep_alive(1).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(client->revoke_lease(1).code(), StatusCode::kUnavailable);
  EXPECT_EQ(client->create_if_absent("/k", "v", 0).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(client->delete_if_lease("/k", 1).status().code(), StatusCode::kUnavailable);
  EXPECT_EQ(client->list_keys("/").status().code(), StatusCode::kUnavailable);
}

TEST(EtcdClientOffline, MalformedEndpointIsInvalidArgument) {
  for (const char* endpoint :
       {"127.0.0.1:2379", "ftp://127.0.0.1:2379", "http://", "http://:2379", "http://127.0.0.1:99999",
        "http://127.0.0.1:port", "http://127.0.0.1:2379/v3", "http://[::1", "http://::1:2379", ""}) {
    auto r = EtcdClient::create(endpoint, 1000ms);
    ASSERT_FALSE(r.ok()) << endpoint;
    EXPECT_EQ(r.status().code(), StatusCode::kInvalidArgument) << endpoint;
    EXPECT_THAT(r.status().message(),
                HasSubstr(std::string("etcd endpoint '") + endpoint + "' is malformed"));
  }
  for (const char* endpoint : {"http://127.0.0.1:2379/", "https://etcd.example", "http://[::1]:2379"}) {
    auto r = EtcdClient::create(endpoint, 1000ms);
    ASSERT_TRUE(r.ok()) << endpoint << ": " << r.status().message();
    EXPECT_EQ(r->endpoint(), endpoint);
  }
  auto no_timeout = EtcdClient::create("http://127.0.0.1:2379", 0ms);
  EXPECT_EQ(no_timeout.status().code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(no_timeout.status().message(), HasSubstr("request_timeout"));
  EXPECT_EQ(EtcdClient::create("http://127.0.0.1:2379", 1000ms)->grant_lease(0s).status().code(),
            StatusCode::kInvalidArgument);
}

TEST(EtcdClientOffline, EncodingHelpers) {
  EXPECT_EQ(EtcdClient::prefix_range_end("a/"), "a0");
  EXPECT_EQ(EtcdClient::prefix_range_end("a\xff"), "b");
  EXPECT_EQ(EtcdClient::prefix_range_end("\xff\xff"), std::string(1, '\0'));
  EXPECT_EQ(EtcdClient::prefix_range_end(""), std::string(1, '\0'));

  EXPECT_EQ(EtcdClient::base64_encode("ab"), "YWI=");
  std::string all;
  for (int c = 0; c < 256; ++c) all += static_cast<char>(c);
  for (size_t n : {0, 1, 2, 3, 4, 5, 256}) {
    const std::string bytes = all.substr(0, n);
    EXPECT_EQ(EtcdClient::base64_decode(EtcdClient::base64_encode(bytes)).value(), bytes) << n;
  }
  EXPECT_EQ(EtcdClient::base64_decode("abc").status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(EtcdClient::base64_decode("a*c=").status().code(), StatusCode::kInvalidArgument);

  EXPECT_EQ(EtcdClient::int64_field({{"ID", "7587869125498730530"}}, "ID"), 7587869125498730530);
  EXPECT_EQ(EtcdClient::int64_field({{"TTL", 5}}, "TTL"), 5);
  EXPECT_EQ(EtcdClient::int64_field({{"TTL", 5}}, "ID"), 0);
}

}  // namespace
}  // namespace crescent
