// The transfer bench driver in process: tcp reads and writes against a target process (the built crescent
// binary), every run's bytes accounted in whole requests and checked by checksums in both processes, the
// baselines measured beside them, the target gone afterwards; a target that cannot start is an error Status.
#include "bench/transfer_bench.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>

#include <cerrno>

#include "common/text_format.h"

namespace crescent::bench {
namespace {

using ::testing::ElementsAre;
using transfer::TransferOp;
using transfer::TransportKind;

TransferBenchOptions tiny_tcp_bench() {
  TransferBenchOptions options;
  options.seconds = 0.05;
  options.working_set_bytes = 4 * kMiB;
  options.loopback_streams = 1;  // the one-socket baseline only
  options.crescent_binary = CRESCENT_BINARY;
  for (TransferOp op : {TransferOp::kRead, TransferOp::kWrite}) {
    options.runs.push_back({.path = {.kind = TransportKind::kTcp, .ucx_tls = ""},
                            .block_bytes = 64 * kKiB,
                            .batch = 4,
                            .threads = 1,
                            .op = op});
  }
  return options;
}

TEST(TransferBenchTest, TcpRunsMoveWholeRequestsAndVerifyChecksums) {
  const TransferBenchOptions options = tiny_tcp_bench();
  Result<TransferBenchReport> report = run_transfer_bench(options);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_THAT(report->target_transports, ElementsAre("tcp"));
  EXPECT_GT(report->target_pid, 0);
  EXPECT_EQ(::kill(report->target_pid, 0) != 0 ? errno : 0, ESRCH) << "the target outlived the bench";
  EXPECT_EQ(report->segment_bytes, 4 * kMiB);
  ASSERT_EQ(report->runs.size(), 2u);
  for (size_t i = 0; i < report->runs.size(); ++i) {
    const TransferRunResult& run = report->runs[i];
    SCOPED_TRACE(op_name(run.spec.op));
    EXPECT_EQ(run.error, "");
    EXPECT_EQ(run.spec.op, options.runs[i].op);  // in the order asked
    EXPECT_GT(run.requests, 0u);
    EXPECT_EQ(run.requests % 4, 0u);  // whole batches
    EXPECT_EQ(run.bytes, run.requests * 64 * kKiB);
    EXPECT_GT(run.seconds, 0);
    EXPECT_DOUBLE_EQ(run.gbps, static_cast<double>(run.bytes) / run.seconds / 1e9);
    EXPECT_GT(run.latency_samples, 0u);
    EXPECT_LE(run.p50_us, run.p99_us);
    EXPECT_LE(run.batch_p50_us, run.batch_p99_us);
    EXPECT_EQ(run.verified_bytes, 3 * 64 * kKiB);  // the verification batch's first, middle and last block
    EXPECT_EQ(run.working_set_bytes, 4 * kMiB);
  }
  // One baseline per block size of the runs, and 1 MiB (the goals'), sorted.
  ASSERT_EQ(report->baselines.size(), 2u);
  EXPECT_EQ(report->baselines[0].block_bytes, 64 * kKiB);
  EXPECT_EQ(report->baselines[0].batch, 4u);
  EXPECT_EQ(report->baselines[1].block_bytes, kMiB);
  for (const TransferBaseline& baseline : report->baselines) {
    EXPECT_GT(baseline.memcpy_gbps, 0);
    EXPECT_EQ(baseline.tcp_loopback_error, "");
    EXPECT_GT(baseline.tcp_loopback_gbps, 0);
    EXPECT_EQ(baseline.tcp_loopback_streams_gbps, 0);  // loopback_streams 1: not run
  }
  EXPECT_GT(report->wall_seconds, 0);
}

TEST(TransferBenchTest, ATargetThatCannotStartIsAnError) {
  TransferBenchOptions options = tiny_tcp_bench();
  options.crescent_binary = "/nonexistent/crescent";
  Result<TransferBenchReport> report = run_transfer_bench(options);
  ASSERT_FALSE(report.ok());
  EXPECT_EQ(report.status().code(), StatusCode::kUnavailable) << report.status().to_string();
}

TEST(TransferBenchTest, WorkingSetCoversEveryThreadsBatch) {
  const TransferRunSpec spec{.path = {}, .block_bytes = kMiB, .batch = 8, .threads = 2};
  EXPECT_EQ(run_working_set_bytes(spec, 4 * kMiB), 16 * kMiB);   // 2 threads x 8 x 1 MiB in flight
  EXPECT_EQ(run_working_set_bytes(spec, 33 * kMiB), 34 * kMiB);  // a multiple of threads x block
}

}  // namespace
}  // namespace crescent::bench
