#include "common/child_process.h"

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "common/temp_dir.h"

namespace crescent {
namespace {

// Waits (up to 5 s) until `child` has exited and been reaped.
void wait_exit(ChildProcess& child) {
  for (int i = 0; i < 500 && child.running(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_FALSE(child.running());
}

// The supervisor restarts a child that exited 0 (a drain asked for) without counting it as a crash: only exit
// status 0 counts as clean, not another code, nor a signal.
TEST(ChildProcess, OnlyExitStatusZeroIsAStopThatWasAskedFor) {
  auto dir = TempDir::create("child-process-test");
  ASSERT_TRUE(dir.ok());
  const std::string log = dir->path() + "/log";
  auto clean = ChildProcess::start({"/bin/sh", "-c", "exit 0"}, log);
  ASSERT_TRUE(clean.ok()) << clean.status().to_string();
  EXPECT_FALSE((*clean)->exited_cleanly()) << "not before it is reaped";
  wait_exit(**clean);
  EXPECT_TRUE((*clean)->exited_cleanly());

  auto failed = ChildProcess::start({"/bin/sh", "-c", "exit 3"}, log);
  ASSERT_TRUE(failed.ok());
  wait_exit(**failed);
  EXPECT_FALSE((*failed)->exited_cleanly());

  auto killed = ChildProcess::start({"/bin/sleep", "30"}, log);
  ASSERT_TRUE(killed.ok());
  (*killed)->kill();
  EXPECT_FALSE((*killed)->exited_cleanly());
}

}  // namespace
}  // namespace crescent
