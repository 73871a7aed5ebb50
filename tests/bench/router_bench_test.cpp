// The router bench driver in process on a small run: every request answered through the router, one
// overhead sample per measured request, the stages timed; bad options refused. No timing is asserted.
#include "bench/router_bench.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace crescent::bench {
namespace {

RouterBenchOptions tiny_router_bench() {
  RouterBenchOptions options;
  options.config = cluster::load_cluster_config(CRESCENT_SOURCE_DIR "/configs/local.json", 16).value();
  std::string corpus;
  for (int i = 0; corpus.size() < 8192; ++i)
    corpus +=
        "The router places request " + std::to_string(i) + " on the engine whose cache holds its prefix. ";
  options.corpus_text = corpus;
  options.prompt_bytes = 2048;
  options.rate_per_s = 100;
  options.seconds = 0.2;
  options.warmup_s = 0.05;
  options.engines = 2;
  options.shared_prefixes = 2;
  return options;
}

TEST(RouterBenchTest, AnswersEveryRequestThroughTheRouter) {
  Result<RouterBenchReport> report = run_router_bench(tiny_router_bench());
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_EQ(report->tokenizer_kind, "bytes");
  EXPECT_EQ(report->requests_sent, 20u);  // 100/s for 0.2 s
  EXPECT_EQ(report->answered, 20u);
  EXPECT_EQ(report->failed, 0u);
  EXPECT_EQ(report->overhead_us.count, 20u);  // one sample per measured request
  EXPECT_GT(report->overhead_us.p50, 0);
  EXPECT_LE(report->overhead_us.p50, report->overhead_us.p99);
  EXPECT_LE(report->overhead_us.p99, report->overhead_us.max);
  EXPECT_EQ(report->end_to_end_us.count, 20u);
  EXPECT_GT(report->prompt_tokens_mean, 2000);  // bytes: a token a byte (a UTF-8 cut takes at most 3 off)
  EXPECT_GT(report->cpu_us_per_request, 0);
  EXPECT_GT(report->placement_us_mean, 0);
  std::vector<std::string> stages;
  for (const StageTiming& stage : report->stages) {
    stages.push_back(stage.name);
    if (stage.name != "tokenize cold") {
      EXPECT_EQ(stage.us.count, 20u) << stage.name;
    }
  }
  EXPECT_EQ(stages, (std::vector<std::string>{"parse body", "tokenize", "block keys", "engine body",
                                              "tokenize cold"}));
}

TEST(RouterBenchTest, OptionsOutOfRangeAreRefused) {
  const auto refused = [](RouterBenchOptions options) {
    return run_router_bench(options).status().code() == StatusCode::kInvalidArgument;
  };
  RouterBenchOptions options = tiny_router_bench();
  options.rate_per_s = 0;
  EXPECT_TRUE(refused(options));
  options = tiny_router_bench();
  options.prompt_bytes = 100;
  EXPECT_TRUE(refused(options));
  options = tiny_router_bench();
  options.engines = 0;
  EXPECT_TRUE(refused(options));
  options = tiny_router_bench();
  options.shared_prefix_share = 1;
  EXPECT_TRUE(refused(options));
  options = tiny_router_bench();
  options.corpus_text = "too short";
  EXPECT_TRUE(refused(options));
}

}  // namespace
}  // namespace crescent::bench
