#include "trace/stats.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <optional>
#include <random>
#include <tuple>
#include <vector>

#include "test_support/temp_dir.h"
#include "trace/reader.h"
#include "trace/writer.h"

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

Request in_session(Request r, std::optional<int64_t> session) {
  r.session_id = session;
  return r;
}

TEST(TraceAnalyzerTest, PrefixRootsRankTheFirstBlocksByReusedTokens) {
  // Block size 4; a request's root is its first key. Ceiling hits (leading run already seen):
  //   R1 [1, 2, 3]     in 12: run 0                            -> 0
  //   R2 [1, 2, 4]     in 10: run 2 (1, 2)                     -> 8
  //   R3 [5, 6]        in 8:  run 0                            -> 0
  //   R4 [1, 2, 3, 7]  in 14: run 3 (1, 2, 3)                  -> 12
  //   R5 [5, 6]        in 6:  run 2, min(8, 6)                 -> 6
  //   R6 [1, 9]        in 5:  run 1                            -> 4
  //   R7 [8]           in 3:  run 0                            -> 0
  // Reused tokens: 30 in all. Root 1: R1 R2 R4 R6, 8 + 12 + 4 = 24 (share 0.8); the keys all four start with
  // are [1] (R6 leaves [1, 2] at 9), and the hits within block 0 are 4 each for R2, R4, R6 = 12; deepest hit
  // 3 blocks (R4). Root 5: R3 R5, 6 (0.2); both are [5, 6], so 2 common blocks, and R5's hit of 4 + 2 tokens
  // lies within them; deepest 2. Root 8: R7 alone, nothing reused: counted, not listed.
  const std::vector<Request> requests = {request(0, 12, {1, 2, 3}), request(1, 10, {1, 2, 4}),
                                         request(2, 8, {5, 6}),     request(3, 14, {1, 2, 3, 7}),
                                         request(4, 6, {5, 6}),     request(5, 5, {1, 9}),
                                         request(6, 3, {8})};
  AnalyzerOptions options{.block_size_tokens = 4, .capacities_tokens = {}};
  TraceStats stats = analyze(requests, options);
  EXPECT_DOUBLE_EQ(stats.reused_tokens, 30);
  EXPECT_DOUBLE_EQ(stats.reuse_ceiling.value(), 30.0 / 58);
  EXPECT_EQ(stats.distinct_roots, 3);
  EXPECT_EQ(stats.roots_with_reuse, 2);
  ASSERT_EQ(stats.top_roots.size(), 2u);
  const PrefixRoot& first = stats.top_roots[0];
  EXPECT_EQ(first.key, 1u);
  EXPECT_EQ(first.requests, 4);
  EXPECT_DOUBLE_EQ(first.reused_tokens, 24);
  EXPECT_DOUBLE_EQ(first.reused_share, 0.8);
  EXPECT_EQ(first.common_blocks, 1);
  EXPECT_DOUBLE_EQ(first.common_reused_tokens, 12);
  EXPECT_EQ(first.deepest_hit_blocks, 3);
  const PrefixRoot& second = stats.top_roots[1];
  EXPECT_EQ(second.key, 5u);
  EXPECT_EQ(second.requests, 2);
  EXPECT_DOUBLE_EQ(second.reused_tokens, 6);
  EXPECT_DOUBLE_EQ(second.reused_share, 0.2);
  EXPECT_EQ(second.common_blocks, 2);
  EXPECT_DOUBLE_EQ(second.common_reused_tokens, 6);
  EXPECT_EQ(second.deepest_hit_blocks, 2);
  EXPECT_FALSE(stats.sessions.has_value()) << "no request has a session";

  options.top_roots = 1;
  stats = analyze(requests, options);
  ASSERT_EQ(stats.top_roots.size(), 1u);
  EXPECT_EQ(stats.top_roots[0].key, 1u);
  EXPECT_EQ(stats.roots_with_reuse, 2) << "counted whether listed or not";

  // Roots of two blocks: a request's second key, its only one for R7. Root 2: R1 R2 R4, 8 + 12 = 20 reused,
  // common [1, 2], within which R2 hits 4 + 4 and R4 4 + 4 (its third block is below) = 16; deepest 3. Root
  // 6: R3 R5 as before. Root 9: R6 alone, its hit of 4 in its common (own) blocks [1, 9]. Root 8: R7, none.
  options.top_roots = 10;
  options.root_blocks = 2;
  stats = analyze(requests, options);
  EXPECT_EQ(stats.distinct_roots, 4);
  EXPECT_EQ(stats.roots_with_reuse, 3);
  ASSERT_EQ(stats.top_roots.size(), 3u);
  const std::vector<std::tuple<BlockKey, int64_t, double, int64_t, double, int64_t>> expected = {
      // key, requests, reused tokens, common blocks, reused in common, deepest hit
      {2, 3, 20, 2, 16, 3},
      {6, 2, 6, 2, 6, 2},
      {9, 1, 4, 2, 4, 1}};
  for (size_t i = 0; i < expected.size(); ++i) {
    SCOPED_TRACE(i);
    const PrefixRoot& root = stats.top_roots[i];
    EXPECT_EQ(std::tie(root.key, root.requests, root.reused_tokens, root.common_blocks,
                       root.common_reused_tokens, root.deepest_hit_blocks),
              expected[i]);
    EXPECT_DOUBLE_EQ(root.reused_share, std::get<2>(expected[i]) / 30);
  }

  // Equal reused tokens: the smaller key first. Roots 20 and 10 reuse 4 tokens each.
  stats = analyze({request(0, 4, {20}), request(1, 4, {10}), request(2, 4, {20}), request(3, 4, {10})},
                  {.block_size_tokens = 4, .capacities_tokens = {}});
  ASSERT_EQ(stats.top_roots.size(), 2u);
  EXPECT_EQ(stats.top_roots[0].key, 10u);
  EXPECT_EQ(stats.top_roots[1].key, 20u);
}

TEST(TraceAnalyzerTest, ReuseWithinAndAcrossSessionsFollowsEachBlocksOrigin) {
  // Block size 4. A block's origin is the session of the first request holding it.
  //   R1 s1 [1, 2]     in 8:  no hit; origins 1, 2 -> s1
  //   R2 s2 [1, 3]     in 8:  block 1 (s1): across 4; origin 3 -> s2
  //   R3 s1 [1, 2, 5]  in 10: blocks 1, 2 (s1): within 4 + 4
  //   R4 s2 [1, 3, 6]  in 9:  block 1 (s1): across 4; block 3 (s2): within 4
  //   R5 -- [1, 2]     in 6:  no session: unattributed 4 + 2 (the second block holds 2 tokens)
  //   R6 -- [8]        in 4:  no hit; origin 8 -> none
  //   R7 s3 [8, 9]     in 5:  block 8 (no origin session): unattributed 4
  // Within 12, across 8, unattributed 10: the ceiling's 30 hit tokens, of 50 input tokens.
  const TraceStats stats =
      analyze({in_session(request(0, 8, {1, 2}), 1), in_session(request(1, 8, {1, 3}), 2),
               in_session(request(2, 10, {1, 2, 5}), 1), in_session(request(3, 9, {1, 3, 6}), 2),
               request(4, 6, {1, 2}), request(5, 4, {8}), in_session(request(6, 5, {8, 9}), 3)},
              {.block_size_tokens = 4, .capacities_tokens = {}});
  EXPECT_DOUBLE_EQ(stats.reused_tokens, 30);
  ASSERT_TRUE(stats.sessions.has_value());
  const SessionReuse& sessions = *stats.sessions;
  EXPECT_EQ(sessions.sessions, 3);
  EXPECT_EQ(sessions.requests_with_session, 5);
  EXPECT_DOUBLE_EQ(sessions.within_tokens, 12);
  EXPECT_DOUBLE_EQ(sessions.across_tokens, 8);
  EXPECT_DOUBLE_EQ(sessions.unattributed_tokens, 10);
  EXPECT_DOUBLE_EQ(sessions.within_input_share.value(), 12.0 / 50);
  EXPECT_DOUBLE_EQ(sessions.across_input_share.value(), 8.0 / 50);
  EXPECT_DOUBLE_EQ(sessions.within_reused_share.value(), 12.0 / 30);
  EXPECT_DOUBLE_EQ(sessions.across_reused_share.value(), 8.0 / 30);

  // Sessions without any reuse: shares of input are 0, shares of nothing reused are absent.
  const TraceStats none = analyze({in_session(request(0, 4, {1}), 0), in_session(request(1, 4, {2}), 0)},
                                  {.block_size_tokens = 4, .capacities_tokens = {}});
  ASSERT_TRUE(none.sessions.has_value());
  EXPECT_EQ(none.sessions->sessions, 1);
  EXPECT_DOUBLE_EQ(none.sessions->within_input_share.value(), 0);
  EXPECT_FALSE(none.sessions->within_reused_share.has_value());
  EXPECT_TRUE(none.top_roots.empty());
  EXPECT_EQ(none.distinct_roots, 2);
}

// The prompt tokens of a small synthetic workload: a few shared documents, each request one of them cut
// somewhere, then its own tokens.
std::vector<Request> token_trace(int64_t requests, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::vector<int64_t>> documents(4);
  for (auto& document : documents) {
    document.resize(200 + rng() % 2000);
    for (int64_t& token : document) token = rng() % 32000;
  }
  std::vector<Request> trace;
  for (int64_t i = 0; i < requests; ++i) {
    const std::vector<int64_t>& document = documents[rng() % documents.size()];
    std::vector<int64_t> tokens(document.begin(),
                                document.begin() + static_cast<ptrdiff_t>(rng() % document.size()));
    for (uint32_t extra = 1 + rng() % 700; extra > 0; --extra) tokens.push_back(rng() % 32000);
    Request r = request(i * 10, static_cast<int64_t>(tokens.size()), {}, 1 + rng() % 100);
    r.session_id = rng() % 5;
    r.token_ids = std::move(tokens);
    trace.push_back(std::move(r));
  }
  return trace;
}

void expect_same_stats(const TraceStats& a, const TraceStats& b) {
  EXPECT_EQ(a.requests, b.requests);
  EXPECT_EQ(a.reuse_ceiling, b.reuse_ceiling);
  EXPECT_EQ(a.reused_tokens, b.reused_tokens);
  ASSERT_EQ(a.hit_ratio_by_capacity.size(), b.hit_ratio_by_capacity.size());
  for (size_t i = 0; i < a.hit_ratio_by_capacity.size(); ++i) {
    EXPECT_EQ(a.hit_ratio_by_capacity[i].hit_ratio, b.hit_ratio_by_capacity[i].hit_ratio);
    EXPECT_EQ(a.hit_ratio_by_capacity[i].optimal_hit_ratio, b.hit_ratio_by_capacity[i].optimal_hit_ratio);
  }
  ASSERT_EQ(a.hottest_blocks.size(), b.hottest_blocks.size());
  for (size_t i = 0; i < a.hottest_blocks.size(); ++i) {
    EXPECT_EQ(a.hottest_blocks[i].key, b.hottest_blocks[i].key);
    EXPECT_EQ(a.hottest_blocks[i].references, b.hottest_blocks[i].references);
  }
  EXPECT_EQ(a.distinct_roots, b.distinct_roots);
  ASSERT_EQ(a.top_roots.size(), b.top_roots.size());
  for (size_t i = 0; i < a.top_roots.size(); ++i) {
    EXPECT_EQ(a.top_roots[i].key, b.top_roots[i].key);
    EXPECT_EQ(a.top_roots[i].reused_tokens, b.top_roots[i].reused_tokens);
    EXPECT_EQ(a.top_roots[i].common_blocks, b.top_roots[i].common_blocks);
  }
  ASSERT_EQ(a.sessions.has_value(), b.sessions.has_value());
  if (a.sessions) {
    EXPECT_EQ(a.sessions->within_tokens, b.sessions->within_tokens);
    EXPECT_EQ(a.sessions->across_tokens, b.sessions->across_tokens);
  }
}

// A trace written with its tokens, its hash_ids computed at 512 by the block-key recurrence: re-keyed from
// its tokens at 512 it analyses exactly as from its hash_ids; at 16 (finer blocks, more of each shared prefix
// is a whole block) the ceiling can only grow.
TEST(TraceAnalyzerTest, KeysFromTokensAtTheTracesBlockSizeMatchItsHashIds) {
  test::TempDir dir("crescent-stats-test");
  const std::string path = (std::filesystem::path(dir.path()) / "tokens.jsonl").string();
  {
    std::vector<Request> trace = token_trace(300, 5);
    for (Request& r : trace) r.block_keys = kv::shipped_block_keys(r.token_ids, 512, kv::kMockModelSeed);
    auto writer = TraceWriter::open(path);
    ASSERT_TRUE(writer.ok()) << writer.status().to_string();
    for (const Request& r : trace) ASSERT_TRUE((*writer)->append(r).ok());
    ASSERT_TRUE((*writer)->commit().ok());
  }
  auto analyze_file = [&](const ReadOptions& read) {
    Result<std::vector<Request>> requests = read_trace(path, read);
    EXPECT_TRUE(requests.ok()) << requests.status().to_string();
    AnalyzerOptions options;
    options.block_size_tokens = read.block_size_tokens;
    options.capacities_tokens = {2'000, 20'000, 100'000, std::nullopt};
    return analyze(requests.ok() ? *requests : std::vector<Request>{}, options);
  };
  const TraceStats from_hash_ids = analyze_file({});
  const TraceStats from_tokens = analyze_file({.keys_from_token_ids = true});
  ASSERT_GT(from_hash_ids.reuse_ceiling.value(), 0.1) << "the workload shares prefixes";
  ASSERT_TRUE(from_hash_ids.sessions.has_value());
  expect_same_stats(from_tokens, from_hash_ids);
  for (int64_t block : {16, 64}) {
    SCOPED_TRACE(block);
    const TraceStats finer = analyze_file({.block_size_tokens = block, .keys_from_token_ids = true});
    EXPECT_EQ(finer.requests, from_hash_ids.requests);
    EXPECT_GE(finer.reuse_ceiling.value(), from_hash_ids.reuse_ceiling.value());
  }
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
