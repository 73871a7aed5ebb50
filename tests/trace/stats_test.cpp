#include "trace/stats.h"

#include <gtest/gtest.h>

#include <optional>
#include <vector>

#include "trace/reader.h"

namespace crescent::trace {
namespace {

Request request(int64_t timestamp_ms, int64_t input_tokens, std::vector<BlockKey> keys,
                int64_t output_tokens = 1) {
  return Request{timestamp_ms, input_tokens, output_tokens, std::move(keys)};
}

TraceStats analyze(const std::vector<Request>& requests, AnalyzerOptions options) {
  TraceAnalyzer analyzer(std::move(options));
  for (const Request& r : requests) analyzer.add(r);
  return analyzer.finish();
}

TEST(TraceAnalyzerTest, EmptyTrace) {
  const TraceStats stats = analyze({}, {});
  EXPECT_EQ(stats.requests, 0);
  EXPECT_EQ(stats.span_s, 0);
  EXPECT_FALSE(stats.arrival_rate_per_s.has_value());  // statistics of nothing are absent, not 0
  EXPECT_FALSE(stats.input_tokens.has_value());
  EXPECT_FALSE(stats.output_tokens.has_value());
  EXPECT_FALSE(stats.reuse_ceiling.has_value());
  ASSERT_EQ(stats.hit_ratio_by_capacity.size(), 5u);  // the default capacities
  EXPECT_EQ(stats.hit_ratio_by_capacity[0].capacity_tokens, 1'000'000);
  EXPECT_EQ(stats.hit_ratio_by_capacity[4].capacity_tokens, std::nullopt);
  EXPECT_FALSE(stats.hit_ratio_by_capacity[4].hit_ratio.has_value());
  EXPECT_TRUE(stats.hottest_blocks.empty());
}

TEST(TraceAnalyzerTest, ArrivalsAndLengthPercentiles) {
  // Timestamps 1000 .. 3000 ms: span 2 s, 3 requests / 2 s = 1.5 req/s.
  // Inputs {30, 10, 20}: mean 20; nearest rank p50 = sorted[ceil(1.5) - 1] = 20, p99 = sorted[ceil(2.97) - 1]
  // = 30. Outputs {5, 7, 1}: mean 13/3; p50 = 5; p99 = 7.
  const TraceStats stats =
      analyze({request(1000, 30, {}, 5), request(1500, 10, {}, 7), request(3000, 20, {}, 1)},
              {.block_size_tokens = 512, .capacities_tokens = {}});
  EXPECT_EQ(stats.requests, 3);
  EXPECT_DOUBLE_EQ(stats.span_s, 2.0);
  EXPECT_DOUBLE_EQ(stats.arrival_rate_per_s.value(), 1.5);
  EXPECT_DOUBLE_EQ(stats.input_tokens->mean, 20.0);
  EXPECT_EQ(stats.input_tokens->p50, 20);
  EXPECT_EQ(stats.input_tokens->p99, 30);
  EXPECT_DOUBLE_EQ(stats.output_tokens->mean, 13.0 / 3);
  EXPECT_EQ(stats.output_tokens->p50, 5);
  EXPECT_EQ(stats.output_tokens->p99, 7);
  EXPECT_TRUE(stats.hit_ratio_by_capacity.empty());
}

TEST(TraceAnalyzerTest, PercentilesOfOneToHundred) {
  // Inputs 100, 99, ..., 1: nearest rank p50 = 50th smallest = 50, p99 = 99th smallest = 99.
  std::vector<Request> requests;
  for (int64_t i = 100; i >= 1; --i) requests.push_back(request(0, i, {}));
  const TraceStats stats = analyze(requests, {.capacities_tokens = {}});
  EXPECT_DOUBLE_EQ(stats.input_tokens->mean, 50.5);
  EXPECT_EQ(stats.input_tokens->p50, 50);
  EXPECT_EQ(stats.input_tokens->p99, 99);
  EXPECT_EQ(stats.span_s, 0);
  EXPECT_FALSE(stats.arrival_rate_per_s.has_value());  // zero span: no rate
}

TEST(TraceAnalyzerTest, CeilingCountsOnlyTheLeadingRunAndCapsAtInputLength) {
  // Block size 4.
  //   keys [1, 2],    input 8:  nothing cached yet                        -> hit 0
  //   keys [1, 2, 3], input 10: 1, 2 cached, 3 not                        -> hit 2 * 4 = 8
  //   keys [1, 5],    input 6:  1 cached, 5 not                           -> hit 4
  //   keys [1, 2],    input 7:  both cached, min(2 * 4, 7)                -> hit 7
  //   keys [9, 2],    input 8:  9 not cached; 2 is, but not leading       -> hit 0
  // Ceiling = (0 + 8 + 4 + 7 + 0) / (8 + 10 + 6 + 7 + 8) = 19 / 39.
  const TraceStats stats = analyze({request(0, 8, {1, 2}), request(1, 10, {1, 2, 3}), request(2, 6, {1, 5}),
                                    request(3, 7, {1, 2}), request(4, 8, {9, 2})},
                                   {.block_size_tokens = 4, .capacities_tokens = {std::nullopt}});
  EXPECT_DOUBLE_EQ(stats.reuse_ceiling.value(), 19.0 / 39);
  ASSERT_EQ(stats.hit_ratio_by_capacity.size(), 1u);
  EXPECT_DOUBLE_EQ(stats.hit_ratio_by_capacity[0].hit_ratio.value(), 19.0 / 39);
}

TEST(TraceAnalyzerTest, LruCapacityCurve) {
  // Block size 4; after its lookup each request's blocks are touched, its first block ending up the most
  // recent and its last the least (kv/block_cache.h). Hit tokens, then cache (LRU first):
  //                   | 1 block (1 token) | 2 blocks (8 or 9) | 3 blocks (12)    | unbounded
  //   R1 [1, 2]  in 8 | 0  [1]            | 0  [2 1]          | 0  [2 1]         | 0
  //   R2 [3]     in 4 | 0  [3]            | 0  [1 3]          | 0  [2 1 3]       | 0
  //   R3 [1, 2]  in 8 | 0  [1]            | 4  [2 1]          | 8  [3 2 1]       | 8
  //   R4 [1, 2]  in 8 | 4  [1]            | 8  [2 1]          | 8  [3 2 1]       | 8
  //   R5 [2, 7]  in 8 | 0  [2]            | 4  [7 2]          | 4  [1 7 2]       | 4
  //   R6 [1]     in 4 | 0  [1]            | 0  [2 1]          | 4  [7 2 1]       | 4
  //   of 40 tokens    | 4 -> 0.1          | 16 -> 0.4         | 24 -> 0.6        | 24 -> 0.6
  // (1 block: R1's 2 cannot evict its own head 1, so it is not cached. 2 blocks: R2's 3 evicts R1's tail 2,
  // leaving R3 a one-block hit.)
  const TraceStats stats =
      analyze({request(0, 8, {1, 2}), request(1, 4, {3}), request(2, 8, {1, 2}), request(3, 8, {1, 2}),
               request(4, 8, {2, 7}), request(5, 4, {1})},
              {.block_size_tokens = 4, .capacities_tokens = {1, 8, 9, 12, std::nullopt}});
  ASSERT_EQ(stats.hit_ratio_by_capacity.size(), 5u);
  const std::vector<double> expected = {0.1, 0.4, 0.4, 0.6, 0.6};
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_DOUBLE_EQ(stats.hit_ratio_by_capacity[i].hit_ratio.value(), expected[i]) << "capacity #" << i;
  }
  EXPECT_EQ(stats.hit_ratio_by_capacity[2].capacity_tokens, 9);
  EXPECT_DOUBLE_EQ(stats.reuse_ceiling.value(), 0.6);

  // Same trace: key 1 is in R1 R3 R4 R6 and key 2 in R1 R3 R4 R5 (4 of 6 requests each, tie -> smaller key
  // first), then 3 and 7 once each.
  ASSERT_EQ(stats.hottest_blocks.size(), 4u);
  const std::vector<std::pair<BlockKey, int64_t>> hottest = {{1, 4}, {2, 4}, {3, 1}, {7, 1}};
  for (size_t i = 0; i < hottest.size(); ++i) {
    EXPECT_EQ(stats.hottest_blocks[i].key, hottest[i].first);
    EXPECT_EQ(stats.hottest_blocks[i].references, hottest[i].second);
    EXPECT_DOUBLE_EQ(stats.hottest_blocks[i].request_share, hottest[i].second / 6.0);
  }
}

// Three one-block prompts in a loop through a cache of two blocks: LRU always evicts the block needed next
// and hits nothing; Belady's rule keeps the two needed soonest (at the third prompt, block 3 is needed
// farthest away, so it is not stored) and hits the fourth and fifth. Worked by hand from the definitions.
TEST(TraceAnalyzerTest, TheOptimalCurveKeepsWhatIsNeededSoonest) {
  std::vector<Request> loop;
  for (BlockKey key : {1, 2, 3, 1, 2, 3}) loop.push_back(request(0, 1, {key}));
  AnalyzerOptions options;
  options.block_size_tokens = 1;
  options.capacities_tokens = {2, std::nullopt};
  const TraceStats stats = analyze(loop, options);
  ASSERT_EQ(stats.hit_ratio_by_capacity.size(), 2u);
  EXPECT_DOUBLE_EQ(stats.hit_ratio_by_capacity[0].hit_ratio.value(), 0.0);
  EXPECT_DOUBLE_EQ(stats.hit_ratio_by_capacity[0].optimal_hit_ratio.value(), 2.0 / 6);
  EXPECT_DOUBLE_EQ(stats.hit_ratio_by_capacity[1].optimal_hit_ratio.value(), 3.0 / 6) << "unbounded: ceiling";
  EXPECT_DOUBLE_EQ(stats.reuse_ceiling.value(), 3.0 / 6);

  options.optimal_curve = false;
  EXPECT_FALSE(analyze(loop, options).hit_ratio_by_capacity[0].optimal_hit_ratio.has_value());
}

// A request longer than the cache keeps its head under Belady's rule too: a chain's later blocks are never
// needed before its earlier ones, so they go first, and a block past a missing one is not stored.
TEST(TraceAnalyzerTest, TheOptimalCurveKeepsAChainsHead) {
  const std::vector<Request> twice = {request(0, 4, {10, 11, 12, 13}), request(1, 4, {10, 11, 12, 13})};
  AnalyzerOptions options;
  options.block_size_tokens = 1;
  options.capacities_tokens = {2};
  const TraceStats stats = analyze(twice, options);
  EXPECT_DOUBLE_EQ(stats.hit_ratio_by_capacity[0].optimal_hit_ratio.value(), 2.0 / 8) << "blocks 10 and 11";
  EXPECT_DOUBLE_EQ(stats.hit_ratio_by_capacity[0].hit_ratio.value(), 2.0 / 8) << "LRU keeps the head too";
}

TEST(TraceAnalyzerTest, HottestBlocksAreTopTenAndCountAKeyOncePerRequest) {
  // Keys 100..111 appear in one request each, key 50 twice within one request (counts once), key 200 in 3.
  std::vector<Request> requests;
  for (BlockKey key = 111; key >= 100; --key) requests.push_back(request(0, 512, {key}));
  requests.push_back(request(0, 1024, {50, 50}));
  for (int i = 0; i < 3; ++i) requests.push_back(request(0, 512, {200}));
  const TraceStats stats = analyze(requests, {.capacities_tokens = {}});
  ASSERT_EQ(stats.hottest_blocks.size(), 10u);
  EXPECT_EQ(stats.hottest_blocks[0].key, 200u);
  EXPECT_EQ(stats.hottest_blocks[0].references, 3);
  EXPECT_DOUBLE_EQ(stats.hottest_blocks[0].request_share, 3.0 / 16);
  // Then the smallest of the 13 keys with 1 reference: 50, 100, ..., 107.
  EXPECT_EQ(stats.hottest_blocks[1].key, 50u);
  EXPECT_EQ(stats.hottest_blocks[1].references, 1);
  for (size_t i = 2; i < 10; ++i) EXPECT_EQ(stats.hottest_blocks[i].key, 100 + (i - 2));
  // Hits: none for the distinct keys nor for [50, 50] (50 is not cached before that request), 512 tokens for
  // the second and third [200]. Ceiling = 1024 / (12 * 512 + 1024 + 3 * 512) = 2 / 17.
  EXPECT_DOUBLE_EQ(stats.reuse_ceiling.value(), 2.0 / 17);
}

struct ShippedTrace {
  const char* path;
  int64_t requests;
  double span_s;
  double ceiling;
  std::vector<double> lru;  // 1M, 3M, 10M, 50M tokens
};

// Expected values from an independent Python implementation of the same definitions
// (tests/trace/reference_analyzer.py, which test trace_reference_analyzer also runs against the CLI).
TEST(TraceAnalyzerTest, ShippedTracesMatchTheReference) {
  const std::vector<ShippedTrace> traces = {
      {CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz",
       12031,
       3536.999,
       0.3736,
       {0.0543, 0.1387, 0.2908, 0.3707}},
      {CRESCENT_SOURCE_DIR "/data/traces/synthetic_trace.jsonl.gz",
       3993,
       1022.025,
       0.6512,
       {0.1451, 0.3151, 0.5770, 0.6512}},
  };
  for (const ShippedTrace& trace : traces) {
    SCOPED_TRACE(trace.path);
    Result<std::vector<Request>> requests = read_trace(trace.path, {});
    ASSERT_TRUE(requests.ok()) << requests.status().to_string();
    const TraceStats stats = analyze(*requests, {});
    EXPECT_EQ(stats.requests, trace.requests);
    EXPECT_NEAR(stats.span_s, trace.span_s, 1e-9);
    EXPECT_NEAR(stats.reuse_ceiling.value(), trace.ceiling, 5e-4);
    ASSERT_EQ(stats.hit_ratio_by_capacity.size(), 5u);
    for (size_t i = 0; i < trace.lru.size(); ++i) {
      EXPECT_NEAR(stats.hit_ratio_by_capacity[i].hit_ratio.value(), trace.lru[i], 5e-4) << "capacity #" << i;
    }
    EXPECT_DOUBLE_EQ(stats.hit_ratio_by_capacity[4].hit_ratio.value(), stats.reuse_ceiling.value());  // unbounded
  }
}

}  // namespace
}  // namespace crescent::trace
