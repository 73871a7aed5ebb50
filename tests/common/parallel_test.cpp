// parallel_for: every index once, calls really at once, errors brought back to the caller.
#include "common/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

namespace crescent {
namespace {

TEST(ParallelFor, CallsEachIndexOnce) {
  for (const unsigned threads : {0u, 1u, 2u, 3u, 16u}) {
    for (const size_t count : {size_t{0}, size_t{1}, size_t{2}, size_t{7}, size_t{1000}}) {
      std::vector<std::atomic<int>> calls(count);
      parallel_for(count, threads, [&](size_t i) { calls[i].fetch_add(1); });
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(calls[i].load(), 1) << threads << " threads, index " << i;
    }
  }
}

// Two calls that each wait for the other can only both finish when they run at the same time.
TEST(ParallelFor, RunsCallsAtOnce) {
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  bool met = true;
  parallel_for(2, 2, [&](size_t) {
    std::unique_lock lock(mu);
    ++arrived;
    cv.notify_all();
    if (!cv.wait_for(lock, std::chrono::seconds(30), [&] { return arrived == 2; })) met = false;
  });
  EXPECT_TRUE(met);
  EXPECT_EQ(arrived, 2);
}

TEST(ParallelFor, OneThreadRunsOnTheCaller) {
  const auto caller = std::this_thread::get_id();
  bool elsewhere = false;
  parallel_for(5, 1, [&](size_t) { elsewhere |= std::this_thread::get_id() != caller; });
  EXPECT_FALSE(elsewhere);
}

TEST(ParallelFor, RethrowsACallsExceptionAfterTheOthersFinish) {
  std::atomic<int> running{0}, finished{0};
  EXPECT_THROW(parallel_for(4, 2,
                            [&](size_t i) {
                              ++running;
                              if (i == 1) throw std::runtime_error("index 1");
                              std::this_thread::sleep_for(std::chrono::milliseconds(20));
                              ++finished;
                              --running;
                            }),
               std::runtime_error);
  EXPECT_EQ(running.load(), 1);  // only the call that threw never finished: none is left running
  EXPECT_GE(finished.load(), 1);
}

TEST(ParallelFor, DefaultParallelismIsAtLeastOne) {
  EXPECT_GE(default_parallelism(), 1u);
}

}  // namespace
}  // namespace crescent
