// The colocated (vLLM-style) baselines through sim::simulate. Expected times are derived from the cost
// model's iteration_time_s by following the engine loop by hand: prefill first (whole prompts, the batch
// stalls) or decode + one prompt chunk per iteration (chunked prefill).
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "cluster/cluster_config.h"
#include "cluster/report.h"
#include "perf/cost_model.h"
#include "sim/simulator.h"
#include "test_cluster.h"
#include "trace/reader.h"

namespace crescent::sim {
namespace {

// Keeps 75% of HBM free of KV: (640e9 * 0.25 - 141,107,412,992) / 327,680 = 57,651 KV tokens per node, so
// requests that fill a node prefill in seconds.
cluster::ClusterConfig small_hbm_cluster() {
  cluster::ClusterConfig c = small_cluster(1, 1);
  c.decode_hbm_reserved_share = 0.75;
  return c;
}

// `blocks` distinct keys starting at `first`.
std::vector<BlockKey> keys(BlockKey first, int64_t blocks) {
  std::vector<BlockKey> k;
  for (int64_t i = 0; i < blocks; ++i) k.push_back(first + static_cast<BlockKey>(i));
  return k;
}

// The keys of a prompt of `input_tokens` tokens in 512-token blocks, starting at `first`.
std::vector<BlockKey> prompt_keys(BlockKey first, int64_t input_tokens) {
  return keys(first, (input_tokens + 511) / 512);
}

trace::Request request(int64_t timestamp_ms, int64_t input_tokens, int64_t output_tokens,
                       std::vector<BlockKey> block_keys) {
  return {timestamp_ms, input_tokens, output_tokens, std::move(block_keys)};
}

cluster::RunResult run(const cluster::ClusterConfig& c, const std::vector<trace::Request>& t, System system) {
  auto r = simulate(c, t, {.system = system});
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

constexpr System kAllColocated[] = {System::kColocated, System::kColocatedPrefixCache,
                                    System::kColocatedChunkedPrefill};

TEST(Colocated, SingleRequestTimeline) {
  const cluster::ClusterConfig c = small_cluster(1, 1);
  const perf::CostModel cost(c.model, c.hardware);
  // 1024-token prompt, 3 output tokens: a prefill iteration makes the first, two decode iterations the rest.
  const cluster::RunResult result = run(c, {request(1000, 1024, 3, {1, 2})}, System::kColocated);
  const cluster::RequestOutcome& o = result.requests[0];
  EXPECT_DOUBLE_EQ(o.arrival_s, 0.0);  // virtual time starts at the first arrival
  EXPECT_DOUBLE_EQ(o.ttft_s, cost.iteration_time_s(0, 0, 1024, 0));
  EXPECT_DOUBLE_EQ(o.prefill_compute_s, cost.prefill_time_s(1024, 0));
  const double step1_s = cost.iteration_time_s(1, 1024, 0, 0);
  const double step2_s = cost.iteration_time_s(1, 1025, 0, 0);
  EXPECT_NEAR(o.finish_s, o.ttft_s + step1_s + step2_s, 1e-12);
  // Two gaps, TBT = the longest ceil(10%) = 1 of them: the second step reads one more KV token.
  EXPECT_NEAR(o.tbt_s, step2_s, 1e-12);
  EXPECT_EQ(o.prefill_instance, 0u);
  EXPECT_EQ(o.decode_instance, 0u);
  EXPECT_EQ(o.prefix_hit_tokens, 0);
  EXPECT_EQ(o.fetched_tokens, 0);
  EXPECT_EQ(result.counters.decode_steps, 2);
  EXPECT_EQ(result.counters.events, 4);  // the arrival and three iterations
  EXPECT_EQ(result.counters.decisions, 1);
  EXPECT_DOUBLE_EQ(result.makespan_s, o.finish_s);
}

// A (10 output tokens) decodes on node 0, C keeps node 1 busy, and B arrives at 150 ms: both nodes have one
// outstanding request, so B joins A on node 0.
std::vector<trace::Request> stall_trace() {
  return {request(0, 1024, 10, keys(0, 2)), request(0, 1024, 100, keys(100, 2)),
          request(150, 8192, 2, keys(200, 16))};
}

TEST(Colocated, PrefillStallsTheRunningBatch) {
  const cluster::ClusterConfig c = small_cluster(1, 1);
  const perf::CostModel cost(c.model, c.hardware);
  const cluster::RunResult result = run(c, stall_trace(), System::kColocated);
  const cluster::RequestOutcome& a = result.requests[0];
  const cluster::RequestOutcome& b = result.requests[2];
  ASSERT_EQ(a.prefill_instance, 0u);
  ASSERT_EQ(result.requests[1].prefill_instance, 1u);
  ASSERT_EQ(b.prefill_instance, 0u);

  // A alone: its prefill, then decode iterations until the one running when B arrives ends.
  double t = cost.iteration_time_s(0, 0, 1024, 0);
  int64_t context = 1024;
  int64_t steps = 0;
  while (t <= 0.15) {
    t += cost.iteration_time_s(1, context, 0, 0);
    ++context;
    ++steps;
  }
  ASSERT_LT(steps, 9);  // A is still decoding
  // B's prefill comes first; A gets its next token one iteration of both after it.
  const double b_prefill_s = cost.iteration_time_s(0, 0, 8192, 0);
  EXPECT_NEAR(b.ttft_s, t + b_prefill_s - 0.15, 1e-9);
  const double stalled_gap_s = b_prefill_s + cost.iteration_time_s(2, context + 8192, 0, 0);
  // Nine gaps, so A's TBT is its longest one: the stall.
  EXPECT_NEAR(a.tbt_s, stalled_gap_s, 1e-9);
  EXPECT_GT(a.tbt_s, 10 * cost.iteration_time_s(1, 1033, 0, 0));

  // Chunked prefill piggybacks B's prompt on A's decode iterations 512 tokens at a time: A's longest gap is
  // at most one decode iteration plus B's costliest chunk (its last, after 7680 tokens).
  const cluster::RunResult chunked = run(c, stall_trace(), System::kColocatedChunkedPrefill);
  const cluster::RequestOutcome& a_chunked = chunked.requests[0];
  ASSERT_EQ(chunked.requests[2].prefill_instance, 0u);
  EXPECT_LE(a_chunked.tbt_s, cost.iteration_time_s(1, 1033, 512, 7680) + 1e-12);
  EXPECT_LT(a_chunked.tbt_s, a.tbt_s / 5);
  // B's first token comes after all 16 chunks, later than without chunking.
  EXPECT_GT(chunked.requests[2].ttft_s, b.ttft_s);
}

TEST(Colocated, PrefixCacheReusesBlocksOnTheSameNode) {
  const cluster::ClusterConfig c = small_cluster(1, 1);
  const perf::CostModel cost(c.model, c.hardware);
  // A long decode (request 1) keeps node 1 busy throughout, so the load balancer sends the others to node 0.
  // Request 2 shares 3 blocks (1536 tokens) with request 0; request 3 repeats request 0's prompt whole, and
  // only its last token is recomputed.
  const std::vector<trace::Request> t{request(0, 2048, 2, {1, 2, 3, 4}), request(0, 512, 20'000, {99}),
                                      request(60'000, 2000, 1, {1, 2, 3, 9}),
                                      request(120'000, 2048, 1, {1, 2, 3, 4})};
  const cluster::RunResult cached = run(c, t, System::kColocatedPrefixCache);
  ASSERT_EQ(cached.requests[1].prefill_instance, 1u);
  ASSERT_GT(cached.requests[1].finish_s, 120.0);
  for (size_t r : {0, 2, 3}) ASSERT_EQ(cached.requests[r].prefill_instance, 0u) << r;
  EXPECT_EQ(cached.requests[0].prefix_hit_tokens, 0);
  EXPECT_EQ(cached.requests[2].prefix_hit_tokens, 1536);
  EXPECT_NEAR(cached.requests[2].ttft_s, cost.iteration_time_s(0, 0, 464, 1536), 1e-9);
  EXPECT_DOUBLE_EQ(cached.requests[2].prefill_compute_s, cost.prefill_time_s(464, 1536));
  EXPECT_EQ(cached.requests[3].prefix_hit_tokens, 2048);
  EXPECT_NEAR(cached.requests[3].ttft_s, cost.iteration_time_s(0, 0, 1, 2047), 1e-9);

  for (System system : {System::kColocated, System::kColocatedChunkedPrefill}) {
    const cluster::RunResult plain = run(c, t, system);
    EXPECT_EQ(plain.requests[2].prefix_hit_tokens, 0);
    EXPECT_GT(plain.requests[2].ttft_s, cached.requests[2].ttft_s);
  }
  EXPECT_NEAR(run(c, t, System::kColocated).requests[2].ttft_s, cost.iteration_time_s(0, 0, 2000, 0), 1e-9);
}

TEST(Colocated, CachedBlocksGiveWayToReservedKv) {
  const cluster::ClusterConfig c = small_hbm_cluster();
  const perf::CostModel cost(c.model, c.hardware);
  const int64_t capacity = cost.decode_kv_capacity_tokens(c.decode_hbm_reserved_share);
  // A long decode (the second request) keeps node 1 busy, so r1, r2 and r3 all go to node 0.
  // r1 leaves 79 cached blocks (40,448 tokens) in node 0's HBM. r2 (8 other blocks) reserves its prompt and
  // output: with 16,000 output tokens the two no longer fit, so r2's admission evicts just enough of r1's
  // blocks, its tail first (kv/block_cache.h), and r3, a repeat of r1, still finds the rest as a prefix.
  // With 1 output token they fit and r3 reuses all of r1.
  const int64_t cached_tokens = 79 * 512;
  ASSERT_GT(4096 + 16'000 + cached_tokens, capacity);
  ASSERT_LE(4096 + 1 + cached_tokens, capacity);
  const int64_t evicted_blocks = (4096 + 16'000 + cached_tokens - capacity + 511) / 512;
  ASSERT_LT(evicted_blocks, 79);
  for (int64_t r2_output : {16'000, 1}) {
    SCOPED_TRACE(r2_output);
    const std::vector<trace::Request> t{request(0, 40'000, 1, keys(0, 79)), request(0, 512, 50'000, {99'999}),
                                        request(100'000, 4096, r2_output, keys(1000, 8)),
                                        request(600'000, 40'000, 1, keys(0, 79))};
    const cluster::RunResult result = run(c, t, System::kColocatedPrefixCache);
    ASSERT_EQ(result.requests[1].prefill_instance, 1u);
    ASSERT_GT(result.requests[1].finish_s, 600.0);
    ASSERT_LT(result.requests[2].finish_s, 600.0);  // r2 has left when r3 arrives
    for (size_t r : {0, 2, 3}) ASSERT_EQ(result.requests[r].prefill_instance, 0u) << r;
    EXPECT_EQ(result.requests[3].prefix_hit_tokens, r2_output == 1 ? 40'000 : (79 - evicted_blocks) * 512);
  }
}

TEST(Colocated, HbmBoundsAdmission) {
  const cluster::ClusterConfig c = small_hbm_cluster();
  const perf::CostModel cost(c.model, c.hardware);
  const int64_t capacity = cost.decode_kv_capacity_tokens(c.decode_hbm_reserved_share);
  // A and B each need over half a node's HBM; C keeps node 1 busy so B queues behind A on node 0.
  const int64_t input = capacity / 2 + 512;
  const std::vector<trace::Request> t{request(0, input, 10, prompt_keys(0, input)),
                                      request(0, 512, 1, {99'999}),
                                      request(0, input, 10, prompt_keys(100'000, input))};
  for (System system : {System::kColocated, System::kColocatedPrefixCache}) {
    SCOPED_TRACE(to_string(system));
    const cluster::RunResult result = run(c, t, system);
    const cluster::RequestOutcome& a = result.requests[0];
    const cluster::RequestOutcome& b = result.requests[2];
    ASSERT_EQ(b.prefill_instance, 0u);
    // B starts only when A has left: A's prefill and its nine decode iterations, then B's prefill.
    double a_done_s = cost.iteration_time_s(0, 0, input, 0);
    EXPECT_DOUBLE_EQ(a.ttft_s, a_done_s);
    for (int64_t j = 0; j < 9; ++j) a_done_s += cost.iteration_time_s(1, input + j, 0, 0);
    EXPECT_NEAR(a.finish_s, a_done_s, 1e-9);
    EXPECT_NEAR(b.ttft_s, a_done_s + cost.iteration_time_s(0, 0, input, 0), 1e-9);
  }
}

TEST(Colocated, RoutesToTheNodeWithFewestOutstandingRequests) {
  const cluster::ClusterConfig c = small_cluster(1, 1);
  // A decodes 2000 tokens on node 0 (~25 s); B (node 1) is done long before C arrives at 10 s, so C goes to
  // node 1; D, at the same time, finds one outstanding request on each and takes the lower id.
  const std::vector<trace::Request> t{request(0, 1024, 2000, keys(0, 2)), request(0, 512, 1, {10}),
                                      request(10'000, 512, 1, {20}), request(10'000, 512, 1, {30})};
  for (System system : kAllColocated) {
    SCOPED_TRACE(to_string(system));
    const cluster::RunResult result = run(c, t, system);
    EXPECT_EQ(result.requests[0].prefill_instance, 0u);
    EXPECT_EQ(result.requests[1].prefill_instance, 1u);
    EXPECT_EQ(result.requests[2].prefill_instance, 1u);
    EXPECT_EQ(result.requests[3].prefill_instance, 0u);
    EXPECT_EQ(result.counters.decisions, 4);
  }
}

TEST(Colocated, RejectsRequestsLargerThanANodesHbm) {
  const cluster::ClusterConfig c = small_hbm_cluster();
  const perf::CostModel cost(c.model, c.hardware);
  const int64_t capacity = cost.decode_kv_capacity_tokens(c.decode_hbm_reserved_share);
  const std::vector<trace::Request> t{request(0, capacity + 1, 1, prompt_keys(0, capacity + 1)),
                                      request(0, capacity - 10, 11, prompt_keys(0, capacity - 10)),
                                      request(0, capacity - 10, 10, prompt_keys(0, capacity - 10))};
  for (System system : kAllColocated) {
    SCOPED_TRACE(to_string(system));
    const cluster::RunResult result = run(c, t, system);
    EXPECT_EQ(result.requests[0].rejected, conductor::RejectReason::kContextLength);
    EXPECT_EQ(result.requests[1].rejected, conductor::RejectReason::kContextLength);
    EXPECT_EQ(result.requests[1].finish_s, result.requests[1].arrival_s);
    EXPECT_EQ(result.requests[2].rejected, conductor::RejectReason::kNone);
    EXPECT_GT(result.requests[2].ttft_s, 0);
    EXPECT_EQ(result.counters.decisions, 1);
  }
}

TEST(Colocated, RejectsAZeroChunk) {
  auto r = simulate(small_cluster(1, 1), std::vector<trace::Request>{request(0, 512, 1, {1})},
                    {.system = System::kColocatedChunkedPrefill, .chunked_prefill_tokens = 0});
  EXPECT_FALSE(r.ok());
}

TEST(Colocated, SameInputsSameResult) {
  const cluster::ClusterConfig c = small_cluster(2, 2);
  auto t = trace::read_trace(CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz",
                             {.max_requests = 500});
  ASSERT_TRUE(t.ok());
  for (System system : kAllColocated) {
    SCOPED_TRACE(to_string(system));
    const cluster::RunResult a = run(c, *t, system);
    const cluster::RunResult b = run(c, *t, system);
    ASSERT_EQ(a.requests.size(), b.requests.size());
    for (size_t i = 0; i < a.requests.size(); ++i) {
      EXPECT_EQ(a.requests[i].ttft_s, b.requests[i].ttft_s);
      EXPECT_EQ(a.requests[i].tbt_s, b.requests[i].tbt_s);
      EXPECT_EQ(a.requests[i].finish_s, b.requests[i].finish_s);
      EXPECT_EQ(a.requests[i].prefix_hit_tokens, b.requests[i].prefix_hit_tokens);
      EXPECT_EQ(a.requests[i].prefill_instance, b.requests[i].prefill_instance);
    }
    EXPECT_EQ(a.counters.events, b.counters.events);
    EXPECT_EQ(a.counters.decode_steps, b.counters.decode_steps);
  }
}

// The first 2000 conversation requests on the paper's 16 nodes, replayed in real time.
TEST(Colocated, ConversationTraceOnPaperFig5Nodes) {
  auto config = cluster::load_cluster_config(CRESCENT_SOURCE_DIR "/configs/paper-fig5.json", 512);
  ASSERT_TRUE(config.ok()) << config.status().to_string();
  auto t = trace::read_trace(CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz",
                             {.max_requests = 2000});
  ASSERT_TRUE(t.ok());
  const cluster::RunResult disaggregated = run(*config, *t, System::kDisaggregated);
  const double disaggregated_tbt_s =
      cluster::summarize("disaggregated", disaggregated, config->slo).tbt_mean_s.value();
  std::map<System, cluster::PolicyReport> reports;
  for (System system : kAllColocated) {
    SCOPED_TRACE(to_string(system));
    int64_t progress_calls = 0;
    auto r =
        simulate(*config, *t, {.system = system, .progress = [&](const SimProgress&) { ++progress_calls; }});
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    EXPECT_EQ(progress_calls, 2000 / 256);
    for (size_t i = 0; i < r->requests.size(); ++i) {
      const cluster::RequestOutcome& o = r->requests[i];
      ASSERT_EQ(o.rejected, conductor::RejectReason::kNone) << i;
      EXPECT_GT(o.ttft_s, 0) << i;
      EXPECT_GE(o.finish_s, o.arrival_s + o.ttft_s) << i;
      EXPECT_LE(o.prefix_hit_tokens, o.input_tokens) << i;
      if (o.output_tokens > 1) {
        EXPECT_GT(o.tbt_s, 0) << i;
      }
      EXPECT_LT(o.prefill_instance, 16u) << i;
      EXPECT_EQ(o.prefill_instance, o.decode_instance) << i;
    }
    const cluster::PolicyReport report = cluster::summarize(std::string(to_string(system)), *r, config->slo);
    EXPECT_EQ(report.completed, 2000);
    if (system == System::kColocatedPrefixCache) {
      EXPECT_GT(report.hit_ratio.value(), 0);
    } else {
      EXPECT_EQ(report.hit_ratio.value(), 0);
    }
    // Prefills share the decoding batch's iterations, whole or in 512-token chunks (~58 ms of compute each),
    // where a disaggregated decode step is ~15 ms: the point of disaggregation.
    EXPECT_GT(report.tbt_mean_s.value(), disaggregated_tbt_s);
    reports[system] = report;
  }
  // Chunks stall the batch for far less than whole prompts.
  EXPECT_LT(reports[System::kColocatedChunkedPrefill].tbt_mean_s.value(),
            reports[System::kColocated].tbt_mean_s.value());
  EXPECT_LT(reports[System::kColocatedChunkedPrefill].tbt_p99_s.value(),
            reports[System::kColocated].tbt_p99_s.value());
}

}  // namespace
}  // namespace crescent::sim
