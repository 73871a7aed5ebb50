// A bounded set of cached KV blocks with LRU eviction that never evicts a block in use (paper §3.2.1).
// The whole block lifecycle of one cache lives here: look up, insert, touch, pin while in use, unpin, evict.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/block_key.h"

namespace crescent::kv {

/// What one touch() did, for keeping an index of holders (kv/block_index.h) in step with the cache.
struct TouchEvents {
  std::vector<BlockKey> stored;   // keys newly cached, in order
  std::vector<BlockKey> evicted;  // keys evicted to make room, in eviction order
  std::vector<BlockKey> pinned;   // keys pinned by this call (pass them to unpin() when the request is done)
  void clear() {
    stored.clear();
    evicted.clear();
    pinned.clear();
  }
};

/// LRU block cache of at most `capacity_blocks` blocks. A pinned block (reference count > 0, i.e. used by an
/// ongoing request) is never evicted; unpinned blocks are evicted least recently used first.
/// Not thread-safe. All operations are O(1) per key (hash map + intrusive list).
class BlockCache {
 public:
  static constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();

  /// REQUIRES: capacity_blocks >= 1 (kUnbounded for no limit).
  explicit BlockCache(int64_t capacity_blocks = kUnbounded);

  /// Length, in blocks, of the leading run of `keys` present in the cache. Does not change recency.
  int64_t prefix_match_blocks(std::span<const BlockKey> keys) const;
  bool contains(BlockKey key) const { return entries_.count(key) != 0; }

  /// Touches `keys` in order: a present key becomes most recent, an absent one is stored (evicting the least
  /// recently used unpinned block when full). With `pin`, every key that ends up cached is pinned once.
  /// A key that cannot be stored because every cached block is pinned is skipped (not cached, not pinned).
  /// `events` (optional) receives what changed.
  void touch(std::span<const BlockKey> keys, bool pin, TouchEvents* events = nullptr);

  /// Drops one pin from each key. A key whose count reaches 0 becomes the most recently used evictable block.
  /// REQUIRES: each key was pinned by touch() and not yet unpinned as often.
  void unpin(std::span<const BlockKey> keys);

  /// Evicts up to `blocks` unpinned blocks, least recently used first, and returns how many it evicted
  /// (fewer when fewer are unpinned). `events` (optional) receives them in `evicted`. For a cache whose room
  /// is shared with other data (a colocated node's HBM, sim/colocated.cpp).
  int64_t evict_unpinned(int64_t blocks, TouchEvents* events = nullptr);

  int64_t size_blocks() const { return static_cast<int64_t>(entries_.size()); }
  int64_t capacity_blocks() const { return capacity_blocks_; }
  /// Blocks with reference count > 0.
  int64_t pinned_blocks() const { return pinned_blocks_; }

 private:
  static constexpr uint32_t kNil = std::numeric_limits<uint32_t>::max();
  struct Entry {
    uint32_t slot;  // index into slots_
    uint32_t ref_count = 0;
  };
  // Evictable (ref_count == 0) blocks form a doubly linked list over slots_, head = least recently used.
  struct Slot {
    BlockKey key;
    uint32_t prev = kNil;
    uint32_t next = kNil;
  };

  void list_remove(uint32_t slot);
  void list_push_back(uint32_t slot);
  uint32_t allocate_slot(BlockKey key);
  // Evicts the least recently used unpinned block. REQUIRES: there is one (lru_head_ != kNil).
  void evict_lru(TouchEvents* events);

  int64_t capacity_blocks_;
  int64_t pinned_blocks_ = 0;
  std::unordered_map<BlockKey, Entry> entries_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  uint32_t lru_head_ = kNil;
  uint32_t lru_tail_ = kNil;
};

}  // namespace crescent::kv
