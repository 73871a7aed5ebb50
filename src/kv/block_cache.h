// A bounded set of cached KV blocks with LRU eviction that never evicts a block in use (paper §3.2.1).
// The whole block lifecycle of one cache lives here: look up, insert, touch, pin while in use, unpin, evict.
//
// Recency within a request: a prefix hit is a *leading* run of keys, so a cache that evicts the head of a
// cached prefix before its tail keeps blocks nobody can reach. Every operation that takes a request's keys
// (touch, unpin) therefore leaves them most recent first-to-last: keys[0] the most recent, the last key the
// least, so under pressure a request's tail goes first and what stays cached is a usable prefix. vLLM gets
// the same order by freeing a request's blocks in reverse.
//
// Unkeyed blocks: a caller that knows no later lookup names a request's trailing blocks (the simulator knows
// its whole trace: sim/disaggregated.cpp) may have touch() store them unkeyed. They take room and their place
// in the LRU order as keyed blocks would, and are evicted as those would be, but they are one run counted in
// one slot, with no entry in the map: a request's tail costs O(1), not a map insert, erase and list move per
// block. Such a cache behaves as a keyed one would for every key anyone names (the sizes, the hits, every
// keyed block's events); only the unkeyed blocks' own events are not reported.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "kv/block_key.h"
#include "kv/block_map.h"

namespace crescent::kv {

/// A run of unkeyed blocks one touch() stored pinned (see the top of this file), to unpin() or erase() as a
/// whole. Empty when there is none.
struct UnkeyedRun {
  static constexpr uint32_t kNone = std::numeric_limits<uint32_t>::max();  // the slot of no run
  uint32_t slot = kNone;                                                   // the run's slot in the cache
  bool empty() const { return slot == kNone; }                             // no run
};

/// What one touch() did, for keeping an index of holders (kv/block_index.h) in step with the cache.
struct TouchEvents {
  std::vector<BlockKey> stored;   // keys newly cached, in order
  std::vector<BlockKey> evicted;  // keys evicted to make room, in eviction order
  std::vector<BlockKey> pinned;   // keys pinned by this call (pass them to unpin() when the request is done)
  std::vector<BlockKey> skipped;  // absent keys not stored: no room left that was not in use
  /// The leading run of the keys that were cached before the call, in blocks (what prefix_match_blocks
  /// answered just before it). Counted into, as the lists are appended to: clear() between calls.
  int64_t hit_blocks = 0;
  /// Unkeyed blocks (touch()'s `keyed_blocks`), of the last call: where its keys' unkeyed tail begins (the
  /// number of keys when there is none), how many of them were stored (not those with no room), and, when
  /// pinned, their run. Their keys are in none of the lists above.
  size_t unkeyed_from = 0;
  int64_t stored_unkeyed = 0;
  UnkeyedRun pinned_unkeyed;
  void clear() {
    stored.clear();
    evicted.clear();
    pinned.clear();
    skipped.clear();
    hit_blocks = 0;
    unkeyed_from = 0;
    stored_unkeyed = 0;
    pinned_unkeyed = {};
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
  ///
  /// `keyed_blocks`: of the keys from index `keyed_blocks` on, the trailing run of absent ones is stored
  /// unkeyed (see the top of this file): from events->unkeyed_from on, in none of the events' lists, and
  /// events->pinned_unkeyed is their run when pinned.
  /// REQUIRES: a key from index `keyed_blocks` on occurs nowhere else in `keys`, and no later call names it
  /// (touch, contains, prefix_match_blocks, erase_unpinned), but to unpin it where this call pinned it keyed.
  void touch(std::span<const BlockKey> keys, bool pin, TouchEvents* events = nullptr,
             size_t keyed_blocks = std::numeric_limits<size_t>::max());

  /// Drops one pin from each occurrence of a key in `keys` (a request's blocks in prefix order, as pinned by
  /// touch()) and from `unkeyed` (the same touch's unkeyed run, after the keys). Blocks whose count reaches
  /// 0 become the most recently used evictable blocks, keys[0] the most recent of them and the unkeyed run
  /// the least, as touch() orders them.
  /// REQUIRES: each key was pinned by touch() and not yet unpinned as often; `unkeyed` is pinned.
  void unpin(std::span<const BlockKey> keys, UnkeyedRun unkeyed = {});
  /// Drops pinned run `unkeyed` from the cache (blocks stored for a request that was cancelled before
  /// computing them). No-op for an empty run. REQUIRES: `unkeyed` is pinned.
  void erase(UnkeyedRun unkeyed);

  /// Evicts up to `blocks` unpinned blocks, least recently used first, and returns how many it evicted
  /// (fewer when fewer are unpinned). `events` (optional) receives them in `evicted` (unkeyed ones are
  /// counted, not listed). For a cache whose room
  /// is shared with other data (a colocated node's HBM, sim/colocated.cpp).
  int64_t evict_unpinned(int64_t blocks, TouchEvents* events = nullptr);
  /// Drops `key` if it is cached and unpinned (e.g. a block stored for a request that was cancelled before
  /// computing it); returns whether it did.
  bool erase_unpinned(BlockKey key);

  /// Cached blocks, keyed and unkeyed.
  int64_t size_blocks() const { return static_cast<int64_t>(entries_.size()) + unkeyed_blocks_; }
  /// Of them, unkeyed (see the top of this file).
  int64_t unkeyed_blocks() const { return unkeyed_blocks_; }
  /// Every cached key, pinned or not, in no particular order (size_blocks() - unkeyed_blocks() of them): the
  /// whole cache, for a subscriber that must learn it again (an instance's full KV report, docs/serving.md).
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
  // Evictable (ref_count == 0) blocks form a doubly linked list over slots_, head = least recently used. A
  // slot is one keyed block, or a run of unkeyed blocks (touch_call == kRunSlot, `key` their number): the
  // blocks of one touch(), neighbours in the LRU order, the first evicted first.
  static constexpr uint64_t kRunSlot = std::numeric_limits<uint64_t>::max();
  struct Slot {
    BlockKey key;  // a run's: how many blocks it holds (>= 1)
    uint32_t prev = kNil;
    uint32_t next = kNil;
    uint64_t touch_call = 0;  // the touch() call that last took it out of the LRU list (touch_calls_)
  };

  void list_remove(uint32_t slot);
  void list_push_back(uint32_t slot);
  uint32_t allocate_slot(BlockKey key);
  // Evicts the least recently used unpinned block. REQUIRES: there is one (lru_head_ != kNil).
  void evict_lru(TouchEvents* events);
  // Stores `blocks` unkeyed blocks as touch() stores absent keys; returns their run's slot (kNil when none
  // had room).
  uint32_t store_unkeyed(int64_t blocks, bool pin, TouchEvents* events);

  int64_t capacity_blocks_;
  int64_t pinned_blocks_ = 0;
  int64_t unkeyed_blocks_ = 0;
  BlockMap<Entry> entries_;
  std::vector<Slot> slots_;
  std::vector<uint32_t> free_slots_;
  uint32_t lru_head_ = kNil;
  uint32_t lru_tail_ = kNil;
  uint64_t touch_calls_ = 0;
  std::vector<uint32_t> held_;  // touch(): unpinned slots taken out of the LRU list, in key order
};

}  // namespace crescent::kv
