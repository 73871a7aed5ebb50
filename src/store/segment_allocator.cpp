#include "store/segment_allocator.h"

#include <algorithm>
#include <cassert>
#include <iterator>

namespace crescent::store {

SegmentAllocator::SegmentAllocator(uint64_t capacity_bytes) : capacity_bytes_(capacity_bytes) {
  if (capacity_bytes > 0) insert_free(0, capacity_bytes);
}

void SegmentAllocator::insert_free(uint64_t offset, uint64_t length) {
  free_by_offset_.emplace(offset, length);
  free_by_size_.emplace(length, offset);
}

void SegmentAllocator::erase_free(std::map<uint64_t, uint64_t>::iterator it) {
  free_by_size_.erase({it->second, it->first});
  free_by_offset_.erase(it);
}

std::optional<uint64_t> SegmentAllocator::allocate(uint64_t size_bytes) {
  assert(size_bytes > 0);
  const uint64_t length = aligned_size_bytes(size_bytes);
  auto fit = free_by_size_.lower_bound({length, 0});
  if (fit == free_by_size_.end()) return std::nullopt;
  const auto [hole_length, offset] = *fit;
  erase_free(free_by_offset_.find(offset));
  if (hole_length > length) insert_free(offset + length, hole_length - length);
  used_bytes_ += length;
  return offset;
}

bool SegmentAllocator::allocate_at(uint64_t offset, uint64_t size_bytes) {
  const uint64_t length = aligned_size_bytes(size_bytes);
  if (size_bytes == 0 || offset > capacity_bytes_ || length > capacity_bytes_ - offset) return false;
  auto it = free_by_offset_.upper_bound(offset);
  if (it == free_by_offset_.begin()) return false;
  --it;  // the free range starting at or before offset
  const auto [hole_offset, hole_length] = *it;
  if (offset + length > hole_offset + hole_length) return false;
  erase_free(it);
  if (offset > hole_offset) insert_free(hole_offset, offset - hole_offset);
  if (hole_offset + hole_length > offset + length) {
    insert_free(offset + length, hole_offset + hole_length - offset - length);
  }
  used_bytes_ += length;
  return true;
}

void SegmentAllocator::free(uint64_t offset, uint64_t size_bytes) {
  uint64_t length = aligned_size_bytes(size_bytes);
  assert(used_bytes_ >= length);
  used_bytes_ -= length;
  auto next = free_by_offset_.lower_bound(offset);
  if (next != free_by_offset_.end() && next->first == offset + length) {
    length += next->second;
    next = std::next(next);
    erase_free(std::prev(next));
  }
  if (next != free_by_offset_.begin()) {
    auto prev = std::prev(next);
    if (prev->first + prev->second == offset) {
      offset = prev->first;
      length += prev->second;
      erase_free(prev);
    }
  }
  insert_free(offset, length);
}

uint64_t SegmentAllocator::largest_free_bytes() const {
  return free_by_size_.empty() ? 0 : free_by_size_.rbegin()->first;
}

uint64_t SegmentAllocator::largest_free_bytes_if_freed(
    std::vector<std::pair<uint64_t, uint64_t>> freed) const {
  for (auto& [offset, size_bytes] : freed) size_bytes = aligned_size_bytes(size_bytes);
  freed.insert(freed.end(), free_by_offset_.begin(), free_by_offset_.end());
  std::sort(freed.begin(), freed.end());
  uint64_t largest = 0;
  uint64_t run_start = 0;
  uint64_t run_end = 0;  // [run_start, run_end): the contiguous run being merged
  for (const auto& [offset, length] : freed) {
    if (offset != run_end)
      run_start = offset;  // a gap (ranges never overlap: each byte is free or used once)
    run_end = offset + length;
    largest = std::max(largest, run_end - run_start);
  }
  return largest;
}

}  // namespace crescent::store
