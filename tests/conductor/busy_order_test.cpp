// BusyOrder (busy_order.h) against the loop over every instance that it replaces, and the Conductor with and
// without it: random pools whose busy times, flags, weights and sizes change between questions.
#include "conductor/busy_order.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "conductor/cluster_state.h"
#include "conductor/conductor.h"
#include "perf/cost_model.h"

namespace crescent::conductor {
namespace {

// What BusyOrder::best answers, by scoring every up member and breaking ties with history.prefer().
template <typename Member, typename Score>
std::optional<BusyOrder::Best> best_by_loop(const std::vector<double>& busy_until_s,
                                            const std::vector<uint8_t>& up, Member member, Score score,
                                            const PlacementHistory& history) {
  std::optional<BusyOrder::Best> best;
  for (InstanceId i = 0; i < busy_until_s.size(); ++i) {
    if ((!up.empty() && up[i] == 0) || !member(i)) continue;
    const double s = score(busy_until_s[i]);
    if (!best || s < best->score || (s == best->score && history.prefer(i, best->instance))) best = {{i, s}};
  }
  return best;
}

// Run twice: comparing every instance at each sync, and reading a change log (PrefillChangeLog) that names
// what changed, sometimes more changes than it keeps, sometimes a new log.
TEST(BusyOrder, AgreesWithALoopAsBusyTimesFlagsWeightsAndSizeChange) {
  for (const bool logged : {false, true}) {
    SCOPED_TRACE(logged ? "with a change log" : "without a change log");
    std::mt19937_64 rng(2026);
    auto uniform = [&](double lo, double hi) { return std::uniform_real_distribution<double>(lo, hi)(rng); };
    auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };
    auto below = [&](size_t n) { return static_cast<size_t>(rng() % n); };
    // Busy times on a coarse grid tie exactly (0 and -0 too); a cost far above them ties by rounding. A few
    // are negative, infinite either way, or subnormal, for the order's mapping of a double's bits.
    auto busy_time = [&] {
      if (chance(0.02)) {
        constexpr double kSpecial[] = {-0.0,
                                       std::numeric_limits<double>::infinity(),
                                       -std::numeric_limits<double>::infinity(),
                                       std::numeric_limits<double>::denorm_min(),
                                       -std::numeric_limits<double>::denorm_min(),
                                       -2.5};
        return kSpecial[below(std::size(kSpecial))];
      }
      return chance(0.7) ? 0.5 * static_cast<double>(below(20)) : uniform(0, 10);
    };
    size_t questions = 0, ties = 0;
    for (int trial = 0; trial < 12; ++trial) {
      BusyOrder order;
      PlacementHistory history(/*half_life_s=*/1.0);
      std::vector<double> busy(1 + below(150));
      for (double& b : busy) b = busy_time();
      std::vector<uint8_t> up;
      PrefillChangeLog log;
      auto note_all = [&] {
        for (InstanceId i = 0; i < busy.size(); ++i) log.note(i);
      };
      double now_s = 0;
      for (int step = 0; step < 400; ++step) {
        // Change the pool: a few busy times (sometimes more than the log keeps), flags, its size; time moves
        // on (sometimes past a rescale).
        for (size_t k = chance(0.05) ? PrefillChangeLog::kRecent + 10 : below(4); k > 0; --k) {
          const auto i = static_cast<InstanceId>(below(busy.size()));
          busy[i] = busy_time();
          log.note(i);
        }
        if (chance(0.1)) up.clear();
        if (chance(0.1)) {
          up.assign(busy.size(), 1);
          note_all();
        }
        if (!up.empty()) {
          up.resize(busy.size(), 1);
          for (size_t k = below(3); k > 0; --k) {
            const auto i = static_cast<InstanceId>(below(up.size()));
            up[i] = up[i] != 0 ? 0 : static_cast<uint8_t>(1 + below(2));  // any non-zero flag is up
            log.note(i);
          }
        }
        if (chance(0.02)) {
          busy.resize(1 + below(150), 1.0);
          if (!up.empty()) up.resize(busy.size(), 1);
          note_all();
        }
        if (chance(0.03)) log = PrefillChangeLog();  // another view's log: its count means nothing here
        now_s += chance(0.01) ? 600 : (chance(0.5) ? 0 : uniform(0, 0.5));
        const double clock_s = std::fmod(now_s, 10.0);  // busy times stay around the clock
        const double floor_s = chance(0.5) ? 0 : 0.5 * static_cast<double>(below(6));
        const double cost_s = chance(0.2) ? 1e17 : uniform(0, 3);
        std::vector<uint8_t> in_group(busy.size());
        const double share = uniform(0, 1);
        for (auto& m : in_group) m = chance(share) ? 1 : 0;
        auto member = [&](InstanceId i) { return in_group[i] != 0; };
        auto score = [&](double b) { return std::max(b - clock_s, floor_s) + cost_s; };

        if (chance(0.02)) order = BusyOrder(order);  // a copy carries on where the original was
        ASSERT_TRUE(order.sync(busy, up, history, logged ? log.changes() : PrefillChanges{}));
        const auto got = order.best(member, score, history);
        const auto want = best_by_loop(busy, up, member, score, history);
        ASSERT_EQ(got.has_value(), want.has_value()) << "trial " << trial << " step " << step;
        if (want) {
          ASSERT_EQ(got->instance, want->instance) << "trial " << trial << " step " << step;
          ASSERT_EQ(got->score, want->score);
          ++questions;
          size_t tied = 0;
          for (InstanceId i = 0; i < busy.size(); ++i) {
            tied += (up.empty() || up[i] != 0) && member(i) && score(busy[i]) == want->score ? 1 : 0;
          }
          ties += tied > 1 ? 1 : 0;
          // The answer is placed on, as the Conductor does, and sometimes others too (a sync then sees more
          // than one weight changed).
          if (chance(0.8)) history.record(want->instance, now_s);
          if (chance(0.1)) {
            for (size_t k = 1 + below(3); k > 0; --k)
              history.record(static_cast<InstanceId>(below(busy.size())), now_s);
          }
        }
      }
    }
    EXPECT_GT(questions, 3000u);
    EXPECT_GT(ties, questions / 4) << "the tie-break must be exercised";
  }
}

// The order trusts a change log: a change it does not name goes unseen until a sync compares everything
// (the log is another one, or has lost changes). ClusterState must therefore log every write (below).
TEST(BusyOrder, ReadsOnlyTheInstancesTheChangeLogNames) {
#ifndef NDEBUG
  GTEST_SKIP() << "debug builds assert that the log named every change; this test breaks that on purpose";
#endif
  PlacementHistory history;
  PrefillChangeLog log;
  std::vector<double> busy{3, 1, 2};
  BusyOrder order;
  auto all = [](InstanceId) { return true; };
  auto queue = [](double b) { return b; };
  ASSERT_TRUE(order.sync(busy, {}, history, log.changes()));
  EXPECT_EQ(order.best(all, queue, history)->instance, 1u);
  busy[2] = 0.5;  // not logged
  ASSERT_TRUE(order.sync(busy, {}, history, log.changes()));
  EXPECT_EQ(order.best(all, queue, history)->instance, 1u);
  log.note(2);
  ASSERT_TRUE(order.sync(busy, {}, history, log.changes()));
  EXPECT_EQ(order.best(all, queue, history)->instance, 2u);
  busy[0] = 0.25;  // not logged, but the log overflows: everything is compared
  for (size_t k = 0; k <= PrefillChangeLog::kRecent; ++k) log.note(1);
  ASSERT_TRUE(order.sync(busy, {}, history, log.changes()));
  EXPECT_EQ(order.best(all, queue, history)->instance, 0u);
  busy[1] = 0.125;  // not logged, but a copy of the log is another log
  const PrefillChangeLog copy = log;
  ASSERT_TRUE(order.sync(busy, {}, history, copy.changes()));
  EXPECT_EQ(order.best(all, queue, history)->instance, 1u);
  // Another log whose count is a few past the last one's (3 against 0): its entries are not this pool's
  // changes.
  PrefillChangeLog other;
  ASSERT_TRUE(order.sync(busy, {}, history, other.changes()));  // the order now follows `other`, at 0
  PrefillChangeLog third;
  for (int k = 0; k < 3; ++k) third.note(0);
  busy[2] = 0.0625;  // named by neither log
  ASSERT_TRUE(
      order.sync(busy, {}, history, third.changes()));  // count 3: within `other`'s reach, not its source
  EXPECT_EQ(order.best(all, queue, history)->instance, 2u);
}

// Every ClusterState event that changes a prefill instance's busy_until or up flag logs it, so the busy
// order never misses a change: random events, the pool compared before and after each.
TEST(ClusterStateChangeLog, NamesEveryPrefillInstanceAnEventChanged) {
  const perf::CostModel cost(*perf::model_preset("llama3-70b"), *perf::hardware_preset("8xA800"));
  Conductor conductor(cost, {.policy = PrefillPolicy::kGlobalCacheAware});
  ClusterState cluster(6, 2, 512, 1'000'000);
  std::mt19937_64 rng(7);
  auto below = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  uint64_t seen = cluster.prefill_changes().count;
  double now_s = 0;
  size_t changed_events = 0;
  for (int step = 0; step < 3000; ++step) {
    const std::vector<double> busy_before(cluster.prefill_busy_until_s().begin(),
                                          cluster.prefill_busy_until_s().end());
    const std::vector<uint8_t> up_before(cluster.prefill_up_flags().begin(),
                                         cluster.prefill_up_flags().end());
    now_s += 0.01 * static_cast<double>(below(50));
    const auto i = static_cast<InstanceId>(below(cluster.prefill_instance_count()));
    std::vector<BlockKey> keys;
    for (size_t k = 1 + below(6); k > 0; --k) keys.push_back(1 + below(20));
    switch (below(8)) {
      case 0: {
        const RequestInfo request{static_cast<int64_t>(keys.size()) * 512, keys, 8};
        const auto d = conductor.schedule(cluster, request, now_s);
        if (d.rejected == RejectReason::kNone) cluster.on_request_placed(request, d, now_s);
        break;
      }
      case 1:
        cluster.on_request_dropped(i, keys, 0.1 * static_cast<double>(below(20)), now_s);
        break;
      case 2:
        cluster.on_prefill_done(i, keys, now_s);
        break;
      case 3:
        cluster.on_prefill_idle(i, now_s);
        break;
      case 4:
        cluster.on_prefill_down(i, now_s);
        break;
      case 5:
        cluster.on_prefill_up(i);
        break;
      case 6:
        if (cluster.prefill_instance_count() < 12) cluster.add_prefill_instance();
        break;
      default:
        cluster.on_kv_cleared(i);
        break;
    }
    const auto changes = cluster.prefill_changes();
    ASSERT_LE(changes.count - seen, changes.recent.size()) << "one event logs a few changes";
    std::vector<uint8_t> logged(cluster.prefill_instance_count(), 0);
    for (uint64_t c = seen; c < changes.count; ++c) {
      const InstanceId id = changes.recent[c % changes.recent.size()];
      ASSERT_LT(id, logged.size()) << "step " << step;
      logged[id] = 1;
    }
    seen = changes.count;
    for (InstanceId p = 0; p < cluster.prefill_instance_count(); ++p) {
      const bool is_new = p >= busy_before.size();
      const bool changed = is_new ||
                           std::bit_cast<uint64_t>(busy_before[p]) !=
                               std::bit_cast<uint64_t>(cluster.prefill_busy_until_s()[p]) ||
                           up_before[p] != cluster.prefill_up_flags()[p];
      changed_events += changed ? 1 : 0;
      EXPECT_TRUE(!changed || logged[p] != 0)
          << "step " << step << ": instance " << p << " changed, not logged";
    }
  }
  EXPECT_GT(changed_events, 500u);
}

TEST(BusyOrder, ANaNBusyTimeMakesTheOrderUnusableUntilItIsGone) {
  BusyOrder order;
  PlacementHistory history;
  std::vector<double> busy{1, 2, std::nan(""), 4};
  EXPECT_FALSE(order.sync(busy, {}, history));
  EXPECT_FALSE(order.sync(busy, {}, history));
  busy[2] = 0.5;
  ASSERT_TRUE(order.sync(busy, {}, history));
  const auto best = order.best([](InstanceId) { return true; }, [](double b) { return b; }, history);
  ASSERT_TRUE(best);
  EXPECT_EQ(best->instance, 2u);
}

TEST(BusyOrder, ACopyCarriesOnAndAMovedFromOrderStartsOver) {
  PlacementHistory history;
  std::vector<double> busy{3, 1, 2};
  BusyOrder order;
  ASSERT_TRUE(order.sync(busy, {}, history));
  auto all = [](InstanceId) { return true; };
  auto queue = [](double b) { return b; };
  EXPECT_EQ(order.best(all, queue, history)->instance, 1u);
  BusyOrder copy = order;
  BusyOrder moved = std::move(order);
  busy[2] = 0.5;
  for (BusyOrder* o : {&copy, &moved}) {
    ASSERT_TRUE(o->sync(busy, {}, history));
    EXPECT_EQ(o->best(all, queue, history)->instance, 2u);
  }
  // Moved from: usable for any pool, the empty one included.
  ASSERT_TRUE(order.sync({}, {}, history));
  EXPECT_FALSE(order.best(all, queue, history));
  ASSERT_TRUE(order.sync(busy, {}, history));
  EXPECT_EQ(order.best(all, queue, history)->instance, 2u);
  order = copy;
  busy[0] = 0.25;
  ASSERT_TRUE(order.sync(busy, {}, history));
  EXPECT_EQ(order.best(all, queue, history)->instance, 0u);
}

// A view whose block index names an instance past the pool (a ClusterState never does; another view might):
// the match's counts then include it, and the busy order must leave the choice to the loop.
class IndexOnlyView : public ClusterView {
 public:
  explicit IndexOnlyView(uint32_t prefill) : busy_until_s(prefill, 0.0), decode(1) {
    decode[0].kv_capacity_tokens = 1'000'000;
  }
  uint32_t prefill_instance_count() const override { return static_cast<uint32_t>(busy_until_s.size()); }
  std::span<const double> prefill_busy_until_s() const override { return busy_until_s; }
  std::span<const kv::DecodeLoad> decode_loads() const override { return decode; }
  const kv::BlockIndex& block_index() const override { return index; }
  double prefix_ready_s(InstanceId, std::span<const BlockKey>, double) const override { return 0; }

  std::vector<double> busy_until_s;
  std::vector<kv::DecodeLoad> decode;
  kv::BlockIndex index;
};

TEST(BusyOrder, AHolderPastThePoolLeavesTheChoiceToTheLoop) {
  const perf::CostModel cost(*perf::model_preset("llama3-70b"), *perf::hardware_preset("8xA800"));
  IndexOnlyView view(64);
  // Instances 1..63 and a stranger (64) hold the first block; instance 0 holds nothing but is idle while
  // the others are busy for longer than that block saves.
  for (InstanceId i = 1; i <= 64; ++i) view.index.add(1, i);
  for (InstanceId i = 1; i < 64; ++i) view.busy_until_s[i] = 100;
  const std::vector<BlockKey> keys{1, 2};
  for (PrefillPolicy policy : {PrefillPolicy::kCacheAware, PrefillPolicy::kGlobalCacheAware}) {
    Conductor with(cost, {.policy = policy});
    Conductor without(cost, {.policy = policy});
    without.set_busy_order_enabled(false);
    const Decision a = with.schedule(view, {1024, keys, 10}, 0);
    const Decision b = without.schedule(view, {1024, keys, 10}, 0);
    EXPECT_EQ(b.prefill_instance, 0u);
    EXPECT_EQ(a.prefill_instance, b.prefill_instance);
  }
}

// The Conductor with the busy order and without it, on one cluster driven by the first one's decisions:
// every decision the same, with instances going down and up, joining, idling and clearing their caches.
TEST(BusyOrder, TheConductorDecidesAlikeWithAndWithoutIt) {
  const perf::CostModel cost(*perf::model_preset("llama3-70b"), *perf::hardware_preset("8xA800"));
  std::mt19937_64 rng(11);
  auto below = [&](uint64_t n) { return rng() % n; };
  auto chance = [&](double p) { return std::bernoulli_distribution(p)(rng); };
  // Prompts: a system prompt most share, then one of a few documents, then a unique tail.
  auto prompt = [&](uint64_t id) {
    std::vector<BlockKey> keys;
    if (chance(0.9)) keys.push_back(1);
    const uint64_t document = below(6);
    for (uint64_t b = 0, n = below(8); b < n; ++b) keys.push_back(1000 * (document + 1) + b);
    for (uint64_t b = 0, n = 1 + below(6); b < n; ++b) keys.push_back((id + 1) * 1'000'000 + b);
    return keys;
  };
  for (PrefillPolicy policy :
       {PrefillPolicy::kLeastLoaded, PrefillPolicy::kCacheAware, PrefillPolicy::kGlobalCacheAware}) {
    SCOPED_TRACE(std::string(to_string(policy)));
    ClusterState cluster(96, 4, 512, 10'000'000);
    ConductorOptions options{.policy = policy};
    Conductor with(cost, options);
    Conductor without(cost, options);
    without.set_busy_order_enabled(false);
    double now_s = 0;
    uint64_t decisions = 0;
    for (uint64_t r = 0; r < 3000; ++r) {
      now_s += chance(0.3) ? 0 : 0.05 * static_cast<double>(below(10));
      const auto instances = cluster.prefill_instance_count();
      if (chance(0.02)) cluster.on_prefill_down(static_cast<InstanceId>(below(instances)), now_s);
      if (chance(0.03)) cluster.on_prefill_up(static_cast<InstanceId>(below(instances)));
      if (chance(0.05)) cluster.on_prefill_idle(static_cast<InstanceId>(below(instances)), now_s);
      if (chance(0.01)) cluster.on_kv_cleared(static_cast<InstanceId>(below(instances)));
      if (chance(0.003)) cluster.on_prefill_up(cluster.add_prefill_instance());
      const std::vector<BlockKey> keys = prompt(r);
      const RequestInfo request{static_cast<int64_t>(keys.size()) * 512, keys, 100};
      const Decision a = with.schedule(cluster, request, now_s);
      const Decision b = without.schedule(cluster, request, now_s);
      ASSERT_EQ(a.rejected, b.rejected) << "request " << r;
      if (a.rejected != RejectReason::kNone) continue;
      ASSERT_EQ(a.prefill_instance, b.prefill_instance) << "request " << r;
      ASSERT_EQ(a.decode_instance, b.decode_instance);
      ASSERT_EQ(a.local_prefix_tokens, b.local_prefix_tokens);
      ASSERT_EQ(a.fetched_prefix_tokens, b.fetched_prefix_tokens);
      ASSERT_EQ(a.fetch_from, b.fetch_from);
      ASSERT_EQ(a.ttft_s, b.ttft_s);
      cluster.on_request_placed(request, a, now_s);
      ++decisions;
    }
    EXPECT_GT(decisions, 2500u);
    EXPECT_GT(with.busy_order_choices(), decisions / 2) << "the busy order must answer most of them";
    EXPECT_EQ(without.busy_order_choices(), 0u);
  }
}

}  // namespace
}  // namespace crescent::conductor
