#include "kv/block_cache.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <random>
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
