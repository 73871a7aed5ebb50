// The Redis baseline: short get and put runs of the load driver against a redis-server started for the
// test, the server gone after destruction, and a bad op refused.
#include "bench/redis_baseline.h"

#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

namespace crescent::bench {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

bool port_accepts(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(port);
  const bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
  ::close(fd);
  return ok;
}

TEST(RedisBaselineTest, RedisGetAndPutRunsThenServerStops) {
  Result<std::unique_ptr<RedisServer>> server = RedisServer::start();
  ASSERT_TRUE(server.ok()) << server.status().message();
  const uint16_t port = (*server)->port();
  EXPECT_TRUE(port_accepts(port));
  for (const char* op : {"get", "put"}) {
    const KvRunSpec spec{
        .system = "redis", .op = op, .value_bytes = 4096, .threads = 2, .batch = 4, .duration = 200ms};
    const KvRunResult r = drive_kv_load(spec, [&](int i) { return make_redis_worker(port, spec, i); });
    EXPECT_EQ(r.error, "") << op;
    EXPECT_GT(r.ops, 0u) << op;
    EXPECT_EQ(r.ops % spec.batch, 0u) << op;
    EXPECT_EQ(r.bytes, r.ops * spec.value_bytes) << op;
    EXPECT_GT(r.seconds, 0) << op;
    EXPECT_GT(r.gbps, 0) << op;
    EXPECT_LE(r.p50_us, r.p99_us) << op;
  }
  server->reset();
  EXPECT_FALSE(port_accepts(port));
}

TEST(RedisBaselineTest, BadOpIsRefused) {
  const KvRunSpec spec{.system = "redis", .op = "delete", .value_bytes = 8, .threads = 1, .batch = 1};
  EXPECT_THAT(make_redis_worker(1, spec, 0).status().message(), HasSubstr("'delete'"));
}

}  // namespace
}  // namespace crescent::bench
