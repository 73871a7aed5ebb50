// `crescent trace import` as a user runs it: a live server's --request-log imported back into a trace with
// the reuse of the traffic that made it, and bad input refused with exit 2 and nothing written. (The chat
// template and real tokenizers are checked against their oracles by tests/trace/import_oracle.py.)
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cli/run_crescent.h"
#include "test_support/temp_dir.h"

namespace crescent::cli_test {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

const std::string kTrace = CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz";

std::vector<json> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> out;
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

json analyze(const std::string& trace, int block_size) {
  const CliRun run =
      run_crescent("analyze --json --block-size " + std::to_string(block_size) + " " + quote(trace));
  EXPECT_EQ(run.exit_code, 0) << run.err;
  return run.exit_code == 0 ? json::parse(run.out) : json();
}

TEST(TraceImportCli, AServersRequestLogImportsBackWithTheReuseOfItsTraffic) {
  test::TempDir dir;
  const std::string root = dir.path();
  for (const std::string content : {"text", "token-ids"}) {
    SCOPED_TRACE(content);
    const std::string log = root + "/requests-" + content + ".jsonl";
    // 24 requests of the conversation trace replayed against the live cluster, each prompt the trace's
    // blocks as token ids (lengths / 8, so a block is 64 tokens).
    const CliRun served =
        run_crescent("serve --in-process --port 0 --replay " + quote(kTrace) +
                     " --limit 24 --length-divisor 8 --block-size 64 --time-scale 200 --json --request-log " +
                     quote(log) + " --request-log-content " + content);
    ASSERT_EQ(served.exit_code, 0) << served.err;
    const std::vector<json> logged = read_lines(log);
    ASSERT_EQ(logged.size(), 24u);
    EXPECT_TRUE(logged[0].contains("prompt_token_ids"));  // both modes: the ids the model read
    EXPECT_EQ(logged[0]["request"].contains("prompt"), content == "text");
    EXPECT_TRUE(logged[0]["usage"]["completion_tokens"].is_number_integer());

    const std::string imported = root + "/imported-" + content + ".jsonl";
    const CliRun run = run_crescent("trace import --format openai-log --block-size 64 --out " +
                                    quote(imported) + " " + quote(log));
    ASSERT_EQ(run.exit_code, 0) << run.err;
    EXPECT_THAT(run.err, HasSubstr("24 requests"));
    const std::vector<json> trace = read_lines(imported);
    ASSERT_EQ(trace.size(), 24u);
    // The same prompts (their lengths) and the same reuse as the slice of the trace that was replayed:
    // keys made from the logged token ids find the blocks the trace's hash_ids shared.
    const CliRun slice = run_shell("zcat " + quote(kTrace) + " | head -24 > " + quote(root + "/slice.jsonl"));
    // (analyze reads the slice at 512 tokens a block with its true lengths: the same hit ratio as the
    // lengths / 8 at 64, up to the rounding of each length.)
    ASSERT_EQ(slice.exit_code, 0);
    std::vector<int64_t> want_lengths, got_lengths;
    for (const json& r : read_lines(root + "/slice.jsonl")) {
      want_lengths.push_back((r["input_length"].get<int64_t>() + 7) / 8);
    }
    for (const json& r : trace) got_lengths.push_back(r["input_length"]);
    std::sort(want_lengths.begin(), want_lengths.end());
    std::sort(got_lengths.begin(), got_lengths.end());
    EXPECT_EQ(got_lengths, want_lengths);
    const json want = analyze(root + "/slice.jsonl", 512), got = analyze(imported, 64);
    ASSERT_TRUE(want.contains("reuse_ceiling") && got.contains("reuse_ceiling")) << want << got;
    EXPECT_GT(want["reuse_ceiling"].get<double>(), 0.02);
    EXPECT_NEAR(got["reuse_ceiling"].get<double>(), want["reuse_ceiling"].get<double>(), 0.002);
    // The log's wall-clock arrivals become times from the first request, non-decreasing.
    EXPECT_EQ(trace[0]["timestamp"], 0);
    for (size_t i = 1; i < trace.size(); ++i) EXPECT_GE(trace[i]["timestamp"], trace[i - 1]["timestamp"]);
  }
}

TEST(TraceImportCli, KeptTokensReanalyseAtOtherBlockSizes) {
  test::TempDir dir;
  const std::string root = dir.path();
  {
    // Prompts of token ids: two share 6 ids (one block of 4 and half the next), one shares nothing.
    std::ofstream log(root + "/log.jsonl");
    log << R"({"timestamp": 1, "prompt": [1, 2, 3, 4, 5, 6, 7, 8, 9]})"
           "\n"
        << R"({"timestamp": 2, "prompt": [1, 2, 3, 4, 5, 6, 70, 80]})"
           "\n"
        << R"({"timestamp": 3, "prompt": [9, 9, 9, 9]})"
           "\n";
  }
  const std::string trace = root + "/trace.jsonl";
  const CliRun run = run_crescent("trace import --keep-tokens --block-size 4 --out " + quote(trace) + " " +
                                  quote(root + "/log.jsonl"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  auto ceiling = [&](const std::string& flags) {
    const CliRun analyzed = run_crescent("analyze --json " + flags + " " + quote(trace));
    EXPECT_EQ(analyzed.exit_code, 0) << analyzed.err;
    return json::parse(analyzed.out)["reuse_ceiling"].get<double>();
  };
  // Input 21 tokens; at 4 a block the second prompt hits its first block (4 tokens), at 2 a block three (6).
  EXPECT_DOUBLE_EQ(ceiling("--block-size 4"), 4.0 / 21);
  EXPECT_DOUBLE_EQ(ceiling("--keys-from-tokens --block-size 4"), 4.0 / 21);
  EXPECT_DOUBLE_EQ(ceiling("--keys-from-tokens --block-size 2"), 6.0 / 21);
}

TEST(TraceImportCli, BadInputExitsTwoAndWritesNothing) {
  test::TempDir dir;
  const std::string root = dir.path();
  const std::string out = root + "/out.jsonl";
  {
    std::ofstream(root + "/log.jsonl") << R"({"timestamp": 1, "prompt": [1, 2]})"
                                          "\n"
                                       << R"({"timestamp": 2, "prompt": "text needs a tokenizer"})"
                                          "\n";
    std::ofstream(root + "/short") << "0123456789\n";
  }
  struct Case {
    std::string args, message;
  };
  const std::vector<Case> cases = {
      {"--format xml " + quote(root + "/log.jsonl"),
       "--format: must be openai-log, sharegpt or csv, got 'xml'"},
      {quote(root + "/missing.jsonl"), "missing.jsonl: no such file"},
      {quote(root + "/log.jsonl"), "log.jsonl:2: text prompts need a tokenizer"},
      {"--skip-invalid " + quote(root + "/log.jsonl"), "log.jsonl:2: text prompts need a tokenizer"},
      {"--block-size 0 " + quote(root + "/log.jsonl"), "--block-size: must be in [1, 2^30], got 0"},
      {"--salt-file " + quote(root + "/short") + " " + quote(root + "/log.jsonl"),
       "a salt must be at least 16"},
      {"--format csv --columns t,i,o " + quote(root + "/log.jsonl"), "--columns: 't' is not NAME=COLUMN"},
  };
  for (const Case& c : cases) {
    const CliRun run = run_crescent("trace import --out " + quote(out) + " " + c.args);
    EXPECT_EQ(run.exit_code, 2) << c.args << "\n" << run.err;
    EXPECT_THAT(run.err, HasSubstr(c.message)) << c.args;
    EXPECT_FALSE(std::filesystem::exists(out)) << c.args;
  }
  // A directory is not a log; `--out -` writes to stdout as it is (appending to a file, never replacing it).
  CliRun run = run_crescent("trace import --out " + quote(out) + " " + quote(root));
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("a directory, not a log file"));
  {
    std::ofstream(root + "/ids.jsonl") << R"({"timestamp": 1, "prompt": [1, 2]})"
                                          "\n";
    std::ofstream(root + "/app.txt") << "kept\n";
  }
  run = run_shell(quote(CRESCENT_BINARY) + " trace import --out - " + quote(root + "/ids.jsonl") + " >> " +
                  quote(root + "/app.txt"));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  std::ifstream appended(root + "/app.txt");
  std::string first, second;
  std::getline(appended, first);
  std::getline(appended, second);
  EXPECT_EQ(first, "kept");
  EXPECT_THAT(second, HasSubstr(R"("input_length":2)"));
  std::filesystem::remove(root + "/ids.jsonl");
  std::filesystem::remove(root + "/app.txt");
  size_t files = 0;  // no temporary file left beside the output
  for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator(root)) ++files;
  EXPECT_EQ(files, 2u);
}

}  // namespace
}  // namespace crescent::cli_test
