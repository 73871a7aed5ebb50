#include "kv/block_index.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

namespace crescent::kv {
namespace {

using ::testing::ElementsAre;
using ::testing::IsEmpty;
using ::testing::Pair;
using ::testing::UnorderedElementsAre;

TEST(BlockIndex, AddRemoveIsIdempotent) {
  BlockIndex index;
  index.add(1, 0);
  index.add(1, 0);
  index.add(1, 3);
  EXPECT_THAT(index.holders(1), UnorderedElementsAre(0u, 3u));
  EXPECT_EQ(index.replicas(), 2);
  index.remove(1, 0);
  index.remove(1, 0);
  index.remove(2, 0);
  EXPECT_THAT(index.holders(1), ElementsAre(3u));
  index.remove(1, 3);
  EXPECT_THAT(index.holders(1), IsEmpty());
  EXPECT_EQ(index.blocks(), 0);
  EXPECT_EQ(index.replicas(), 0);
}

TEST(BlockIndex, MatchPrefixPerInstance) {
  BlockIndex index;
  // instance 0 holds 10,11,12; instance 1 holds 10,11; instance 2 holds 11,12 (no leading block); 3 holds 10.
  for (BlockKey k : {10, 11, 12}) index.add(k, 0);
  for (BlockKey k : {10, 11}) index.add(k, 1);
  for (BlockKey k : {11, 12}) index.add(k, 2);
  index.add(10, 3);
  std::vector<BlockKey> request{10, 11, 12, 13};
  PrefixMatch m;
  index.match_prefix(request, m);
  EXPECT_THAT(m.matches, UnorderedElementsAre(Pair(0u, 3), Pair(1u, 2), Pair(3u, 1)));
  EXPECT_EQ(m.best_blocks, 3);
  EXPECT_EQ(m.best_instance, 0u);
}

TEST(BlockIndex, BestInstanceTieGoesToLowestId) {
  BlockIndex index;
  index.add(5, 7);
  index.add(5, 2);
  std::vector<BlockKey> request{5};
  PrefixMatch m;
  index.match_prefix(request, m);
  EXPECT_EQ(m.best_blocks, 1);
  EXPECT_EQ(m.best_instance, 2u);
}

TEST(BlockIndex, FollowsCacheEvents) {
  BlockCache cache(2);
  BlockIndex index;
  TouchEvents ev;
  cache.touch(std::vector<BlockKey>{1, 2}, false, &ev);
  index.apply(4, ev);
  ev.clear();
  cache.touch(std::vector<BlockKey>{3}, false, &ev);  // evicts 2, the tail of [1, 2]
  index.apply(4, ev);
  EXPECT_THAT(index.holders(2), IsEmpty());
  EXPECT_THAT(index.holders(3), ElementsAre(4u));
  PrefixMatch m;
  index.match_prefix(std::vector<BlockKey>{1, 2}, m);
  EXPECT_THAT(m.matches, ElementsAre(std::pair<InstanceId, int64_t>(4, 1)));
  EXPECT_EQ(m.best_blocks, 1);
}

}  // namespace
}  // namespace crescent::kv
