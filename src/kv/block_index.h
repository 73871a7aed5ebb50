// Which instance holds which cached block: key → holders, the Conductor's view of the prefix caches (paper
// §4.1). Kept current from cache events (stored / evicted); prefix matching costs time proportional to the
// request's blocks (times the replicas of each), never instances × cached blocks.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "common/instance_id.h"
#include "kv/block_cache.h"
#include "kv/block_key.h"
#include "kv/block_map.h"

namespace crescent::kv {

/// Result of BlockIndex::match_prefix for one request: each instance's leading run of the request's keys.
struct PrefixMatch {
  /// Per instance id: how many leading keys of the request its cache holds, in blocks (0: none). At least
  /// as long as the caller made it and as the largest holder id + 1; an id past the end matches 0
  /// (blocks_of). Dense so a loop over every instance reads its run without a lookup.
  std::vector<int32_t> run_blocks;
  /// reaching[j]: how many instances hold the request's first j + 1 keys (run >= j + 1); size best_blocks.
  /// A run length L >= 1 occurs when reaching[L - 1] > reaching[L] (or L == best_blocks).
  std::vector<int64_t> reaching;
  int64_t best_blocks = 0;  // longest run over all instances (0 when no instance matches)
  InstanceId best_instance =
      0;  // lowest-numbered instance with best_blocks (meaningful when best_blocks > 0)
  std::vector<InstanceId> best_holders;  // every instance with best_blocks, in no particular order

  /// Instance `i`'s run, in blocks.
  int64_t blocks_of(InstanceId i) const { return i < run_blocks.size() ? run_blocks[i] : 0; }
  /// (instance, run in blocks) of every instance with a non-empty run, by instance id. O(run_blocks.size()):
  /// for tests and reports, not for the Conductor's loops.
  std::vector<std::pair<InstanceId, int64_t>> matches() const;
};

/// The instances holding one block: up to two inline, more in an array of their own. 16 bytes, where
/// boost::container::small_vector<InstanceId, 2> takes 32: an index of millions of blocks keeps one per
/// block. Move-only (a moved-from list is empty); the room of an array is kept when ids are popped.
class HolderList {
 public:
  HolderList() = default;
  /// Takes `other`'s ids (and its array), leaving it empty.
  HolderList(HolderList&& other) noexcept : size_(other.size_), capacity_(other.capacity_), ids_(other.ids_) {
    other.size_ = 0;
    other.capacity_ = kInline;
  }
  /// Frees this list's array, then takes `other`'s ids, leaving it empty. Self-assignment does nothing.
  HolderList& operator=(HolderList&& other) noexcept {
    if (this != &other) {
      release();
      size_ = std::exchange(other.size_, 0);
      capacity_ = std::exchange(other.capacity_, kInline);
      ids_ = other.ids_;
    }
    return *this;
  }
  HolderList(const HolderList&) = delete;
  HolderList& operator=(const HolderList&) = delete;
  ~HolderList() { release(); }

  /// The ids, size() of them, in the order push_back and the caller's writes left them.
  const InstanceId* data() const { return on_heap() ? ids_.heap : ids_.inline_ids; }
  InstanceId* data() { return on_heap() ? ids_.heap : ids_.inline_ids; }
  uint32_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  InstanceId* begin() { return data(); }
  InstanceId* end() { return data() + size_; }
  const InstanceId* begin() const { return data(); }
  const InstanceId* end() const { return data() + size_; }
  /// The last id. REQUIRES: !empty().
  InstanceId& back() { return data()[size_ - 1]; }
  /// Appends `id`, moving the ids to an array twice as large when the room is full.
  void push_back(InstanceId id) {
    if (size_ == capacity_) grow();
    data()[size_++] = id;
  }
  void pop_back() { --size_; }  // REQUIRES: !empty(); the room stays

 private:
  static constexpr uint32_t kInline = 2;
  bool on_heap() const { return capacity_ > kInline; }
  void grow() {
    auto* heap = new InstanceId[capacity_ * 2];
    std::copy_n(data(), size_, heap);
    release();
    ids_.heap = heap;
    capacity_ *= 2;
  }
  void release() {
    if (on_heap()) delete[] ids_.heap;
  }

  uint32_t size_ = 0;
  uint32_t capacity_ = kInline;
  union Ids {
    InstanceId inline_ids[kInline];
    InstanceId* heap;
  } ids_{};
};
static_assert(sizeof(HolderList) == 16, "a HolderList is 16 bytes: one per indexed block");

/// Map from block key to the instances holding a replica. Not thread-safe, const methods included
/// (match_prefix keeps a cache); movable, not copyable.
class BlockIndex {
 public:
  /// Records that `holder` caches `key`. Idempotent.
  void add(BlockKey key, InstanceId holder);
  /// Records that `holder` no longer caches `key`. No-op if it did not.
  void remove(BlockKey key, InstanceId holder);
  /// Applies one cache's events: stored keys are added for `holder`, evicted keys removed.
  void apply(InstanceId holder, const TouchEvents& events);

  /// Makes room for `blocks` distinct keys now (BlockMap::reserve): no growth nor page fault below it.
  void reserve(int64_t blocks) {
    if (blocks > 0) holders_.reserve(static_cast<size_t>(blocks));
  }

  /// Slots the index's tables hold, used or free (its memory, in entries; kv::BlockMap::slot_count).
  size_t slot_count() const { return holders_.slot_count(); }

  /// Starts loading where `key` is kept (a hint for loops over a request's keys, a few keys ahead). Always
  /// inlined, as BlockMap::prefetch.
  [[gnu::always_inline]] void prefetch(BlockKey key) const { holders_.prefetch(key); }

  /// How many keys ahead of its walk match_prefix starts their lookups. 16, not kPrefetchAheadKeys: the
  /// walk does little per key, and 8 ahead it still waited on memory (docs/benchmarks.md, "Conductor
  /// decisions").
  static constexpr size_t kMatchPrefetchAheadKeys = 16;

  /// Starts loading what match_prefix(keys) reads first (the first kMatchPrefetchAheadKeys keys' slots), for
  /// a caller with other work to do before the match. Always inlined, as prefetch.
  [[gnu::always_inline]] void prefetch_match(std::span<const BlockKey> keys) const {
    for (size_t j = 0; j < std::min(keys.size(), kMatchPrefetchAheadKeys); ++j) prefetch(keys[j]);
  }

  /// Instances holding `key` (empty if none), in insertion order.
  std::span<const InstanceId> holders(BlockKey key) const;

  /// Per-instance leading-run match of `keys`. Overwrites `out`; run_blocks keeps at least its size (the
  /// caller's floor) and may come back longer (zeros past the largest holder id). Cost: one pass over
  /// run_blocks plus the holders of each key up to one past the longest run, O(len(keys) × replicas per
  /// key); never instances × cached blocks. When the first key has many holders (a shared system prompt
  /// every instance holds), its runs are kept for the next match that starts with it (until its holders
  /// change), and that pass is a copy instead of a write per holder.
  void match_prefix(std::span<const BlockKey> keys, PrefixMatch& out) const;

  /// Distinct keys held by at least one instance.
  int64_t blocks() const { return static_cast<int64_t>(holders_.size()); }
  /// Sum over keys of their holder counts.
  int64_t replicas() const { return replicas_; }

 private:
  // Keeps first_runs_ current only while `key`'s holders stay as they were.
  void key_changed(BlockKey key) {
    if (key == first_key_) first_runs_.clear();
  }

  // Most blocks have one or two holders: kept inline, no allocation per block.
  BlockMap<HolderList> holders_;
  int64_t replicas_ = 0;
  // The dense runs (1 per holder, else 0) after matching first_key_, the first key of the last match with
  // many holders; empty when not known (none yet, or first_key_'s holders changed since), never empty once
  // built (first_key_ has holders).
  mutable BlockKey first_key_ = 0;
  mutable std::vector<int32_t> first_runs_;
};

}  // namespace crescent::kv
