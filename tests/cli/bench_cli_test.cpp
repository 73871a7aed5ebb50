// End-to-end tests of `crescent bench transfer`: the JSON shape of a quick shm run, the human table, per-run
// errors that do not abort the bench, bad flag values (exit code 2, one error line), and that the target
// process never outlives the bench.
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "run_crescent.h"

namespace crescent::cli_test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

// Small memory per side, so first touches of fresh memory do not dominate the test's time.
const std::string kSmall = "--working-set 8MiB --seconds 0.05";

void expect_positive(const nlohmann::json& j, const char* key) {
  ASSERT_TRUE(j.contains(key)) << key << " missing in " << j.dump();
  ASSERT_TRUE(j[key].is_number()) << key << " in " << j.dump();
  EXPECT_GT(j[key].get<double>(), 0) << key;
}

// True when `pid` no longer runs (gone, or a zombie waiting for another parent).
bool process_gone(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  if (!std::getline(stat, line)) return true;
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

TEST(BenchCli, QuickShmRunPrintsTheJsonShape) {
  // A 32 MiB working set instead of 256 MiB: first touches of fresh memory are slow on this VM.
  CliRun run = run_crescent(
      "bench transfer --transports shm --block-sizes 64KiB --batch 4 --seconds 0.2 --working-set 32MiB "
      "--json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto j = nlohmann::json::parse(run.out);
  expect_positive(j["baselines"], "memcpy_gbps");
  expect_positive(j["baselines"], "tcp_loopback_gbps");
  for (const char* block : {"65536", "1048576"}) {  // the run's block size, and 1 MiB (the goals')
    ASSERT_TRUE(j["baselines"]["by_block_bytes"].contains(block)) << j["baselines"].dump();
    expect_positive(j["baselines"]["by_block_bytes"][block], "memcpy_gbps");
    expect_positive(j["baselines"]["by_block_bytes"][block], "tcp_loopback_gbps");
  }
  ASSERT_EQ(j["runs"].size(), 1u);
  const auto& r = j["runs"][0];
  EXPECT_EQ(r["transport"], "shm");
  EXPECT_EQ(r["block_bytes"], 65536);
  EXPECT_EQ(r["batch"], 4);
  EXPECT_EQ(r["threads"], 1);
  EXPECT_EQ(r["op"], "read");
  for (const char* key : {"gbps", "requests_per_s", "p50_us", "p99_us", "baseline_ratio", "verified_bytes"}) {
    expect_positive(r, key);
  }
  EXPECT_GE(r["p99_us"].get<double>(), r["p50_us"].get<double>());
  EXPECT_EQ(r["baseline"], "memcpy");
  EXPECT_FALSE(r.contains("error"));
  const pid_t target = j["config"]["target"]["pid"].get<pid_t>();
  EXPECT_GT(target, 0);
  EXPECT_TRUE(process_gone(target)) << "target " << target << " outlived the bench";
}

TEST(BenchCli, HumanOutputIsATableWithRatios) {
  CliRun run =
      run_crescent("bench transfer --transports shm --block-sizes 1MiB --batch 64 --op read,write " + kSmall);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("Baselines"));
  EXPECT_THAT(run.out, HasSubstr("% of memcpy"));
  EXPECT_THAT(run.out, HasSubstr("write"));
  EXPECT_THAT(run.out, HasSubstr("Goals (1 MiB blocks, batch 64, 1 thread, reads)"));
  EXPECT_THAT(run.out, HasSubstr("goal >= 60%"));
  EXPECT_EQ(run.err, "");  // progress goes to stderr only when it is a terminal
}

TEST(BenchCli, AFailingTransportIsAPerRunErrorNotAnAbort) {
  // No UCX transport is named "bogus": that run fails, the shm run still reports numbers.
  CliRun run =
      run_crescent("bench transfer --transports shm,ucx --ucx-tls bogus --block-sizes 4KiB --batch 2 " +
                   kSmall + " --json");
  EXPECT_EQ(run.exit_code, 1) << run.err;
  EXPECT_THAT(run.err, HasSubstr("error: 1 of 2 runs failed"));
  const auto j = nlohmann::json::parse(run.out);
  ASSERT_EQ(j["runs"].size(), 2u);
  EXPECT_EQ(j["runs"][0]["transport"], "shm");
  expect_positive(j["runs"][0], "gbps");
  EXPECT_EQ(j["runs"][1]["transport"], "ucx");
  EXPECT_EQ(j["runs"][1]["ucx_tls"], "bogus");
  EXPECT_TRUE(j["runs"][1]["gbps"].is_null());
  EXPECT_FALSE(j["runs"][1]["error"].get<std::string>().empty());
}

TEST(BenchCli, TargetDiesWithTheBench) {
  const pid_t bench = ::fork();
  ASSERT_GE(bench, 0);
  if (bench == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::dup2(null, 2);
    ::execl(CRESCENT_BINARY, "crescent", "bench", "transfer", "--transports", "shm", "--block-sizes", "4KiB",
            "--batch", "1", "--working-set", "4MiB", "--seconds", "30", nullptr);
    ::_exit(127);
  }
  // Find the target: the bench's child process.
  pid_t target = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (target == 0 && std::chrono::steady_clock::now() < deadline) {
    for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
      std::ifstream stat(entry.path() / "stat");
      std::string line;
      if (!std::getline(stat, line)) continue;
      const size_t paren = line.rfind(')');
      if (paren == std::string::npos) continue;
      std::istringstream rest(line.substr(paren + 2));
      std::string state;
      pid_t ppid = 0;
      rest >> state >> ppid;
      if (ppid == bench) target = std::stoi(entry.path().filename().string());
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  ::kill(bench, SIGKILL);
  ::waitpid(bench, nullptr, 0);
  ASSERT_GT(target, 0) << "the bench started no target process";
  const auto gone_by = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (!process_gone(target) && std::chrono::steady_clock::now() < gone_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(process_gone(target)) << "target " << target << " outlived a killed bench";
  // The killed bench could not remove its metadata directory (the next bench would).
  for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::temp_directory_path())) {
    if (entry.path().filename().string().rfind("crescent-bench-" + std::to_string(bench) + "-", 0) == 0) {
      std::filesystem::remove_all(entry.path());
    }
  }
}

struct BadFlag {
  std::string args;
  std::string needle;
};

class BenchCliBadFlag : public ::testing::TestWithParam<BadFlag> {};

TEST_P(BenchCliBadFlag, ExitsTwoWithOneErrorLine) {
  CliRun run = run_crescent("bench transfer " + GetParam().args);
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_THAT(run.err, StartsWith("error: "));
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  EXPECT_THAT(run.err, HasSubstr(GetParam().needle));
  EXPECT_EQ(run.out, "");
}

INSTANTIATE_TEST_SUITE_P(
    Flags, BenchCliBadFlag,
    ::testing::Values(BadFlag{"--block-sizes 4XB", "--block-sizes: '4XB' is not a size"},
                      BadFlag{"--block-sizes 0", "--block-sizes: '0' is outside"},
                      BadFlag{"--block-sizes 4KiB,,1MiB", "--block-sizes: empty item"},
                      BadFlag{"--batch 0", "--batch: '0' is not an integer"},
                      BadFlag{"--batch 12x", "--batch: '12x'"}, BadFlag{"--threads -1", "--threads: '-1'"},
                      BadFlag{"--transports tcp,rdma", "unknown transport 'rdma'"},
                      BadFlag{"--transports shm,shm", "'shm' listed twice"},
                      BadFlag{"--seconds abc", "--seconds: 'abc'"}, BadFlag{"--seconds 0", "--seconds: '0'"},
                      BadFlag{"--op copy", "--op: 'copy'"}, BadFlag{"--working-set 1KiB", "--working-set"},
                      BadFlag{"--block-sizes 64MiB --batch 64", "exceeds the 1 GiB limit"}));

}  // namespace
}  // namespace crescent::cli_test
