// End-to-end tests of `crescent plan`: what its first line says, the files it writes, and that `crescent
// simulate` on the config it recommends meets the target while the best of one node fewer does not.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "run_crescent.h"

namespace crescent::cli_test {
namespace {

using ::testing::HasSubstr;
using ::testing::StartsWith;

const std::string kTrace = quote(CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz");

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in(path);
  return nlohmann::json::parse(in);
}

// Runs a "crescent simulate ..." command the plan printed, with --json; the SLO attainment it reports.
double simulated_attainment(std::string command) {
  const std::string word = "crescent ";
  EXPECT_THAT(command, StartsWith(word));
  CliRun run = run_shell(quote(CRESCENT_BINARY) + " " + command.substr(word.size()) + " --json");
  EXPECT_EQ(run.exit_code, 0) << command << "\n" << run.err;
  if (run.exit_code != 0) return -1;
  return nlohmann::json::parse(run.out)["policies"][0]["slo_attainment"].get<double>();
}

TEST(PlanCli, WithNoFlagsItSaysWhatItPlansForAndItsRecommendationChecksOut) {
  const auto out = temp_path("crescent_plan_out");
  CliRun run =
      run_crescent("plan " + kTrace + " --limit 2000 --admissions none,early --out " + quote(out.string()));
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const std::string first_line = run.out.substr(0, run.out.find('\n'));
  EXPECT_THAT(first_line, HasSubstr("llama3-70b on 8xA800"));
  EXPECT_THAT(first_line, HasSubstr("the bundled default configs/paper-fig5.json"));
  EXPECT_THAT(first_line, HasSubstr("TTFT <= 30 s and TBT <= 100 ms for 99% of requests"));
  EXPECT_THAT(first_line, HasSubstr("the trace's own rate"));
  EXPECT_THAT(run.out, HasSubstr("\nRecommended: "));
  EXPECT_THAT(run.out, HasSubstr("\nCheck: crescent simulate "));
  for (const char* file : {"plan.json", "plan.svg", "recommended.json"}) {
    EXPECT_TRUE(std::filesystem::exists(out / file)) << file;
  }
  const nlohmann::json plan = read_json(out / "plan.json");
  EXPECT_EQ(plan["question"], "fewest-nodes");
  EXPECT_EQ(plan["requests"], 2000);
  ASSERT_TRUE(plan["recommended"].is_object());
  EXPECT_TRUE(plan["recommended"]["meets"].get<bool>());
  EXPECT_GE(plan["search"]["candidates"].get<int>(), 50);
  // `crescent simulate` on the recommended config gives the plan's attainment, at or above the target; on the
  // best config of one node fewer, below it.
  const double recommended = simulated_attainment(plan["recommended_check"].get<std::string>());
  EXPECT_EQ(recommended, plan["recommended"]["report"]["slo_attainment"].get<double>());
  EXPECT_GE(recommended, 0.99);
  ASSERT_TRUE(plan.contains("next_smaller_check")) << "the plan found nothing one node smaller to check";
  EXPECT_LT(simulated_attainment(plan["next_smaller_check"].get<std::string>()), 0.99);
  EXPECT_EQ(plan["next_smaller"]["nodes"].get<int>() + 1, plan["recommended"]["nodes"].get<int>());
}

TEST(PlanCli, JsonGoesToStdoutAloneAndBadFlagsAreOneErrorLine) {
  CliRun run = run_crescent("plan " + kTrace + " --limit 800 --admissions none --json --rate 2");
  ASSERT_EQ(run.exit_code, 0) << run.err;
  const nlohmann::json plan = nlohmann::json::parse(run.out);  // the first line went to stderr
  EXPECT_THAT(run.err, HasSubstr("requests/s"));
  EXPECT_NEAR(plan["rate_scale"].get<double>() * plan["trace_rate_rps"].get<double>(), 2.0, 1e-9);
  for (const auto& [flags, needle] : std::vector<std::pair<std::string, std::string>>{
           {"--rate 2 --rate-scale 3", "--rate-scale and --rate"},
           {"--attainment 1.5", "attainment target 1.5"},
           {"--nodes 1", "--nodes 1"},
           {"--nodes 0", "--nodes 0"},
           {"--nodes 4 --max-nodes 8", "--max-nodes"},
           {"--nodes 513", "at most 512"},
           {"--admissions none,maybe", "maybe"},
           {"--tbt-slo 0", "--tbt-slo 0"}}) {
    CliRun bad = run_crescent("plan " + kTrace + " --limit 100 " + flags);
    EXPECT_EQ(bad.exit_code, 2) << flags << "\n" << bad.err;
    EXPECT_THAT(bad.err, StartsWith("error: ")) << flags;
    EXPECT_THAT(bad.err, HasSubstr(needle)) << flags;
  }
}

}  // namespace
}  // namespace crescent::cli_test
