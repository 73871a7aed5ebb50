// `crescent serve --replay` and `crescent replay` as a user runs them.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "run_crescent.h"
#include "test_support/temp_dir.h"

namespace crescent::cli_test {
namespace {

using ::testing::HasSubstr;

TEST(ServeCli, ReplaysASliceOfTheBundledTraceAgainstTheLiveCluster) {
  const CliRun run = run_crescent("serve --port 0 --replay " +
                                  quote(CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz") +
                                  " --limit 6 --time-scale 100 --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto out = nlohmann::json::parse(run.out);
  EXPECT_EQ(out["requests"], 6);
  EXPECT_EQ(out["failed"], 0);
  EXPECT_EQ(out["model"], "mock");
  const auto& live = out["policies"][0];
  EXPECT_EQ(live["name"], "live");
  EXPECT_EQ(live["completed"], 6);
  EXPECT_GT(live["ttft_mean_s"].get<double>(), 0);
  EXPECT_TRUE(live["prefill_compute_s_per_request"].is_null());  // a client cannot see it
  EXPECT_THAT(run.err, HasSubstr("crescent serve: model 'mock' on http://127.0.0.1:"));
}

// The config's "serve" section sets the port, policy and admission; flags given on the command line win.
TEST(ServeCli, TheConfigsServeSectionSetsPortPolicyAndAdmissionAndFlagsWin) {
  const auto config = temp_path("serve_section.json");
  {
    std::ifstream in(CRESCENT_SOURCE_DIR "/configs/local.json");
    nlohmann::json j = nlohmann::json::parse(in);
    j["serve"]["http_port"] = 0;
    j["serve"]["admission"] = "early";
    j["serve"]["policy"] = "cache-aware";
    std::ofstream(config) << j.dump();
  }
  const std::string trace = quote(CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz");
  CliRun run = run_crescent("serve --in-process --config " + quote(config.string()) + " --replay " + trace +
                            " --limit 2 --time-scale 100 --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.err, HasSubstr("policy cache-aware, admission early"));
  run = run_crescent("serve --in-process --config " + quote(config.string()) + " --admission none --replay " +
                     trace + " --limit 2 --time-scale 100 --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.err, HasSubstr("admission none"));
  std::filesystem::remove(config);
}

// A new user's first run of the cpu executor: the default config (LLaMA3-70B's 8xA800 HBM) would size the KV
// cache for hundreds of GB (it died with std::bad_alloc); the budget now comes from this machine's memory and
// the model's KV bytes per token, the start line says how much, and a budget too small for one request of the
// model's context is one clear error.
TEST(ServeCli, TheCpuExecutorWithNoOtherFlagSizesItsKvCacheFromTheMachine) {
  test::TempDir dir;
  ASSERT_EQ(run_crescent("model init --preset tiny --out " + quote(dir.file("m"))).exit_code, 0);
  const std::string trace = quote(CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz");
  CliRun run = run_crescent("serve --executor cpu --model " + quote(dir.file("m")) + " --port 0 --replay " +
                            trace + " --limit 3 --length-divisor 64 --block-size 8 --time-scale 100 --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto out = nlohmann::json::parse(run.out);
  EXPECT_EQ(out["failed"], 0);
  EXPECT_EQ(out["policies"][0]["completed"], 3);
  EXPECT_THAT(run.err, HasSubstr("per instance (half of the"));
  EXPECT_THAT(run.err, HasSubstr("available on this machine, shared by 4 instances"));
  EXPECT_THAT(run.err, ::testing::Not(HasSubstr("bad_alloc")));

  run = run_crescent("serve --executor cpu --model " + quote(dir.file("m")) +
                     " --port 0 --kv-cache-bytes 1MiB");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err,
              HasSubstr("a KV cache budget of 1048576 bytes per instance (--kv-cache-bytes) holds 2048 "
                        "tokens of m KV (512 bytes per token)"));
  EXPECT_THAT(run.err, HasSubstr("one request of the model's context of 4096 tokens"));
  run = run_crescent("serve --executor cpu --model " + quote(dir.file("m")) +
                     " --port 0 --kv-cache-bytes lots");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("--kv-cache-bytes"));
}

TEST(ServeCli, BenchServeMeasuresAdmissionAndStreams) {
  const CliRun run = run_crescent("bench serve --rate 100 --seconds 0.5 --streams 40 --tokens 5 --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const auto out = nlohmann::json::parse(run.out);
  EXPECT_EQ(out["admission"]["requests"], 50);
  EXPECT_EQ(out["admission"]["answered"], 50);
  EXPECT_GT(out["admission"]["handler_p99_us"].get<double>(), 0);
  EXPECT_EQ(out["streams"]["completed"], 40);
  EXPECT_EQ(out["streams"]["tokens_delivered"], 40 * 5);
  EXPECT_GE(out["streams"]["held_at_once"], 40);
}

TEST(ServeCli, BadInputIsRefusedWithAClearMessage) {
  CliRun run = run_crescent("replay nowhere.jsonl --url ftp://x");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("expected http://HOST:PORT"));
  run = run_crescent("replay " + quote(CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz") +
                     " --url http://127.0.0.1:1 --limit 1");
  EXPECT_EQ(run.exit_code, 1);
  EXPECT_THAT(run.err, HasSubstr("cannot reach http://127.0.0.1:1"));
  run = run_crescent("serve --port 0 --replay no-such-trace.jsonl");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("no-such-trace.jsonl"));
  run = run_crescent("serve --port 0 --policy fastest");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("'fastest'"));
  // The cpu executor needs a model, a readable one, and the instance processes.
  run = run_crescent("serve --port 0 --executor cpu");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("--executor cpu needs a model: --model DIR"));
  run = run_crescent("serve --port 0 --executor cpu --model /nonexistent/model");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("/nonexistent/model/config.json"));
  run = run_crescent("serve --port 0 --executor gpu");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("--executor: unknown executor 'gpu' (valid: mock, cpu)"));
  test::TempDir dir;
  ASSERT_EQ(run_crescent("model init --preset tiny --out " + quote(dir.file("m"))).exit_code, 0);
  run = run_crescent("serve --port 0 --in-process --executor cpu --model " + quote(dir.file("m")));
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("--in-process runs mock instances only"));
}

// The API key comes from --api-key, $CRESCENT_API_KEY or --api-key-file, once; an empty one (an unset
// variable) is refused rather than served without authentication (issue 22 §3). The supervisor hands it
// to its Conductor process (the replay authenticates with it).
TEST(ServeCli, TheApiKeyIsGivenOnceAndNeverEmpty) {
  test::TempDir dir;
  const std::string empty = dir.file("empty"), key = dir.file("key");
  std::ofstream(empty) << "\n";
  std::ofstream(key) << "sesame\n";
  CliRun run = run_crescent("serve --port 0 --in-process --api-key ''");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("--api-key (or $CRESCENT_API_KEY) is empty (an unset variable?)"));
  run = run_shell("CRESCENT_API_KEY= " + quote(CRESCENT_BINARY) + " serve --port 0 --in-process");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("is empty"));
  run = run_crescent("serve --port 0 --in-process --api-key-file " + quote(empty));
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("its first line is empty"));
  run = run_crescent("serve --port 0 --in-process --api-key-file " + quote(dir.file("missing")));
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("cannot be read"));
  run = run_crescent("serve --port 0 --in-process --api-key k --api-key-file " + quote(key));
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("give the API key once"));
  run = run_crescent("serve --port 0 --api-key-file " + quote(key) + " --replay " +
                     quote(CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz") +
                     " --limit 4 --time-scale 50 --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json report = nlohmann::json::parse(run.out);
  EXPECT_EQ(report["policies"][0]["completed"], 4) << "the Conductor took the key the replay sends";
  EXPECT_EQ(report["failed"], 0);
}

// A role started alone needs the members' secret, from a private file; `crescent serve secret FILE` makes
// one (issue 22 §1).
TEST(ServeCli, RolesStartedAloneNeedThePrivateClusterSecret) {
  test::TempDir dir;
  const std::string secret = dir.file("cluster-secret");
  CliRun run = run_crescent("serve conductor --port 0 --control tcp://127.0.0.1:0");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err,
              HasSubstr("--cluster-secret-file FILE (or $CRESCENT_CLUSTER_SECRET_FILE) is required"));
  run = run_crescent("serve decode --index 0 --conductor tcp://127.0.0.1:1");
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err,
              HasSubstr("--cluster-secret-file FILE (or $CRESCENT_CLUSTER_SECRET_FILE) is required"));
  run = run_crescent("serve secret " + quote(secret));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(std::filesystem::status(secret).permissions() & std::filesystem::perms::all,
            std::filesystem::perms::owner_read | std::filesystem::perms::owner_write);
  run = run_crescent("serve secret " + quote(secret));
  EXPECT_NE(run.exit_code, 0);
  EXPECT_THAT(run.err, HasSubstr("cannot create it"));
  std::filesystem::permissions(secret, std::filesystem::perms::group_read,
                               std::filesystem::perm_options::add);
  run = run_crescent("serve decode --index 0 --conductor tcp://127.0.0.1:1 --cluster-secret-file " +
                     quote(secret));
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("lets others read it"));
}

}  // namespace
}  // namespace crescent::cli_test
