#include "kv/block_index.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <random>
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

// A block's holders are kept two inline and more apart (HolderList): through adds and removes of up to 300
// holders per key, a key's holders are what a std::vector kept the same way says, in the same order, and keys
// whose lists moved (the map spreading from one table over 256 past 7,168 keys, its tables growing and
// shifting on erase) keep theirs.
TEST(BlockIndex, HolderListsOfAnySizeStayExact) {
  std::mt19937 rng(5);
  BlockIndex index;
  std::vector<std::vector<InstanceId>> reference(9000);
  for (int step = 0; step < 400'000; ++step) {
    const auto key = static_cast<BlockKey>(rng() % reference.size());
    // Key k has up to 1 + k % 300 holders: most keys have several, some hundreds.
    const auto holder = static_cast<InstanceId>(rng() % (1 + key % 300));
    auto& want = reference[key];
    auto pos = std::find(want.begin(), want.end(), holder);
    if (rng() % 3 != 0) {
      index.add(key, holder);
      if (pos == want.end()) want.push_back(holder);
    } else {
      index.remove(key, holder);
      if (pos != want.end()) {
        *pos = want.back();  // the index's removal: the last holder takes the removed one's place
        want.pop_back();
      }
    }
  }
  int64_t replicas = 0, blocks = 0;
  for (size_t key = 0; key < reference.size(); ++key) {
    const auto have = index.holders(key);
    ASSERT_EQ(std::vector<InstanceId>(have.begin(), have.end()), reference[key]) << "key " << key;
    replicas += static_cast<int64_t>(reference[key].size());
    blocks += !reference[key].empty();
  }
  EXPECT_EQ(index.replicas(), replicas);
  EXPECT_EQ(index.blocks(), blocks);
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
  EXPECT_THAT(m.matches(), UnorderedElementsAre(Pair(0u, 3), Pair(1u, 2), Pair(3u, 1)));
  EXPECT_EQ(m.best_blocks, 3);
  EXPECT_EQ(m.best_instance, 0u);
  EXPECT_THAT(m.best_holders, ElementsAre(0u));
  EXPECT_THAT(m.reaching, ElementsAre(3, 2, 1)) << "instance 2 holds 11 and 12 but not 10: no run";
  EXPECT_EQ(m.blocks_of(2), 0);
  EXPECT_EQ(m.blocks_of(1000), 0);

  // Run again on a request sharing only the first key: nothing of the last match is left over.
  index.match_prefix(std::vector<BlockKey>{10, 99}, m);
  EXPECT_THAT(m.matches(), UnorderedElementsAre(Pair(0u, 1), Pair(1u, 1), Pair(3u, 1)));
  EXPECT_THAT(m.best_holders, UnorderedElementsAre(0u, 1u, 3u));
  EXPECT_THAT(m.reaching, ElementsAre(3));
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
  EXPECT_THAT(m.best_holders, UnorderedElementsAre(2u, 7u));
}

// Against the definition, instance by instance: the run is how many leading keys holders() lists it for.
// Random indexes with gaps (an instance holding a later key but not an earlier one) and reused scratch.
TEST(BlockIndex, MatchPrefixAgreesWithCheckingEachInstance) {
  std::mt19937 rng(7);
  PrefixMatch m;
  for (int round = 0; round < 200; ++round) {
    BlockIndex index;
    const uint32_t instances = 1 + rng() % 40;
    std::vector<BlockKey> request(rng() % 12);
    for (size_t j = 0; j < request.size(); ++j) request[j] = 100 + j;
    for (uint32_t i = 0; i < instances; ++i) {
      const size_t held = rng() % (request.size() + 1);
      for (size_t j = 0; j < held; ++j) {
        if (rng() % 10 != 0) index.add(request[j], i);  // sometimes a gap
      }
    }
    index.match_prefix(request, m);
    int64_t best = 0;
    std::vector<InstanceId> best_holders;
    for (uint32_t i = 0; i < instances; ++i) {
      int64_t run = 0;
      while (run < static_cast<int64_t>(request.size())) {
        auto h = index.holders(request[run]);
        if (std::find(h.begin(), h.end(), i) == h.end()) break;
        ++run;
      }
      ASSERT_EQ(m.blocks_of(i), run) << "round " << round << " instance " << i;
      if (run > best) best_holders.clear();
      if (run >= best && run > 0) best_holders.push_back(i);
      best = std::max(best, run);
    }
    ASSERT_EQ(m.best_blocks, best);
    std::sort(m.best_holders.begin(), m.best_holders.end());
    ASSERT_EQ(m.best_holders, best_holders);
    if (best > 0) {
      ASSERT_EQ(m.best_instance, best_holders.front());
    }
    ASSERT_EQ(m.reaching.size(), static_cast<size_t>(best));
    for (int64_t j = 0; j < best; ++j) {
      int64_t reach = 0;
      for (uint32_t i = 0; i < instances; ++i) reach += m.blocks_of(i) > j;
      ASSERT_EQ(m.reaching[j], reach);
    }
  }
}

// One index changing between matches, as the Conductor's does: most requests start with the same key
// (a shared system prompt, held by about 64 of 90 instances, so its runs are kept between matches some of
// the time), the others with a key few instances hold. After every add and remove, of that key or others,
// each instance's run, `reaching`, the best run and its holders are what holders() gives, whatever the
// caller's run_blocks held and however long it was (two matches used in turn, refilled with junk).
TEST(BlockIndex, MatchesStayExactAsTheSharedFirstKeysHoldersChange) {
  std::mt19937 rng(11);
  BlockIndex index;
  constexpr uint32_t kInstances = 90;
  for (InstanceId i = 0; i < kInstances; ++i) index.add(1, i);
  std::array<PrefixMatch, 2> matches;
  int kept = 0;  // matches whose first key had enough holders for its runs to be kept
  for (int step = 0; step < 6000; ++step) {
    const BlockKey first = rng() % 5 == 0 ? 7 : 1;
    std::vector<BlockKey> request{first};
    for (size_t j = 1; j < 1 + rng() % 5; ++j) request.push_back(100 + rng() % 4 * 10 + j);
    const auto instance = static_cast<InstanceId>(rng() % kInstances);
    if (rng() % 2 == 0) {  // the first key: held by about three quarters of the instances
      if (first == 7 || rng() % 4 != 0) {
        index.add(first, instance);
      } else {
        index.remove(first, instance);
      }
    } else if (rng() % 3 == 0) {
      index.remove(request.back(), instance);
    } else {
      index.add(request.back(), instance);
    }
    if (first == 7 && rng() % 2 == 0) index.remove(7, static_cast<InstanceId>(rng() % kInstances));

    PrefixMatch& m = matches[static_cast<size_t>(step % 2)];
    const size_t floor = rng() % (2 * kInstances);
    m.run_blocks.assign(floor, 7);  // junk the match must overwrite
    index.match_prefix(request, m);
    kept += index.holders(first).size() >= 64;

    ASSERT_GE(m.run_blocks.size(), floor);
    int64_t best = 0;
    std::vector<InstanceId> best_holders;
    std::vector<int64_t> reaching(request.size() + 1, 0);
    for (InstanceId i = 0; i < kInstances; ++i) {
      int64_t run = 0;
      while (run < static_cast<int64_t>(request.size())) {
        auto h = index.holders(request[static_cast<size_t>(run)]);
        if (std::find(h.begin(), h.end(), i) == h.end()) break;
        ++run;
      }
      if (run > 0) {
        ASSERT_GT(m.run_blocks.size(), i);
      }
      ASSERT_EQ(m.blocks_of(i), run) << "step " << step << " instance " << i;
      for (int64_t j = 0; j < run; ++j) ++reaching[static_cast<size_t>(j)];
      if (run > best) best_holders.clear();
      if (run >= best && run > 0) best_holders.push_back(i);
      best = std::max(best, run);
    }
    for (size_t i = kInstances; i < m.run_blocks.size(); ++i)
      ASSERT_EQ(m.run_blocks[i], 0) << "step " << step;
    ASSERT_EQ(m.best_blocks, best) << "step " << step;
    reaching.resize(static_cast<size_t>(best));
    ASSERT_EQ(m.reaching, reaching) << "step " << step;
    std::sort(m.best_holders.begin(), m.best_holders.end());
    ASSERT_EQ(m.best_holders, best_holders) << "step " << step;
  }
  EXPECT_GT(kept, 1000);
  EXPECT_LT(kept, 5000);  // and some matches took the other path
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
  EXPECT_THAT(m.matches(), ElementsAre(std::pair<InstanceId, int64_t>(4, 1)));
  EXPECT_EQ(m.best_blocks, 1);
}

}  // namespace
}  // namespace crescent::kv
