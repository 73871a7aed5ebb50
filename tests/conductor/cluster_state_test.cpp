#include "conductor/cluster_state.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <random>
#include <vector>

namespace crescent::conductor {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

constexpr int64_t kBlock = 512;

Decision placed_on(InstanceId prefill, InstanceId decode, double transfer_s, double prefill_s) {
  Decision d;
  d.prefill_instance = prefill;
  d.decode_instance = decode;
  d.transfer_s = transfer_s;
  d.prefill_s = prefill_s;
  return d;
}

TEST(ClusterState, PlacedPrefillsQueueFifoPerInstance) {
  ClusterState state(2, 1, kBlock, 1000);
  const std::vector<BlockKey> keys{1, 2};
  const RequestInfo request{1024, keys, 10};
  const PrefillTimeline first = state.on_request_placed(request, placed_on(0, 0, 0.5, 2.0), 1.0);
  EXPECT_DOUBLE_EQ(first.start_s, 1.0);
  EXPECT_DOUBLE_EQ(first.compute_start_s, 1.5);
  EXPECT_DOUBLE_EQ(first.done_s, 3.5);
  // The second waits for the first on instance 0; instance 1 stays idle.
  const PrefillTimeline second = state.on_request_placed(request, placed_on(0, 0, 0, 1.0), 2.0);
  EXPECT_DOUBLE_EQ(second.start_s, 3.5);
  EXPECT_DOUBLE_EQ(second.done_s, 4.5);
  EXPECT_THAT(state.prefill_busy_until_s(), ElementsAre(4.5, 0.0));
}

// Room for each instance's cache is reserved once: asking again for as much (an engine back up, or
// registered again) or less adds nothing; more grows the index by the difference. Placements after it are
// the same as without.
TEST(ClusterState, ReservedRoomIsPerInstanceAndPlacesTheSame) {
  ClusterState reserved(2, 1, kBlock, 1000), plain(2, 1, kBlock, 1000);
  reserved.reserve_prefix_cache_blocks(0, 20'000);
  const size_t slots = reserved.block_index().slot_count();
  EXPECT_GE(slots * 7, size_t{20'000} * 8);
  reserved.reserve_prefix_cache_blocks(0, 20'000);
  reserved.reserve_prefix_cache_blocks(0, 5'000);
  EXPECT_EQ(reserved.block_index().slot_count(), slots);
  reserved.reserve_prefix_cache_blocks(1, 20'000);  // a second instance: room for both
  EXPECT_GE(reserved.block_index().slot_count() * 7, size_t{40'000} * 8);
  const size_t both = reserved.block_index().slot_count();
  reserved.reserve_prefix_cache_blocks(1, 20'000);
  EXPECT_EQ(reserved.block_index().slot_count(), both);

  std::vector<BlockKey> keys;
  for (BlockKey k = 1; k <= 300; ++k) keys.push_back(k * 0x9E3779B97F4A7C15ull);
  const RequestInfo request{300 * kBlock, keys, 10};
  for (ClusterState* state : {&reserved, &plain})
    state->on_request_placed(request, placed_on(1, 0, 0, 1.0), 1.0);
  EXPECT_EQ(reserved.block_index().blocks(), 300);
  EXPECT_EQ(plain.block_index().blocks(), 300);
  EXPECT_EQ(reserved.block_index().slot_count(), both);  // 300 blocks took no growth
  for (BlockKey k : keys) ASSERT_THAT(reserved.block_index().holders(k), ElementsAre(1));
  EXPECT_EQ(reserved.prefill_busy_until_s()[1], plain.prefill_busy_until_s()[1]);
  for (ClusterState* state : {&reserved, &plain}) state->on_prefill_done(1, keys, 2.0);
  EXPECT_EQ(reserved.block_index().blocks(), plain.block_index().blocks());
}

TEST(ClusterState, FetchedPrefixWaitsUntilTheSourceHasComputedIt) {
  ClusterState state(2, 1, kBlock, 1000);
  const std::vector<BlockKey> keys{1, 2, 3};
  // Instance 1 will have computed blocks 1-2 at 7 s (their request was placed, its prefill not run yet).
  state.on_kv_event(1, std::vector<BlockKey>{1, 2}, {}, 7.0);
  EXPECT_DOUBLE_EQ(state.prefix_ready_s(1, std::vector<BlockKey>{1, 2}), 7.0);
  Decision d = placed_on(0, 0, 0.25, 1.0);
  d.fetched_prefix_tokens = 2 * kBlock;
  d.fetch_from = 1;
  const PrefillTimeline t = state.on_request_placed({3 * kBlock, keys, 10}, d, 2.0);
  EXPECT_DOUBLE_EQ(t.start_s, 7.0);
  EXPECT_DOUBLE_EQ(t.done_s, 8.25);
}

TEST(ClusterState, KvEventsKeepTheIndexAndReadyTimes) {
  ClusterState state(2, 1, kBlock, 1000);
  state.on_kv_event(0, std::vector<BlockKey>{1, 2, 3}, {}, 1.0);
  state.on_kv_event(1, std::vector<BlockKey>{1}, {}, 2.0);
  EXPECT_THAT(state.block_index().holders(1), ElementsAre(0u, 1u));
  state.on_kv_event(0, std::vector<BlockKey>{4}, std::vector<BlockKey>{3}, 5.0);
  EXPECT_THAT(state.block_index().holders(3), IsEmpty());
  EXPECT_DOUBLE_EQ(state.prefix_ready_s(0, std::vector<BlockKey>{1, 4}), 5.0);
  state.on_kv_cleared(0);
  EXPECT_THAT(state.block_index().holders(1), ElementsAre(1u));
  EXPECT_THAT(state.block_index().holders(4), IsEmpty());
  EXPECT_EQ(state.block_index().blocks(), 1);
  EXPECT_DOUBLE_EQ(state.prefix_ready_s(0, std::vector<BlockKey>{1, 2}), 0.0);
}

// A caller looking for the holder ready soonest passes the best time so far: the answer is exact up to it,
// and only said to be later beyond it (the walk may stop at the first key ready later).
TEST(ClusterState, APrefixReadyTimeIsExactUpToTheStopAndLaterBeyondIt) {
  ClusterState state(2, 1, kBlock, 1000);
  std::mt19937_64 rng(7);
  std::vector<BlockKey> keys;
  for (BlockKey k = 1; k <= 40; ++k) {
    keys.push_back(k);
    state.on_kv_event(0, std::vector<BlockKey>{k}, {}, static_cast<double>(1 + rng() % 20));
  }
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t first = rng() % keys.size();
    const std::span<const BlockKey> prefix(keys.data() + first, 1 + rng() % (keys.size() - first));
    double exact_s = 0;
    for (BlockKey k : prefix) exact_s = std::max(exact_s, state.prefix_ready_s(0, std::vector<BlockKey>{k}));
    ASSERT_EQ(state.prefix_ready_s(0, prefix), exact_s);
    const double stop_s = static_cast<double>(rng() % 22);
    const double ready_s = state.prefix_ready_s(0, prefix, stop_s);
    if (exact_s <= stop_s) {
      ASSERT_EQ(ready_s, exact_s) << "trial " << trial << ", stop " << stop_s;
    } else {
      ASSERT_GT(ready_s, stop_s) << "trial " << trial << ", exact " << exact_s;
    }
  }
}

TEST(ClusterState, PlacementsCountAsIncomingUntilTheDecodeInstanceReports) {
  ClusterState state(1, 2, kBlock, 1000);
  EXPECT_EQ(state.decode_load(1).kv_capacity_tokens, 1000);
  const std::vector<BlockKey> keys{1};
  state.on_request_placed({300, keys, 50}, placed_on(0, 1, 0, 1), 0);
  state.on_request_placed({200, keys, 1}, placed_on(0, 1, 0, 1), 0);  // one token: it never decodes
  kv::DecodeLoad load = state.decode_load(1);
  EXPECT_EQ(load.incoming.requests, 1);
  EXPECT_EQ(load.incoming.context_tokens, 300);
  EXPECT_EQ(load.incoming.kv_tokens, 350);
  EXPECT_EQ(state.decode_load(0).incoming.requests, 0);
  // The instance's report is the truth from then on.
  kv::DecodeLoad report;
  report.running = {.requests = 1, .context_tokens = 301, .kv_tokens = 350};
  report.kv_capacity_tokens = 1000;
  state.on_decode_report(1, report);
  load = state.decode_load(1);
  EXPECT_EQ(load.incoming.requests, 0);
  EXPECT_EQ(load.running.requests, 1);
}

// The arrays the decode choice reads (DecodeChoiceLoads) are kept by every event that changes a decode
// instance's load or up flag: after each, they equal those derived afresh from decode_loads() and
// decode_up_flags().
TEST(ClusterState, TheDecodeChoiceLoadsFollowEveryDecodeEvent) {
  ClusterState state(1, 3, kBlock, 1000);
  const auto expect_kept = [&](const char* after) {
    SCOPED_TRACE(after);
    DecodeChoiceLoads derived;
    derived.set_all(state.decode_loads(), state.decode_up_flags());
    const DecodeChoiceLoads* kept = state.decode_choice_loads();
    ASSERT_NE(kept, nullptr);
    EXPECT_THAT(kept->batch_requests(), ::testing::ElementsAreArray(derived.batch_requests()));
    EXPECT_THAT(kept->context_tokens(), ::testing::ElementsAreArray(derived.context_tokens()));
    EXPECT_THAT(kept->room_tokens(), ::testing::ElementsAreArray(derived.room_tokens()));
  };
  expect_kept("start");
  EXPECT_THAT(state.decode_choice_loads()->room_tokens(), ElementsAre(1000, 1000, 1000));
  const std::vector<BlockKey> keys{1};
  state.on_request_placed({300, keys, 50}, placed_on(0, 1, 0, 1), 0);
  expect_kept("placed");
  EXPECT_THAT(state.decode_choice_loads()->batch_requests(), ElementsAre(0, 1, 0));
  EXPECT_THAT(state.decode_choice_loads()->context_tokens(), ElementsAre(0, 300, 0));
  EXPECT_THAT(state.decode_choice_loads()->room_tokens(), ElementsAre(1000, 650, 1000));
  kv::DecodeLoad report;
  report.running = {.requests = 2, .context_tokens = 500, .kv_tokens = 600};
  report.waiting = {.requests = 1, .context_tokens = 40, .kv_tokens = 90};
  report.incoming = {.requests = 1, .context_tokens = 7, .kv_tokens = 10};
  report.kv_capacity_tokens = 2000;
  state.on_decode_report(2, report);
  expect_kept("report");
  EXPECT_EQ(state.decode_choice_loads()->batch_requests()[2], 4);
  EXPECT_EQ(state.decode_choice_loads()->context_tokens()[2], 547);
  EXPECT_EQ(state.decode_choice_loads()->room_tokens()[2], 2000 - 700);
  state.on_decode_down(1);
  expect_kept("down");
  EXPECT_EQ(state.decode_choice_loads()->room_tokens()[1], -std::numeric_limits<double>::infinity());
  state.on_decode_report(1, report);  // a report while down: still no room
  expect_kept("report while down");
  EXPECT_EQ(state.decode_choice_loads()->room_tokens()[1], -std::numeric_limits<double>::infinity());
  state.on_decode_up(1);
  expect_kept("up again");
  EXPECT_EQ(state.decode_choice_loads()->room_tokens()[1], 2000 - 700);  // the report's load
  const InstanceId added = state.add_decode_instance(500);
  expect_kept("added, down");
  EXPECT_EQ(state.decode_choice_loads()->room_tokens()[added], -std::numeric_limits<double>::infinity());
  state.on_decode_up(added);
  expect_kept("added, up");
  state.on_request_placed({100, keys, 20}, placed_on(0, added, 0, 1), 0);
  expect_kept("placed on the added");
  EXPECT_EQ(state.decode_choice_loads()->room_tokens()[added], 380);
}

TEST(ClusterState, APlacedPromptsBlocksAreIndexedAtOnceAndReadyWhenItsPrefillEnds) {
  ClusterState state(2, 1, kBlock, 1000);
  state.on_kv_event(0, std::vector<BlockKey>{1}, {}, 0.5);  // already computed there
  const std::vector<BlockKey> keys{1, 2};
  const PrefillTimeline t = state.on_request_placed({2 * kBlock, keys, 2}, placed_on(0, 0, 0, 3.0), 1.0);
  EXPECT_THAT(state.block_index().holders(2), ElementsAre(0u));
  EXPECT_DOUBLE_EQ(state.prefix_ready_s(0, std::vector<BlockKey>{1}), 0.5);  // keeps its time
  EXPECT_DOUBLE_EQ(state.prefix_ready_s(0, std::vector<BlockKey>{2}), t.done_s);
  // The instance reports storing block 2 when the prefill starts: the block stays ready at the prediction.
  state.on_kv_event(0, std::vector<BlockKey>{2}, {}, 1.0);
  EXPECT_DOUBLE_EQ(state.prefix_ready_s(0, std::vector<BlockKey>{2}), t.done_s);
}

TEST(ClusterState, APrefillThatRanLateMovesTheQueueEstimate) {
  ClusterState state(1, 1, kBlock, 1000);
  const std::vector<BlockKey> keys{1};
  state.on_request_placed({100, keys, 2}, placed_on(0, 0, 0, 1.0), 0);
  state.on_prefill_done(0, keys, 0.8);  // early: the estimate stands
  EXPECT_THAT(state.prefill_busy_until_s(), ElementsAre(1.0));
  state.on_prefill_done(0, keys, 3.0);  // late: the queue is at least that far behind
  EXPECT_THAT(state.prefill_busy_until_s(), ElementsAre(3.0));
}

// Once a prefill is done its placement's prediction is over: blocks the instance did not store (its cache
// kept only the prompt's head) leave the index, unless another queued placement there will compute them.
TEST(ClusterState, APrefillDoneKeepsOnlyWhatTheInstanceStored) {
  ClusterState state(1, 1, kBlock, 1000);
  const std::vector<BlockKey> first{1, 2, 3}, queued{1, 2, 3, 4};
  Decision d;
  d.prefill_instance = 0;
  state.on_request_placed({3 * kBlock, first, 1}, d, 0);
  state.on_request_placed({4 * kBlock, queued, 1}, d, 0);
  state.on_kv_event(0, std::vector<BlockKey>{1, 2}, {}, 0);  // the first prefill starts: its cache keeps 1, 2
  state.on_prefill_done(0, first, 1.0);
  kv::PrefixMatch match;
  state.block_index().match_prefix(queued, match);
  EXPECT_EQ(match.best_blocks, 4) << "3 and 4 stay: the queued placement will compute them";
  state.on_prefill_done(0, queued, 2.0);  // its prefill stored nothing more
  state.block_index().match_prefix(queued, match);
  EXPECT_EQ(match.best_blocks, 2);
}

// A live engine's KV events can come after its answer says the prefill ended: between on_prefill_computed and
// on_placement_settled the placed blocks stay indexed, and an event arriving then keeps them for good.
TEST(ClusterState, APlacementStandsUntilSettledWhileItsEventsAreOnTheirWay) {
  ClusterState state(1, 1, kBlock, 1000);
  const std::vector<BlockKey> keys{1, 2, 3};
  Decision d;
  d.prefill_instance = 0;
  state.on_request_placed({3 * kBlock, keys, 1}, d, 0);
  state.on_prefill_computed(0, keys, 1.0);
  kv::PrefixMatch match;
  state.block_index().match_prefix(keys, match);
  EXPECT_EQ(match.best_blocks, 3) << "no event yet, but the placement still stands";
  EXPECT_THAT(state.prefill_busy_until_s(), ElementsAre(1.0));
  state.on_kv_event(0, std::vector<BlockKey>{1, 2}, {}, 1.1);  // the events arrive: the cache kept 1, 2
  state.on_placement_settled(0, keys);
  state.block_index().match_prefix(keys, match);
  EXPECT_EQ(match.best_blocks, 2);
}

}  // namespace
}  // namespace crescent::conductor

namespace crescent::conductor {
namespace {

// A request cancelled (or failed) before its prefill started takes out of the index the blocks only its
// placement put there; blocks an instance said it stores, or another placement will compute, stay.
TEST(ClusterState, ADroppedRequestTakesOnlyItsOwnPlacedBlocksOutOfTheIndex) {
  ClusterState state(2, 1, 512, 1000);
  const std::vector<BlockKey> shared{1, 2}, mine{1, 2, 3}, other{1, 2, 4};
  Decision d;
  d.prefill_instance = 0;
  state.on_request_placed({1536, mine, 1}, d, 0);
  state.on_request_placed({1536, other, 1}, d, 0);
  const std::vector<BlockKey> stored{5};
  state.on_kv_event(0, stored, {}, 0);
  const std::vector<BlockKey> with_stored{5, 6};
  state.on_request_placed({1024, with_stored, 1}, d, 0);

  state.on_request_dropped(0, mine, 0, 0);
  kv::PrefixMatch match;
  state.block_index().match_prefix(mine, match);
  EXPECT_EQ(match.best_blocks, 2) << "blocks 1 and 2 stay: the other placement will compute them";
  state.block_index().match_prefix(std::vector<BlockKey>{3}, match);
  EXPECT_EQ(match.best_blocks, 0) << "block 3 was only mine";
  state.on_request_dropped(0, other, 0, 0);
  state.block_index().match_prefix(shared, match);
  EXPECT_EQ(match.best_blocks, 0) << "nobody will compute 1 and 2 now";
  state.on_request_dropped(0, with_stored, 0, 0);
  state.block_index().match_prefix(stored, match);
  EXPECT_EQ(match.best_blocks, 1) << "the instance said it stores block 5";
  state.on_request_dropped(0, with_stored, 0, 0);  // again: nothing more goes
  state.block_index().match_prefix(stored, match);
  EXPECT_EQ(match.best_blocks, 1);
}

}  // namespace
}  // namespace crescent::conductor

namespace crescent::conductor {
namespace {

// on_prefill_done is on_prefill_computed then on_placement_settled in one pass over the keys, and a stored
// block that is in an instance's ready map already skips the index. Two states driven alike through random
// events (requests with repeated keys and key 0; events for blocks placed and not; drops, clears, instances
// down and up), one ending prefills with on_prefill_done and one with the two halves, must agree on every
// key's holders and ready times after each event; and in both, the index holds a key on an instance exactly
// when that instance has a ready time for it (every time here is >= 1, so a present block's is > 0).
TEST(ClusterState, APrefillDoneInOnePassActsAsItsTwoHalvesAndTheIndexFollowsTheReadyTimes) {
  constexpr uint32_t kInstances = 3;
  constexpr BlockKey kKeys = 12;  // keys 0..11
  ClusterState one_pass(kInstances, 1, kBlock, 1'000'000), two_halves(kInstances, 1, kBlock, 1'000'000);
  std::mt19937_64 rng(26);
  auto below = [&](uint64_t n) { return rng() % n; };
  auto random_keys = [&](size_t max_size) {
    std::vector<BlockKey> keys(1 + below(max_size));
    for (BlockKey& k : keys) k = below(kKeys);
    return keys;
  };
  struct Placed {
    InstanceId instance;
    std::vector<BlockKey> keys;
  };
  std::vector<Placed> placed;
  double now_s = 1;
  for (int event = 0; event < 4000; ++event) {
    now_s += 0.25;
    const auto instance = static_cast<InstanceId>(below(kInstances));
    const uint64_t kind = below(10);
    if (kind < 3) {
      Placed p{instance, random_keys(6)};
      Decision d;
      d.prefill_instance = instance;
      d.prefill_s = static_cast<double>(below(4));
      const RequestInfo request{static_cast<int64_t>(p.keys.size()) * kBlock, p.keys, 1};
      one_pass.on_request_placed(request, d, now_s);
      two_halves.on_request_placed(request, d, now_s);
      placed.push_back(std::move(p));
    } else if (kind < 5) {
      const std::vector<BlockKey> stored = random_keys(4), removed = random_keys(3);
      one_pass.on_kv_event(instance, stored, removed, now_s);
      two_halves.on_kv_event(instance, stored, removed, now_s);
    } else if (kind < 8 && !placed.empty()) {
      const size_t i = below(placed.size());
      const Placed p = placed[i];
      placed.erase(placed.begin() + static_cast<ptrdiff_t>(i));
      if (kind == 7) {
        one_pass.on_request_dropped(p.instance, p.keys, 1.0, now_s);
        two_halves.on_request_dropped(p.instance, p.keys, 1.0, now_s);
      } else {
        one_pass.on_prefill_done(p.instance, p.keys, now_s);
        two_halves.on_prefill_computed(p.instance, p.keys, now_s);
        two_halves.on_placement_settled(p.instance, p.keys);
      }
    } else if (kind == 8 && below(20) == 0) {  // its placements' blocks are forgotten with it
      one_pass.on_prefill_down(instance, now_s);
      two_halves.on_prefill_down(instance, now_s);
      one_pass.on_prefill_up(instance);
      two_halves.on_prefill_up(instance);
      std::erase_if(placed, [&](const Placed& p) { return p.instance == instance; });
    }
    for (BlockKey k = 0; k < kKeys; ++k) {
      auto holders = [&](const ClusterState& s) {
        const auto span = s.block_index().holders(k);
        std::vector<InstanceId> sorted(span.begin(), span.end());
        std::sort(sorted.begin(), sorted.end());
        return sorted;
      };
      const std::vector<InstanceId> held = holders(one_pass);
      ASSERT_EQ(held, holders(two_halves)) << "event " << event << ", key " << k;
      for (InstanceId i = 0; i < kInstances; ++i) {
        const std::vector<BlockKey> key{k};
        const double ready_s = one_pass.prefix_ready_s(i, key);
        ASSERT_EQ(ready_s, two_halves.prefix_ready_s(i, key)) << "event " << event << ", key " << k;
        ASSERT_EQ(std::binary_search(held.begin(), held.end(), i), ready_s > 0)
            << "event " << event << ", key " << k << ", instance " << i;
      }
    }
  }
  EXPECT_EQ(one_pass.prefill_busy_until_s()[0], two_halves.prefill_busy_until_s()[0]);
}

}  // namespace
}  // namespace crescent::conductor
