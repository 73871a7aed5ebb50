// Space inside one mounted segment, run by the master (the segment's bytes live on its node; the master only
// decides offsets). Best fit over free ranges, with neighbours coalesced on free.
//
// KV cache blocks are mostly one size. With every value of size S, each free range is a whole number of
// S-sized slots (allocation takes the front of a range, so ranges start and end on slot boundaries), best fit
// takes an exact slot in O(log n), and the segment holds capacity / S values whatever the order of frees: no
// fragmentation. Mixed sizes work as in any best-fit allocator.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <set>
#include <utility>
#include <vector>

namespace crescent::store {

/// Sizes are rounded up to this many bytes (a cache line), so every value starts aligned.
inline constexpr uint64_t kAllocationAlignmentBytes = 64;

/// `size_bytes` rounded up to kAllocationAlignmentBytes.
constexpr uint64_t aligned_size_bytes(uint64_t size_bytes) {
  return (size_bytes + kAllocationAlignmentBytes - 1) / kAllocationAlignmentBytes * kAllocationAlignmentBytes;
}

/// Offsets within [0, capacity_bytes). Not thread-safe (the master's lock guards it).
class SegmentAllocator {
 public:
  explicit SegmentAllocator(uint64_t capacity_bytes);

  /// The offset of a free range of aligned_size_bytes(size_bytes), or nullopt when no free range is that
  /// large. REQUIRES: size_bytes > 0.
  std::optional<uint64_t> allocate(uint64_t size_bytes);
  /// Marks [offset, offset + aligned_size_bytes(size_bytes)) used, as a re-mounting node reports it. False
  /// (and nothing changed) when any byte of it is not free or it does not fit the segment.
  bool allocate_at(uint64_t offset, uint64_t size_bytes);
  /// Returns a range from allocate or allocate_at (same size_bytes). REQUIRES: it is allocated.
  void free(uint64_t offset, uint64_t size_bytes);

  uint64_t capacity_bytes() const { return capacity_bytes_; }
  /// Bytes allocated, counting each value's aligned size.
  uint64_t used_bytes() const { return used_bytes_; }
  uint64_t free_bytes() const { return capacity_bytes_ - used_bytes_; }
  /// The largest value allocate would place now (0 when full).
  uint64_t largest_free_bytes() const;
  /// The largest value allocate would place if the allocated ranges `freed` ((offset, size_bytes), as given
  /// to allocate or allocate_at) were freed as well. For checking that evicting can make room before
  /// evicting; O((free ranges + freed) log).
  uint64_t largest_free_bytes_if_freed(std::vector<std::pair<uint64_t, uint64_t>> freed) const;

 private:
  void insert_free(uint64_t offset, uint64_t length);
  void erase_free(std::map<uint64_t, uint64_t>::iterator it);

  uint64_t capacity_bytes_;
  uint64_t used_bytes_ = 0;
  std::map<uint64_t, uint64_t> free_by_offset_;           // offset -> length
  std::set<std::pair<uint64_t, uint64_t>> free_by_size_;  // (length, offset)
};

}  // namespace crescent::store
