// The scenarios of issue #8, run as a user runs them: small traces and configs written to files, `crescent
// simulate --requests-out` read back to see where each request went and why. Each test is one kind of fault
// the issue found (ties in placement, eviction of a prefix's head, trace files as people have them,
// statistics of nothing, options that would be ignored).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "run_crescent.h"
#include "test_support/temp_dir.h"

namespace crescent::cli_test {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// One trace line.
std::string row(int64_t timestamp_ms, int64_t input_tokens, int64_t output_tokens,
                const std::vector<uint64_t>& keys) {
  return json{{"timestamp", timestamp_ms},
              {"input_length", input_tokens},
              {"output_length", output_tokens},
              {"hash_ids", keys}}
      .dump();
}

// A scratch directory with the files of one scenario.
class Scenario {
 public:
  std::string write(const std::string& name, const std::string& content) {
    const std::string path = dir_.file(name);
    std::ofstream(path, std::ios::binary) << content;
    return path;
  }
  // A config of llama3-70b on 8xA800 instances; `fields` adds or overrides fields.
  std::string config(json fields) {
    json c = {{"model", "llama3-70b"}, {"hardware", "8xA800"}};
    c.update(fields);
    return write("config.json", c.dump());
  }
  std::string file(const std::string& name) const { return dir_.file(name); }

 private:
  test::TempDir dir_{"crescent-cli-scenario"};
};

// The JSON lines of a --requests-out file.
std::vector<json> read_lines(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(json::parse(line));
  return lines;
}

int64_t total(const std::vector<json>& lines, const char* key) {
  int64_t sum = 0;
  for (const json& l : lines) sum += l[key].get<int64_t>();
  return sum;
}

double mean(const std::vector<json>& lines, const char* key) {
  double sum = 0;
  for (const json& l : lines) sum += l[key].get<double>();
  return sum / static_cast<double>(lines.size());
}

// §1: 2 prefill instances caching 4 blocks each, 1 decode; requests 10 s apart, prefixes shared pairwise.
// Ties between idle instances used to send everything to instance 0 (cache-aware hit ratio 0%).
TEST(UserScenarios, TiesInPlacementSpreadLoad) {
  Scenario s;
  const std::string trace = s.write(
      "t.jsonl", row(0, 1536, 1, {1, 2, 3}) + "\n" + row(10'000, 1536, 1, {4, 5, 6}) + "\n" +
                     row(20'000, 2048, 1, {1, 2, 3, 7}) + "\n" + row(30'000, 2048, 1, {4, 5, 6, 8}) + "\n");
  const std::string config =
      s.config({{"prefill_instances", 2}, {"decode_instances", 1}, {"prefill_cache_capacity_tokens", 2048}});
  const CliRun run = run_crescent("simulate " + quote(trace) + " --config " + quote(config) +
                                  " --compare least-loaded,cache-aware,global-cache-aware --requests-out " +
                                  quote(s.file("r.jsonl")));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::vector<json> least = read_lines(s.file("r.least-loaded.jsonl"));
  ASSERT_EQ(least.size(), 4u);
  EXPECT_EQ(total(least, "hit_tokens"), 3072);
  for (const std::string& policy : std::vector<std::string>{"cache-aware", "global-cache-aware"}) {
    SCOPED_TRACE(policy);
    const std::vector<json> lines = read_lines(s.file("r." + policy + ".jsonl"));
    ASSERT_EQ(lines.size(), 4u);
    EXPECT_EQ(lines[0]["policy"], policy);
    // The first two go to different instances; each repeat goes where its prefix is.
    EXPECT_NE(lines[0]["prefill_instance"], lines[1]["prefill_instance"]);
    EXPECT_EQ(lines[2]["prefill_instance"], lines[0]["prefill_instance"]);
    EXPECT_EQ(lines[3]["prefill_instance"], lines[1]["prefill_instance"]);
    EXPECT_GE(total(lines, "hit_tokens"), 3072);  // of 7,168 prompt tokens
    EXPECT_EQ(total(lines, "prompt_tokens"), 7168);
    EXPECT_LE(mean(lines, "ttft_s"), mean(least, "ttft_s") + 1e-12);
  }
}

// §2: 1 prefill instance caching 3 blocks: [1,2,3], [4], [1,2,3]. [4] evicts block 3, the first request's
// tail, so the third reuses blocks 1-2: 1,024 of 3,584 tokens (it used to be 0: the head went first).
TEST(UserScenarios, EvictionKeepsPrefixesUsable) {
  Scenario s;
  const std::string trace = s.write("t.jsonl", row(0, 1536, 1, {1, 2, 3}) + "\n" + row(10'000, 512, 1, {4}) +
                                                   "\n" + row(20'000, 1536, 1, {1, 2, 3}));
  const std::string config =
      s.config({{"prefill_instances", 1}, {"decode_instances", 1}, {"prefill_cache_capacity_tokens", 1536}});
  const CliRun run = run_crescent("simulate " + quote(trace) + " --config " + quote(config) +
                                  " --policy cache-aware --json --requests-out " + quote(s.file("r.jsonl")));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_NEAR(json::parse(run.out)["policies"][0]["hit_ratio"].get<double>(), 1024.0 / 3584, 1e-12);
  const std::vector<json> lines = read_lines(s.file("r.jsonl"));
  ASSERT_EQ(lines.size(), 3u);
  EXPECT_EQ(lines[2]["hit_tokens"], 1024);
  EXPECT_EQ(lines[2]["local_hit_tokens"], 1024);
  EXPECT_EQ(lines[2]["fetched_hit_tokens"], 0);

  // The analyzer's capacity curve follows the same rule.
  const CliRun analyze = run_crescent("analyze --json --capacities 1536 " + quote(trace));
  ASSERT_EQ(analyze.exit_code, 0) << analyze.err;
  EXPECT_NEAR(json::parse(analyze.out)["hit_ratio_by_capacity"][0]["hit_ratio"].get<double>(), 1024.0 / 3584,
              1e-12);
}

// §3: a trace exported from production logs: a byte-order mark, CRLF lines, Unix-epoch milliseconds and
// 64-bit block keys gives the same results as the plain trace shifted to start at 0.
TEST(UserScenarios, TraceFilesAsPeopleHaveThem) {
  Scenario s;
  const std::vector<std::vector<uint64_t>> keys = {
      {18446744073709551615u, 7}, {18446744073709551615u, 9}, {5}, {18446744073709551615u, 7, 11}};
  const std::vector<int64_t> times = {0, 1'500, 1'500, 9'000};
  const std::vector<int64_t> inputs = {1000, 700, 300, 1400};
  std::string plain, exported = "\xEF\xBB\xBF";
  for (size_t i = 0; i < keys.size(); ++i) {
    plain += row(times[i], inputs[i], 20, keys[i]) + "\n";
    exported += row(1'717'171'717'000 + times[i], inputs[i], 20, keys[i]) + "\r\n";
  }
  const std::string a = s.write("plain.jsonl", plain), b = s.write("exported.jsonl", exported);
  const std::string config = s.config({{"prefill_instances", 2}, {"decode_instances", 2}});
  for (const std::string& command :
       {"simulate --json --config " + quote(config), std::string("analyze --json")}) {
    SCOPED_TRACE(command);
    const CliRun ra = run_crescent(command + " " + quote(a));
    const CliRun rb = run_crescent(command + " " + quote(b));
    ASSERT_EQ(ra.exit_code, 0) << ra.err;
    ASSERT_EQ(rb.exit_code, 0) << rb.err;
    json ja = json::parse(ra.out), jb = json::parse(rb.out);
    ja.erase("trace");
    jb.erase("trace");
    EXPECT_EQ(ja, jb);
  }
  const CliRun out = run_crescent("simulate --config " + quote(config) + " " + quote(b) + " --requests-out " +
                                  quote(s.file("r.jsonl")));
  ASSERT_EQ(out.exit_code, 0) << out.err;
  EXPECT_EQ(read_lines(s.file("r.jsonl"))[3]["arrival_s"], 9.0);  // from the first arrival
}

TEST(UserScenarios, ZeroLengthsAreInvalidOrSkipped) {
  Scenario s;
  const std::string trace = s.write(
      "t.jsonl", row(0, 600, 5, {1, 2}) + "\n" + row(1, 512, 0, {3}) + "\n" + row(2, 512, 5, {4}) + "\n");
  const std::string config = s.config({{"prefill_instances", 1}, {"decode_instances", 1}});
  const CliRun strict = run_crescent("simulate --config " + quote(config) + " " + quote(trace));
  EXPECT_EQ(strict.exit_code, 2);
  EXPECT_THAT(strict.err, HasSubstr(trace + ":2: field 'output_length': must be >= 1, got 0"));
  const CliRun skip =
      run_crescent("simulate --json --skip-invalid --config " + quote(config) + " " + quote(trace));
  ASSERT_EQ(skip.exit_code, 0) << skip.err;
  EXPECT_EQ(json::parse(skip.out)["requests"], 2);
  EXPECT_THAT(skip.err, HasSubstr("skipped 1 invalid line: 1 zero length"));
}

// §4: when nothing completes, the statistics are null / n/a and a warning says why.
TEST(UserScenarios, StatisticsOfNothingAreNotZero) {
  Scenario s;
  const std::string trace =
      s.write("t.jsonl", row(0, 1536, 4, {1, 2, 3}) + "\n" + row(10, 1536, 4, {4, 5, 6}));
  // 79% of HBM reserved leaves llama3-70b about 900 tokens of KV on a decode instance: no request fits.
  const std::string config =
      s.config({{"prefill_instances", 1}, {"decode_instances", 1}, {"decode_hbm_reserved_share", 0.779}});
  const CliRun table = run_crescent("simulate --config " + quote(config) + " " + quote(trace));
  ASSERT_EQ(table.exit_code, 0) << table.err;
  EXPECT_THAT(table.out, HasSubstr("n/a"));
  EXPECT_THAT(table.err,
              StartsWith("warning: global-cache-aware: no request completed: all 2 were rejected (2 "
                         "context-length: prompt + output larger than a decode instance's whole HBM"));
  const CliRun run = run_crescent("simulate --json --config " + quote(config) + " " + quote(trace) +
                                  " --requests-out " + quote(s.file("r.jsonl")));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const json p = json::parse(run.out)["policies"][0];
  for (const char* key : {"ttft_mean_s", "ttft_p50_s", "ttft_p99_s", "tbt_mean_s", "tbt_p99_s", "hit_ratio",
                          "prefill_compute_s_per_request", "slo_attainment_accepted"}) {
    EXPECT_TRUE(p[key].is_null()) << key;
  }
  EXPECT_EQ(p["rejected_by_reason"]["context-length"], 2);
  const std::vector<json> lines = read_lines(s.file("r.jsonl"));
  ASSERT_EQ(lines.size(), 2u);
  EXPECT_EQ(lines[0]["outcome"], "rejected");
  EXPECT_EQ(lines[0]["reject_reason"], "context-length");
  EXPECT_TRUE(lines[0]["ttft_s"].is_null());
  EXPECT_TRUE(lines[0]["prefill_instance"].is_null());

  // One output token each: TTFT exists, TBT does not.
  const std::string one = s.write("one.jsonl", row(0, 512, 1, {1}) + "\n" + row(10, 512, 1, {2}));
  const std::string roomy = s.config({{"prefill_instances", 1}, {"decode_instances", 1}});
  const CliRun single = run_crescent("simulate --json --config " + quote(roomy) + " " + quote(one));
  ASSERT_EQ(single.exit_code, 0) << single.err;
  const json q = json::parse(single.out)["policies"][0];
  EXPECT_TRUE(q["ttft_mean_s"].is_number());
  EXPECT_TRUE(q["tbt_mean_s"].is_null());
  EXPECT_EQ(single.err, "");
}

// §5: every request's line says where it went and what its time was spent on.
TEST(UserScenarios, RequestsOutExplainsEachRequest) {
  Scenario s;
  // Two long prompts at once on one prefill instance: the second waits for the first.
  const std::string trace = s.write("t.jsonl", row(0, 8192, 3, std::vector<uint64_t>(16, 0)) + "\n" +
                                                   row(0, 4096, 3, {100, 101, 102, 103, 104, 105, 106, 107}));
  const std::string config = s.config({{"prefill_instances", 1}, {"decode_instances", 1}});
  const CliRun run = run_crescent("simulate --config " + quote(config) + " " + quote(trace) +
                                  " --requests-out " + quote(s.file("r.jsonl")));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::vector<json> lines = read_lines(s.file("r.jsonl"));
  ASSERT_EQ(lines.size(), 2u);
  for (const char* key :
       {"request", "policy", "arrival_s", "outcome", "reject_reason", "prefill_instance", "decode_instance",
        "prompt_tokens", "output_tokens", "hit_tokens", "local_hit_tokens", "fetched_hit_tokens",
        "queue_wait_s", "prefix_load_s", "prefill_s", "ttft_s", "tbt_s", "max_token_gap_s", "e2e_s"}) {
    EXPECT_TRUE(lines[1].contains(key)) << key;
  }
  EXPECT_EQ(lines[1]["request"], 1);
  EXPECT_EQ(lines[1]["line"], 2);  // its line in the trace file
  EXPECT_EQ(lines[1]["outcome"], "completed");
  EXPECT_EQ(lines[1]["prompt_tokens"], 4096);
  EXPECT_DOUBLE_EQ(lines[1]["queue_wait_s"].get<double>(), lines[0]["ttft_s"].get<double>());
  EXPECT_NEAR(lines[1]["ttft_s"].get<double>(),
              lines[1]["queue_wait_s"].get<double>() + lines[1]["prefix_load_s"].get<double>() +
                  lines[1]["prefill_s"].get<double>(),
              1e-9);
  EXPECT_GE(lines[1]["max_token_gap_s"].get<double>(), lines[1]["tbt_s"].get<double>());
  EXPECT_GT(lines[1]["e2e_s"].get<double>(), lines[1]["ttft_s"].get<double>());
  EXPECT_THAT(run.err, HasSubstr("wrote 2 per-request lines (global-cache-aware) to " + s.file("r.jsonl")));

  // '-': the lines on stdout, the report on stderr.
  const CliRun piped =
      run_crescent("simulate --config " + quote(config) + " " + quote(trace) + " --requests-out -");
  ASSERT_EQ(piped.exit_code, 0) << piped.err;
  std::istringstream out(piped.out);
  int n = 0;
  for (std::string line; std::getline(out, line); ++n)
    EXPECT_EQ(json::parse(line)["policy"], "global-cache-aware");
  EXPECT_EQ(n, 2);
  EXPECT_THAT(piped.err, HasSubstr("TTFT mean"));
}

// §7: options that would be ignored are errors, named before any work is done.
TEST(UserScenarios, IgnoredOptionsAreErrors) {
  Scenario s;
  const std::string trace = s.write("t.jsonl", row(0, 512, 2, {1}));
  const std::string empty = s.write("empty.jsonl", "\n\n");
  const std::string config = s.config({{"prefill_instances", 1}, {"decode_instances", 1}});
  const std::string sim = "simulate --config " + quote(config) + " ";
  auto expect_error = [](const CliRun& run, const std::string& needle) {
    EXPECT_EQ(run.exit_code, 2) << run.err;
    EXPECT_THAT(run.err, HasSubstr("error: "));
    EXPECT_THAT(run.err, HasSubstr(needle));
  };
  expect_error(run_crescent(sim + quote(trace) + " --policy random --compare random,cache-aware"),
               "--policy and --compare both choose prefill policies");
  expect_error(run_crescent(sim + quote(trace) + " --chunk-tokens 256"),
               "colocated-chunked-prefill only, not 'disaggregated'");
  expect_error(run_crescent(sim + quote(trace) + " --system colocated --chunk-tokens 256"),
               "colocated-chunked-prefill only, not 'colocated'");
  EXPECT_EQ(
      run_crescent(sim + quote(trace) + " --system colocated-chunked-prefill --chunk-tokens 256").exit_code,
      0);
  expect_error(run_crescent(sim + quote(empty)), empty + ": the trace has no requests");
  expect_error(run_crescent("analyze " + quote(empty)), empty + ": the trace has no requests");
  expect_error(run_crescent(sim + quote(trace) + " --compare random,random"), "names policy 'random' twice");
  expect_error(run_crescent(sim + quote(trace) + " --requests-out " + quote(s.file("no/such/dir/r.jsonl"))),
               "does not exist");
  const std::string bad = s.write("bad.jsonl", row(0, 512, 0, {1}));
  expect_error(run_crescent(sim + quote(bad) + " --skip-invalid"),
               "no valid requests (all 1 non-blank lines");
}

}  // namespace
}  // namespace crescent::cli_test
