#include "common/compute_thread.h"

#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <thread>

namespace crescent {
namespace {

// The job runs on another thread while `wait` runs on the caller's, which sees the job's end through the
// descriptor and not before; the job's effects are visible once run() returns, run after run.
TEST(ComputeThread, WaitServesTheCallerUntilTheJobIsDone) {
  ComputeThread compute;
  ASSERT_GE(compute.done_fd(), 0);
  const std::thread::id caller = std::this_thread::get_id();
  for (int round = 0; round < 50; ++round) {
    std::atomic<bool> release{false};
    std::thread::id job_thread, wait_thread;
    int result = 0, polls_before_done = 0;
    compute.run(
        [&] {
          job_thread = std::this_thread::get_id();
          while (!release) std::this_thread::yield();
          result = round + 1;
        },
        [&](int done_fd) {
          wait_thread = std::this_thread::get_id();
          pollfd fd{.fd = done_fd, .events = POLLIN, .revents = 0};
          // Not done while the job is held; once released, done.
          for (int i = 0; i < 3; ++i) {
            EXPECT_EQ(::poll(&fd, 1, 1), 0) << "done before the job ended";
            ++polls_before_done;
          }
          release = true;
          ASSERT_EQ(::poll(&fd, 1, 10'000), 1);
        });
    EXPECT_EQ(result, round + 1);
    EXPECT_EQ(polls_before_done, 3);
    EXPECT_NE(job_thread, caller);
    EXPECT_EQ(wait_thread, caller);
  }
}

TEST(ComputeThread, OnStartRunsOnTheThreadBeforeAnyJob) {
  std::thread::id start_thread, job_thread;
  ComputeThread compute([&] { start_thread = std::this_thread::get_id(); });
  compute.run([&] { job_thread = std::this_thread::get_id(); },
              [](int done_fd) {
                pollfd fd{.fd = done_fd, .events = POLLIN, .revents = 0};
                ASSERT_EQ(::poll(&fd, 1, 10'000), 1);
              });
  EXPECT_EQ(start_thread, job_thread);
  EXPECT_NE(job_thread, std::this_thread::get_id());
}

}  // namespace
}  // namespace crescent
