#include "kv/block_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
#include <unordered_set>
#include <vector>

namespace crescent::kv {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;

TEST(BlockCache, PrefixMatchCountsLeadingRunOnly) {
  BlockCache cache(10);
  std::vector<BlockKey> keys{1, 2, 3};
  cache.touch(keys, false);
  std::vector<BlockKey> probe{1, 2, 9, 3};
  EXPECT_EQ(cache.prefix_match_blocks(probe), 2);
  std::vector<BlockKey> miss{9, 1};
  EXPECT_EQ(cache.prefix_match_blocks(miss), 0);
  // A touch reports the same run, as it was before the touch stored 9.
  TouchEvents events;
  cache.touch(probe, false, &events);
  EXPECT_EQ(events.hit_blocks, 2);
  EXPECT_EQ(cache.prefix_match_blocks(probe), 4);
}

TEST(BlockCache, EvictsLeastRecentlyUsed) {
  BlockCache cache(2);
  TouchEvents ev;
  cache.touch(std::vector<BlockKey>{1, 2}, false, &ev);
  EXPECT_THAT(ev.stored, ElementsAre(1, 2));
  ev.clear();
  cache.touch(std::vector<BlockKey>{1}, false, &ev);  // 1 becomes most recent; 2 is now the LRU
  EXPECT_THAT(ev.stored, IsEmpty());
  cache.touch(std::vector<BlockKey>{3}, false, &ev);
  EXPECT_THAT(ev.evicted, ElementsAre(2));
  EXPECT_TRUE(cache.contains(1));
  EXPECT_TRUE(cache.contains(3));
  EXPECT_FALSE(cache.contains(2));
  EXPECT_EQ(cache.size_blocks(), 2);
}

TEST(BlockCache, NeverEvictsPinnedBlocks) {
  BlockCache cache(2);
  TouchEvents ev;
  cache.touch(std::vector<BlockKey>{1, 2}, /*pin=*/true, &ev);
  EXPECT_THAT(ev.pinned, ElementsAre(1, 2));
  EXPECT_EQ(cache.pinned_blocks(), 2);
  ev.clear();
  cache.touch(std::vector<BlockKey>{3}, false, &ev);  // no room: every block is in use
  EXPECT_FALSE(cache.contains(3));
  EXPECT_THAT(ev.evicted, IsEmpty());
  EXPECT_THAT(ev.stored, IsEmpty());

  cache.unpin(std::vector<BlockKey>{2});  // 2 becomes evictable
  ev.clear();
  cache.touch(std::vector<BlockKey>{3}, false, &ev);
  EXPECT_THAT(ev.evicted, ElementsAre(2));
  EXPECT_TRUE(cache.contains(1));
}

TEST(BlockCache, PinsAreCounted) {
  BlockCache cache(1);
  cache.touch(std::vector<BlockKey>{7}, true);
  cache.touch(std::vector<BlockKey>{7}, true);
  cache.unpin(std::vector<BlockKey>{7});
  EXPECT_EQ(cache.pinned_blocks(), 1);
  cache.touch(std::vector<BlockKey>{8}, false);  // 7 still pinned once
  EXPECT_TRUE(cache.contains(7));
  EXPECT_FALSE(cache.contains(8));
  cache.unpin(std::vector<BlockKey>{7});
  EXPECT_EQ(cache.pinned_blocks(), 0);
  cache.touch(std::vector<BlockKey>{8}, false);
  EXPECT_FALSE(cache.contains(7));
  EXPECT_TRUE(cache.contains(8));
}

TEST(BlockCache, UnpinnedBlockBecomesMostRecent) {
  BlockCache cache(3);
  cache.touch(std::vector<BlockKey>{1}, true);
  cache.touch(std::vector<BlockKey>{2, 3}, false);
  cache.unpin(std::vector<BlockKey>{1});  // LRU order now 3, 2, 1 (a request's tail is least recent)
  TouchEvents ev;
  cache.touch(std::vector<BlockKey>{4, 5}, false, &ev);
  EXPECT_THAT(ev.evicted, ElementsAre(3, 2));
  EXPECT_TRUE(cache.contains(1));
}

TEST(BlockCache, EvictUnpinnedTakesLeastRecentlyUsedAndSkipsPinned) {
  BlockCache cache(10);
  cache.touch(std::vector<BlockKey>{1, 2}, /*pin=*/true);
  cache.touch(std::vector<BlockKey>{3, 4, 5}, false);  // LRU order of the unpinned: 5, 4, 3
  TouchEvents ev;
  EXPECT_EQ(cache.evict_unpinned(2, &ev), 2);
  EXPECT_THAT(ev.evicted, ElementsAre(5, 4));
  // Asking for more than are unpinned evicts what there is; pinned blocks stay.
  ev.clear();
  EXPECT_EQ(cache.evict_unpinned(5, &ev), 1);
  EXPECT_THAT(ev.evicted, ElementsAre(3));
  EXPECT_EQ(cache.evict_unpinned(1), 0);
  EXPECT_EQ(cache.size_blocks(), 2);
  EXPECT_TRUE(cache.contains(1));
  EXPECT_TRUE(cache.contains(2));
  // Freed slots are reused.
  cache.touch(std::vector<BlockKey>{6, 7, 8}, false);
  EXPECT_EQ(cache.size_blocks(), 5);
  EXPECT_EQ(cache.prefix_match_blocks(std::vector<BlockKey>{6, 7, 8}), 3);
}

// Issue #8 §2: [1,2,3], then [4], then [1,2,3] in a 3-block cache. Touching first to last would make block 1
// the least recent, evict it for 4, and leave 2 and 3 cached but unreachable (a hit is a leading run).
TEST(BlockCache, EvictsARequestsTailFirstSoItsPrefixStaysUsable) {
  BlockCache cache(3);
  const std::vector<BlockKey> doc{1, 2, 3};
  cache.touch(doc, false);
  TouchEvents ev;
  cache.touch(std::vector<BlockKey>{4}, false, &ev);
  EXPECT_THAT(ev.evicted, ElementsAre(3));
  EXPECT_EQ(cache.prefix_match_blocks(doc), 2);
}

TEST(BlockCache, UnpinReleasesTailFirst) {
  BlockCache cache(3);
  const std::vector<BlockKey> doc{1, 2, 3};
  cache.touch(doc, /*pin=*/true);
  cache.unpin(doc);
  TouchEvents ev;
  cache.touch(std::vector<BlockKey>{4, 5}, false, &ev);
  EXPECT_THAT(ev.evicted, ElementsAre(3, 2));
  EXPECT_EQ(cache.prefix_match_blocks(doc), 1);
}

TEST(BlockCache, RequestLongerThanTheCacheKeepsItsHead) {
  for (const bool pin : {false, true}) {
    SCOPED_TRACE(pin ? "pinned" : "unpinned");
    BlockCache cache(3);
    TouchEvents ev;
    const std::vector<BlockKey> keys{1, 2, 3, 4, 5};
    cache.touch(keys, pin, &ev);
    EXPECT_THAT(ev.stored, ElementsAre(1, 2, 3));  // no churn: 4 and 5 never evict the head
    EXPECT_THAT(ev.evicted, IsEmpty());
    EXPECT_THAT(ev.skipped, ElementsAre(4, 5));  // said, so an index of holders does not count on them
    EXPECT_EQ(cache.prefix_match_blocks(keys), 3);
    if (pin) {
      EXPECT_THAT(ev.pinned, ElementsAre(1, 2, 3));
    }
  }
}

TEST(BlockCache, RepeatedKeysInOneRequest) {
  BlockCache cache(3);
  TouchEvents ev;
  cache.touch(std::vector<BlockKey>{7, 8, 7, 9}, false, &ev);
  EXPECT_THAT(ev.stored, ElementsAre(7, 8, 9));
  EXPECT_EQ(cache.size_blocks(), 3);
  ev.clear();
  cache.touch(std::vector<BlockKey>{10}, false, &ev);
  EXPECT_THAT(ev.evicted, ElementsAre(9));  // order 9, 8, 7: a key's first occurrence sets its place
  // Pinned twice, unpinned twice.
  cache.touch(std::vector<BlockKey>{7, 7}, /*pin=*/true);
  EXPECT_EQ(cache.pinned_blocks(), 1);
  cache.unpin(std::vector<BlockKey>{7});
  EXPECT_EQ(cache.pinned_blocks(), 1);
  cache.unpin(std::vector<BlockKey>{7});
  EXPECT_EQ(cache.pinned_blocks(), 0);
}

// A cache with its room reserved behaves exactly as one that grew: the same events, matches and sizes under a
// seeded mix of touches (pinned or not), unpins and erases past its capacity.
TEST(BlockCache, AReservedCacheBehavesAsOneThatGrew) {
  std::mt19937_64 rng(5);
  BlockCache reserved(500), grown(500);
  reserved.reserve(500);
  std::vector<std::vector<BlockKey>> pinned;
  // Touches both caches with `keys` and checks they did the same, and that each reported as hits what
  // prefix_match_blocks answered before; the reserved one's events.
  const auto touch_both = [&](const std::vector<BlockKey>& keys, bool pin) {
    TouchEvents a, b;
    const int64_t hits = reserved.prefix_match_blocks(keys);
    reserved.touch(keys, pin, &a);
    EXPECT_EQ(a.hit_blocks, hits);
    grown.touch(keys, pin, &b);
    EXPECT_EQ(a.stored, b.stored);
    EXPECT_EQ(a.evicted, b.evicted);
    EXPECT_EQ(a.pinned, b.pinned);
    EXPECT_EQ(a.skipped, b.skipped);
    EXPECT_EQ(a.hit_blocks, b.hit_blocks);
    return a;
  };
  for (int step = 0; step < 5000; ++step) {
    std::vector<BlockKey> keys(1 + rng() % 40);
    const BlockKey base = rng() % 64 * 1000;  // shared prefixes: 64 of them
    for (size_t i = 0; i < keys.size(); ++i) keys[i] = base + (i < keys.size() / 2 ? i : rng() % 2000);
    switch (rng() % 4) {
      case 0:
        pinned.push_back(touch_both(keys, true).pinned);
        break;
      case 1:
        if (!pinned.empty()) {
          reserved.unpin(pinned.back());
          grown.unpin(pinned.back());
          pinned.pop_back();
        }
        break;
      case 2:
        ASSERT_EQ(reserved.erase_unpinned(keys[0]), grown.erase_unpinned(keys[0]));
        break;
      default:
        touch_both(keys, false);
    }
    ASSERT_FALSE(::testing::Test::HasFailure()) << "step " << step;
    ASSERT_EQ(reserved.prefix_match_blocks(keys), grown.prefix_match_blocks(keys));
    ASSERT_EQ(reserved.size_blocks(), grown.size_blocks());
    ASSERT_EQ(reserved.pinned_blocks(), grown.pinned_blocks());
  }
}

// Unkeyed blocks take room and a place in the LRU order as keyed blocks would, and go unreported.
TEST(BlockCache, UnkeyedBlocksAreEvictedWhereKeyedOnesWouldBe) {
  BlockCache cache(4);
  TouchEvents ev;
  cache.touch(std::vector<BlockKey>{1, 2, 3, 4}, false, &ev, /*keyed_blocks=*/1);
  EXPECT_THAT(ev.stored, ElementsAre(1));
  EXPECT_EQ(ev.unkeyed_from, 1u);
  EXPECT_EQ(ev.stored_unkeyed, 3);
  EXPECT_TRUE(ev.pinned_unkeyed.empty());  // not pinned
  EXPECT_EQ(cache.size_blocks(), 4);
  EXPECT_EQ(cache.unkeyed_blocks(), 3);
  EXPECT_THAT(cache.keys(), ElementsAre(1));
  // 1 is the most recent of the four and the unkeyed run the least: the next three blocks evict the run.
  ev.clear();
  cache.touch(std::vector<BlockKey>{5}, false, &ev);
  EXPECT_THAT(ev.evicted, IsEmpty());
  EXPECT_EQ(cache.unkeyed_blocks(), 2);
  cache.touch(std::vector<BlockKey>{6, 7}, false, &ev);
  EXPECT_THAT(ev.evicted, IsEmpty());
  EXPECT_EQ(cache.unkeyed_blocks(), 0);
  cache.touch(std::vector<BlockKey>{8}, false, &ev);
  EXPECT_THAT(ev.evicted, ElementsAre(1));
  EXPECT_EQ(cache.size_blocks(), 4);
  // A cached key from `keyed_blocks` on stays keyed, and so does every key before it: only the absent run
  // at the end goes unkeyed.
  ev.clear();
  cache.touch(std::vector<BlockKey>{9, 8, 10}, false, &ev, /*keyed_blocks=*/0);  // LRU first: 5, 7, 6, 8
  EXPECT_EQ(ev.unkeyed_from, 2u);
  EXPECT_THAT(ev.stored, ElementsAre(9));
  EXPECT_EQ(ev.stored_unkeyed, 1);
  EXPECT_THAT(ev.evicted, ElementsAre(5, 7));
}

TEST(BlockCache, APinnedUnkeyedRunIsUnpinnedOrErasedAsAWhole) {
  BlockCache cache(3);
  TouchEvents ev;
  cache.touch(std::vector<BlockKey>{1, 2, 3}, /*pin=*/true, &ev, /*keyed_blocks=*/1);
  ASSERT_FALSE(ev.pinned_unkeyed.empty());
  EXPECT_THAT(ev.pinned, ElementsAre(1));
  EXPECT_EQ(cache.pinned_blocks(), 3);
  const UnkeyedRun run = ev.pinned_unkeyed;
  ev.clear();
  cache.touch(std::vector<BlockKey>{9}, false, &ev);  // every block is in use
  EXPECT_THAT(ev.skipped, ElementsAre(9));
  cache.unpin(std::vector<BlockKey>{1}, run);  // the run goes back as the least recent
  EXPECT_EQ(cache.pinned_blocks(), 0);
  ev.clear();
  cache.touch(std::vector<BlockKey>{9}, false, &ev);
  EXPECT_THAT(ev.evicted, IsEmpty());  // one of the run's blocks, not 1
  EXPECT_TRUE(cache.contains(1));
  EXPECT_EQ(cache.unkeyed_blocks(), 1);

  // Erased while pinned (its request was cancelled before computing it): its room is free at once.
  BlockCache other(4);
  ev.clear();
  other.touch(std::vector<BlockKey>{1, 2, 3, 4}, /*pin=*/true, &ev, /*keyed_blocks=*/2);
  EXPECT_EQ(other.unkeyed_blocks(), 2);
  other.erase(ev.pinned_unkeyed);
  EXPECT_EQ(other.size_blocks(), 2);
  EXPECT_EQ(other.pinned_blocks(), 2);
  other.erase(UnkeyedRun{});  // no run: no-op
  // Blocks with no room left are skipped, unkeyed or not: none stored, no run.
  ev.clear();
  other.touch(std::vector<BlockKey>{5, 6, 7}, /*pin=*/true, &ev, /*keyed_blocks=*/1);
  EXPECT_EQ(ev.stored_unkeyed, 1);
  EXPECT_EQ(other.size_blocks(), 4);
  ev.clear();
  other.touch(std::vector<BlockKey>{8, 9}, /*pin=*/true, &ev, /*keyed_blocks=*/0);
  EXPECT_EQ(ev.stored_unkeyed, 0);
  EXPECT_TRUE(ev.pinned_unkeyed.empty());
}

// A cache told which keys no later call names behaves as one keying every block: the same sizes, pins,
// hits and events for every keyed block, under a seeded mix of touches (pinned or not), unpins, cancels
// and evictions whose prompts share prefixes, repeat keys and end in keys of their own. Each touch's
// `keyed_blocks` is computed from the whole op sequence, last op first, as the simulator does.
TEST(BlockCache, UnkeyedTailsChangeNothingAKeyedCacheWouldShow) {
  std::mt19937_64 rng(11);
  struct Op {
    enum Kind { kTouch, kTouchPinned, kUnpin, kCancel, kEvict } kind;
    std::vector<BlockKey> keys;
    size_t keyed_blocks = 0;
  };
  std::vector<Op> ops;
  BlockKey fresh = 1'000'000;  // keys no other op names
  for (int i = 0; i < 6000; ++i) {
    const auto kind = static_cast<Op::Kind>(rng() % 5);
    Op op{kind, {}};
    if (kind == Op::kTouch || kind == Op::kTouchPinned) {
      op.keys.resize(1 + rng() % 30);
      const BlockKey base = rng() % 16 * 1000;
      const size_t shared = rng() % (op.keys.size() + 1), own = rng() % (op.keys.size() + 1);
      for (size_t k = 0; k < op.keys.size(); ++k) {
        op.keys[k] = k < shared ? base + k : k >= op.keys.size() - own ? fresh++ : 500 + rng() % 400;
      }
    }
    ops.push_back(std::move(op));
  }
  std::unordered_set<BlockKey> named_later;
  for (auto op = ops.rbegin(); op != ops.rend(); ++op) {
    for (size_t k = 0; k < op->keys.size(); ++k) {
      if (!named_later.insert(op->keys[k]).second) op->keyed_blocks = k + 1;
    }
  }
  BlockCache keyed(300), unkeyed(300);
  std::unordered_set<BlockKey> went_unkeyed;
  const auto keyed_only = [&](const std::vector<BlockKey>& keys) {
    std::vector<BlockKey> out;
    for (BlockKey k : keys)
      if (!went_unkeyed.contains(k)) out.push_back(k);
    return out;
  };
  struct Pinned {
    std::vector<BlockKey> keys;          // as the keyed cache pinned them
    std::vector<BlockKey> unkeyed_keys;  // of them, those the other cache holds unkeyed
    UnkeyedRun run;
  };
  std::vector<Pinned> pinned;
  int64_t stored_unkeyed = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    switch (op.kind) {
      case Op::kTouch:
      case Op::kTouchPinned: {
        const bool pin = op.kind == Op::kTouchPinned;
        TouchEvents a, b;
        keyed.touch(op.keys, pin, &a);
        unkeyed.touch(op.keys, pin, &b, op.keyed_blocks);
        ASSERT_GE(b.unkeyed_from, std::min(op.keyed_blocks, op.keys.size()));
        const std::vector<BlockKey> tail(op.keys.begin() + static_cast<ptrdiff_t>(b.unkeyed_from),
                                         op.keys.end());
        went_unkeyed.insert(tail.begin(), tail.end());
        stored_unkeyed += b.stored_unkeyed;
        EXPECT_EQ(b.hit_blocks, a.hit_blocks);
        EXPECT_EQ(b.stored, keyed_only(a.stored));
        EXPECT_EQ(b.evicted, keyed_only(a.evicted));
        EXPECT_EQ(b.pinned, keyed_only(a.pinned));
        EXPECT_EQ(b.skipped, keyed_only(a.skipped));
        EXPECT_EQ(b.stored_unkeyed, static_cast<int64_t>(a.stored.size() - b.stored.size()));
        if (pin) {
          std::vector<BlockKey> unkeyed_keys;
          for (BlockKey k : a.pinned)
            if (went_unkeyed.contains(k)) unkeyed_keys.push_back(k);
          pinned.push_back({a.pinned, unkeyed_keys, b.pinned_unkeyed});
        }
        break;
      }
      case Op::kUnpin:
      case Op::kCancel:
        if (!pinned.empty()) {
          const size_t which = rng() % pinned.size();
          const Pinned p = pinned[which];
          pinned.erase(pinned.begin() + static_cast<ptrdiff_t>(which));
          if (op.kind == Op::kUnpin) {
            keyed.unpin(p.keys);
            unkeyed.unpin(keyed_only(p.keys), p.run);
          } else {  // its unkeyed blocks leave; as the keyed cache's would once unpinned
            keyed.unpin(p.keys);
            for (BlockKey k : p.unkeyed_keys) ASSERT_TRUE(keyed.erase_unpinned(k));
            unkeyed.erase(p.run);
            unkeyed.unpin(keyed_only(p.keys));
          }
        }
        break;
      case Op::kEvict: {
        TouchEvents a, b;
        const int64_t blocks = static_cast<int64_t>(rng() % 20);
        ASSERT_EQ(keyed.evict_unpinned(blocks, &a), unkeyed.evict_unpinned(blocks, &b));
        EXPECT_EQ(b.evicted, keyed_only(a.evicted));
        break;
      }
    }
    ASSERT_FALSE(::testing::Test::HasFailure()) << "op " << i;
    ASSERT_EQ(unkeyed.size_blocks(), keyed.size_blocks()) << "op " << i;
    ASSERT_EQ(unkeyed.pinned_blocks(), keyed.pinned_blocks()) << "op " << i;
    ASSERT_EQ(unkeyed.size_blocks() - unkeyed.unkeyed_blocks(),
              static_cast<int64_t>(keyed_only(keyed.keys()).size()))
        << "op " << i;
  }
  // The mix exercised what it is about: many blocks went unkeyed, and the caches were full.
  EXPECT_GT(stored_unkeyed, 10000);
  EXPECT_GT(unkeyed.unkeyed_blocks(), 0);
}

TEST(BlockCache, UnboundedNeverEvicts) {
  BlockCache cache;
  std::vector<BlockKey> keys;
  for (BlockKey k = 0; k < 10000; ++k) keys.push_back(k);
  TouchEvents ev;
  cache.touch(keys, false, &ev);
  EXPECT_THAT(ev.evicted, IsEmpty());
  EXPECT_EQ(cache.size_blocks(), 10000);
}

}  // namespace
}  // namespace crescent::kv
