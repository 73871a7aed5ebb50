#include "conductor/conductor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "conductor/cluster_state.h"
#include "perf/cost_model.h"

namespace crescent::conductor {
namespace {

// A hand-set cluster: queues, decode loads and cached blocks are whatever the test says.
class FakeCluster : public ClusterView {
 public:
  FakeCluster(uint32_t prefill, uint32_t decode)
      : busy_until_s(prefill, 0.0), ready_s(prefill, 0.0), decode(decode) {
    for (auto& d : this->decode) d.kv_capacity_tokens = 1'000'000;
  }
  uint32_t prefill_instance_count() const override { return static_cast<uint32_t>(busy_until_s.size()); }
  std::span<const double> prefill_busy_until_s() const override { return busy_until_s; }
  std::span<const kv::DecodeLoad> decode_loads() const override { return decode; }
  std::span<const uint8_t> decode_up_flags() const override { return decode_up; }
  const kv::BlockIndex& block_index() const override { return index; }
  double prefix_ready_s(InstanceId holder, std::span<const BlockKey>, double) const override {
    return ready_s[holder];
  }

  void cache(InstanceId instance, const std::vector<BlockKey>& keys) {
    for (BlockKey k : keys) index.add(k, instance);
  }

  std::vector<double> busy_until_s;
  std::vector<double> ready_s;  // per instance: when its cached blocks are computed
  std::vector<kv::DecodeLoad> decode;
  std::vector<uint8_t> decode_up;  // empty: every decode instance is up
  kv::BlockIndex index;
};

class ConductorTest : public ::testing::Test {
 protected:
  ConductorTest() : cost_(*perf::model_preset("llama3-70b"), *perf::hardware_preset("8xA800")) {}

  Decision place(PrefillPolicy policy, const FakeCluster& cluster, int64_t input_tokens,
                 const std::vector<BlockKey>& keys, double threshold = 1.0, double now_s = 0) {
    Conductor conductor(cost_, {.policy = policy, .kvcache_balancing_threshold = threshold});
    return conductor.schedule(cluster, {input_tokens, keys, /*max_output_tokens=*/100}, now_s);
  }

  perf::CostModel cost_;
  // An 8-block (4096-token) prompt.
  std::vector<BlockKey> keys_{1, 2, 3, 4, 5, 6, 7, 8};
};

TEST_F(ConductorTest, ParsesPolicyNamesAndListsValidOnes) {
  for (const auto& name : prefill_policy_names()) {
    auto p = parse_prefill_policy(name);
    ASSERT_TRUE(p.ok()) << name;
    EXPECT_EQ(to_string(*p), name);
  }
  auto bad = parse_prefill_policy("fastest");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(bad.status().message(), ::testing::HasSubstr("'fastest'"));
  EXPECT_THAT(bad.status().message(),
              ::testing::HasSubstr("random, round-robin, least-loaded, cache-aware, global-cache-aware"));
  EXPECT_FALSE(parse_admission("maybe").ok());
}

TEST_F(ConductorTest, RandomIsSeededAndCoversAllInstances) {
  FakeCluster cluster(4, 1);
  Conductor a(cost_, {.policy = PrefillPolicy::kRandom, .seed = 7});
  Conductor b(cost_, {.policy = PrefillPolicy::kRandom, .seed = 7});
  std::set<InstanceId> seen;
  for (int i = 0; i < 200; ++i) {
    auto da = a.schedule(cluster, {4096, keys_}, 0);
    auto db = b.schedule(cluster, {4096, keys_}, 0);
    EXPECT_EQ(da.prefill_instance, db.prefill_instance);
    seen.insert(da.prefill_instance);
  }
  EXPECT_EQ(seen.size(), 4u);
}

TEST_F(ConductorTest, RoundRobinTakesEachInstanceInTurnIgnoringCacheAndQueue) {
  FakeCluster cluster(3, 1);
  cluster.busy_until_s = {50.0, 0.0, 0.0};
  cluster.cache(1, keys_);
  Conductor conductor(cost_, {.policy = PrefillPolicy::kRoundRobin});
  std::vector<InstanceId> chosen;
  for (int i = 0; i < 6; ++i)
    chosen.push_back(conductor.schedule(cluster, {4096, keys_}, 0).prefill_instance);
  EXPECT_THAT(chosen, ::testing::ElementsAre(0u, 1u, 2u, 0u, 1u, 2u));
}

TEST_F(ConductorTest, APrefixCacheInHbmCostsNoLoad) {
  FakeCluster cluster(3, 1);
  cluster.cache(2, {1, 2, 3, 4, 5, 6});
  Conductor conductor(cost_, {.policy = PrefillPolicy::kCacheAware, .prefix_cache_in_hbm = true});
  const Decision d = conductor.schedule(cluster, {4096, keys_, 100}, 0);
  EXPECT_EQ(d.prefill_instance, 2u);
  EXPECT_EQ(d.local_prefix_tokens, 6 * 512);
  EXPECT_DOUBLE_EQ(d.transfer_s, 0.0);  // in DRAM it would be cost_.kv_load_time_s(3072)
  EXPECT_DOUBLE_EQ(d.ttft_s, cost_.prefill_time_s(1024, 3072));
}

TEST_F(ConductorTest, InstancesNotAlikeAreEachTimedByTheirOwnCostModel) {
  // Instance 1 is twice as fast (compute and memory), instance 0 holds half the prompt.
  perf::HardwareSpec fast_hardware = *perf::hardware_preset("8xA800");
  fast_hardware.peak_flops_per_gpu *= 2;
  fast_hardware.hbm_bytes_per_s_per_gpu *= 2;
  const perf::CostModel fast(*perf::model_preset("llama3-70b"), fast_hardware);
  FakeCluster cluster(2, 2);
  cluster.cache(0, {1, 2, 3, 4});
  Conductor conductor(cost_, {.policy = PrefillPolicy::kCacheAware});
  conductor.set_instance_cost_models({nullptr, &fast}, {nullptr, &fast});
  const Decision d = conductor.schedule(cluster, {4096, keys_, 100}, 0);
  // Alike, instance 0's cached half would win; here the whole prompt on the fast one beats half on the slow.
  ASSERT_LT(fast.prefill_time_s(4096, 0), cost_.prefill_time_s(2048, 2048) + cost_.kv_load_time_s(2048));
  EXPECT_EQ(d.prefill_instance, 1u);
  EXPECT_DOUBLE_EQ(d.prefill_s, fast.prefill_time_s(4096, 0));
  EXPECT_EQ(d.decode_instance, 1u);  // the faster decode step
  ASSERT_LT(fast.decode_step_time_s(1, 4096), cost_.decode_step_time_s(1, 4096));
  EXPECT_DOUBLE_EQ(d.predicted_tbt_s, fast.decode_step_time_s(1, 4096));
  // Without them, the cached half wins.
  conductor.set_instance_cost_models({}, {});
  EXPECT_EQ(conductor.schedule(cluster, {4096, keys_, 100}, 0).prefill_instance, 0u);
}

TEST_F(ConductorTest, LeastLoadedPicksShortestQueueAndIgnoresCache) {
  FakeCluster cluster(3, 1);
  cluster.busy_until_s = {5.0, 2.0, 9.0};
  cluster.cache(0, keys_);  // the whole prompt is cached on the busiest-but-one instance
  auto d = place(PrefillPolicy::kLeastLoaded, cluster, 4096, keys_, 1.0, /*now_s=*/1.0);
  EXPECT_EQ(d.prefill_instance, 1u);
  EXPECT_DOUBLE_EQ(d.queue_s, 1.0);
  EXPECT_EQ(d.prefix_tokens(), 0);
  EXPECT_DOUBLE_EQ(d.prefill_s, cost_.prefill_time_s(4096, 0));
}

TEST_F(ConductorTest, CacheAwarePrefersLocalPrefixWhenQueuesAreEqual) {
  FakeCluster cluster(3, 1);
  cluster.cache(2, {1, 2, 3, 4, 5, 6});  // 6 of 8 blocks on instance 2
  auto d = place(PrefillPolicy::kCacheAware, cluster, 4096, keys_);
  EXPECT_EQ(d.prefill_instance, 2u);
  EXPECT_EQ(d.local_prefix_tokens, 6 * 512);
  EXPECT_EQ(d.fetched_prefix_tokens, 0);
  EXPECT_EQ(d.prefill_tokens, 2 * 512);
  EXPECT_DOUBLE_EQ(d.prefill_s, cost_.prefill_time_s(1024, 3072));
  EXPECT_DOUBLE_EQ(d.transfer_s, cost_.kv_load_time_s(3072));  // DRAM -> HBM
  EXPECT_DOUBLE_EQ(d.ttft_s, d.transfer_s + d.prefill_s);
}

TEST_F(ConductorTest, CacheAwareTradesPrefixForQueue) {
  FakeCluster cluster(2, 1);
  cluster.cache(1, keys_);
  const double saving_s =
      cost_.prefill_time_s(4096, 0) - cost_.prefill_time_s(1, 4095) - cost_.kv_load_time_s(4096);
  cluster.busy_until_s = {0.0, saving_s * 1.5};  // waiting for the cache costs more than recomputing
  EXPECT_EQ(place(PrefillPolicy::kCacheAware, cluster, 4096, keys_).prefill_instance, 0u);
  cluster.busy_until_s = {0.0, saving_s * 0.5};
  auto d = place(PrefillPolicy::kCacheAware, cluster, 4096, keys_);
  EXPECT_EQ(d.prefill_instance, 1u);
  EXPECT_EQ(d.prefill_tokens, 1);  // fully cached: only the last token is recomputed
}

TEST_F(ConductorTest, GlobalFetchesRemotePrefixToIdleInstance) {
  FakeCluster cluster(2, 1);
  cluster.cache(1, keys_);
  cluster.busy_until_s = {0.0, 100.0};  // the holder is busy
  auto d = place(PrefillPolicy::kGlobalCacheAware, cluster, 4096, keys_);
  EXPECT_EQ(d.prefill_instance, 0u);
  EXPECT_EQ(d.local_prefix_tokens, 0);
  EXPECT_EQ(d.fetched_prefix_tokens, 4096);
  EXPECT_EQ(d.fetch_from, 1u);
  EXPECT_DOUBLE_EQ(d.transfer_s, cost_.kv_transfer_time_s(4096) + cost_.kv_load_time_s(4096));
  EXPECT_DOUBLE_EQ(d.ttft_s, d.transfer_s + d.prefill_s);
  // Local cache-aware cannot fetch: it recomputes everything on the idle instance.
  auto local = place(PrefillPolicy::kCacheAware, cluster, 4096, keys_);
  EXPECT_EQ(local.prefill_instance, 0u);
  EXPECT_EQ(local.prefix_tokens(), 0);
}

TEST_F(ConductorTest, BalancingThresholdKeepsShortLocalPrefix) {
  FakeCluster cluster(2, 1);
  cluster.cache(1, keys_);            // 8 blocks on 1 (busy)
  cluster.cache(0, {1, 2, 3, 4, 5});  // 5 blocks on 0
  cluster.busy_until_s = {0.0, 100.0};
  // best/local = 8/5 = 1.6: fetch above a 1.5 threshold, recompute below a 2.0 one.
  auto fetch = place(PrefillPolicy::kGlobalCacheAware, cluster, 4096, keys_, 1.5);
  EXPECT_EQ(fetch.local_prefix_tokens, 5 * 512);
  EXPECT_EQ(fetch.fetched_prefix_tokens, 3 * 512);
  EXPECT_DOUBLE_EQ(fetch.transfer_s, cost_.kv_transfer_time_s(3 * 512) + cost_.kv_load_time_s(8 * 512));
  auto keep = place(PrefillPolicy::kGlobalCacheAware, cluster, 4096, keys_, 2.0);
  EXPECT_EQ(keep.local_prefix_tokens, 5 * 512);
  EXPECT_EQ(keep.fetched_prefix_tokens, 0);
  EXPECT_DOUBLE_EQ(keep.transfer_s, cost_.kv_load_time_s(5 * 512));
}

TEST_F(ConductorTest, DecodePicksLowestPredictedTbtThatFits) {
  FakeCluster cluster(1, 3);
  cluster.decode[0] = {
      .running = {40, 400'000, 420'000}, .waiting = {}, .incoming = {}, .kv_capacity_tokens = 1'000'000};
  // Lightest batch, but the requests waiting and incoming already claim its HBM.
  cluster.decode[1] = {.running = {2, 20'000, 22'000},
                       .waiting = {10, 500'000, 520'000},
                       .incoming = {5, 450'000, 455'000},
                       .kv_capacity_tokens = 1'000'000};
  cluster.decode[2] = {.running = {10, 100'000, 110'000},
                       .waiting = {},
                       .incoming = {1, 5'000, 6'000},
                       .kv_capacity_tokens = 1'000'000};
  auto d = place(PrefillPolicy::kLeastLoaded, cluster, 4096, keys_);
  EXPECT_EQ(d.decode_instance, 2u);
  EXPECT_TRUE(d.decode_has_room);
  // Incoming and waiting requests count as joined: 10 + 1 + this one, with their contexts.
  EXPECT_DOUBLE_EQ(d.predicted_tbt_s, cost_.decode_step_time_s(12, 100'000 + 5'000 + 4096));
}

TEST_F(ConductorTest, DecodeWithoutRoomAnywhereStillPicksLightest) {
  FakeCluster cluster(1, 2);
  cluster.decode[0] = {
      .running = {50, 990'000, 999'000}, .waiting = {}, .incoming = {}, .kv_capacity_tokens = 1'000'000};
  cluster.decode[1] = {
      .running = {5, 900'000, 999'000}, .waiting = {}, .incoming = {}, .kv_capacity_tokens = 1'000'000};
  auto d = place(PrefillPolicy::kLeastLoaded, cluster, 4096, keys_);
  EXPECT_EQ(d.decode_instance, 1u);
  EXPECT_FALSE(d.decode_has_room);
}

// The decode choice against the plainest reading of Algorithm 1 line 17: one pass keeping the best
// candidate, among the instances up with room (all up ones when none has room), ties to the history's
// prefer(). Loads drawn from a few values so that scores tie often, some instances down, sometimes no room
// anywhere, 37 instances (not a multiple of the scoring loop's eight lanes), one cost model or several.
TEST_F(ConductorTest, DecodeChoiceIsAOneCandidateFoldOverTheInstances) {
  perf::HardwareSpec fast_hardware = *perf::hardware_preset("8xA800");
  fast_hardware.hbm_bytes_per_s_per_gpu *= 2;
  const perf::CostModel fast(*perf::model_preset("llama3-70b"), fast_hardware);
  constexpr uint32_t kDecode = 37;
  // Cost models: the Conductor's for all; every third instance faster; all faster (one model, not the
  // Conductor's); all listed faster but the list shorter than the pool (the rest the Conductor's).
  for (const int models : {0, 1, 2, 3}) {
    SCOPED_TRACE("cost models " + std::to_string(models));
    FakeCluster cluster(1, kDecode);
    cluster.decode_up.assign(kDecode, 1);
    Conductor conductor(cost_, {.policy = PrefillPolicy::kLeastLoaded});
    std::vector<const perf::CostModel*> decode_costs(kDecode, nullptr);
    for (uint32_t d = 0; d < kDecode; ++d) {
      if ((models == 1 && d % 3 == 0) || models >= 2) decode_costs[d] = &fast;
    }
    if (models == 3) decode_costs.resize(kDecode - 5);
    conductor.set_instance_cost_models({}, decode_costs);
    auto cost_of = [&](InstanceId d) -> const perf::CostModel& {
      return d < decode_costs.size() && decode_costs[d] != nullptr ? *decode_costs[d] : cost_;
    };
    PlacementHistory history;  // the Conductor's, mirrored: it records each accepted decode placement
    std::mt19937_64 rng(26);
    int ties = 0, no_room = 0;
    for (int decision = 0; decision < 3000; ++decision) {
      const double now_s = decision * 0.01;
      const bool crowded = decision % 10 == 0;  // no instance has room
      for (uint32_t d = 0; d < kDecode; ++d) {
        const int64_t running = static_cast<int64_t>(rng() % 4) * 10;
        const int64_t incoming = static_cast<int64_t>(rng() % 2);
        cluster.decode[d] = {.running = {running, running * 2'000, running * 2'500},
                             .waiting = {},
                             .incoming = {incoming, incoming * 3'000, incoming * 4'000},
                             .kv_capacity_tokens = crowded ? running * 2'500 + incoming * 4'000 + 1'000
                                                           : (rng() % 3 == 0 ? 60'000 : 1'000'000)};
        cluster.decode_up[d] = d == 0 || rng() % 8 != 0 ? 1 : 0;
      }
      const int64_t input_tokens = 1'000 + static_cast<int64_t>(rng() % 3) * 1'000;
      const RequestInfo request{input_tokens, {}, 100};
      // The reference: one candidate with room, one of all up.
      const int64_t need = input_tokens + 100;
      std::optional<InstanceId> with_room, any_up;
      double room_score = std::numeric_limits<double>::infinity(), up_score = room_score;
      int at_lowest = 0;
      for (InstanceId d = 0; d < kDecode; ++d) {
        if (cluster.decode_up[d] == 0) continue;
        const kv::DecodeLoad& load = cluster.decode[d];
        const double score = cost_of(d).decode_step_time_s(
            load.running.requests + load.incoming.requests + 1,
            load.running.context_tokens + load.incoming.context_tokens + input_tokens);
        auto consider = [&](std::optional<InstanceId>& best, double& best_score) {
          if (score < best_score || (score == best_score && history.prefer(d, *best))) {
            best_score = score;
            best = d;
          }
        };
        consider(any_up, up_score);
        if (need <= load.kv_capacity_tokens - load.reserved_kv_tokens()) consider(with_room, room_score);
      }
      const bool fits = with_room.has_value();
      const InstanceId expected = fits ? *with_room : *any_up;
      for (InstanceId d = 0; d < kDecode; ++d) {
        const kv::DecodeLoad& load = cluster.decode[d];
        at_lowest += cluster.decode_up[d] != 0 &&
                     (!fits || need <= load.kv_capacity_tokens - load.reserved_kv_tokens()) &&
                     cost_of(d).decode_step_time_s(
                         load.running.requests + load.incoming.requests + 1,
                         load.running.context_tokens + load.incoming.context_tokens + input_tokens) ==
                         (fits ? room_score : up_score);
      }
      ties += at_lowest > 1;
      no_room += !fits;

      const Decision got = conductor.schedule(cluster, request, now_s);
      ASSERT_EQ(got.rejected, RejectReason::kNone) << decision;
      ASSERT_EQ(got.decode_instance, expected) << decision;
      ASSERT_EQ(got.decode_has_room, fits) << decision;
      ASSERT_EQ(got.predicted_tbt_s, fits ? room_score : up_score) << decision;
      history.record(got.decode_instance, now_s);
    }
    // The draw exercised what it is for.
    EXPECT_GT(ties, 500);
    EXPECT_GT(no_room, 200);
  }
}

TEST_F(ConductorTest, RefusesRequestsLargerThanAnyDecodeHbm) {
  FakeCluster cluster(1, 2);
  cluster.decode[1].kv_capacity_tokens = 2'000'000;
  Conductor conductor(cost_, {.policy = PrefillPolicy::kCacheAware});
  EXPECT_EQ(conductor.schedule(cluster, {1'999'000, {}, 1'000}, 0).rejected, RejectReason::kNone);
  EXPECT_EQ(conductor.schedule(cluster, {1'999'000, {}, 1'001}, 0).rejected, RejectReason::kContextLength);
  EXPECT_EQ(conductor.schedule(cluster, {2'000'001, {}, 0}, 0).rejected, RejectReason::kContextLength);
  // No overflow on absurd lengths.
  EXPECT_EQ(conductor.schedule(cluster, {10, {}, INT64_MAX}, 0).rejected, RejectReason::kContextLength);
}

TEST_F(ConductorTest, FetchWaitsForTheSourceToComputeThePrefix) {
  FakeCluster cluster(3, 1);
  cluster.cache(0, keys_);
  cluster.cache(1, keys_);
  cluster.busy_until_s = {50.0, 50.0, 0.0};  // both holders busy; instance 2 idle
  cluster.ready_s = {30.0, 20.0, 0.0};       // holder 1 computes the prefix first
  auto d = place(PrefillPolicy::kGlobalCacheAware, cluster, 4096, keys_);
  EXPECT_EQ(d.prefill_instance, 2u);
  EXPECT_EQ(d.fetch_from, 1u);
  EXPECT_DOUBLE_EQ(d.queue_s, 20.0);  // waits for the source, not for its own (empty) queue
  EXPECT_DOUBLE_EQ(d.ttft_s, 20.0 + d.transfer_s + d.prefill_s);
  // When the wait is longer than recomputing, an idle instance recomputes instead... which only an instance
  // without the fetch can do: with every holder busy, local cache-aware recomputes on instance 2.
  cluster.ready_s = {1000.0, 1000.0, 0.0};
  auto late = place(PrefillPolicy::kGlobalCacheAware, cluster, 4096, keys_);
  EXPECT_EQ(late.prefill_instance, 0u);  // its own queue (50 s) beats waiting 1000 s for a fetch
  EXPECT_EQ(late.fetched_prefix_tokens, 0);
}

TEST_F(ConductorTest, SloAdmissionRejectsWhenTtftCannotBeMet) {
  FakeCluster cluster(2, 1);
  cluster.busy_until_s = {50.0, 60.0};
  Conductor conductor(
      cost_, {.policy = PrefillPolicy::kCacheAware, .admission = Admission::kSlo, .ttft_slo_s = 30.0});
  EXPECT_EQ(conductor.schedule(cluster, {4096, keys_}, 0).rejected, RejectReason::kTtft);
  EXPECT_EQ(conductor.schedule(cluster, {4096, keys_}, 45.0).rejected, RejectReason::kNone);
}

// Issue #8 §1: with idle, equal instances and nothing cached, every choice used to fall to instance 0.
TEST_F(ConductorTest, EveryPolicySpreadsTiesOverIdleInstances) {
  for (auto policy :
       {PrefillPolicy::kLeastLoaded, PrefillPolicy::kCacheAware, PrefillPolicy::kGlobalCacheAware}) {
    SCOPED_TRACE(to_string(policy));
    FakeCluster cluster(4, 3);  // stays idle: the fake does not queue what is placed
    Conductor conductor(cost_, {.policy = policy});
    std::set<InstanceId> prefill, decode;
    for (BlockKey r = 0; r < 4; ++r) {
      const std::vector<BlockKey> keys{100 * r + 1, 100 * r + 2};
      const Decision d = conductor.schedule(cluster, {1024, keys, 10}, 10.0 * static_cast<double>(r));
      prefill.insert(d.prefill_instance);
      if (r < 3) decode.insert(d.decode_instance);
    }
    EXPECT_EQ(prefill.size(), 4u);
    EXPECT_EQ(decode.size(), 3u);
  }
}

TEST_F(ConductorTest, TieGoesToTheInstanceWithFewestRecentPlacements) {
  FakeCluster cluster(3, 1);
  Conductor conductor(cost_, {.policy = PrefillPolicy::kCacheAware});
  cluster.busy_until_s = {100.0, 0.0, 100.0};
  EXPECT_EQ(conductor.schedule(cluster, {1024, keys_}, 0).prefill_instance, 1u);
  cluster.busy_until_s = {0.0, 100.0, 100.0};
  EXPECT_EQ(conductor.schedule(cluster, {1024, keys_}, 0).prefill_instance, 0u);
  EXPECT_EQ(conductor.schedule(cluster, {1024, keys_}, 0).prefill_instance, 0u);
  // All idle: instance 2 has had no request (round robin alone would give 1, after the last placed, 0).
  cluster.busy_until_s = {0.0, 0.0, 0.0};
  EXPECT_EQ(conductor.schedule(cluster, {1024, keys_}, 1).prefill_instance, 2u);
  // A rejected request is not a placement.
  Conductor strict(cost_,
                   {.policy = PrefillPolicy::kCacheAware, .admission = Admission::kSlo, .ttft_slo_s = 1e-9});
  EXPECT_NE(strict.schedule(cluster, {1024, keys_}, 0).rejected, RejectReason::kNone);
  EXPECT_EQ(strict.schedule(cluster, {1024, {}, 0}, 0).prefill_instance, 0u);
}

TEST_F(ConductorTest, FetchSourceTiesSpreadOverHolders) {
  FakeCluster cluster(3, 1);
  cluster.cache(0, keys_);
  cluster.cache(1, keys_);
  cluster.busy_until_s = {100.0, 100.0, 0.0};  // both holders busy and ready: fetch to idle instance 2
  Conductor conductor(cost_, {.policy = PrefillPolicy::kGlobalCacheAware});
  std::set<InstanceId> sources;
  for (int i = 0; i < 2; ++i) {
    const Decision d = conductor.schedule(cluster, {4096, keys_}, 0);
    ASSERT_EQ(d.prefill_instance, 2u);
    ASSERT_EQ(d.fetched_prefix_tokens, 4096);
    sources.insert(d.fetch_from);
    cluster.busy_until_s = {100.0, 100.0, 0.0};
  }
  EXPECT_EQ(sources.size(), 2u);  // equally ready holders take turns serving fetches
}

// The fetch's wait is the soonest holder's (0 once one holder has computed the prefix), and its source is
// that holder: ties to the lowest id for a new Conductor, then, once it has served a fetch, to the next tied
// holder after it (fewer recent fetches, then round robin). Checked against every holder's exact ready time
// in a ClusterState, whose answers stop early past the best time so far. In half the trials every other
// instance holds the whole prefix, so the busy order answers; in the rest the loop does.
TEST_F(ConductorTest, TheFetchSourceIsTheHolderReadySoonestAndTheWaitIsItsOwn) {
  constexpr uint32_t kInstances = 70;  // the last holds nothing and is idle: it fetches
  std::mt19937_64 rng(11);
  const std::vector<BlockKey> keys{1, 2, 3};
  uint64_t by_order = 0, by_loop = 0, second_source_moved = 0;
  for (int trial = 0; trial < 300; ++trial) {
    const bool all_hold = trial % 2 == 0;
    ClusterState state(kInstances, 1, 512, 1'000'000);
    const double now_s = 100;
    std::vector<double> ready_s(kInstances, -1);  // per holder: its prefix's exact ready time
    for (InstanceId h = 0; h + 1 < kInstances; ++h) {
      double latest_s = 0;
      for (BlockKey k : keys) {  // times from few values, so holders tie; some before now
        if (!all_hold && rng() % 3 == 0) break;
        const double t = 90 + 5 * static_cast<double>(rng() % 6);
        state.on_kv_event(h, std::vector<BlockKey>{k}, {}, t);
        latest_s = std::max(latest_s, t);
        if (k == keys.back()) ready_s[h] = latest_s;  // holds the whole prefix
      }
      Decision busy;  // a queue no fetch waits as long for
      busy.prefill_instance = h;
      busy.prefill_s = 1e6;
      state.on_request_placed({1, {}, 1}, busy, now_s);
    }
    double soonest_s = std::numeric_limits<double>::infinity();
    std::vector<InstanceId> tied;  // holders ready at soonest_s, by id
    for (InstanceId h = 0; h < kInstances; ++h) {
      if (ready_s[h] < 0 || ready_s[h] > soonest_s) continue;
      if (ready_s[h] < soonest_s) tied.clear();
      soonest_s = ready_s[h];
      tied.push_back(h);
    }
    if (tied.empty()) continue;  // no holder
    Conductor conductor(cost_, {.policy = PrefillPolicy::kGlobalCacheAware});
    const RequestInfo request{3 * 512, keys, 10};
    const Decision first = conductor.schedule(state, request, now_s);
    ASSERT_EQ(first.prefill_instance, kInstances - 1) << "trial " << trial;
    ASSERT_EQ(first.fetched_prefix_tokens, 3 * 512);
    ASSERT_EQ(first.fetch_from, tied.front()) << "trial " << trial;
    ASSERT_EQ(first.queue_s, std::max(0.0, soonest_s - now_s)) << "trial " << trial;
    // The same request again: the first source has served a fetch, the other tied holders none.
    const Decision second = conductor.schedule(state, request, now_s);
    const InstanceId expected = tied.size() > 1 ? tied[1] : tied.front();
    ASSERT_EQ(second.fetch_from, expected) << "trial " << trial;
    second_source_moved += second.fetch_from != first.fetch_from;
    (conductor.busy_order_choices() > 0 ? by_order : by_loop) += 1;
  }
  EXPECT_GT(by_order, 100u);
  EXPECT_GT(by_loop, 100u);
  EXPECT_GT(second_source_moved, 50u);
}

TEST_F(ConductorTest, SameInputsGiveSameDecisions) {
  for (auto policy : {PrefillPolicy::kRandom, PrefillPolicy::kLeastLoaded, PrefillPolicy::kCacheAware,
                      PrefillPolicy::kGlobalCacheAware}) {
    FakeCluster cluster(5, 4);
    Conductor a(cost_, {.policy = policy, .seed = 3}), b(cost_, {.policy = policy, .seed = 3});
    for (int i = 0; i < 50; ++i) {
      const std::vector<BlockKey> keys{static_cast<BlockKey>(i % 7), static_cast<BlockKey>(i)};
      const Decision da = a.schedule(cluster, {1024, keys, 5}, i);
      const Decision db = b.schedule(cluster, {1024, keys, 5}, i);
      EXPECT_EQ(da.prefill_instance, db.prefill_instance);
      EXPECT_EQ(da.decode_instance, db.decode_instance);
    }
  }
}

TEST_F(ConductorTest, ScalesToManyInstancesWithSparseMatches) {
  FakeCluster cluster(1024, 1);
  for (InstanceId i = 0; i < 1024; ++i) cluster.busy_until_s[i] = 1.0 + i;
  cluster.busy_until_s[700] = 0.0;  // the only idle instance holds nothing
  cluster.cache(3, keys_);          // the holder has a 4 s queue
  auto d = place(PrefillPolicy::kGlobalCacheAware, cluster, 4096, keys_);
  EXPECT_EQ(d.prefill_instance, 700u);
  EXPECT_EQ(d.fetched_prefix_tokens, 4096);
}

}  // namespace
}  // namespace crescent::conductor

namespace crescent::conductor {
namespace {

TEST_F(ConductorTest, EmptyPromptStillComputesOneToken) {
  FakeCluster cluster(2, 1);
  for (auto policy : {PrefillPolicy::kRandom, PrefillPolicy::kCacheAware, PrefillPolicy::kGlobalCacheAware}) {
    auto d = place(policy, cluster, 0, {});
    EXPECT_EQ(d.prefill_tokens, 1);
    EXPECT_EQ(d.prefix_tokens(), 0);
    // One token computes almost nothing but still reads the weights once (the prefill iteration's roofline).
    EXPECT_DOUBLE_EQ(d.prefill_s, cost_.iteration_time_s(0, 0, 1, 0));
    EXPECT_GT(d.prefill_s, 10 * cost_.prefill_time_s(1, 0));
  }
}

}  // namespace
}  // namespace crescent::conductor

namespace crescent::conductor {
namespace {

TEST(OutputLengthEstimator, RunningMeanFromPrior) {
  OutputLengthEstimator e(/*prior_tokens=*/100, /*prior_weight=*/2);
  EXPECT_DOUBLE_EQ(e.expected_tokens(), 100);
  e.observe(400);  // (100 * 2 + 400) / 3
  EXPECT_DOUBLE_EQ(e.expected_tokens(), 200);
}

// The simulator's decode instances report finished requests in index order, not time order: the estimate
// must not depend on the order. Lengths up to 2^40 and a prior whose sum is not a whole number make a sum
// kept in a double round differently in different orders.
TEST(OutputLengthEstimator, TheOrderOfObservationsChangesNothing) {
  std::mt19937_64 rng(4);
  std::vector<int64_t> outputs(100'000);
  for (int64_t& o : outputs) o = 1 + static_cast<int64_t>(rng() % (int64_t{1} << 40));
  OutputLengthEstimator forward(/*prior_tokens=*/300.3), shuffled(/*prior_tokens=*/300.3);
  for (int64_t o : outputs) forward.observe(o);
  std::shuffle(outputs.begin(), outputs.end(), rng);
  for (int64_t o : outputs) shuffled.observe(o);
  EXPECT_EQ(forward.expected_tokens(), shuffled.expected_tokens());  // the same bits
  int64_t sum = 0;
  for (int64_t o : outputs) sum += o;
  EXPECT_DOUBLE_EQ(forward.expected_tokens(), (300.3 * 8 + static_cast<double>(sum)) / (8 + 100'000.0));
}

class AdmissionTest : public ConductorTest {
 protected:
  // One decode instance with 1M tokens of HBM; `running`, `incoming` as given; prefill idle.
  Decision admit(Admission admission, kv::DecodeGroup running, kv::DecodeGroup incoming, int64_t input_tokens,
                 double prefill_busy_until_s = 0, bool admitted = false) {
    FakeCluster cluster(1, 1);
    cluster.busy_until_s = {prefill_busy_until_s};
    cluster.decode[0] = {
        .running = running, .waiting = {}, .incoming = incoming, .kv_capacity_tokens = 1'000'000};
    Conductor conductor(cost_, {.policy = PrefillPolicy::kCacheAware,
                                .admission = admission,
                                .ttft_slo_s = 30,
                                .tbt_slo_s = 0.1,
                                .expected_output_prior_tokens = 100});
    RequestInfo request{input_tokens, keys_, /*max_output_tokens=*/100};
    request.admitted = admitted;
    return conductor.schedule(cluster, request, 0);
  }
};

TEST_F(AdmissionTest, EveryPolicyButNoneRejectsWhenTtftSloCannotBeMet) {
  for (auto a : {Admission::kSlo, Admission::kEarly, Admission::kPredictive}) {
    EXPECT_EQ(admit(a, {}, {}, 4096, /*prefill_busy_until_s=*/40).rejected, RejectReason::kTtft);
  }
  EXPECT_EQ(admit(Admission::kNone, {}, {}, 4096, 40).rejected, RejectReason::kNone);
}

// A request accepted before and placed again after its instance failed is never refused by admission: its
// client was told yes (issue 25 §2).
TEST_F(AdmissionTest, ARequestAlreadyAdmittedIsNotJudgedAgain) {
  for (auto a : {Admission::kSlo, Admission::kEarly, Admission::kPredictive}) {
    EXPECT_EQ(admit(a, {}, {}, 4096, 40, /*admitted=*/true).rejected, RejectReason::kNone);
    EXPECT_EQ(admit(a, {50, 990'000, 997'000}, {}, 4096, 0, /*admitted=*/true).rejected, RejectReason::kNone);
  }
}

TEST_F(AdmissionTest, EarlyJudgesCurrentLoadOnly) {
  // 997k tokens running: no room now for 4096 + 100. Incoming requests are not part of the current load.
  EXPECT_EQ(admit(Admission::kEarly, {50, 990'000, 997'000}, {}, 4096).rejected,
            RejectReason::kDecodeCapacity);
  EXPECT_EQ(admit(Admission::kEarly, {50, 490'000, 500'000}, {20, 490'000, 495'000}, 4096).rejected,
            RejectReason::kNone);
}

TEST_F(AdmissionTest, PredictiveCountsIncomingAndDepartures) {
  // Incoming requests will have joined by the time this request's KV arrives: no room (early, judging the
  // current load only, admits it).
  EXPECT_EQ(admit(Admission::kPredictive, {1, 2'000, 3'000}, {20, 980'000, 997'000}, 4096).rejected,
            RejectReason::kDecodeCapacity);
  EXPECT_EQ(admit(Admission::kEarly, {1, 2'000, 3'000}, {20, 980'000, 997'000}, 4096).rejected,
            RejectReason::kNone);
  // Full now, but a long queue ahead (20 s) outlasts the running requests' expected decode lifetime
  // (100 expected output tokens x one step): they will have left, so it is admitted; early rejects it.
  EXPECT_EQ(admit(Admission::kPredictive, {50, 990'000, 997'000}, {}, 4096, 20).rejected,
            RejectReason::kNone);
  EXPECT_EQ(admit(Admission::kEarly, {50, 990'000, 997'000}, {}, 4096, 20).rejected,
            RejectReason::kDecodeCapacity);
}

TEST_F(AdmissionTest, SloJudgesTheChosenInstancesStepTimeOnly) {
  // Step time over the TBT SLO: reading 3.5M tokens of KV per step takes ~100+ ms on 8xA800.
  ASSERT_GT(cost_.decode_step_time_s(51, 3'500'000 + 4096), 0.1);
  EXPECT_EQ(admit(Admission::kSlo, {50, 3'500'000, 500'000}, {}, 4096).rejected, RejectReason::kTbt);
  // No HBM room (running + incoming + this request exceed 1M tokens) is not part of Algorithm 1's rule.
  EXPECT_EQ(admit(Admission::kSlo, {50, 490'000, 500'000}, {20, 490'000, 497'000}, 4096).rejected,
            RejectReason::kNone);
}

}  // namespace
}  // namespace crescent::conductor

namespace crescent::conductor {
namespace {

TEST_F(ConductorTest, EarlyRejectionPlacesTheRequestWhereItFoundRoom) {
  FakeCluster cluster(1, 2);
  // Instance 0 has the lighter batch but no room for prompt + expected output; instance 1 has room.
  cluster.decode[0] = {
      .running = {5, 50'000, 999'000}, .waiting = {}, .incoming = {}, .kv_capacity_tokens = 1'000'000};
  cluster.decode[1] = {
      .running = {30, 300'000, 400'000}, .waiting = {}, .incoming = {}, .kv_capacity_tokens = 1'000'000};
  Conductor conductor(cost_, {.policy = PrefillPolicy::kCacheAware, .admission = Admission::kEarly});
  auto d = conductor.schedule(cluster, {4096, keys_, 100}, 0);
  EXPECT_EQ(d.rejected, RejectReason::kNone);
  EXPECT_EQ(d.decode_instance, 1u);
  EXPECT_DOUBLE_EQ(d.predicted_tbt_s, cost_.decode_step_time_s(31, 300'000 + 4096));
}

}  // namespace
}  // namespace crescent::conductor

namespace crescent::conductor {
namespace {

// A live cluster's instances go down and come back (ClusterState's instance events): nothing is placed on one
// that is down, by any policy or admission, and with none up the answer is kNoInstance.
TEST(ConductorInstancesDown, NothingIsPlacedOnAnInstanceThatIsDown) {
  const perf::CostModel cost(*perf::model_preset("llama3-70b"), *perf::hardware_preset("8xA800"));
  const std::vector<BlockKey> keys{1, 2, 3, 4};
  for (PrefillPolicy policy : {PrefillPolicy::kRandom, PrefillPolicy::kLeastLoaded,
                               PrefillPolicy::kCacheAware, PrefillPolicy::kGlobalCacheAware}) {
    for (Admission admission : {Admission::kNone, Admission::kPredictive}) {
      SCOPED_TRACE(std::string(to_string(policy)) + " " + std::string(to_string(admission)));
      ClusterState state(3, 3, 512, 1'000'000);
      Conductor conductor(cost,
                          {.policy = policy, .admission = admission, .ttft_slo_s = 1e9, .tbt_slo_s = 1e9});
      // Instance 0 holds the prompt's prefix, then goes down with its cache; decode 1 goes down too.
      Decision first = conductor.schedule(state, {2048, keys, 10}, 0);
      ASSERT_EQ(first.rejected, RejectReason::kNone);
      state.on_request_placed({2048, keys, 10}, first, 0);
      state.on_prefill_down(first.prefill_instance, 1);
      state.on_decode_down(1);
      for (int i = 0; i < 30; ++i) {
        const Decision d = conductor.schedule(state, {2048, keys, 10}, 2 + i);
        ASSERT_EQ(d.rejected, RejectReason::kNone);
        EXPECT_NE(d.prefill_instance, first.prefill_instance);
        EXPECT_NE(d.decode_instance, 1u);
        if (d.fetched_prefix_tokens > 0) {
          EXPECT_NE(d.fetch_from, first.prefill_instance)
              << "the cache of an instance that went down is gone";
        }
      }
      for (InstanceId p = 0; p < 3; ++p) state.on_prefill_down(p, 40);
      EXPECT_EQ(conductor.schedule(state, {2048, keys, 10}, 41).rejected, RejectReason::kNoInstance);
      state.on_prefill_up(2);
      EXPECT_EQ(conductor.schedule(state, {2048, keys, 10}, 42).prefill_instance, 2u);
      for (InstanceId d = 0; d < 3; ++d) state.on_decode_down(d);
      EXPECT_EQ(conductor.schedule(state, {2048, keys, 10}, 43).rejected, RejectReason::kNoInstance);
    }
  }
}

}  // namespace
}  // namespace crescent::conductor

namespace crescent::conductor {
namespace {

// A cost model whose times overflow (figures too small to be real; cluster::validate and the router refuse
// them, cluster::check_cost_model_times) leaves no instance with a finite score. The Conductor still answers:
// the first prefill instance up, its TTFT predicted infinite or NaN (0 tokens x an infinite time per token),
// which SLO admission rejects. Before, the prefill choice dereferenced an empty optional.
TEST(ConductorInfiniteCosts, EveryPolicyPlacesOnTheFirstInstanceUpAndSloAdmissionRejects) {
  perf::HardwareSpec no_compute = *perf::hardware_preset("8xA800");  // every iteration takes forever
  no_compute.peak_flops_per_gpu = 1e-300;
  no_compute.hbm_bytes_per_s_per_gpu = 1e-300;
  perf::HardwareSpec no_links = *perf::hardware_preset("8xA800");  // moving or loading KV: NaN for 0 tokens
  no_links.network_bytes_per_s = 1e-310;  // a subnormal: bytes per token over it overflow
  no_links.host_device_bytes_per_s = 1e-310;
  const std::vector<BlockKey> keys{1, 2, 3, 4};
  for (const perf::HardwareSpec& hardware : {no_compute, no_links}) {
    const perf::CostModel cost(*perf::model_preset("llama3-70b"), hardware);
    ASSERT_FALSE(cost.check_times_finite(4096, 0, "test").ok());
    const bool compute = &hardware == &no_compute;
    for (PrefillPolicy policy :
         {PrefillPolicy::kLeastLoaded, PrefillPolicy::kCacheAware, PrefillPolicy::kGlobalCacheAware}) {
      SCOPED_TRACE(std::string(to_string(policy)) + (compute ? ", no compute" : ", no links"));
      ClusterState state(3, 3, 512, 1'000'000);
      state.on_prefill_down(0, 0);
      state.on_decode_down(0);
      Conductor none(cost, {.policy = policy});
      for (int i = 0; i < 4; ++i) {  // placed again and again: every queue's predicted end becomes unknowable
        const Decision d = none.schedule(state, {2048, keys, 10}, i);
        ASSERT_EQ(d.rejected, RejectReason::kNone);
        // Least-loaded scores queues alone: the first two go to the two queues still empty.
        if (policy != PrefillPolicy::kLeastLoaded || i >= 2) {
          EXPECT_EQ(d.prefill_instance, 1u);
        }
        EXPECT_NE(d.prefill_instance, 0u);
        EXPECT_NE(d.decode_instance, 0u);
        EXPECT_FALSE(std::isfinite(d.ttft_s)) << d.ttft_s;
        if (compute) {
          EXPECT_EQ(d.decode_instance, 1u);
          EXPECT_EQ(d.predicted_tbt_s, std::numeric_limits<double>::infinity());
        }
        state.on_request_placed({2048, keys, 10}, d, i);
      }
      Conductor slo(cost,
                    {.policy = policy, .admission = Admission::kSlo, .ttft_slo_s = 1e9, .tbt_slo_s = 1e9});
      EXPECT_EQ(slo.schedule(state, {2048, keys, 10}, 5).rejected, RejectReason::kTtft);
      Conductor predictive(
          cost, {.policy = policy, .admission = Admission::kPredictive, .ttft_slo_s = 1e9, .tbt_slo_s = 1e9});
      EXPECT_EQ(predictive.schedule(state, {2048, keys, 10}, 5).rejected, RejectReason::kTtft);
    }
  }
}

}  // namespace
}  // namespace crescent::conductor
