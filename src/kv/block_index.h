// Which instance holds which cached block: key → holders, the Conductor's view of the prefix caches (paper
// §4.1). Kept current from cache events (stored / evicted); prefix matching costs time proportional to the
// request's blocks (times the replicas of each), never instances × cached blocks.
#pragma once

#include <boost/container/small_vector.hpp>
#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "common/instance_id.h"
#include "kv/block_cache.h"
#include "kv/block_key.h"
#include "kv/block_map.h"

namespace crescent::kv {

/// Result of BlockIndex::match_prefix for one request.
struct PrefixMatch {
  /// Instances whose cache holds a non-empty leading run of the request's keys: (instance, run length in
  /// blocks), in no particular order. Instances not listed match 0 blocks.
  std::vector<std::pair<InstanceId, int64_t>> matches;
  int64_t best_blocks = 0;  // longest run over all instances (0 when no instance matches)
  InstanceId best_instance =
      0;  // lowest-numbered instance with best_blocks (meaningful when best_blocks > 0)
};

/// Map from block key to the instances holding a replica. Not thread-safe.
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

  /// Starts loading where `key` is kept (a hint for loops over a request's keys, a few keys ahead).
  void prefetch(BlockKey key) const { holders_.prefetch(key); }

  /// Instances holding `key` (empty if none), in insertion order.
  std::span<const InstanceId> holders(BlockKey key) const;

  /// Per-instance leading-run match of `keys`. Cost O(len(keys) × replicas per key). Overwrites `out`.
  void match_prefix(std::span<const BlockKey> keys, PrefixMatch& out) const;

  /// Distinct keys held by at least one instance.
  int64_t blocks() const { return static_cast<int64_t>(holders_.size()); }
  /// Sum over keys of their holder counts.
  int64_t replicas() const { return replicas_; }

 private:
  // Most blocks have one or two holders: kept inline, no allocation per block.
  BlockMap<boost::container::small_vector<InstanceId, 2>> holders_;
  int64_t replicas_ = 0;
  // Scratch for match_prefix, mutable so matching stays const for callers: the instances whose run is
  // unbroken, and a per-instance stamp marking the holders of the block being examined.
  mutable std::vector<InstanceId> alive_, next_alive_;
  mutable std::vector<uint64_t> stamp_;
  mutable uint64_t stamp_now_ = 0;
};

}  // namespace crescent::kv
