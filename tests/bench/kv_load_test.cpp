// The key-value load driver: the timed window counts whole batches of every thread's calls after the
// warm-up; a worker's error stops every thread and reaches the result, and so does an
// error setting a worker up.
#include "bench/kv_load.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>
#include <thread>

namespace crescent::bench {
namespace {

using ::testing::HasSubstr;
using namespace std::chrono_literals;

TEST(KvLoadTest, CountsWholeBatchesOfTheTimedWindow) {
  const KvRunSpec spec{
      .system = "fake", .op = "get", .value_bytes = 100, .threads = 2, .batch = 4, .duration = 100ms};
  std::atomic<uint64_t> calls{0};
  std::atomic<int> made{0};
  const KvRunResult r = drive_kv_load(spec, [&](int) -> Result<KvWorker> {
    ++made;
    return KvWorker([&] {
      std::this_thread::sleep_for(1ms);
      ++calls;
      return Status();
    });
  });
  EXPECT_EQ(r.error, "");
  EXPECT_EQ(made.load(), 2);
  EXPECT_GT(r.ops, 0u);
  EXPECT_EQ(r.ops % spec.batch, 0u);
  EXPECT_EQ(r.bytes, r.ops * spec.value_bytes);
  // Every timed call was made, and at least 3 warm-up calls per thread before them.
  EXPECT_LE(r.ops / spec.batch + 2 * 3, calls.load());
  EXPECT_GE(r.seconds, 0.09);
  EXPECT_DOUBLE_EQ(r.ops_per_s, static_cast<double>(r.ops) / r.seconds);
  EXPECT_GE(r.p50_us, 1000);  // each call sleeps 1 ms
  EXPECT_LE(r.p50_us, r.p99_us);
}

TEST(KvLoadTest, WorkerErrorStopsTheRun) {
  const KvRunSpec spec{
      .system = "fake", .op = "put", .value_bytes = 8, .threads = 2, .batch = 1, .duration = 10s};
  const KvRunResult r = drive_kv_load(spec, [](int) -> Result<KvWorker> {
    auto calls = std::make_shared<int>(0);
    return KvWorker([calls] { return ++*calls == 3 ? Status::internal("failed on call 3") : Status(); });
  });
  EXPECT_THAT(r.error, HasSubstr("failed on call 3"));
  EXPECT_EQ(r.ops, 0u);
}

TEST(KvLoadTest, SetupErrorEndsTheRun) {
  const KvRunSpec spec{
      .system = "fake", .op = "put", .value_bytes = 8, .threads = 2, .batch = 1, .duration = 10s};
  const KvRunResult r = drive_kv_load(spec, [](int i) -> Result<KvWorker> {
    if (i == 1) return Status::unavailable("no connection");
    return KvWorker([] { return Status(); });
  });
  EXPECT_THAT(r.error, HasSubstr("no connection"));
}

}  // namespace
}  // namespace crescent::bench
