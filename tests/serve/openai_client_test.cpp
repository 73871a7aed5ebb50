// `crescent serve` as a user runs it, driven by the official OpenAI Node client (tests/serve/openai_client,
// installed by scripts/install-deps.sh): streamed chat and completion, a prefix hit, a 404.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "served_cluster.h"
#include "test_support/temp_dir.h"

namespace crescent {
namespace {

const std::string kClientDir = CRESCENT_SOURCE_DIR "/tests/serve/openai_client";

TEST(OpenAiClient, TheOfficialNodeClientStreamsAndSeesAPrefixHit) {
  ASSERT_TRUE(std::filesystem::exists(kClientDir + "/node_modules/openai"))
      << "the openai npm package is missing: run scripts/install-deps.sh (npm ci in " << kClientDir << ")";
  ServedCluster server;
  ASSERT_GT(server.port(), 0) << server.log();

  test::TempDir dir;
  const std::string log = dir.file("client.log");
  const std::string command = "node " + kClientDir +
                              "/client_test.mjs http://127.0.0.1:" + std::to_string(server.port()) +
                              "/v1 mock > " + log + " 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(log);
  std::stringstream output;
  output << in.rdbuf();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command << "\n" << output.str();
  EXPECT_THAT(output.str(), ::testing::HasSubstr("openai client ok"));
}

}  // namespace
}  // namespace crescent
