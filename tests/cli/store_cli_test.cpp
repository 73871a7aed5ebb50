// `crescent store` from a shell (issue 22 §2): the pool's master and nodes admit only the cluster's members,
// so the shell commands need its secret, and a stranger on the same host can neither read a user's KV nor
// rewrite or empty the pool.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>

#include "common/child_process.h"
#include "common/secret.h"
#include "run_crescent.h"
#include "test_support/temp_dir.h"

namespace crescent::cli_test {
namespace {

using ::testing::HasSubstr;

TEST(StoreCli, TheShellCommandsNeedTheClusterSecretAndStrangersChangeNothing) {
  test::TempDir dir("crescent-store-cli");
  const std::string secret = dir.file("cluster-secret");
  const std::string stranger_secret = dir.file("stranger-secret");
  ASSERT_TRUE(ClusterSecret::generate().write_to(secret).ok());
  ASSERT_TRUE(ClusterSecret::generate().write_to(stranger_secret).ok());
  auto master = ChildProcess::start(
      {CRESCENT_BINARY, "store", "master", "--listen", "127.0.0.1:0", "--metrics", "", "--transfer-metadata",
       "dir:" + dir.file("metadata"), "--cluster-secret-file", secret},
      dir.file("master.log"));
  ASSERT_TRUE(master.ok());
  auto line = (*master)->wait_for_line("store master on ", std::chrono::seconds(20));
  ASSERT_TRUE(line.ok()) << line.status().message();
  const size_t at = line->find("on ") + 3;
  const std::string address = line->substr(at, line->find(' ', at) - at);
  auto node = ChildProcess::start({CRESCENT_BINARY, "store", "node", "--master", address, "--dram", "16MiB",
                                   "--metrics", "", "--cluster-secret-file", secret},
                                  dir.file("node.log"));
  ASSERT_TRUE(node.ok());
  ASSERT_TRUE((*node)->wait_for_line("store node: segment", std::chrono::seconds(20)).ok())
      << (*node)->log_tail();
  {
    std::ofstream(dir.file("value")) << "a user's KV";
    std::ofstream(dir.file("forged")) << "someone else's bytes";
  }
  const std::string master_flag = " --master " + address + " ";
  const std::string member = master_flag + "--cluster-secret-file " + quote(secret) + " ";
  const std::string stranger = master_flag + "--cluster-secret-file " + quote(stranger_secret) + " ";

  // No secret at all: refused before anything is sent.
  CliRun run = run_crescent("store get kv/0001" + master_flag + "--file " + quote(dir.file("out")));
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err,
              HasSubstr("--cluster-secret-file FILE (or $CRESCENT_CLUSTER_SECRET_FILE) is required"));

  run = run_crescent("store put kv/0001 --file " + quote(dir.file("value")) + member);
  ASSERT_EQ(run.exit_code, 0) << run.err;

  // Another cluster's secret: every command refused, naming why; the pool unchanged.
  for (const std::string& command :
       {"store get kv/0001 --file " + quote(dir.file("stolen")), std::string("store rm kv/0001"),
        std::string("store rm --all"), "store put kv/0002 --file " + quote(dir.file("forged")),
        std::string("store stat")}) {
    run = run_crescent(command + stranger);
    EXPECT_EQ(run.exit_code, 1) << command;
    EXPECT_THAT(run.err, HasSubstr("not a member of this cluster")) << command;
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("stolen")));
  run = run_crescent("store get kv/0001 --file " + quote(dir.file("out")) + member);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::ifstream out(dir.file("out"));
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(out), {}), "a user's KV");
  run = run_crescent("store get kv/0002 --file " + quote(dir.file("out2")) + member);
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, HasSubstr("not found"));

  // The secret through the environment, as an operator sets it once.
  run = run_shell("CRESCENT_CLUSTER_SECRET_FILE=" + quote(secret) + " " + quote(CRESCENT_BINARY) +
                  " store put kv/0003 --file " + quote(dir.file("value")) + master_flag);
  EXPECT_EQ(run.exit_code, 0) << run.err;
}

// Every duration of the master is a flag, checked before it listens: 0 is refused, naming the setting.
TEST(StoreCli, AMasterDurationOfZeroIsRefusedNamingIt) {
  test::TempDir dir("crescent-store-cli");
  const std::string secret = dir.file("cluster-secret");
  ASSERT_TRUE(ClusterSecret::generate().write_to(secret).ok());
  const std::string common = "store master --listen 127.0.0.1:0 --metrics '' --transfer-metadata dir:" +
                             quote(dir.file("metadata")) + " --cluster-secret-file " + quote(secret) + " ";
  for (const std::string flag : {"--lease-ttl-ms", "--segment-ttl-ms", "--placement-stale-after-ms",
                                 "--put-timeout-ms"}) {
    const CliRun run = run_crescent(common + flag + " 0");
    EXPECT_EQ(run.exit_code, 2) << flag << ": " << run.err;
    std::string setting = flag.substr(2, flag.size() - 5);  // "--lease-ttl-ms" -> "lease-ttl"
    std::replace(setting.begin(), setting.end(), '-', '_');
    EXPECT_THAT(run.err, HasSubstr(setting + " must be > 0 ms, got 0")) << flag;
  }
}

}  // namespace
}  // namespace crescent::cli_test
