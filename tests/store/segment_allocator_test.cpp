#include "store/segment_allocator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>
#include <vector>

namespace crescent::store {
namespace {

TEST(SegmentAllocator, OneSizeFillsTheSegmentAfterAnyOrderOfFrees) {
  constexpr uint64_t kBlock = 512 << 10;
  constexpr uint64_t kSlots = 100;
  SegmentAllocator allocator(kBlock * kSlots + 1000);  // a tail too small for a block
  std::vector<uint64_t> offsets;
  while (auto offset = allocator.allocate(kBlock)) offsets.push_back(*offset);
  ASSERT_EQ(offsets.size(), kSlots);
  std::mt19937_64 rng(7);
  for (int round = 0; round < 50; ++round) {
    std::shuffle(offsets.begin(), offsets.end(), rng);
    const size_t freed = 1 + rng() % kSlots;
    for (size_t i = 0; i < freed; ++i) allocator.free(offsets[i], kBlock);
    offsets.erase(offsets.begin(), offsets.begin() + static_cast<long>(freed));
    while (auto offset = allocator.allocate(kBlock)) offsets.push_back(*offset);
    ASSERT_EQ(offsets.size(), kSlots) << "round " << round;  // every freed slot is usable again
  }
  std::set<uint64_t> distinct(offsets.begin(), offsets.end());
  EXPECT_EQ(distinct.size(), kSlots);
  for (uint64_t o : offsets) EXPECT_EQ(o % kBlock, 0u);
  EXPECT_EQ(allocator.used_bytes(), kBlock * kSlots);
}

TEST(SegmentAllocator, MixedSizesNeverOverlapAndCoalesceBackToOneRange) {
  constexpr uint64_t kCapacity = 1 << 20;
  SegmentAllocator allocator(kCapacity);
  std::mt19937_64 rng(3);
  std::vector<std::pair<uint64_t, uint64_t>> live;  // offset, size
  for (int i = 0; i < 5000; ++i) {
    if (!live.empty() && rng() % 3 == 0) {
      const size_t k = rng() % live.size();
      allocator.free(live[k].first, live[k].second);
      live.erase(live.begin() + static_cast<long>(k));
      continue;
    }
    const uint64_t size = 1 + rng() % 20000;
    if (auto offset = allocator.allocate(size)) {
      EXPECT_EQ(*offset % kAllocationAlignmentBytes, 0u);
      EXPECT_LE(*offset + size, kCapacity);
      for (const auto& [o, s] : live) {
        EXPECT_TRUE(*offset + size <= o || o + s <= *offset) << "overlap at " << *offset;
      }
      live.emplace_back(*offset, size);
    }
  }
  for (const auto& [o, s] : live) allocator.free(o, s);
  EXPECT_EQ(allocator.used_bytes(), 0u);
  EXPECT_EQ(allocator.largest_free_bytes(), kCapacity);
}

TEST(SegmentAllocator, AllocateAtClaimsExactlyTheFreeRangeAsked) {
  SegmentAllocator allocator(64 * 10);
  EXPECT_TRUE(allocator.allocate_at(64 * 3, 100));  // 128 aligned bytes: slots 3 and 4
  EXPECT_FALSE(allocator.allocate_at(64 * 4, 1));   // taken
  EXPECT_FALSE(allocator.allocate_at(64 * 9, 65));  // past the end
  EXPECT_FALSE(allocator.allocate_at(0, 0));
  EXPECT_EQ(allocator.used_bytes(), 128u);
  EXPECT_EQ(allocator.largest_free_bytes(), 64u * 5);
  EXPECT_EQ(allocator.allocate(64 * 3), 0u);  // best fit: the 3-slot hole before the claimed range
  allocator.free(64 * 3, 100);
  allocator.free(0, 64 * 3);
  EXPECT_EQ(allocator.largest_free_bytes(), 64u * 10);
}

TEST(SegmentAllocator, RefusesWhatDoesNotFit) {
  SegmentAllocator allocator(1000);
  EXPECT_FALSE(allocator.allocate(1001));
  EXPECT_EQ(allocator.allocate(960), 0u);  // 960 is aligned; the 40-byte tail is too small for anything
  EXPECT_FALSE(allocator.allocate(1));
}

TEST(SegmentAllocator, LargestFreeIfFreedMergesFreedRangesWithFreeOnes) {
  SegmentAllocator allocator(64 * 8);
  std::vector<uint64_t> offsets;
  for (int i = 0; i < 8; ++i) offsets.push_back(allocator.allocate(64).value());
  allocator.free(offsets[3], 64);
  EXPECT_EQ(allocator.largest_free_bytes(), 64u);
  EXPECT_EQ(allocator.largest_free_bytes_if_freed({{offsets[2], 64}, {offsets[4], 10}}), 64u * 3);
  EXPECT_EQ(allocator.largest_free_bytes_if_freed({{offsets[0], 64}, {offsets[1], 64}}), 64u * 2);
  EXPECT_EQ(allocator.largest_free_bytes_if_freed({}), 64u);
}

}  // namespace
}  // namespace crescent::store
