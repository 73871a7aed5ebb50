// `crescent profile --url` against the engine stand-in (tests/router/engine_standin.py, a fake vLLM whose
// prefill takes prefill_base_s + uncached tokens × prefill_s_per_token and whose tokens stream one every
// decode_step_s): the fitted profile gives back the stand-in's parameters, and an engine that cannot be
// profiled (not there, not answering, serving another model, refusing the prompts) is an error naming it.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/child_process.h"
#include "run_crescent.h"
#include "test_support/etcd_server.h"  // free_ports
#include "test_support/temp_dir.h"

namespace crescent::cli_test {
namespace {

using ::testing::HasSubstr;

constexpr const char* kStandin = CRESCENT_SOURCE_DIR "/tests/router/engine_standin.py";
constexpr const char* kModel = "standin-model";
// The stand-in's timing: a per-token prefill time large enough that the HTTP round trip (a fraction of a
// millisecond here, more on a loaded machine) does not hide it in a 64-token prefill.
constexpr double kPrefillSPerToken = 0.0002;
constexpr double kPrefillBaseS = 0.002;
constexpr double kDecodeStepS = 0.005;

// The stand-in on a port of its own; stopped with the object.
struct Standin {
  std::unique_ptr<ChildProcess> process;
  std::string url;  // "http://127.0.0.1:PORT"
};

// Starts the stand-in; `error` says why it did not come up (empty when it did).
Standin start_standin(const test::TempDir& dir, std::string& error) {
  Standin s;
  auto process = ChildProcess::start(
      {CRESCENT_DEBIAN_PYTHON, kStandin, "--model", kModel, "--port", "0", "--block-size", "16",
       "--cache-blocks", "4096", "--prefill-s-per-token", std::to_string(kPrefillSPerToken),
       "--prefill-base-s", std::to_string(kPrefillBaseS), "--decode-step-s", std::to_string(kDecodeStepS),
       "--kv-events", "off"},
      dir.file("standin.log"));
  if (!process.ok()) {
    error = process.status().message();
    return s;
  }
  s.process = std::move(*process);
  auto ready = s.process->wait_for_line("\"http\"", std::chrono::seconds(20));
  if (!ready.ok()) {
    error = ready.status().message();
    return s;
  }
  const auto line = nlohmann::json::parse(*ready, nullptr, false);
  if (line.is_discarded() || !line.contains("http") || !line["http"].is_string()) {
    error = "an unexpected ready line: " + *ready;
    return s;
  }
  s.url = line["http"].get<std::string>();
  return s;
}

class ProfileUrl : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(kStandin)) GTEST_SKIP() << kStandin << " is not in this tree";
  }
  test::TempDir dir_{"crescent-profile-url"};
};

// The fit gives back the stand-in's parameters: the per-token prefill time within 30% (the round trip and
// the stand-in's base time go into the overhead), no attention term to speak of, and the decode step
// (the time between streamed tokens) as the weights' read within 30%. No chunked-prefill rows: the API
// cannot show a mixed iteration.
TEST_F(ProfileUrl, FitsTheEnginesPrefillAndDecodeTimes) {
  std::string error;
  Standin standin = start_standin(dir_, error);
  ASSERT_TRUE(error.empty()) << error;
  const std::string out = dir_.file("profile.json");
  const CliRun run = run_crescent("profile --url " + quote(standin.url) + " --served-model " + kModel +
                                  " --block-size 16 --quick --out " + quote(out));
  ASSERT_EQ(run.exit_code, 0) << run.err << "\n" << standin.process->log_tail();
  EXPECT_THAT(run.out, HasSubstr("linear_s_per_token"));
  EXPECT_THAT(run.out, HasSubstr("wrote " + out));
  std::ifstream in(out);
  const nlohmann::json profile = nlohmann::json::parse(in);
  EXPECT_EQ(profile["source"], "url: " + standin.url + " (model " + kModel + ")");
  const double linear = profile["linear_s_per_token"].get<double>();
  const double attention = profile["attention_s_per_token_context"].get<double>();
  const double step = profile["decode_weight_read_s"].get<double>();
  const double overhead = profile["prefill_iteration_overhead_s"].get<double>();
  std::cerr << "fitted: linear " << linear << " s/token (true " << kPrefillSPerToken << "), attention "
            << attention << ", decode step " << step << " s (true " << kDecodeStepS << "), per request "
            << profile["decode_s_per_request"].get<double>() << ", kv "
            << profile["decode_kv_read_s_per_token"].get<double>() << ", overhead " << overhead
            << " s (stand-in base " << kPrefillBaseS << " + HTTP)\n";
  EXPECT_NEAR(linear / kPrefillSPerToken, 1, 0.3);
  // Over the grid's longest prompt (512 new tokens after 512 cached, each attending to 768.5 on average) the
  // attention term adds under 15% to the per-token time (a fit of noise around a straight line).
  EXPECT_LT(attention * 768.5, 0.15 * linear);
  EXPECT_NEAR(step / kDecodeStepS, 1, 0.3);
  EXPECT_GE(overhead, 0);
  EXPECT_LT(overhead, 0.05);
  EXPECT_EQ(profile["chunked_prefill"], nlohmann::json::array());
  EXPECT_EQ(profile["points"].size(), 6u + 6u);  // the quick grid: 3 × 2 prefill, 3 × 2 decode points
}

// Nothing listens at the URL: the error names it.
TEST(ProfileUrlErrors, AnUnreachableEngineIsAnErrorNamingItsUrl) {
  test::TempDir dir_("crescent-profile-url");
  const std::string url = "http://127.0.0.1:" + std::to_string(test::free_ports(1)[0]);
  const CliRun run = run_crescent("profile --url " + quote(url) + " --served-model " + kModel +
                                  " --quick --out " + quote(dir_.file("profile.json")));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr("cannot reach " + url));
  EXPECT_FALSE(std::filesystem::exists(dir_.file("profile.json")));
}

// A server that accepts the connection and never answers: the call times out (--request-timeout).
TEST(ProfileUrlErrors, AnEngineThatDoesNotAnswerTimesOut) {
  test::TempDir dir_("crescent-profile-url");
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(listen(fd, 4), 0);  // the kernel accepts; nobody reads or answers
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const std::string url = "http://127.0.0.1:" + std::to_string(ntohs(addr.sin_port));
  const auto start = std::chrono::steady_clock::now();
  const CliRun run = run_crescent("profile --url " + quote(url) + " --served-model " + kModel +
                                  " --request-timeout 1 --quick --out " + quote(dir_.file("profile.json")));
  const double took_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  close(fd);
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr(url));
  EXPECT_THAT(run.err, HasSubstr("nothing came for 1 s"));
  EXPECT_LT(took_s, 10);
}

// The engine serves another model: the error names the URL, the model asked for and the ones it serves.
// Token ids the engine refuses: the error is its HTTP status and the start of its answer.
TEST_F(ProfileUrl, AnotherModelOrRefusedPromptsAreErrorsNamingThem) {
  std::string error;
  Standin standin = start_standin(dir_, error);
  ASSERT_TRUE(error.empty()) << error;
  CliRun run = run_crescent("profile --url " + quote(standin.url) +
                            " --served-model not-served --quick --out " + quote(dir_.file("profile.json")));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr(standin.url + " does not serve model \"not-served\""));
  EXPECT_THAT(run.err, HasSubstr(std::string("it serves: \"") + kModel + "\""));

  // The stand-in's vocabulary is 128,256 tokens: ids drawn below 10^9 are refused with HTTP 400.
  run = run_crescent("profile --url " + quote(standin.url) + " --served-model " + kModel +
                     " --vocab-size 1000000000 --quick --out " + quote(dir_.file("profile.json")));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr(standin.url + "/v1/completions"));
  EXPECT_THAT(run.err, HasSubstr("HTTP 400"));
  EXPECT_THAT(run.err, HasSubstr("token ids must be integers"));
  EXPECT_FALSE(std::filesystem::exists(dir_.file("profile.json")));
}

// Flags that belong to the executors are refused with --url; --url needs the model's name, a URL of the
// form http://HOST:PORT and a key file that can be read.
TEST(ProfileUrlErrors, ExecutorFlagsAndAMissingModelAreRefused) {
  test::TempDir dir_("crescent-profile-url");
  CliRun run = run_crescent("profile --url http://127.0.0.1:9 --executor mock --out " +
                            quote(dir_.file("profile.json")));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr("--executor"));
  run = run_crescent("profile --url http://127.0.0.1:9 --out " + quote(dir_.file("profile.json")));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr("--served-model"));
  run = run_crescent("profile --url 127.0.0.1:9 --served-model m --out " + quote(dir_.file("profile.json")));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr("expected http://HOST:PORT"));
  run = run_crescent("profile --url http://127.0.0.1:9 --served-model m --api-key-file " +
                     quote(dir_.file("no-such-key")) + " --out " + quote(dir_.file("profile.json")));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr("--api-key-file"));
}

}  // namespace
}  // namespace crescent::cli_test
