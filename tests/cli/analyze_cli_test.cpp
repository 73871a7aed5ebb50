// End-to-end tests of `crescent analyze`: runs the built binary and checks its output and exit code.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "kv/block_key.h"
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

// Where the reuse comes from on the conversation trace (the roots also checked against the independent Python
// reference, tests/trace/reference_analyzer.py): every request starts with block 0, which alone holds 11.4%
// of the reused tokens; one block further, the conversations appear.
TEST(AnalyzeCliTest, PrefixRootsAndSessionsOnShippedTrace) {
  auto run = run_crescent("analyze --json --capacities inf " + quote(kConversation));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  nlohmann::json stats = nlohmann::json::parse(run.out);
  EXPECT_EQ(stats["reused_tokens"], 54098411);
  EXPECT_EQ(stats["root_blocks"], 1);
  EXPECT_EQ(stats["distinct_roots"], 1);
  EXPECT_EQ(stats["roots_with_reuse"], 1);
  ASSERT_EQ(stats["top_roots"].size(), 1u);
  const nlohmann::json& root = stats["top_roots"][0];
  EXPECT_EQ(root["root_key"], 0);
  EXPECT_EQ(root["requests"], 12031);
  EXPECT_EQ(root["reused_tokens"], 54098411);
  EXPECT_EQ(root["reused_share"], 1.0);
  EXPECT_EQ(root["common_blocks"], 1);
  EXPECT_EQ(root["common_reused_tokens"], 12030 * 512) << "every later request hits block 0";
  EXPECT_EQ(root["deepest_hit_blocks"], 240);
  EXPECT_TRUE(stats["sessions"].is_null()) << "the released traces have no session_id";

  run = run_crescent("analyze --json --capacities inf --root-blocks 2 --top-roots 3 " + quote(kConversation));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  stats = nlohmann::json::parse(run.out);
  EXPECT_EQ(stats["distinct_roots"], 7373);
  ASSERT_EQ(stats["top_roots"].size(), 3u);
  EXPECT_EQ(stats["top_roots"][0]["root_key"], 9382);
  EXPECT_EQ(stats["top_roots"][0]["requests"], 17);
  EXPECT_EQ(stats["top_roots"][0]["reused_tokens"], 1252864);
  EXPECT_EQ(stats["top_roots"][0]["deepest_hit_blocks"], 185);

  run = run_crescent("analyze --capacities inf " + quote(kConversation));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("prefix roots    1 (first blocks), 1 with reused tokens"));
  EXPECT_THAT(run.out, HasSubstr("11.39%"));
  EXPECT_THAT(run.out, HasSubstr("sessions        no sessions in this trace"));
}

// A trace as `crescent trace import --keep-tokens` writes it, hash_ids at 512 tokens by the block-key
// recurrence; R3 repeats R1, R2 shares R1's first 60 tokens. Sessions: R1, R3 in 0, R2 in 1.
std::string write_token_trace(const std::string& name, bool tokens_on_line_3 = true) {
  std::vector<int64_t> r1(100);
  for (int64_t i = 0; i < 100; ++i) r1[static_cast<size_t>(i)] = i;
  std::vector<int64_t> r2(r1.begin(), r1.begin() + 60);
  for (int64_t i = 0; i < 60; ++i) r2.push_back(1000 + i);
  const std::filesystem::path path = temp_path(name);
  std::ofstream out(path);
  int64_t timestamp = 0;
  for (const auto& [tokens, session] :
       std::vector<std::pair<std::vector<int64_t>, int>>{{r1, 0}, {r2, 1}, {r1, 0}}) {
    nlohmann::json line = {{"timestamp", timestamp},
                           {"input_length", tokens.size()},
                           {"output_length", 5},
                           {"hash_ids", kv::shipped_block_keys(tokens, 512, kv::kMockModelSeed)},
                           {"session_id", session}};
    if (timestamp < 2 || tokens_on_line_3) line["token_ids"] = tokens;
    out << line.dump() << "\n";
    ++timestamp;
  }
  return path.string();
}

TEST(AnalyzeCliTest, KeysFromTokensReanalyseAtOtherBlockSizes) {
  const std::string path = write_token_trace("crescent_cli_tokens.jsonl");
  // At 512, keys from the tokens are the hash_ids: the same report.
  auto from_hash_ids = run_crescent("analyze --json " + quote(path));
  auto from_tokens = run_crescent("analyze --json --keys-from-tokens --block-size 512 " + quote(path));
  ASSERT_EQ(from_hash_ids.exit_code, 0) << from_hash_ids.err;
  ASSERT_EQ(from_tokens.exit_code, 0) << from_tokens.err;
  nlohmann::json hash_stats = nlohmann::json::parse(from_hash_ids.out);
  nlohmann::json token_stats = nlohmann::json::parse(from_tokens.out);
  EXPECT_EQ(token_stats["keys_from_token_ids"], true);
  token_stats["keys_from_token_ids"] = false;
  EXPECT_EQ(token_stats, hash_stats);
  // Each prompt is one partial block: only R3, equal to R1, hits, all of its 100 tokens, in its own session.
  EXPECT_DOUBLE_EQ(hash_stats["reuse_ceiling"].get<double>(), 100.0 / 320);
  EXPECT_EQ(hash_stats["sessions"]["within_session_tokens"], 100);
  EXPECT_EQ(hash_stats["sessions"]["across_sessions_tokens"], 0);

  // At 16 tokens a block, R2 also hits the 3 whole blocks of 16 it shares with R1 (48 of its 60 shared
  // tokens), blocks that came from session 0: (48 + 100) / 320, 48 across sessions, 100 within.
  from_tokens = run_crescent("analyze --json --keys-from-tokens --block-size 16 " + quote(path));
  ASSERT_EQ(from_tokens.exit_code, 0) << from_tokens.err;
  token_stats = nlohmann::json::parse(from_tokens.out);
  EXPECT_EQ(token_stats["block_size_tokens"], 16);
  EXPECT_DOUBLE_EQ(token_stats["reuse_ceiling"].get<double>(), 148.0 / 320);
  EXPECT_EQ(token_stats["sessions"]["sessions"], 2);
  EXPECT_EQ(token_stats["sessions"]["within_session_tokens"], 100);
  EXPECT_EQ(token_stats["sessions"]["across_sessions_tokens"], 48);
  EXPECT_DOUBLE_EQ(token_stats["sessions"]["across_sessions_input_share"].get<double>(), 48.0 / 320);
  EXPECT_DOUBLE_EQ(token_stats["sessions"]["within_session_reused_share"].get<double>(), 100.0 / 148);
  ASSERT_EQ(token_stats["top_roots"].size(), 1u) << "R1, R2, R3 start with the same 16 tokens";
  EXPECT_EQ(token_stats["top_roots"][0]["requests"], 3);
  EXPECT_EQ(token_stats["top_roots"][0]["common_blocks"], 3);
  EXPECT_EQ(token_stats["top_roots"][0]["deepest_hit_blocks"], 7);

  const auto text = run_crescent("analyze --keys-from-tokens --block-size 16 " + quote(path));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_THAT(text.out, HasSubstr("(unbounded cache, 16-token blocks, keys from token ids)"));
  EXPECT_THAT(text.out, HasSubstr("sessions        2, on 3 of 3 requests"));
  std::filesystem::remove(path);
}

TEST(AnalyzeCliTest, KeysFromTokensNeedTokenIdsOnEveryLine) {
  const std::string path = write_token_trace("crescent_cli_tokens_missing.jsonl", /*tokens_on_line_3=*/false);
  auto run = run_crescent("analyze --keys-from-tokens --block-size 64 " + quote(path));
  expect_one_error_line(run);
  EXPECT_THAT(run.err, HasSubstr(path + ":3: missing field 'token_ids'"));
  run = run_crescent("analyze --keys-from-tokens " + quote(kConversation));
  expect_one_error_line(run);
  EXPECT_THAT(run.err, HasSubstr(kConversation + ":1: missing field 'token_ids'"));
  std::filesystem::remove(path);
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
  const auto top_roots = run_crescent("analyze --top-roots -1 " + quote(kConversation));
  expect_one_error_line(top_roots);
  EXPECT_THAT(top_roots.err, HasSubstr("--top-roots must be >= 0, got -1"));
  const auto root_blocks = run_crescent("analyze --root-blocks 0 " + quote(kConversation));
  expect_one_error_line(root_blocks);
  EXPECT_THAT(root_blocks.err, HasSubstr("--root-blocks must be >= 1, got 0"));
}

}  // namespace
}  // namespace crescent::cli_test
