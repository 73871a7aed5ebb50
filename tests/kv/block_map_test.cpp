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

// Room reserved for N keys is enough: N random keys (block keys are hashes) go in without a table growing,
// and the map behaves as one that grew (same contents, lookups and erases), entries kept across a reserve.
TEST(BlockMap, ReservedRoomTakesItsKeysWithoutGrowing) {
  std::mt19937_64 rng(11);
  for (const size_t n : {size_t{1}, size_t{1000}, size_t{100'000}, size_t{400'000}}) {
    BlockMap<uint64_t> reserved, grown;
    std::vector<BlockKey> keys(n);
    for (BlockKey& key : keys) key = rng();
    ASSERT_TRUE(reserved.try_emplace(keys[0], 1).second);  // an entry from before the reserve stays
    reserved.reserve(n);
    const size_t slots = reserved.slot_count();
    EXPECT_GE(slots * 7, n * 8) << n;
    EXPECT_LE(slots, 4 * n + 256 * 64) << n << ": room beyond what the spread of the hash needs";
    EXPECT_EQ(*reserved.find(keys[0]), 1u);
    for (size_t i = 1; i < n; ++i) {
      ASSERT_TRUE(reserved.try_emplace(keys[i], keys[i] ^ 1).second);
    }
    for (size_t i = 1; i < n; ++i) grown.try_emplace(keys[i], keys[i] ^ 1);
    grown.try_emplace(keys[0], 1);
    EXPECT_EQ(reserved.slot_count(), slots) << n << " keys grew a reserved table";
    ASSERT_EQ(reserved.size(), grown.size());
    std::map<BlockKey, uint64_t> a, b;
    reserved.for_each([&](BlockKey k, uint64_t v) { a.emplace(k, v); });
    grown.for_each([&](BlockKey k, uint64_t v) { b.emplace(k, v); });
    EXPECT_EQ(a, b);
    for (size_t i = 0; i < n; i += 3) ASSERT_TRUE(reserved.erase(keys[i]));
    for (size_t i = 0; i < n; ++i) ASSERT_EQ(reserved.find(keys[i]) != nullptr, i % 3 != 0);
  }
}

// A small map is one table: room for n keys is then within about twice n, where 256 tables of their share
// and its spread took up to 3x (5,859 keys, a simulated prefill instance's cache, took 16,384 slots). Filled
// far past it, with erases among the inserts, it spreads over all tables and stays a map.
TEST(BlockMap, ASmallMapIsOneTableAndStillGrows) {
  std::mt19937_64 rng(13);
  for (const size_t n : {size_t{1}, size_t{1000}, size_t{4096}, size_t{5859}}) {
    BlockMap<uint64_t> map;
    std::unordered_map<BlockKey, uint64_t> reference;
    const bool reserved = n <= 4096;  // reserved room, or grown to n keys
    if (reserved) map.reserve(n);
    const size_t slots = map.slot_count();
    std::vector<BlockKey> keys(n);
    for (BlockKey& key : keys) key = rng();
    for (BlockKey key : keys) {
      ASSERT_TRUE(map.try_emplace(key, key ^ 1).second);
      reference.emplace(key, key ^ 1);
    }
    EXPECT_GE(map.slot_count() * 7, n * 8) << n;
    EXPECT_LE(map.slot_count(), 2 * n * 8 / 7 + 64) << n << ": room beyond twice what n keys need";
    if (reserved) {
      EXPECT_EQ(map.slot_count(), slots) << n << " keys grew a reserved table";
    }
    for (size_t i = 0; i < 20 * n + 40'000; ++i) {
      const BlockKey key = rng();
      if (i % 3 == 2) {
        const BlockKey gone = reference.begin()->first;
        ASSERT_TRUE(map.erase(gone));
        reference.erase(gone);
      }
      ASSERT_TRUE(map.try_emplace(key, key ^ 1).second);
      reference.emplace(key, key ^ 1);
    }
    ASSERT_EQ(map.size(), reference.size());
    for (const auto& [key, value] : reference) {
      const uint64_t* found = map.find(key);
      ASSERT_NE(found, nullptr);
      ASSERT_EQ(*found, value);
    }
    const std::map<BlockKey, uint64_t> want(reference.begin(), reference.end());
    std::map<BlockKey, uint64_t> have;
    map.for_each([&](BlockKey k, uint64_t v) { EXPECT_TRUE(have.emplace(k, v).second); });
    EXPECT_EQ(have, want);
    // Emptied and reserved small again: one table's room, not the 256 it had grown to.
    map.clear();
    map.reserve(1000);
    EXPECT_LE(map.slot_count(), 2048u) << n;
    ASSERT_TRUE(map.try_emplace(keys[0], 7).second);
    EXPECT_EQ(*map.find(keys[0]), 7u);
    EXPECT_EQ(map.size(), 1u);
  }
}

}  // namespace
}  // namespace crescent::kv
