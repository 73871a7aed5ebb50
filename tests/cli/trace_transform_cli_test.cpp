// End-to-end tests of `crescent trace transform`: what each step does to a trace, as `crescent analyze` (and
// `simulate`) see the output, with expectations worked out by hand; bad flags and inputs (exit 2, one line).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "run_crescent.h"

namespace crescent::cli_test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

const std::string kConversation = CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz";
const std::string kSynthetic = CRESCENT_SOURCE_DIR "/data/traces/synthetic_trace.jsonl.gz";

void expect_one_error_line(const CliRun& run, const std::string& needle) {
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_THAT(run.err, StartsWith("error: "));
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  EXPECT_THAT(run.err, HasSubstr(needle));
}

std::string write_trace(const std::string& name, const std::vector<std::string>& lines) {
  const std::filesystem::path path = temp_path(name);
  std::ofstream out(path);
  for (const std::string& line : lines) out << line << "\n";
  return path.string();
}

// One line: {"timestamp", "input_length", "output_length": 1, "hash_ids"[, "session_id"]}.
std::string row(int64_t timestamp_ms, int64_t input_tokens, const std::string& keys, int64_t session = -1) {
  std::string line = "{\"timestamp\": " + std::to_string(timestamp_ms) +
                     ", \"input_length\": " + std::to_string(input_tokens) +
                     ", \"output_length\": 1, \"hash_ids\": [" + keys + "]";
  if (session >= 0) line += ", \"session_id\": " + std::to_string(session);
  return line + "}";
}

std::vector<nlohmann::json> read_lines(const std::string& path) {
  std::vector<nlohmann::json> out;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) out.push_back(nlohmann::json::parse(line));
  return out;
}

std::vector<int64_t> timestamps(const std::vector<nlohmann::json>& lines) {
  std::vector<int64_t> out;
  for (const nlohmann::json& line : lines) out.push_back(line["timestamp"].get<int64_t>());
  return out;
}

// `crescent transform ARGS`, which must succeed; its stderr.
std::string transform(const std::string& args) {
  const CliRun run = run_crescent("trace transform " + args);
  EXPECT_EQ(run.exit_code, 0) << run.err;
  EXPECT_EQ(run.out, "");
  return run.err;
}

nlohmann::json analyze(const std::string& path, const std::string& capacities = "inf") {
  const CliRun run = run_crescent("analyze --json --capacities " + capacities + " " + quote(path));
  EXPECT_EQ(run.exit_code, 0) << run.err;
  return run.exit_code == 0 ? nlohmann::json::parse(run.out) : nlohmann::json();
}

// Arrivals twice as fast: half the span, twice the rate; the analyzer's hit ratios depend on the order of
// arrivals only, so they do not move.
TEST(TraceTransformCli, RateScaleHalvesTheSpanAndDoublesTheRate) {
  const std::string out = temp_path("rate.jsonl").string();
  const std::string err = transform(quote(kConversation) + " --rate-scale 2 --out " + quote(out));
  EXPECT_EQ(err, "wrote 12031 requests over 1768.500 s to " + out + "\n");  // 3536.999 s / 2, rounded to ms
  const nlohmann::json before = analyze(kConversation, "1M,inf");
  const nlohmann::json after = analyze(out, "1M,inf");
  EXPECT_EQ(after["requests"], 12031);
  EXPECT_NEAR(after["span_s"].get<double>(), before["span_s"].get<double>() / 2, 1e-3);
  EXPECT_NEAR(after["arrival_rate_per_s"].get<double>() / before["arrival_rate_per_s"].get<double>(), 2,
              1e-6);
  EXPECT_EQ(after["reuse_ceiling"], before["reuse_ceiling"]);
  EXPECT_EQ(after["hit_ratio_by_capacity"], before["hit_ratio_by_capacity"]);
}

TEST(TraceTransformCli, WindowKeepsItsStartDropsItsEndAndStartsAtZero) {
  const std::string in =
      write_trace("window_in.jsonl", {row(0, 1, "1"), row(999, 1, "2"), row(1000, 1, "3"), row(1500, 1, "4"),
                                      row(1999, 1, "5"), row(2000, 1, "6"), row(3000, 1, "7")});
  const std::string out = temp_path("window.jsonl").string();
  transform(quote(in) + " --window 1:2 --out " + quote(out));
  std::vector<nlohmann::json> lines = read_lines(out);
  EXPECT_EQ(timestamps(lines), (std::vector<int64_t>{0, 500, 999}));
  EXPECT_EQ(lines[0]["hash_ids"], nlohmann::json::array({3}));
  transform(quote(in) + " --window 1.5: --out " + quote(out));
  EXPECT_EQ(timestamps(read_lines(out)), (std::vector<int64_t>{0, 499, 500, 1500}));
  transform(quote(in) + " --window :1 --out " + quote(out));
  EXPECT_EQ(timestamps(read_lines(out)), (std::vector<int64_t>{0, 999}));

  const CliRun empty = run_crescent("trace transform " + quote(in) + " --window 10:20 --out " + quote(out));
  expect_one_error_line(empty, "no request arrives in the window [10 s, 20 s)");
}

// Three sessions, each a system prompt block P (key 100) and its own history: turn 1 [P, a], turn 2 [P, a,
// b], one 512-token block each. With an unbounded cache, of N copies every request but the very first hits P
// and every turn 2 also hits its a: (6N - 1) + 3N hit blocks of 15N.
std::string system_prompt_sessions() {
  std::vector<std::string> lines;
  for (int s = 0; s < 3; ++s) lines.push_back(row(1000 * s, 1024, "100, " + std::to_string(10 + s), s));
  for (int s = 0; s < 3; ++s) {
    lines.push_back(
        row(5000 + 1000 * s, 1536, "100, " + std::to_string(10 + s) + ", " + std::to_string(20 + s), s));
  }
  return write_trace("sessions.jsonl", lines);
}

TEST(TraceTransformCli, CopiesShareTheSystemPromptAndNothingElse) {
  const std::string in = system_prompt_sessions();
  const std::string out = temp_path("copies.jsonl").string();
  const std::string err = transform(quote(in) + " --copies 4 --out " + quote(out));
  EXPECT_THAT(err, HasSubstr("wrote 24 requests"));
  EXPECT_THAT(err, HasSubstr("4 copies of 6 requests; 1 of 7 block keys shared by >= 2 of 3 sessions"));
  EXPECT_NEAR(analyze(out)["reuse_ceiling"].get<double>(), (9.0 * 4 - 1) / (15 * 4), 1e-12);
  std::vector<int64_t> sessions;
  for (const nlohmann::json& line : read_lines(out)) sessions.push_back(line["session_id"].get<int64_t>());
  std::sort(sessions.begin(), sessions.end());
  EXPECT_EQ(std::unique(sessions.begin(), sessions.end()) - sessions.begin(), 12);  // 3 sessions x 4 copies

  // A block of one session is shared too: the copies repeat the same prompts, and only the first occurrence
  // of each of the 7 blocks misses.
  transform(quote(in) + " --copies 4 --shared-min 1 --out " + quote(out));
  EXPECT_NEAR(analyze(out)["reuse_ceiling"].get<double>(), 1 - 7.0 / (15 * 4), 1e-12);
}

// The bundled trace has no session ids: a block is shared when 1% of the requests (121 of 12,031) use it,
// which only the first block (in every request) is. More users, the same ceiling, but a cache of a given
// size holds less of it.
TEST(TraceTransformCli, CopiesOfTheBundledTrace) {
  const std::string out = temp_path("copies_conversation.jsonl").string();
  const std::string err = transform(quote(kConversation) + " --copies 3 --out " + quote(out));
  EXPECT_THAT(err, HasSubstr("wrote 36093 requests"));
  EXPECT_THAT(err, HasSubstr("1 of 182790 block keys shared by >= 121 of 12031 requests (no session ids)"));
  const nlohmann::json before = analyze(kConversation, "1M");
  const nlohmann::json after = analyze(out, "1M");
  EXPECT_NEAR(after["arrival_rate_per_s"].get<double>(), 3 * before["arrival_rate_per_s"].get<double>(),
              0.01);
  EXPECT_GE(after["reuse_ceiling"].get<double>(), before["reuse_ceiling"].get<double>());
  EXPECT_LT(after["reuse_ceiling"].get<double>(), before["reuse_ceiling"].get<double>() + 1e-3);
  EXPECT_LT(after["hit_ratio_by_capacity"][0]["hit_ratio"].get<double>(),
            before["hit_ratio_by_capacity"][0]["hit_ratio"].get<double>());
}

// Merged in arrival order (ties to the first input), each input from time 0; the second input's keys apart
// from the first's unless --shared-keys; sessions numbered apart.
TEST(TraceTransformCli, MergeOrdersArrivalsAndKeepsKeysApart) {
  const std::string a = write_trace("merge_a.jsonl", {row(100, 512, "1", 3), row(400, 1024, "1, 2", 3)});
  const std::string b = write_trace("merge_b.jsonl", {row(7000, 512, "1", 3), row(7200, 512, "5", 4)});
  const std::string out = temp_path("merged.jsonl").string();
  transform(quote(a) + " " + quote(b) + " --out " + quote(out));
  const std::vector<nlohmann::json> lines = read_lines(out);
  ASSERT_EQ(lines.size(), 4u);
  EXPECT_EQ(timestamps(lines), (std::vector<int64_t>{0, 0, 200, 300}));
  EXPECT_EQ(lines[0]["hash_ids"], nlohmann::json::array({1}));  // a's first: ties go to the first input
  EXPECT_NE(lines[1]["hash_ids"], nlohmann::json::array({1}));  // b's 1 is not a's 1
  EXPECT_EQ(lines[0]["session_id"], 6);                         // 3 x 2 inputs + 0
  EXPECT_EQ(lines[1]["session_id"], 7);                         // 3 x 2 + 1
  EXPECT_EQ(lines[2]["session_id"], 9);                         // 4 x 2 + 1
  // Hits: a's second request reuses block 1 (512 of 2560 tokens); keyed alike, b's first does too.
  EXPECT_NEAR(analyze(out)["reuse_ceiling"].get<double>(), 512.0 / 2560, 1e-12);
  transform(quote(a) + " " + quote(b) + " --shared-keys --out " + quote(out));
  EXPECT_NEAR(analyze(out)["reuse_ceiling"].get<double>(), 1024.0 / 2560, 1e-12);
  transform(quote(a) + " " + quote(b) + " --absolute-time --out " + quote(out));
  EXPECT_EQ(timestamps(read_lines(out)), (std::vector<int64_t>{0, 300, 6900, 7100}));
}

// Twice the length: every shared prefix is twice as long in tokens, so the share of reused tokens is the
// same to the last bit (hits and lengths both double, exactly).
TEST(TraceTransformCli, LengthScaleKeepsTheHitStructure) {
  const std::string out = temp_path("longer.jsonl").string();
  transform(quote(kConversation) + " --length-scale 2 --out " + quote(out));
  const nlohmann::json before = analyze(kConversation);
  const nlohmann::json after = analyze(out);
  EXPECT_EQ(after["reuse_ceiling"], before["reuse_ceiling"]);
  EXPECT_EQ(after["input_tokens_mean"].get<double>(), 2 * before["input_tokens_mean"].get<double>());
  EXPECT_EQ(after["output_tokens_mean"].get<double>(), 2 * before["output_tokens_mean"].get<double>());
  EXPECT_EQ(after["span_s"], before["span_s"]);
  transform(quote(kConversation) + " --length-scale 2 --output-scale 1 --out " + quote(out));
  EXPECT_EQ(analyze(out)["output_tokens_mean"], before["output_tokens_mean"]);
}

// Both bundled traces, every step at once: the output is a trace simulate runs, request for request.
TEST(TraceTransformCli, EveryStepOnTheBundledTracesGivesATraceSimulateRuns) {
  const std::string out = temp_path("all_steps.jsonl").string();
  const std::string err = transform(
      quote(kConversation) + " " + quote(kSynthetic) +
      " --window 60:240 --copies 2 --length-scale 0.5 --rate-scale 1.5 --dense-ids --out " + quote(out));
  const std::vector<nlohmann::json> lines = read_lines(out);
  EXPECT_THAT(err, HasSubstr("wrote " + std::to_string(lines.size()) + " requests over"));
  ASSERT_GT(lines.size(), 1000u);
  EXPECT_EQ(lines[0]["hash_ids"][0], 0);         // dense ids from 0
  EXPECT_LE(timestamps(lines).back(), 120'000);  // 180 s / 1.5
  const CliRun run = run_crescent("simulate --json --policy cache-aware --config " +
                                  quote(CRESCENT_SOURCE_DIR "/configs/paper-fig5.json") + " " + quote(out));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json result = nlohmann::json::parse(run.out);
  EXPECT_EQ(result["requests"], lines.size());
  const nlohmann::json& policy = result["policies"][0];
  EXPECT_EQ(policy["completed"].get<size_t>() + policy["rejected"].get<size_t>(), lines.size());
}

TEST(TraceTransformCli, HelpListsTheStepsInOrder) {
  const CliRun run = run_crescent("trace transform --help");
  EXPECT_EQ(run.exit_code, 0);
  EXPECT_THAT(run.out, HasSubstr("Steps, in this order"));
  EXPECT_LT(run.out.find("2. --window"), run.out.find("3. --copies"));
  EXPECT_THAT(run.out, HasSubstr("docs/traces.md"));
}

TEST(TraceTransformCli, BadFlagsAndInputsFailNamingThem) {
  const std::string in = system_prompt_sessions();
  const std::string out = temp_path("never_written.jsonl").string();
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"--rate-scale 0", "--rate-scale '0': expected a number in [1e-06, 1e+06]"},
      {"--rate-scale -2", "--rate-scale '-2'"},
      {"--rate-scale abc", "--rate-scale 'abc'"},
      {"--rate-scale inf", "--rate-scale 'inf'"},
      {"--length-scale 0", "--length-scale '0'"},
      {"--output-scale 1e9", "--output-scale '1e9'"},
      {"--window 5:3", "--window '5:3': END must be after START"},
      {"--window 5", "--window '5': expected START_S:END_S"},
      {"--window a:9", "--window 'a:9': START 'a' is not a number of seconds >= 0"},
      {"--window 1:-4", "END '-4' is not a number of seconds >= 0"},
      {"--copies 0", "--copies must be in [1, 256], got 0"},
      {"--copies 257", "--copies must be in [1, 256], got 257"},
      {"--copies 2 --shared-min 0", "--shared-min '0': expected a number of sessions >= 1"},
      {"--copies 2 --shared-min 0%", "--shared-min '0%': a percentage must be in (0, 100]"},
      {"--copies 2 --shared-min 101%", "--shared-min '101%'"},
      {"--copies 2 --shared-min two", "--shared-min 'two'"},
      {"--shared-min 2", "--shared-min decides what --copies share"},
      {"--block-size 0", "--block-size must be >= 1, got 0"},
      {"--block-size 256",
       in + ":1: field 'hash_ids': has 2 entries, expected ceil(input_length 1024 / block size 256) = 4"},
  };
  for (const auto& [flags, message] : cases) {
    SCOPED_TRACE(flags);
    expect_one_error_line(run_crescent("trace transform " + quote(in) + " " + flags + " --out " + quote(out)),
                          message);
    EXPECT_FALSE(std::filesystem::exists(out));
  }
  expect_one_error_line(run_crescent("trace transform " + quote(in) + " --out " + quote(out + ".gz")),
                        "gzip output is not written");
  expect_one_error_line(run_crescent("trace transform /nonexistent/trace.jsonl --out " + quote(out)),
                        "/nonexistent/trace.jsonl");
  const std::string bad = write_trace("bad_session.jsonl", {row(0, 512, "1", 2), R"({"timestamp": 5, )"
                                                                                 R"("input_length": 512, )"
                                                                                 R"("output_length": 1, )"
                                                                                 R"("hash_ids": [1], )"
                                                                                 R"("session_id": "x"})"});
  for (const char* copies : {"", " --copies 2"}) {
    expect_one_error_line(
        run_crescent("trace transform " + quote(in) + " " + quote(bad) + copies + " --out " + quote(out)),
        bad + ":2: field 'session_id': must be a non-negative integer, got \"x\"");
  }
  EXPECT_FALSE(std::filesystem::exists(out));
}

}  // namespace
}  // namespace crescent::cli_test
