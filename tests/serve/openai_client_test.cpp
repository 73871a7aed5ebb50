// `crescent serve` as a user runs it, driven by the official OpenAI Node client (tests/serve/openai_client,
// installed by scripts/install-deps.sh): streamed chat and completion, a prefix hit, a 404.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "common/child_process.h"
#include "test_support/temp_dir.h"

namespace crescent {
namespace {

const std::string kClientDir = CRESCENT_SOURCE_DIR "/tests/serve/openai_client";

TEST(OpenAiClient, TheOfficialNodeClientStreamsAndSeesAPrefixHit) {
  ASSERT_TRUE(std::filesystem::exists(kClientDir + "/node_modules/openai"))
      << "the openai npm package is missing: run scripts/install-deps.sh (npm ci in " << kClientDir << ")";
  test::TempDir dir;
  auto server = ChildProcess::start({CRESCENT_BINARY, "serve", "--port", "0"}, dir.file("serve.log"));
  ASSERT_TRUE(server.ok()) << server.status().message();
  auto line = (*server)->wait_for_line("crescent serve: model", std::chrono::seconds(10));
  ASSERT_TRUE(line.ok()) << line.status().message();
  std::smatch port;
  ASSERT_TRUE(std::regex_search(*line, port, std::regex(R"(http://127\.0\.0\.1:(\d+))"))) << *line;

  const std::string log = dir.file("client.log");
  const std::string command = "node " + kClientDir + "/client_test.mjs http://127.0.0.1:" + port[1].str() +
                              "/v1 mock > " + log + " 2>&1";
  const int status = std::system(command.c_str());
  std::ifstream in(log);
  std::stringstream output;
  output << in.rdbuf();
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << command << "\n" << output.str();
  EXPECT_THAT(output.str(), ::testing::HasSubstr("openai client ok"));
  (*server)->stop();
}

}  // namespace
}  // namespace crescent
