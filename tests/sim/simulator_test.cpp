#include "sim/simulator.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <vector>

#include "cluster/report.h"
#include "perf/cost_model.h"
#include "test_cluster.h"
#include "trace/reader.h"

namespace crescent::sim {
namespace {

using conductor::PrefillPolicy;

trace::Request request(int64_t timestamp_ms, int64_t input_tokens, int64_t output_tokens,
                       std::vector<BlockKey> keys) {
  return {timestamp_ms, input_tokens, output_tokens, std::move(keys)};
}

cluster::RunResult run(const cluster::ClusterConfig& c, const std::vector<trace::Request>& t,
                       PrefillPolicy policy = PrefillPolicy::kGlobalCacheAware, double time_scale = 1.0) {
  auto r = simulate(c, t, {.policy = policy, .time_scale = time_scale});
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

TEST(Simulator, SingleRequestTimeline) {
  const cluster::ClusterConfig c = small_cluster(1, 1);
  const perf::CostModel cost(c.model, c.hardware);
  // 1024-token prompt, 3 output tokens: prefill makes the first, two decode steps make the rest.
  auto result = run(c, {request(1000, 1024, 3, {1, 2})});
  const cluster::RequestOutcome& o = result.requests[0];
  EXPECT_DOUBLE_EQ(o.arrival_s, 0.0);  // virtual time starts at the first arrival
  EXPECT_DOUBLE_EQ(o.ttft_s, cost.prefill_time_s(1024, 0));
  EXPECT_EQ(o.prefix_hit_tokens, 0);
  // KV streams during prefill layer by layer (one chunk here): each layer's share leaves as that layer is
  // computed, so with a link faster than compute it arrives one layer's share after prefill ends; then two
  // steps: batch 1 at context 1024, then 1025.
  const double first_token_s = o.ttft_s;
  const double layers = static_cast<double>(c.model.layers);
  ASSERT_LT(cost.kv_transfer_time_s(1024), first_token_s) << "the link keeps up with compute here";
  const double kv_arrives_s = first_token_s + cost.kv_transfer_time_s(1024) / layers;
  const double step1_s = cost.decode_step_time_s(1, 1024);
  const double step2_s = cost.decode_step_time_s(1, 1025);
  EXPECT_NEAR(o.finish_s, kv_arrives_s + step1_s + step2_s, 1e-12);
  // Two gaps; TBT is the mean of the longest ceil(10%) = 1: the first (transfer + first step).
  EXPECT_NEAR(o.tbt_s, kv_arrives_s + step1_s - first_token_s, 1e-12);
  EXPECT_EQ(result.counters.decode_steps, 2);
}

TEST(Simulator, FifoQueueOnOnePrefillInstance) {
  const cluster::ClusterConfig c = small_cluster(1, 1);
  const perf::CostModel cost(c.model, c.hardware);
  auto result = run(c, {request(0, 4096, 1, {1, 2, 3, 4, 5, 6, 7, 8}), request(0, 2048, 1, {9, 10, 11, 12})});
  EXPECT_DOUBLE_EQ(result.requests[0].ttft_s, cost.prefill_time_s(4096, 0));
  EXPECT_DOUBLE_EQ(result.requests[1].ttft_s, cost.prefill_time_s(4096, 0) + cost.prefill_time_s(2048, 0));
}

TEST(Simulator, LaterRequestReusesCachedPrefix) {
  const cluster::ClusterConfig c = small_cluster(1, 1);
  const perf::CostModel cost(c.model, c.hardware);
  // The second request shares the first 3 blocks (1536 tokens) and arrives after the first is done.
  auto result = run(c, {request(0, 2048, 1, {1, 2, 3, 4}), request(60'000, 2000, 1, {1, 2, 3, 9})});
  EXPECT_EQ(result.requests[1].prefix_hit_tokens, 1536);
  EXPECT_DOUBLE_EQ(result.requests[1].prefill_compute_s, cost.prefill_time_s(2000 - 1536, 1536));
  EXPECT_NEAR(result.requests[1].ttft_s, cost.kv_load_time_s(1536) + result.requests[1].prefill_compute_s,
              1e-9);
}

TEST(Simulator, GlobalPolicyFetchesFromBusyHolder) {
  const cluster::ClusterConfig c = small_cluster(2, 1);
  const perf::CostModel cost(c.model, c.hardware);
  std::vector<BlockKey> doc;
  for (BlockKey k = 0; k < 64; ++k) doc.push_back(k);  // a 32k-token document
  std::vector<BlockKey> doc_and_question = doc;
  doc_and_question.push_back(1000);
  // r0 computes the document on instance 0. r1 (another long prompt) then occupies instance 0's queue... the
  // Conductor sends r1 to the idle instance 1, so r2 (document + question) finds the holder idle again. To
  // force a fetch, r1 must keep instance 0 busy: it reuses r0's prefix so cache-aware scheduling puts it
  // there.
  std::vector<BlockKey> doc_long = doc;
  for (BlockKey k = 2000; k < 2064; ++k) doc_long.push_back(k);
  auto result = run(c, {request(0, 32768, 1, doc), request(60'000, 65536, 1, doc_long),
                        request(60'001, 33000, 1, doc_and_question)});
  EXPECT_EQ(result.requests[1].prefill_instance, result.requests[0].prefill_instance);
  const cluster::RequestOutcome& r2 = result.requests[2];
  EXPECT_NE(r2.prefill_instance, result.requests[0].prefill_instance);
  EXPECT_EQ(r2.fetched_tokens, 32768);
  EXPECT_EQ(r2.prefix_hit_tokens, 32768);
  EXPECT_NEAR(
      r2.ttft_s,
      cost.kv_transfer_time_s(32768) + cost.kv_load_time_s(32768) + cost.prefill_time_s(33000 - 32768, 32768),
      1e-6);

  // Local cache-aware instead waits for the holder or recomputes: never fetches.
  auto local = run(c,
                   {request(0, 32768, 1, doc), request(60'000, 65536, 1, doc_long),
                    request(60'001, 33000, 1, doc_and_question)},
                   PrefillPolicy::kCacheAware);
  EXPECT_EQ(local.requests[2].fetched_tokens, 0);
  EXPECT_GT(local.requests[2].ttft_s, r2.ttft_s);
}

// Issue #8 §1: 2 prefill instances caching 4 blocks each, requests 10 s apart sharing prefixes pairwise.
// Ties between the idle instances used to fall to instance 0 for the cache-aware policies, so its cache
// thrashed (0% hits) while least-loaded spread the load and hit 3,072 of 7,168 tokens.
TEST(Simulator, CacheAwarePoliciesSpreadTiesAndMatchLeastLoaded) {
  cluster::ClusterConfig c = small_cluster(2, 1);
  c.prefill_cache_capacity_tokens = 2048;
  const std::vector<trace::Request> t{request(0, 1536, 1, {1, 2, 3}), request(10'000, 1536, 1, {4, 5, 6}),
                                      request(20'000, 2048, 1, {1, 2, 3, 7}),
                                      request(30'000, 2048, 1, {4, 5, 6, 8})};
  const cluster::PolicyReport least = cluster::summarize("", run(c, t, PrefillPolicy::kLeastLoaded), c.slo);
  EXPECT_DOUBLE_EQ(least.hit_ratio.value(), 3072.0 / 7168);
  for (auto policy : {PrefillPolicy::kCacheAware, PrefillPolicy::kGlobalCacheAware}) {
    SCOPED_TRACE(to_string(policy));
    const cluster::RunResult result = run(c, t, policy);
    EXPECT_NE(result.requests[0].prefill_instance, result.requests[1].prefill_instance);
    EXPECT_EQ(result.requests[2].prefill_instance, result.requests[0].prefill_instance);
    EXPECT_EQ(result.requests[3].prefill_instance, result.requests[1].prefill_instance);
    const cluster::PolicyReport report = cluster::summarize("", result, c.slo);
    EXPECT_GE(report.hit_ratio.value() * 7168, 3072 - 1e-9);
    EXPECT_LE(report.ttft_mean_s.value(), least.ttft_mean_s.value() + 1e-12);
  }
}

// Issue #8 §2: one prefill instance caching 3 blocks: [1,2,3], then [4], then [1,2,3]. [4] evicts block 3
// (the first request's tail), so the third request reuses blocks 1-2: 1,024 of 3,584 tokens.
TEST(Simulator, EvictionKeepsTheHeadOfAPrefix) {
  cluster::ClusterConfig c = small_cluster(1, 1);
  c.prefill_cache_capacity_tokens = 1536;
  const std::vector<trace::Request> t{request(0, 1536, 1, {1, 2, 3}), request(10'000, 512, 1, {4}),
                                      request(20'000, 1536, 1, {1, 2, 3})};
  for (auto policy :
       {PrefillPolicy::kLeastLoaded, PrefillPolicy::kCacheAware, PrefillPolicy::kGlobalCacheAware}) {
    SCOPED_TRACE(to_string(policy));
    const cluster::RunResult result = run(c, t, policy);
    EXPECT_EQ(result.requests[2].prefix_hit_tokens, 1024);
    EXPECT_NEAR(cluster::summarize("", result, c.slo).hit_ratio.value(), 1024.0 / 3584, 1e-12);
  }
}

// A prefill instance takes a prompt's blocks into its cache when the prompt is queued. With a 2-block cache
// pinned by the first prompt, the second prompt's blocks find no room: the Conductor must not count on them
// for a third prompt with the same prefix (they were placed, but the instance said it could not keep them).
TEST(Simulator, BlocksAPrefillCacheCouldNotKeepAreNoHits) {
  cluster::ClusterConfig c = small_cluster(1, 1);
  c.prefill_cache_capacity_tokens = 1024;
  const std::vector<trace::Request> t{request(0, 1536, 1, {1, 2, 3}), request(0, 1024, 1, {4, 5}),
                                      request(0, 1024, 1, {4, 5})};
  for (auto policy : {PrefillPolicy::kCacheAware, PrefillPolicy::kGlobalCacheAware}) {
    SCOPED_TRACE(to_string(policy));
    const cluster::RunResult result = run(c, t, policy);
    EXPECT_EQ(result.requests[0].prefix_hit_tokens, 0);
    EXPECT_EQ(result.requests[2].prefix_hit_tokens, 0);
    EXPECT_EQ(result.requests[2].fetched_tokens, 0);
  }
}

TEST(Simulator, DecodeHbmBoundsTheBatch) {
  cluster::ClusterConfig c = small_cluster(2, 1);
  const perf::CostModel cost(c.model, c.hardware);
  const int64_t capacity = cost.decode_kv_capacity_tokens(c.decode_hbm_reserved_share);
  // Two requests whose KV (prompt + output) each takes over half of the decode instance's HBM.
  const int64_t input = capacity / 2 + 512;
  std::vector<BlockKey> a, b;
  for (int64_t i = 0; i < (input + 511) / 512; ++i) {
    a.push_back(static_cast<BlockKey>(i));
    b.push_back(static_cast<BlockKey>(1'000'000 + i));
  }
  auto result = run(c, {request(0, input, 10, a), request(0, input, 10, b)});
  const auto& r0 = result.requests[0];
  const auto& r1 = result.requests[1];
  // Both prefill in parallel on the two prefill instances and finish together, but the second cannot join the
  // batch until the first has left: its decode starts at or after the first one's finish.
  EXPECT_DOUBLE_EQ(r0.ttft_s, r1.ttft_s);
  const auto& later = r0.finish_s < r1.finish_s ? r1 : r0;
  const auto& earlier = r0.finish_s < r1.finish_s ? r0 : r1;
  EXPECT_GE(later.finish_s - (later.output_tokens - 1) * cost.decode_step_time_s(1, input),
            earlier.finish_s - 1e-9);
  EXPECT_GT(later.tbt_s, earlier.finish_s - earlier.arrival_s - earlier.ttft_s);
}

TEST(Simulator, TimeScaleCompressesArrivals) {
  const cluster::ClusterConfig c = small_cluster(1, 1);
  auto result = run(c, {request(0, 512, 1, {1}), request(10'000, 512, 1, {2})}, PrefillPolicy::kRandom, 4.0);
  EXPECT_DOUBLE_EQ(result.requests[1].arrival_s, 2.5);
}

// Issue #8 §3: traces exported from production logs carry Unix-epoch milliseconds; virtual time starts at
// the first arrival, so the results equal those of the same trace shifted to start at 0.
TEST(Simulator, EpochTimestampsRunLikeTheTraceShiftedToZero) {
  auto t = trace::read_trace(CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz", {});
  ASSERT_TRUE(t.ok());
  t->resize(400);
  std::vector<trace::Request> epoch = *t;
  for (trace::Request& r : epoch) r.timestamp_ms += 1'717'171'717'000;
  for (System system : {System::kDisaggregated, System::kColocatedPrefixCache}) {
    SCOPED_TRACE(to_string(system));
    const cluster::ClusterConfig c = small_cluster(2, 2);
    auto a = simulate(c, *t, {.system = system, .time_scale = 2});
    auto b = simulate(c, epoch, {.system = system, .time_scale = 2});
    ASSERT_TRUE(a.ok() && b.ok()) << b.status().to_string();
    ASSERT_EQ(a->requests.size(), b->requests.size());
    for (size_t i = 0; i < a->requests.size(); ++i) {
      EXPECT_EQ(a->requests[i].arrival_s, b->requests[i].arrival_s) << i;
      EXPECT_EQ(a->requests[i].ttft_s, b->requests[i].ttft_s) << i;
      EXPECT_EQ(a->requests[i].tbt_s, b->requests[i].tbt_s) << i;
      EXPECT_EQ(a->requests[i].finish_s, b->requests[i].finish_s) << i;
      EXPECT_EQ(a->requests[i].prefill_instance, b->requests[i].prefill_instance) << i;
    }
    EXPECT_EQ(a->makespan_s, b->makespan_s);
  }
}

// Load samples go on until the cluster has drained, not only while requests arrive: a short trace's loads
// are still plotted.
TEST(Simulator, LoadSamplesLastUntilTheClusterDrains) {
  const cluster::ClusterConfig c = small_cluster(1, 1);
  auto result = simulate(c, std::vector<trace::Request>{request(0, 8192, 2000, std::vector<BlockKey>(16, 7))},
                         {.load_sample_interval_s = 1});
  ASSERT_TRUE(result.ok());
  ASSERT_GT(result->makespan_s, 10);
  ASSERT_FALSE(result->load_series.empty());
  EXPECT_GE(result->load_series.back().time_s, result->makespan_s - 1);
  EXPECT_GT(result->load_series[5].decode_running, 0);
}

TEST(Simulator, SameInputsSameResult) {
  const cluster::ClusterConfig c = small_cluster(4, 2);
  auto t = trace::read_trace(CRESCENT_SOURCE_DIR "/data/traces/synthetic_trace.jsonl.gz", {});
  ASSERT_TRUE(t.ok());
  t->resize(800);
  for (auto policy : {PrefillPolicy::kRandom, PrefillPolicy::kGlobalCacheAware}) {
    auto a = run(c, *t, policy);
    auto b = run(c, *t, policy);
    ASSERT_EQ(a.requests.size(), b.requests.size());
    for (size_t i = 0; i < a.requests.size(); ++i) {
      EXPECT_EQ(a.requests[i].ttft_s, b.requests[i].ttft_s);
      EXPECT_EQ(a.requests[i].tbt_s, b.requests[i].tbt_s);
      EXPECT_EQ(a.requests[i].prefill_instance, b.requests[i].prefill_instance);
    }
    EXPECT_EQ(a.counters.events, b.counters.events);
  }
}

// The Conductor's state told only of the blocks a later request names decides as when told of all of them:
// every outcome the same, over policies that read the index, fetch and evict (caches of 60 blocks), on both
// bundled traces.
TEST(Simulator, IndexingOnlyBlocksALaterRequestNamesChangesNoOutcome) {
  cluster::ClusterConfig c = small_cluster(6, 3);
  c.prefill_cache_capacity_tokens = 60 * 512;
  c.slo.ttft_s = 2.0;
  for (const char* name : {"conversation_trace", "synthetic_trace"}) {
    auto t = trace::read_trace(std::string(CRESCENT_SOURCE_DIR "/data/traces/") + name + ".jsonl.gz", {});
    ASSERT_TRUE(t.ok());
    t->resize(1200);
    for (auto policy : {PrefillPolicy::kCacheAware, PrefillPolicy::kGlobalCacheAware}) {
      // Admission on the predicted TTFT, near the load's: a prediction that differs changes who is refused.
      SimOptions options{.policy = policy, .admission = conductor::Admission::kSlo, .time_scale = 4.0};
      auto all = simulate(c, *t, [&] {
        SimOptions o = options;
        o.index_only_reused_blocks = false;
        return o;
      }());
      auto reused = simulate(c, *t, options);
      ASSERT_TRUE(all.ok() && reused.ok());
      ASSERT_EQ(all->requests.size(), reused->requests.size());
      int64_t fetched_tokens = 0, rejected = 0;
      for (size_t i = 0; i < all->requests.size(); ++i) {
        const cluster::RequestOutcome& a = all->requests[i];
        const cluster::RequestOutcome& b = reused->requests[i];
        EXPECT_EQ(a.prefill_instance, b.prefill_instance) << name << " " << i;
        EXPECT_EQ(a.decode_instance, b.decode_instance) << name << " " << i;
        EXPECT_EQ(a.prefix_hit_tokens, b.prefix_hit_tokens) << name << " " << i;
        EXPECT_EQ(a.fetched_tokens, b.fetched_tokens) << name << " " << i;
        EXPECT_EQ(a.ttft_s, b.ttft_s) << name << " " << i;
        EXPECT_EQ(a.finish_s, b.finish_s) << name << " " << i;
        EXPECT_EQ(a.rejected, b.rejected) << name << " " << i;
        fetched_tokens += a.fetched_tokens;
        rejected += a.rejected != conductor::RejectReason::kNone;
      }
      EXPECT_EQ(all->counters.events, reused->counters.events);
      if (policy == PrefillPolicy::kGlobalCacheAware) {
        EXPECT_GT(fetched_tokens, 0) << name;
      }
      EXPECT_GT(rejected, 0) << name;
      EXPECT_LT(rejected, static_cast<int64_t>(all->requests.size()) / 2) << name;
    }
  }
}

TEST(Simulator, EveryRequestCompletesWithConsistentTimes) {
  const cluster::ClusterConfig c = small_cluster(3, 2);
  auto t = trace::read_trace(CRESCENT_SOURCE_DIR "/data/traces/conversation_trace.jsonl.gz", {});
  ASSERT_TRUE(t.ok());
  t->resize(1500);
  auto result = run(c, *t);
  for (size_t i = 0; i < result.requests.size(); ++i) {
    const auto& o = result.requests[i];
    ASSERT_EQ(o.rejected, conductor::RejectReason::kNone);
    EXPECT_GT(o.ttft_s, 0) << i;
    EXPECT_GE(o.finish_s, o.arrival_s + o.ttft_s) << i;
    EXPECT_LE(o.prefix_hit_tokens, o.input_tokens) << i;
    if (o.output_tokens > 1) {
      EXPECT_GT(o.tbt_s, 0) << i;
    }
  }
}

TEST(Simulator, RejectsImpossibleOptions) {
  const cluster::ClusterConfig c = small_cluster(1, 1);
  std::vector<trace::Request> t{request(0, 512, 1, {1})};
  EXPECT_FALSE(simulate(c, t, {.time_scale = 0}).ok());
  EXPECT_FALSE(simulate(c, t, {.time_scale = -1}).ok());
  cluster::ClusterConfig tiny = c;
  tiny.prefill_cache_capacity_tokens = 100;
  auto r = simulate(tiny, t, {});
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), ::testing::HasSubstr("below one block"));
}

TEST(Report, PercentilesAndAttainment) {
  cluster::RunResult result;
  for (int i = 1; i <= 10; ++i) {
    cluster::RequestOutcome o;
    o.ttft_s = i;  // 1..10 s
    o.tbt_s = i <= 5 ? 0.05 : 0.15;
    o.input_tokens = 100;
    o.prefix_hit_tokens = 25;
    result.requests.push_back(o);
  }
  result.requests[9].rejected = conductor::RejectReason::kTtft;  // the 10 s one
  cluster::SloConfig slo{.ttft_s = 8, .tbt_s = {0.1, 0.2}};
  cluster::PolicyReport r = cluster::summarize("x", result, slo);
  EXPECT_EQ(r.completed, 9);
  EXPECT_EQ(r.rejected, 1);
  EXPECT_DOUBLE_EQ(r.ttft_mean_s.value(), 5.0);  // mean of 1..9
  EXPECT_DOUBLE_EQ(r.ttft_p50_s.value(), 5.0);   // nearest rank ceil(4.5) = 5th
  EXPECT_DOUBLE_EQ(r.ttft_p90_s.value(), 9.0);
  EXPECT_DOUBLE_EQ(r.hit_ratio.value(), 0.25);
  // TBT <= 100 ms and TTFT <= 8 s: requests 1..5 → 5/10. TBT <= 200 ms: 1..8 → 8/10.
  EXPECT_DOUBLE_EQ(r.slo_attainment_by_tbt[0].attainment, 0.5);
  EXPECT_DOUBLE_EQ(r.slo_attainment_by_tbt[1].attainment, 0.8);
  EXPECT_DOUBLE_EQ(r.slo_attainment, 0.5);
}

// Issue #8 §4: statistics over an empty set are absent (null, n/a), never 0.
TEST(Report, StatisticsOfNothingAreAbsent) {
  cluster::RunResult result;
  for (int i = 0; i < 3; ++i) {
    cluster::RequestOutcome o;
    o.input_tokens = 100;
    o.output_tokens = 1;
    o.rejected = conductor::RejectReason::kDecodeCapacity;
    result.requests.push_back(o);
  }
  const cluster::PolicyReport none = cluster::summarize("p", result, {});
  EXPECT_EQ(none.completed, 0);
  for (const auto& stat : {none.ttft_mean_s, none.ttft_p50_s, none.ttft_p90_s, none.ttft_p99_s,
                           none.tbt_mean_s, none.tbt_p99_s, none.hit_ratio, none.fetched_ratio,
                           none.prefill_compute_s_per_request, none.slo_attainment_accepted}) {
    EXPECT_FALSE(stat.has_value());
  }
  EXPECT_EQ(none.slo_attainment, 0);  // over all requests: none met the SLO
  const nlohmann::json j = to_json(none);
  EXPECT_TRUE(j["ttft_mean_s"].is_null());
  EXPECT_TRUE(j["tbt_p99_s"].is_null());
  EXPECT_TRUE(j["hit_ratio"].is_null());
  const std::string table = cluster::format_table({none}, {});
  EXPECT_NE(table.find("n/a"), std::string::npos);
  EXPECT_EQ(
      cluster::no_completion_warning(none),
      "p: no request completed: all 3 were rejected (3 decode-capacity: admission judged the decode pool "
      "full); TTFT and TBT statistics are n/a");

  // Completed, but all with one output token: TTFT is known, TBT is not.
  for (auto& o : result.requests) o.rejected = conductor::RejectReason::kNone;
  const cluster::PolicyReport one_token = cluster::summarize("p", result, {});
  EXPECT_TRUE(one_token.ttft_mean_s.has_value());
  EXPECT_FALSE(one_token.tbt_mean_s.has_value());
  EXPECT_FALSE(one_token.tbt_p99_s.has_value());
  EXPECT_EQ(cluster::no_completion_warning(one_token), "");
}

}  // namespace
}  // namespace crescent::sim
