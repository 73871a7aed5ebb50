// End-to-end tests of `crescent simulate`: output shape, determinism, and bad input (exit code 2, one error
// line).
#include <gmock/gmock.h>
#include <gnu/libc-version.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "common/huge_pages.h"
#include "run_crescent.h"

namespace crescent::cli_test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

const std::string kTrace = quote(CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz");
const std::string kConfig = "--config " + quote(CRESCENT_SOURCE_DIR "/configs/paper-fig5.json");

// Exactly one line on stderr, starting with "error: ".
void expect_one_error_line(const CliRun& run, const std::string& needle) {
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_THAT(run.err, StartsWith("error: "));
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  EXPECT_THAT(run.err, HasSubstr(needle));
}

// Writes `body` to this process's config file (one path, rewritten by each call), removed at exit.
std::string write_config(const std::string& body) {
  struct RemovedAtExit {
    std::filesystem::path path;
    ~RemovedAtExit() {
      std::error_code ec;
      std::filesystem::remove(path, ec);
    }
  };
  static const RemovedAtExit file{temp_path("crescent_cli_config.json")};
  std::ofstream(file.path) << body;
  return file.path.string();
}

TEST(SimulateCli, JsonHasEveryPolicyWithTheDocumentedFields) {
  CliRun run =
      run_crescent("simulate " + kTrace + " " + kConfig +
                   " --limit 2000 --compare random,least-loaded,cache-aware,global-cache-aware --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  auto j = nlohmann::json::parse(run.out);
  ASSERT_EQ(j["policies"].size(), 4u);
  EXPECT_EQ(j["policies"][0]["name"], "random");
  EXPECT_EQ(j["policies"][3]["name"], "global-cache-aware");
  for (const auto& p : j["policies"]) {
    for (const char* key : {"name", "ttft_mean_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s", "tbt_mean_s",
                            "tbt_p99_s", "hit_ratio", "slo_attainment", "completed", "rejected"}) {
      EXPECT_TRUE(p.contains(key)) << key;
    }
    EXPECT_EQ(p["completed"].get<int>() + p["rejected"].get<int>(), 2000);
    EXPECT_LE(p["ttft_p50_s"].get<double>(), p["ttft_p99_s"].get<double>());
  }
}

// The commands that simulate start once more, with a heap of huge pages (common/huge_pages.h). Under
// LD_SHOW_AUXV glibc prints each start's auxiliary vector, whose AT_EXECFN is the file executed. One second
// start and no third (it saw its tunable set), of the binary itself (not /proc/self/exe: the process keeps
// its name); what it prints is what one start prints. None when asked not to, when the user set the
// tunable, under LD_PRELOAD or the dynamic loader, or for a command that does not simulate; and a setgid
// copy (secure mode, where glibc drops the tunable) runs once and ends.
TEST(SimulateCli, SimulatingCommandsStartOnceMoreWithAHugePageHeap) {
  const std::string mode = transparent_huge_page_mode();
  if (mode != "madvise")
    GTEST_SKIP() << "transparent huge pages are " << (mode.empty() ? "unknown" : mode)
                 << " here, not given only when asked for";
  int glibc_major = 0, glibc_minor = 0;
  std::sscanf(gnu_get_libc_version(), "%d.%d", &glibc_major, &glibc_minor);
  if (glibc_major == 2 && glibc_minor < 35)
    GTEST_SKIP() << "glibc " << gnu_get_libc_version() << " has no hugetlb tunable";
  const std::string binary = std::filesystem::canonical(CRESCENT_BINARY).string();
  const auto run_with = [](const std::string& env, const std::string& command_line) {
    return run_shell("env -u GLIBC_TUNABLES -u CRESCENT_HUGE_PAGES -u LD_PRELOAD LD_SHOW_AUXV=1 " + env +
                     " " + command_line);
  };
  // The files executed, in order, and the output without the auxiliary vectors' lines.
  const auto starts_of = [](const CliRun& run) {
    std::vector<std::string> executed;
    std::string output;
    std::istringstream lines(run.out);
    for (std::string line; std::getline(lines, line);) {
      if (!line.starts_with("AT_")) {
        output += line + "\n";
      } else if (line.starts_with("AT_EXECFN:")) {
        executed.push_back(line.substr(line.find_first_not_of(' ', 10)));
      }
    }
    return std::pair(executed, output);
  };
  const std::string simulate = "simulate " + kTrace + " " + kConfig + " --limit 300 --json";
  const CliRun again = run_with("", quote(CRESCENT_BINARY) + " " + simulate);
  ASSERT_EQ(again.exit_code, 0) << again.err;
  const auto [executed, output] = starts_of(again);
  ASSERT_EQ(executed.size(), 2u) << again.out;
  EXPECT_EQ(executed[1], binary);
  EXPECT_THAT(output, HasSubstr("global-cache-aware"));
  const std::string libc = "/lib/x86_64-linux-gnu/libc.so.6";
  for (const std::string& env : std::vector<std::string>{
           "CRESCENT_HUGE_PAGES=0", "GLIBC_TUNABLES=glibc.malloc.hugetlb=0", "LD_PRELOAD=" + libc}) {
    if (env.starts_with("LD_PRELOAD") && !std::filesystem::exists(libc)) continue;
    const CliRun once = run_with(env, quote(CRESCENT_BINARY) + " " + simulate);
    ASSERT_EQ(once.exit_code, 0) << env << ": " << once.err;
    EXPECT_EQ(starts_of(once).first.size(), 1u) << env;
    EXPECT_EQ(starts_of(once).second, output) << env;
  }
  const std::string loader = "/lib64/ld-linux-x86-64.so.2";
  if (std::filesystem::exists(loader)) {
    const CliRun loaded = run_with("", loader + " " + quote(CRESCENT_BINARY) + " " + simulate);
    ASSERT_EQ(loaded.exit_code, 0) << loaded.err;
    EXPECT_EQ(starts_of(loaded).first.size(), 1u) << loaded.out.substr(0, 2000);
    EXPECT_EQ(starts_of(loaded).second, output);
  }
  for (const std::string command : {"plan", "experiment"}) {
    EXPECT_EQ(starts_of(run_with("", quote(CRESCENT_BINARY) + " " + command + " --help")).first.size(), 2u)
        << command;
  }
  const CliRun analyze = run_with("", quote(CRESCENT_BINARY) + " analyze " + kTrace + " --json");
  ASSERT_EQ(analyze.exit_code, 0) << analyze.err;
  EXPECT_EQ(starts_of(analyze).first.size(), 1u);
  // Secure mode: a setgid copy whose group is not ours (as root, which CI is; elsewhere chgrp fails and this
  // part is left out, and where the file system ignores setgid the copy just runs as any binary does).
  // `timeout` ends a start that never stops starting.
  const auto copy = temp_path("crescent-setgid");
  std::filesystem::copy_file(CRESCENT_BINARY, copy, std::filesystem::copy_options::overwrite_existing);
  if (run_shell("chgrp nogroup " + quote(copy.string()) + " && chmod g+s " + quote(copy.string()))
          .exit_code == 0) {
    const CliRun secure = run_with("", "timeout 120 " + quote(copy.string()) + " " + simulate);
    EXPECT_EQ(secure.exit_code, 0) << secure.err;
    EXPECT_EQ(starts_of(secure).second, output);
  }
  std::filesystem::remove(copy);
}

TEST(SimulateCli, SameInputsGiveByteIdenticalOutput) {
  const std::string args =
      "simulate " + kTrace + " " + kConfig + " --limit 3000 --compare random,global-cache-aware";
  CliRun a = run_crescent(args);
  CliRun b = run_crescent(args);
  ASSERT_EQ(a.exit_code, 0) << a.err;
  EXPECT_EQ(a.out, b.out);
  EXPECT_THAT(a.out, HasSubstr("global-cache-aware"));
  CliRun ja = run_crescent(args + " --json");
  CliRun jb = run_crescent(args + " --json");
  EXPECT_EQ(ja.out, jb.out);
}

// Per-request lines that cannot be written (a full disk) are an error naming where, not a truncated output
// and exit 0; to a file, they leave no file behind.
TEST(SimulateCli, PerRequestLinesThatCannotBeWrittenAreAnError) {
  if (!std::filesystem::exists("/dev/full")) GTEST_SKIP() << "no /dev/full here";
  const std::string args = "simulate " + kTrace + " " + kConfig + " --limit 300";
  expect_one_error_line(run_crescent(args + " --requests-out - > /dev/full"), "cannot write to stdout");
  const CliRun fine = run_crescent(args + " --requests-out - 2>/dev/null");
  EXPECT_EQ(fine.exit_code, 0);
  EXPECT_EQ(std::count(fine.out.begin(), fine.out.end(), '\n'), 300);
}

// Policies run at once (one per thread) give what they give one after another: the table, the JSON and
// each policy's per-request lines, byte for byte.
TEST(SimulateCli, PoliciesRunAtOnceGiveTheSameOutputAsOneAfterAnother) {
  const std::string args = "simulate " + kTrace + " " + kConfig +
                           " --limit 3000 --compare random,least-loaded,cache-aware,global-cache-aware";
  const auto lines = [](const std::string& out) { return quote(temp_path(out).string()); };
  CliRun one = run_crescent(args + " --threads 1 --requests-out " + lines("crescent_sim_t1.jsonl"));
  CliRun three = run_crescent(args + " --threads 3 --requests-out " + lines("crescent_sim_t3.jsonl"));
  ASSERT_EQ(one.exit_code, 0) << one.err;
  ASSERT_EQ(three.exit_code, 0) << three.err;
  EXPECT_EQ(one.out, three.out);
  for (const char* policy : {"random", "least-loaded", "cache-aware", "global-cache-aware"}) {
    const auto read = [&](const char* stem) {
      const std::filesystem::path path = temp_path(std::string(stem) + "." + policy + ".jsonl");
      std::ifstream in(path);
      std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
      std::filesystem::remove(path);
      return text;
    };
    const std::string a = read("crescent_sim_t1"), b = read("crescent_sim_t3");
    EXPECT_FALSE(a.empty()) << policy;
    EXPECT_EQ(a, b) << policy;
  }
  EXPECT_EQ(run_crescent(args + " --threads 2 --json").out, run_crescent(args + " --threads 1 --json").out);
  expect_one_error_line(run_crescent(args + " --threads -1"), "--threads -1");
  expect_one_error_line(run_crescent("simulate " + kTrace + " " + kConfig + " --threads 2"), "--compare");
}

TEST(SimulateCli, UnknownPolicyListsValidNames) {
  expect_one_error_line(
      run_crescent("simulate " + kTrace + " " + kConfig + " --compare random,fastest"),
      "unknown prefill policy 'fastest' (valid: random, round-robin, least-loaded, cache-aware, "
      "global-cache-aware)");
  expect_one_error_line(run_crescent("simulate " + kTrace + " " + kConfig + " --admission maybe"),
                        "valid: none, slo");
}

TEST(SimulateCli, ImpossibleConfigsAreRefused) {
  auto zero = write_config(R"({"model": "llama3-70b", "hardware": "8xA800", "prefill_instances": 0,
                               "decode_instances": 8})");
  expect_one_error_line(run_crescent("simulate " + kTrace + " --config " + quote(zero)), "prefill_instances");
  auto bandwidth = write_config(R"({"model": "llama3-70b", "prefill_instances": 1, "decode_instances": 1,
                                    "hardware": {"preset": "8xA800", "network_bytes_per_s": -1}})");
  expect_one_error_line(run_crescent("simulate " + kTrace + " --config " + quote(bandwidth)),
                        "network_bytes_per_s");
  auto small_cache = write_config(R"({"model": "llama3-70b", "hardware": "8xA800", "prefill_instances": 1,
                                      "decode_instances": 1, "prefill_cache_capacity_tokens": 10})");
  expect_one_error_line(run_crescent("simulate " + kTrace + " --config " + quote(small_cache)),
                        "prefill_cache_capacity_tokens");
  auto preset = write_config(R"({"model": "llama9", "hardware": "8xA800", "prefill_instances": 1,
                                 "decode_instances": 1})");
  expect_one_error_line(run_crescent("simulate " + kTrace + " --config " + quote(preset)), "llama3-70b");
  auto not_json = write_config("{ nope");
  expect_one_error_line(run_crescent("simulate " + kTrace + " --config " + quote(not_json)),
                        "not valid JSON");
  expect_one_error_line(run_crescent("simulate " + kTrace + " --config /nonexistent.json"),
                        "/nonexistent.json");
  std::filesystem::remove(zero);
}

TEST(SimulateCli, BadTraceAndOptionsAreRefused) {
  auto path = temp_path("crescent_cli_trace.jsonl");
  std::ofstream(path) << R"({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]})"
                         "\n{\"timestamp\": 1, \"input_length\": 600}\n";
  expect_one_error_line(run_crescent("simulate " + quote(path.string()) + " " + kConfig), ":2:");
  CliRun skipped =
      run_crescent("simulate " + quote(path.string()) + " " + kConfig + " --skip-invalid --json");
  EXPECT_EQ(skipped.exit_code, 0) << skipped.err;
  EXPECT_THAT(skipped.err, HasSubstr("skipped 1"));
  EXPECT_EQ(nlohmann::json::parse(skipped.out)["requests"], 1);
  std::filesystem::remove(path);
  expect_one_error_line(run_crescent("simulate " + kTrace + " " + kConfig + " --time-scale 0"),
                        "--time-scale");
  expect_one_error_line(run_crescent("simulate " + kTrace + " " + kConfig + " --time-scale -2"),
                        "--time-scale");
  expect_one_error_line(run_crescent("simulate " + kTrace + " " + kConfig + " --block-size 0"), "block size");
  // Arrivals pushed past what doubles time precisely.
  expect_one_error_line(run_crescent("simulate " + kTrace + " " + kConfig + " --time-scale 1e-310"),
                        "last arrival");
}

TEST(SimulateCli, ExtremeRequestsAreRefusedNotSimulatedForever) {
  // An output longer than a decode instance's whole HBM can never run: counted as rejected, quickly.
  auto path = temp_path("crescent_cli_huge.jsonl");
  std::ofstream(path)
      << R"({"timestamp": 0, "input_length": 600, "output_length": 9223372036854775807, "hash_ids": [1, 2]})"
         "\n"
      << R"({"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [3]})"
         "\n";
  CliRun run = run_crescent("simulate " + quote(path.string()) + " " + kConfig + " --json");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  auto p = nlohmann::json::parse(run.out)["policies"][0];
  EXPECT_EQ(p["rejected"], 1);
  EXPECT_EQ(p["completed"], 1);
  std::filesystem::remove(path);
}

TEST(SimulateCli, WeightsThatDoNotFitDecodeHbmAreAConfigError) {
  auto config = write_config(R"({"model": "llama3-70b", "prefill_instances": 1, "decode_instances": 1,
                                 "hardware": {"preset": "8xA800", "gpus": 1}})");
  expect_one_error_line(run_crescent("simulate " + kTrace + " --config " + quote(config)), "no room for KV");
}

TEST(SimulateCli, NonUtf8PathInJsonDoesNotCrash) {
  auto dir = temp_path("crescent_cli_\xff");
  std::filesystem::create_directories(dir);
  auto path = dir / "t.jsonl";
  std::ofstream(path) << R"({"timestamp": 0, "input_length": 600, "output_length": 5, "hash_ids": [1, 2]})"
                         "\n";
  CliRun run = run_crescent("simulate " + quote(path.string()) + " " + kConfig + " --json");
  EXPECT_EQ(run.exit_code, 0) << run.err;
  auto j = nlohmann::json::parse(run.out);  // valid JSON: the bad byte was replaced
  EXPECT_EQ(j["requests"], 1);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace crescent::cli_test

namespace crescent::cli_test {
namespace {

TEST(SimulateCli, ConfigNumberOverflowIsBadInput) {
  auto config = temp_path("crescent_cli_overflow.json");
  std::ofstream(config) << R"({"model": "llama3-70b", "hardware": "8xA800", "prefill_instances": 1,
                               "decode_instances": 1, "slo": {"tbt_s": [1e400]}})";
  CliRun run = run_crescent("simulate " + kTrace + " --config " + quote(config.string()));
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_THAT(run.err, HasSubstr(config.string()));
  std::filesystem::remove(config);
}

TEST(SimulateCli, AdmissionAndPoliciesAreRefusedForColocatedSystems) {
  for (const char* flag : {"--admission predictive", "--policy random", "--compare random,cache-aware"}) {
    CliRun run =
        run_crescent("simulate " + kTrace + " " + kConfig + " --system colocated --limit 10 " + flag);
    EXPECT_EQ(run.exit_code, 2) << flag;
    EXPECT_THAT(run.err, HasSubstr("apply to --system disaggregated")) << flag;
  }
}

TEST(ExperimentCli, EmptyTraceIsRefusedAndLeavesNoDirectory) {
  auto trace = temp_path("crescent_cli_empty.jsonl");
  std::ofstream(trace) << "\n";
  auto out = temp_path("crescent_cli_empty_out");
  std::filesystem::remove_all(out);
  CliRun run = run_crescent("experiment capacity --trace " + quote(trace.string()) + " " + kConfig +
                            " --out " + quote(out.string()));
  EXPECT_EQ(run.exit_code, 2);
  EXPECT_THAT(run.err, HasSubstr("no requests"));
  EXPECT_FALSE(std::filesystem::exists(out));
  // A run that fails after the directory was created removes it again.
  CliRun late = run_crescent("experiment capacity " + kConfig + " --trace " + kTrace +
                             " --time-scale 1e-300 --out " + quote(out.string()));
  EXPECT_EQ(late.exit_code, 2);
  EXPECT_FALSE(std::filesystem::exists(out));
  std::filesystem::remove(trace);
}

}  // namespace
}  // namespace crescent::cli_test
