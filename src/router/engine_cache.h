// What one engine's prefix cache holds, as the router knows it, under crescent's own block keys
// (kv/block_key.h) whatever the engine's hash function (docs/router.md, "What each engine holds"):
// - from its KV events (vLLM's BlockStored carries each block's token ids and its parent's hash): a stored
//   block's key is chained from its parent's key and its tokens, and the engine's hash is remembered only to
//   find that key again when the engine removes the block or names it as a parent;
// - without events, approximately: an LRU of the engine's cache size over the prompts the router sent it.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "kv/block_cache.h"
#include "kv/block_key.h"
#include "serve/kv_events.h"

namespace crescent::router {

/// How the router knows an engine's cache.
enum class CacheTracking {
  kEvents,       // from its KV events
  kApproximate,  // from what the router sent it (an LRU of its size)
};

/// The keys a change adds to and removes from the engine's cache (ClusterState::on_kv_event's arguments).
struct CacheChanges {
  std::vector<BlockKey> stored, removed;
  bool cleared = false;  // everything went first (AllBlocksCleared)
  void clear() {
    stored.clear();
    removed.clear();
    cleared = false;
  }
};

/// Problems with an engine's events, counted (they are the engine's, not the router's, to fix).
struct EventProblems {
  uint64_t unknown_parent_blocks = 0;  // stored under a parent the router never saw stored (not indexed)
  uint64_t wrong_block_size = 0;       // BlockStored whose block_size is not the engine's (skipped)
  uint64_t wrong_token_count = 0;      // BlockStored whose token ids do not fill its blocks (skipped)
};

/// The most blocks of one engine's cache the router makes room for up front (kv::BlockCache::reserve, the
/// Conductor's index and ready times): a larger cache grows beyond as it fills. Room costs ~170 bytes a
/// block in all (the three maps' slots at their load factor, the LRU's list): 256k blocks ~45 MiB.
inline constexpr int64_t kMaxReservedCacheBlocks = int64_t{1} << 18;

/// One engine's cache, tracked by one of the two CacheTracking ways. Not thread-safe.
class EngineCache {
 public:
  /// An engine whose blocks hold `block_size_tokens` tokens, keyed from `model_seed` (kv/block_key.h). With
  /// `approximate_capacity_blocks` > 0 it is tracked approximately with an LRU of that many blocks, room for
  /// which (up to kMaxReservedCacheBlocks) is made now; 0: from its events.
  EngineCache(BlockKey model_seed, int64_t block_size_tokens, int64_t approximate_capacity_blocks);

  CacheTracking tracking() const { return lru_ ? CacheTracking::kApproximate : CacheTracking::kEvents; }

  /// Events: what `batch` changes, in crescent's keys. A block is held while any tier (medium: GPU, CPU,
  /// ...) holds it: BlockRemoved from one tier of a block another tier keeps changes nothing.
  void apply(const serve::KvEventBatch& batch, CacheChanges& out);
  /// Approximately: a prefill of the prompt whose full blocks are `keys` ended on the engine; its blocks are
  /// the most recent, the least recent ones are evicted past the capacity.
  void on_prefill_done(std::span<const BlockKey> keys, CacheChanges& out);
  /// Forgets everything (a gap in its events that replay could not fill, or the engine went down).
  void clear();

  /// Blocks known to be cached.
  int64_t blocks() const;
  const EventProblems& problems() const { return problems_; }

 private:
  struct Held {
    BlockKey key = 0;
    uint8_t tiers = 0;  // bit per medium holding it
  };
  static uint8_t tier_bit(const std::optional<std::string>& medium);

  const BlockKey model_seed_;
  const int64_t block_size_tokens_;
  std::unordered_map<uint64_t, Held> by_engine_hash_;  // events: the engine's hash → crescent's key
  std::optional<kv::BlockCache> lru_;                  // approximately
  kv::TouchEvents touch_;
  EventProblems problems_;
};

}  // namespace crescent::router
