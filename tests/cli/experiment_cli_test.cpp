// End-to-end tests of `crescent experiment`: the files written, determinism, and bad input (exit code 2, one
// error line, nothing written).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "run_crescent.h"

namespace crescent::cli_test {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

const std::string kConversation = quote(CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz");
const std::string kSynthetic = quote(CRESCENT_SOURCE_DIR "/data/traces/synthetic_trace.jsonl.gz");
const std::string kConfig = "--config " + quote(CRESCENT_SOURCE_DIR "/configs/paper-fig5.json");

// An output directory of this test process (not created), removed at the end.
struct OutDir {
  fs::path path = temp_path("crescent_experiment_cli_test");
  OutDir() { fs::remove_all(path); }
  ~OutDir() { fs::remove_all(path); }
  std::string arg() const { return "--out " + quote(path.string()); }
};

std::string read(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void expect_one_error_line(const CliRun& run, const std::string& needle) {
  EXPECT_EQ(run.exit_code, 2) << run.err;
  EXPECT_THAT(run.err, StartsWith("error: "));
  EXPECT_EQ(std::count(run.err.begin(), run.err.end(), '\n'), 1) << run.err;
  EXPECT_THAT(run.err, HasSubstr(needle));
}

TEST(ExperimentCli, CacheCapacityWritesJsonAndPlotForEveryTrace) {
  OutDir out;
  CliRun run = run_crescent("experiment cache-capacity " + out.arg() + " --trace " + kConversation +
                            " --trace " + kSynthetic + " " + kConfig);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("cache-capacity.json"));
  const auto j = nlohmann::json::parse(read(out.path / "cache-capacity.json"));
  EXPECT_EQ(j["experiment"], "cache-capacity");
  EXPECT_EQ(j["time_scale"], 1.0);
  ASSERT_EQ(j["traces"].size(), 2u);
  for (const auto& t : j["traces"]) {
    EXPECT_GT(t["ceiling"].get<double>(), 0);
    ASSERT_FALSE(t["points"].empty());
    for (const char* key : {"capacity_tokens", "local_hit_ratio", "global_hit_ratio"}) {
      EXPECT_TRUE(t["points"][0].contains(key)) << key;
    }
  }
  const std::string svg = read(out.path / "cache-capacity.svg");
  EXPECT_THAT(svg, HasSubstr("<svg"));
  EXPECT_THAT(svg, HasSubstr("conversation_trace"));
  EXPECT_THAT(svg, HasSubstr("synthetic_trace"));
}

// Issue #8 §7: an experiment prints a short table of its main numbers, not only the file names, and names
// the hardware as used when the config overrides a preset.
TEST(ExperimentCli, PrintsItsMainNumbersAndTheHardwareAsUsed) {
  OutDir out;
  const fs::path config = out.path.string() + "-config.json";
  nlohmann::json c = nlohmann::json::parse(read(CRESCENT_SOURCE_DIR "/configs/paper-fig5.json"));
  c["hardware"] = {{"preset", "8xA800"}, {"gpus", 16}};
  std::ofstream(config) << c.dump();
  const CliRun run = run_crescent("experiment scheduling " + out.arg() + " --trace " + kSynthetic +
                                  " --config " + quote(config.string()));
  const CliRun simulate =
      run_crescent("simulate " + kSynthetic + " --limit 200 --config " + quote(config.string()));
  fs::remove(config);
  ASSERT_EQ(run.exit_code, 0) << run.err;
  EXPECT_THAT(run.out, HasSubstr("TTFT mean"));
  EXPECT_THAT(run.out, HasSubstr("global-cache-aware"));
  EXPECT_THAT(run.out, HasSubstr("scheduling.json"));
  EXPECT_NE(read(out.path / "scheduling.svg").find("8xA800 with gpus=16"), std::string::npos);
  ASSERT_EQ(simulate.exit_code, 0) << simulate.err;
  EXPECT_THAT(simulate.out, HasSubstr("instances of 8xA800 with gpus=16 serving llama3-70b"));
}

TEST(ExperimentCli, SameInputsGiveByteIdenticalJson) {
  OutDir out;
  const std::string args =
      "experiment cache-capacity " + out.arg() + " --trace " + kSynthetic + " " + kConfig;
  ASSERT_EQ(run_crescent(args).exit_code, 0);
  const std::string first = read(out.path / "cache-capacity.json");
  ASSERT_EQ(run_crescent(args).exit_code, 0);
  EXPECT_EQ(read(out.path / "cache-capacity.json"), first);
  EXPECT_THAT(first, HasSubstr("synthetic_trace"));
}

TEST(ExperimentCli, UnknownExperimentListsValidNames) {
  expect_one_error_line(
      run_crescent("experiment fastest --out /tmp"),
      "unknown experiment 'fastest' (valid: scheduling, cache-capacity, capacity, overload, pd-ratio)");
}

TEST(ExperimentCli, BadOptionsWriteNothing) {
  OutDir out;
  expect_one_error_line(run_crescent("experiment scheduling " + kConfig + " " + out.arg() + " --trace " +
                                     kSynthetic + " --time-scale 0"),
                        "--time-scale must be > 0");
  expect_one_error_line(run_crescent("experiment scheduling " + kConfig + " " + out.arg() + " --trace " +
                                     kSynthetic + " --trace " + kSynthetic),
                        "takes one --trace, got 2");
  expect_one_error_line(
      run_crescent("experiment scheduling " + kConfig + " " + out.arg() + " --trace /nonexistent.jsonl"),
      "/nonexistent.jsonl");
  EXPECT_FALSE(fs::exists(out.path));
}

TEST(ExperimentCli, UnwritableOutputDirectoryWritesNothing) {
  expect_one_error_line(
      run_crescent("experiment scheduling " + kConfig + " --out /proc/forbidden --trace " + kSynthetic),
      "/proc/forbidden");
  OutDir out;
  fs::create_directories(out.path);
  std::ofstream(out.path / "file") << "x";
  expect_one_error_line(run_crescent("experiment scheduling " + kConfig + " --out " +
                                     quote((out.path / "file" / "sub").string()) + " --trace " + kSynthetic),
                        "file/sub");
  EXPECT_EQ(std::distance(fs::directory_iterator(out.path), {}), 1);
}

}  // namespace
}  // namespace crescent::cli_test
