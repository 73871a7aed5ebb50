// A bounded set of cached KV blocks with LRU eviction that never evicts a block in use (paper §3.2.1).
// The whole block lifecycle of one cache lives here: look up, insert, touch, pin while in use, unpin, evict.
//
// Recency within a request: a prefix hit is a *leading* run of keys, so a cache that evicts the head of a
// cached prefix before its tail keeps blocks nobody can reach. Every operation that takes a request's keys
// (touch, unpin) therefore leaves them most recent first-to-last: keys[0] the most recent, the last key the
// least, so under pressure a request's tail goes first and what stays cached is a usable prefix. vLLM gets
// the same order by freeing a request's blocks in reverse.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kv/block_key.h"
#include "kv/block_map.h"

namespace crescent::kv {

/// What one touch() did, for keeping an index of holders (kv/block_index.h) in step with the cache.
struct TouchEvents {
  std::vector<BlockKey> stored;   // keys newly cached, in order
  std::vector<BlockKey> evicted;  // keys evicted to make room, in eviction order
  std::vector<BlockKey> pinned;   // keys pinned by this call (pass them to unpin() when the request is done)
  std::vector<BlockKey> skipped;  // absent keys not stored: no room left that was not in use
  /// The leading run of the keys that were cached before the call, in blocks (what prefix_match_blocks
  /// answered just before it). Counted into, as the lists are appended to: clear() between calls.
  int64_t hit_blocks = 0;
  void clear() {
    stored.clear();
    evicted.clear();
    pinned.clear();
    skipped.clear();
    hit_blocks = 0;
  }
};

/// LRU block cache of at most `capacity_blocks` blocks. A pinned block (reference count > 0, i.e. used by an
/// ongoing request) is never evicted; unpinned blocks are evicted least recently used first.
/// Not thread-safe. All operations are O(1) per key (an open-addressing hash map + an intrusive list).
class BlockCache {
 public:
  static constexpr int64_t kUnbounded = std::numeric_limits<int64_t>::max();

  /// REQUIRES: capacity_blocks >= 1 (kUnbounded for no limit).
  explicit BlockCache(int64_t capacity_blocks = kUnbounded);

  /// Makes room for `blocks` cached blocks now (memory allocated and written): a cache that fills up to it
  /// then allocates nothing and takes no page fault while it is used (a router's request path). Behaviour
  /// is unchanged but for keys()'s order.
  void reserve(int64_t blocks);

  /// Length, in blocks, of the leading run of `keys` present in the cache. Does not change recency.
  int64_t prefix_match_blocks(std::span<const BlockKey> keys) const;
  bool contains(BlockKey key) const { return entries_.find(key) != nullptr; }

  /// Touches a request's blocks, `keys` in prefix order. Absent keys are stored first to last, each evicting
  /// the least recently used unpinned block not among `keys` when the cache is full; once nothing is left
  /// to evict, further absent keys are skipped (not cached, not pinned), so a request longer than the cache
  /// keeps its head. Afterwards every touched key is more recent than any other block, keys[0] the most
  /// recent and the last key the least (see the top of this file). With `pin`, every occurrence of a key
  /// that ends up cached is pinned once (pinned blocks are out of the LRU order until unpinned).
  /// `events` (optional) receives what changed, and the run of keys that were cached already (hit_blocks).
  void touch(std::span<const BlockKey> keys, bool pin, TouchEvents* events = nullptr);

  /// Drops one pin from each occurrence of a key in `keys` (a request's blocks in prefix order, as pinned by
  /// touch()). Keys whose count reaches 0 become the most recently used evictable blocks, keys[0] the most
  /// recent of them, as touch() orders them.
  /// REQUIRES: each key was pinned by touch() and not yet unpinned as often.
  void unpin(std::span<const BlockKey> keys);

  /// Evicts up to `blocks` unpinned blocks, least recently used first, and returns how many it evicted
  /// (fewer when fewer are unpinned). `events` (optional) receives them in `evicted`. For a cache whose room
  /// is shared with other data (a colocated node's HBM, sim/colocated.cpp).
  int64_t evict_unpinned(int64_t blocks, TouchEvents* events = nullptr);
  /// Drops `key` if it is cached and unpinned (e.g. a block stored for a request that was cancelled before
  /// computing it); returns whether it did.
  bool erase_unpinned(BlockKey key);

  int64_t size_blocks() const { return static_cast<int64_t>(entries_.size()); }
  /// Every cached key, pinned or not, in no particular order (size_blocks() of them): the whole cache, for a
  /// subscriber that must learn it again (an instance's full KV report, docs/serving.md).
  std::vector<BlockKey> keys() const {
    std::vector<BlockKey> out;
    out.reserve(entries_.size());
    entries_.for_each([&](BlockKey key, const Entry&) { out.push_back(key); });
    return out;
  }
  int64_t capacity_blocks() const { return capacity_blocks_; }
  /// Blocks with reference count > 0.
  int64_t pinned_blocks() const { return pinned_blocks_; }

 private:
  static constexpr uint32_t kNil = std::numeric_limits<uint32_t>::max();
  struct Entry {
    uint32_t slot = 0;  // index into slots_
    uint32_t ref_count = 0;
  };
  // Evictable (ref_count == 0) blocks form a doubly linked list over slots_, head = least recently used.
  struct Slot {
    BlockKey key;
    uint32_t prev = kNil;
    uint32_t next = kNil;
    uint64_t touch_call = 0;  // the touch() call that last took it out of the LRU list (touch_calls_)
  };

  void list_remove(uint32_t slot);
  void list_push_back(uint32_t slot);
  uint32_t allocate_slot(BlockKey key);
  // Evicts the least recently used unpinned block. REQUIRES: there is one (lru_head_ != kNil).
  void evict_lru(TouchEvents* events);

  int64_t capacity_blocks_;
  int64_t pinned_blocks_ = 0;
  BlockMap<Entry> entries_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  uint32_t lru_head_ = kNil;
  uint32_t lru_tail_ = kNil;
  uint64_t touch_calls_ = 0;
  std::vector<uint32_t> held_;  // touch(): unpinned slots taken out of the LRU list, in key order
};

}  // namespace crescent::kv
