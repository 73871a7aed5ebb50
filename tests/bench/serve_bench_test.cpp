// The serve bench driver in process on a small mock cluster: every open-loop request answered, every stream
// completed with all its tokens, the handler timed once per request; bad options refused.
#include "bench/serve_bench.h"

#include <gtest/gtest.h>

namespace crescent::bench {
namespace {

ServeBenchOptions tiny_serve_bench() {
  ServeBenchOptions options;
  options.config = cluster::load_cluster_config(CRESCENT_SOURCE_DIR "/configs/paper-fig5.json", 512).value();
  options.config.prefill_instances = 2;
  options.config.decode_instances = 1;
  options.rate_per_s = 100;
  options.seconds = 0.2;
  options.streams = 8;
  options.tokens_per_stream = 4;
  return options;
}

TEST(ServeBenchTest, AnswersEveryRequestAndCompletesEveryStream) {
  Result<ServeBenchReport> report = run_serve_bench(tiny_serve_bench());
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  const ServeAdmission& a = report->admission;
  EXPECT_EQ(a.requests, 20u);  // 100/s for 0.2 s
  EXPECT_EQ(a.answered, 20u);
  EXPECT_EQ(a.dropped_client_side, 0u);
  EXPECT_GT(a.achieved_per_s, 0);
  EXPECT_GT(a.handler_p50_us, 0);
  EXPECT_LE(a.handler_p50_us, a.handler_p99_us);
  EXPECT_LE(a.response_p50_ms, a.response_p99_ms);
  EXPECT_GT(a.response_p50_ms * 1e3, a.handler_p50_us);  // a response takes longer than its admission
  const ServeStreams& s = report->streams;
  EXPECT_EQ(s.completed, 8u);
  EXPECT_EQ(s.tokens_delivered, 8 * 4);
  EXPECT_GE(s.held_at_once, 8);
  EXPECT_EQ(s.admissions_timed, 8u);  // one handler call per stream
  EXPECT_GT(s.seconds, 0);
  EXPECT_DOUBLE_EQ(s.tokens_per_s, 32 / s.seconds);
  EXPECT_GT(report->peak_rss_mib, 0);
}

TEST(ServeBenchTest, OptionsOutOfRangeAreRefused) {
  ServeBenchOptions options = tiny_serve_bench();
  options.streams = 0;
  EXPECT_EQ(run_serve_bench(options).status().code(), StatusCode::kInvalidArgument);
  options = tiny_serve_bench();
  options.tokens_per_stream = 1;
  EXPECT_EQ(run_serve_bench(options).status().code(), StatusCode::kInvalidArgument);
  options = tiny_serve_bench();
  options.rate_per_s = 0;
  EXPECT_EQ(run_serve_bench(options).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace crescent::bench
