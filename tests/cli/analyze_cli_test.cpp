// End-to-end tests of `crescent analyze`: runs the built binary and checks its output and exit code.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "run_crescent.h"

namespace crescent::cli_test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

const std::string kConversation = CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz";

// A trace whose line 2 has a negative input_length.
std::string write_malformed_trace() {
  const std::filesystem::path path = temp_path("crescent_cli_bad_trace.jsonl");
  std::ofstream(path) << R"({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
{"timestamp": 1, "input_length": -5, "output_length": 5, "hash_ids": []}
{"timestamp": 2, "input_length": 10, "output_length": 5, "hash_ids": [1]}
)";
  return path.string();
}

// Exit code 2 and exactly one line on stderr, starting with "error: ".
void expect_one_error_line(const CliRun& run) {
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_THAT(run.err, StartsWith("error: "));
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
}

TEST(AnalyzeCliTest, JsonOnShippedTrace) {
  const auto run = run_crescent("analyze --json " + quote(kConversation));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json stats = nlohmann::json::parse(run.out);  // exactly one JSON document
  EXPECT_EQ(stats["trace"], kConversation);
  EXPECT_EQ(stats["requests"], 12031);
  EXPECT_NEAR(stats["reuse_ceiling"].get<double>(), 0.3736, 5e-4);  // independent Python reference
  EXPECT_NEAR(stats["span_s"].get<double>(), 3536.999, 1e-9);
  ASSERT_EQ(stats["hit_ratio_by_capacity"].size(), 5u);
  EXPECT_EQ(stats["hit_ratio_by_capacity"][0]["capacity_tokens"], 1'000'000);
  EXPECT_NEAR(stats["hit_ratio_by_capacity"][0]["hit_ratio"].get<double>(), 0.0543, 5e-4);
  EXPECT_TRUE(stats["hit_ratio_by_capacity"][4]["capacity_tokens"].is_null());
  EXPECT_EQ(stats["hottest_blocks"].size(), 10u);
  EXPECT_EQ(stats["skipped_lines"], 0);
}

TEST(AnalyzeCliTest, JsonLinePerTraceAndCustomCapacities) {
  const auto run = run_crescent("analyze --json --capacities 3M,10000000,unbounded " + quote(kConversation) +
                                " " + quote(kConversation));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::istringstream lines(run.out);
  int traces = 0;
  for (std::string line; std::getline(lines, line); ++traces) {
    const nlohmann::json stats = nlohmann::json::parse(line);
    ASSERT_EQ(stats["hit_ratio_by_capacity"].size(), 3u);
    EXPECT_EQ(stats["hit_ratio_by_capacity"][0]["capacity_tokens"], 3'000'000);
    EXPECT_NEAR(stats["hit_ratio_by_capacity"][0]["hit_ratio"].get<double>(), 0.1387, 5e-4);
    EXPECT_NEAR(stats["hit_ratio_by_capacity"][1]["hit_ratio"].get<double>(), 0.2908, 5e-4);
  }
  EXPECT_EQ(traces, 2);
}

// Capacities in bytes of a model's KV: Llama 3 70B's config.json says 80 layers, 8 KV heads of 128, bf16:
// 80 x 2 (K, V) x 8 x 128 x 2 bytes a token. A model directory's config.json is read the same way; a name
// that is neither is refused, listing the presets.
TEST(AnalyzeCliTest, CapacitiesInBytesOfAModelsKv) {
  constexpr int64_t kLlama3_70bBytesPerToken = 80 * 2 * 8 * 128 * 2;
  auto run = run_crescent("analyze --json --capacities 1M,inf --model llama3-70b " + quote(kConversation));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  nlohmann::json stats = nlohmann::json::parse(run.out);
  EXPECT_EQ(stats["kv_bytes_per_token"], kLlama3_70bBytesPerToken);
  EXPECT_EQ(stats["hit_ratio_by_capacity"][0]["capacity_bytes"], 1'000'000 * kLlama3_70bBytesPerToken);
  EXPECT_TRUE(stats["hit_ratio_by_capacity"][1]["capacity_bytes"].is_null()) << "unbounded";

  const std::filesystem::path dir = temp_path("crescent_cli_analyze_model");
  std::filesystem::remove_all(dir);
  ASSERT_EQ(run_crescent("model init --preset tiny --out " + quote(dir.string())).exit_code, 0);
  const nlohmann::json config = nlohmann::json::parse(std::ifstream(dir / "config.json"));
  const int64_t head_dim = config["hidden_size"].get<int64_t>() / config["num_attention_heads"].get<int64_t>();
  const int64_t element_bytes = config.value("torch_dtype", "float32") == "bfloat16" ? 2 : 4;
  const int64_t bytes_per_token = config["num_hidden_layers"].get<int64_t>() * 2 *
                                  config["num_key_value_heads"].get<int64_t>() * head_dim * element_bytes;
  run = run_crescent("analyze --json --capacities 1000 --model " + quote(dir.string()) + " " + quote(kConversation));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  stats = nlohmann::json::parse(run.out);
  EXPECT_EQ(stats["kv_bytes_per_token"], bytes_per_token);
  EXPECT_EQ(stats["hit_ratio_by_capacity"][0]["capacity_bytes"], 1000 * bytes_per_token);
  std::filesystem::remove_all(dir);

  run = run_crescent("analyze --model llama9 " + quote(kConversation));
  expect_one_error_line(run);
  EXPECT_THAT(run.err, HasSubstr("--model 'llama9': not a model directory"));
  EXPECT_THAT(run.err, HasSubstr("llama3-70b"));
}

TEST(AnalyzeCliTest, TextReport) {
  const auto run = run_crescent("analyze " + quote(kConversation));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr(kConversation));
  EXPECT_THAT(run.out, HasSubstr("12031"));
  EXPECT_THAT(run.out, HasSubstr("37.36%"));
  EXPECT_THAT(run.out, HasSubstr("unbounded"));
  EXPECT_EQ(run.err, "");
}

TEST(AnalyzeCliTest, MalformedTraceFailsNamingTheLine) {
  const std::string path = write_malformed_trace();
  const auto run = run_crescent("analyze " + quote(path));
  expect_one_error_line(run);
  EXPECT_THAT(run.err, HasSubstr(path + ":2:"));
  EXPECT_THAT(run.err, HasSubstr("input_length"));

  const auto skipping = run_crescent("analyze --json --skip-invalid " + quote(path));
  EXPECT_EQ(skipping.exit_code, 0) << skipping.err;
  EXPECT_THAT(skipping.err, HasSubstr("skipped 1 invalid line"));
  const nlohmann::json stats = nlohmann::json::parse(skipping.out);
  EXPECT_EQ(stats["requests"], 2);
  EXPECT_EQ(stats["skipped_lines"], 1);
  std::filesystem::remove(path);
}

TEST(AnalyzeCliTest, BomAndCrlfTraceAnalysesLikePlainLf) {
  const std::string rows[] = {
      R"({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]})",
      R"({"timestamp": 10, "input_length": 1100, "output_length": 7, "hash_ids": [1, 2, 3]})",
      R"({"timestamp": 20, "input_length": 512, "output_length": 1, "hash_ids": [4]})",
  };
  const std::filesystem::path plain = temp_path("crescent_cli_lf.jsonl");
  const std::filesystem::path windows = temp_path("crescent_cli_bom_crlf.jsonl");
  {
    std::ofstream lf(plain, std::ios::binary);
    std::ofstream crlf(windows, std::ios::binary);
    crlf << "\xEF\xBB\xBF";
    for (const std::string& row : rows) {
      lf << row << "\n";
      crlf << row << "\r\n";
    }
  }
  const auto plain_run = run_crescent("analyze --json " + quote(plain.string()));
  const auto windows_run = run_crescent("analyze --json " + quote(windows.string()));
  ASSERT_EQ(plain_run.exit_code, 0) << plain_run.err;
  ASSERT_EQ(windows_run.exit_code, 0) << windows_run.err;
  EXPECT_EQ(windows_run.err, "");
  nlohmann::json plain_stats = nlohmann::json::parse(plain_run.out);
  nlohmann::json windows_stats = nlohmann::json::parse(windows_run.out);
  EXPECT_EQ(plain_stats["requests"], 3);
  EXPECT_EQ(windows_stats["trace"], windows.string());
  plain_stats.erase("trace");
  windows_stats.erase("trace");
  EXPECT_EQ(windows_stats, plain_stats);
  std::filesystem::remove(plain);
  std::filesystem::remove(windows);
}

TEST(AnalyzeCliTest, ZeroLengthRowFailsNamingTheLine) {
  const std::filesystem::path path = temp_path("crescent_cli_zero_output.jsonl");
  std::ofstream(path) << R"({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]}
{"timestamp": 1, "input_length": 600, "output_length": 0, "hash_ids": [1, 2]}
)";
  const auto run = run_crescent("analyze " + quote(path.string()));
  expect_one_error_line(run);
  EXPECT_THAT(run.err, HasSubstr(path.string() + ":2: field 'output_length'"));
  EXPECT_THAT(run.err, HasSubstr("must be >= 1, got 0"));
  std::filesystem::remove(path);
}

TEST(AnalyzeCliTest, MissingFileFails) {
  const auto run = run_crescent("analyze /nonexistent/trace.jsonl");
  expect_one_error_line(run);
  EXPECT_THAT(run.err, HasSubstr("/nonexistent/trace.jsonl"));
}

TEST(AnalyzeCliTest, BadOptionsFail) {
  for (const char* capacities : {"abc", "3X", "-1", "0", "1M,,inf", "99999999999G", ""}) {
    SCOPED_TRACE(capacities);
    const auto run = run_crescent("analyze --capacities " + quote(capacities) + " " + quote(kConversation));
    expect_one_error_line(run);
    EXPECT_THAT(run.err, HasSubstr("--capacities"));
  }
  const auto block_size = run_crescent("analyze --block-size 0 " + quote(kConversation));
  expect_one_error_line(block_size);
  EXPECT_THAT(block_size.err, HasSubstr("--block-size"));
}

}  // namespace
}  // namespace crescent::cli_test
