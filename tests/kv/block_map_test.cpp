// kv::BlockMap against std::unordered_map under a seeded random mix of inserts, lookups and erases (key 0,
// colliding keys and long probe runs included): the same contents after every step; and at scale.
#include "kv/block_map.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <unordered_map>
#include <vector>

namespace crescent::kv {
namespace {

std::map<BlockKey, int> contents(const BlockMap<int>& map) {
  std::map<BlockKey, int> out;
  map.for_each([&](BlockKey key, int value) { out.emplace(key, value); });
  return out;
}

TEST(BlockMap, BehavesAsAnUnorderedMap) {
  std::mt19937_64 rng(7);
  BlockMap<int> map;
  std::unordered_map<BlockKey, int> reference;
  // A small key space, so inserts meet erased and present keys often; keys differing only in their high
  // bits, so they share home slots and probe runs wrap and shift.
  std::vector<BlockKey> keys = {0};
  for (int i = 1; i < 3000; ++i) keys.push_back(i % 3 == 0 ? static_cast<BlockKey>(i) << 44 : rng());
  for (int step = 0; step < 200000; ++step) {
    const BlockKey key = keys[rng() % keys.size()];
    switch (rng() % 4) {
      case 0:
      case 1: {
        const int value = static_cast<int>(rng() % 1000);
        const auto [found, inserted] = map.try_emplace(key, value);
        const auto [it, reference_inserted] = reference.try_emplace(key, value);
        ASSERT_EQ(inserted, reference_inserted);
        ASSERT_EQ(*found, it->second);
        *found += 1;  // the pointer reaches the stored value
        it->second += 1;
        break;
      }
      case 2:
        ASSERT_EQ(map.erase(key), reference.erase(key) == 1);
        break;
      default: {
        const int* found = map.find(key);
        auto it = reference.find(key);
        ASSERT_EQ(found != nullptr, it != reference.end());
        if (found != nullptr) {
          ASSERT_EQ(*found, it->second);
        }
      }
    }
    ASSERT_EQ(map.size(), reference.size());
    if (step % 20000 == 0) {
      const std::map<BlockKey, int> want(reference.begin(), reference.end());
      ASSERT_EQ(contents(map), want);
    }
  }
  const std::map<BlockKey, int> want(reference.begin(), reference.end());
  ASSERT_EQ(contents(map), want);
  map.clear();
  EXPECT_EQ(map.size(), 0u);
  EXPECT_EQ(map.find(keys[1]), nullptr);
  EXPECT_EQ(map.find(0), nullptr);
  EXPECT_TRUE(map.try_emplace(keys[1], 5).second);
  EXPECT_EQ(*map.find(keys[1]), 5);
}

// Many keys: every table grows several times, and the entries stay findable through erases.
TEST(BlockMap, GrowsAndErasesAtScale) {
  std::mt19937_64 rng(9);
  BlockMap<uint64_t> map;
  std::vector<BlockKey> keys(300'000);
  for (BlockKey& key : keys) key = rng();
  for (BlockKey key : keys) ASSERT_TRUE(map.try_emplace(key, key ^ 1).second);
  EXPECT_EQ(map.size(), keys.size());
  for (size_t i = 0; i < keys.size(); i += 2) ASSERT_TRUE(map.erase(keys[i]));
  EXPECT_EQ(map.size(), keys.size() / 2);
  for (size_t i = 0; i < keys.size(); ++i) {
    const uint64_t* value = map.find(keys[i]);
    if (i % 2 == 0) {
      ASSERT_EQ(value, nullptr);
    } else {
      ASSERT_NE(value, nullptr);
      ASSERT_EQ(*value, keys[i] ^ 1);
    }
  }
  size_t seen = 0;
  map.for_each([&](BlockKey key, uint64_t value) {
    ++seen;
    EXPECT_EQ(value, key ^ 1);
  });
  EXPECT_EQ(seen, keys.size() / 2);
}

}  // namespace
}  // namespace crescent::kv
