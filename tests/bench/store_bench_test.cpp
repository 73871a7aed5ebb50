// The store bench driver in process: a master and a node (the built crescent binary) and put and get runs
// over tcp and shm, each counting whole batches of checked values; the metadata figures beside them; bad
// options refused before anything starts.
#include "bench/store_bench.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <tuple>
#include <vector>

namespace crescent::bench {
namespace {

using namespace std::chrono_literals;

StoreBenchOptions tiny_store_bench() {
  StoreBenchOptions options;
  options.crescent_binary = CRESCENT_BINARY;
  options.systems = {"crescent-tcp", "crescent-shm"};
  options.ops = {"put", "get"};
  options.value_bytes = {4096};
  options.threads = {1};
  options.batches = {2};
  options.duration = 150ms;
  options.node_dram_bytes = 64ull << 20;
  options.metadata_objects = 2000;
  options.metadata_threads = {1};
  return options;
}

TEST(StoreBenchTest, PutAndGetRunsCountWholeBatchesOverBothTransports) {
  StoreBenchOptions options = tiny_store_bench();
  std::vector<std::string> progressed;
  options.progress = [&](const KvRunResult& r) { progressed.push_back(r.spec.system + " " + r.spec.op); };
  Result<StoreBenchReport> report = run_store_bench(options);
  ASSERT_TRUE(report.ok()) << report.status().to_string();
  EXPECT_THAT(report->warnings, ::testing::IsEmpty());
  // Value size, threads, batch, op, then system, as the options nest.
  const std::vector<std::string> order = {"crescent-tcp put", "crescent-shm put", "crescent-tcp get",
                                          "crescent-shm get"};
  EXPECT_EQ(progressed, order);
  ASSERT_EQ(report->runs.size(), 4u);
  for (size_t i = 0; i < report->runs.size(); ++i) {
    const KvRunResult& r = report->runs[i];
    SCOPED_TRACE(order[i]);
    EXPECT_EQ(r.spec.system + " " + r.spec.op, order[i]);
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(std::tie(r.spec.value_bytes, r.spec.threads, r.spec.batch), std::tuple(4096u, 1, 2u));
    EXPECT_GT(r.ops, 0u);
    EXPECT_EQ(r.ops % 2, 0u);
    EXPECT_EQ(r.bytes, r.ops * 4096);
    EXPECT_GT(r.gbps, 0);
    EXPECT_LE(r.p50_us, r.p99_us);
  }
  ASSERT_EQ(report->metadata_runs.size(), 1u);
  EXPECT_EQ(report->metadata_runs[0].threads, 1);
  EXPECT_GT(report->metadata_runs[0].ops_per_s, 0);
  EXPECT_EQ(report->master_objects, 2000u);
  EXPECT_GE(report->master_rss_bytes_per_object, 0);
  EXPECT_GT(report->get_replica_list_p50_us, 0);
  EXPECT_LE(report->get_replica_list_p50_us, report->get_replica_list_p99_us);
}

TEST(StoreBenchTest, BadOptionsAreRefusedBeforeAnythingStarts) {
  StoreBenchOptions options = tiny_store_bench();
  options.systems = {"memcached"};
  EXPECT_EQ(run_store_bench(options).status().code(), StatusCode::kInvalidArgument);
  options = tiny_store_bench();
  options.ops = {"delete"};
  EXPECT_EQ(run_store_bench(options).status().code(), StatusCode::kInvalidArgument);
  options = tiny_store_bench();
  options.crescent_binary = "";
  EXPECT_EQ(run_store_bench(options).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace crescent::bench
