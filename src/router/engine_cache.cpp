#include "router/engine_cache.h"

namespace crescent::router {

EngineCache::EngineCache(BlockKey model_seed, int64_t block_size_tokens, int64_t approximate_capacity_blocks)
    : model_seed_(model_seed), block_size_tokens_(block_size_tokens) {
  if (approximate_capacity_blocks > 0) {
    lru_.emplace(approximate_capacity_blocks);
    lru_->reserve(std::min(approximate_capacity_blocks, kMaxReservedCacheBlocks));
  }
}

uint8_t EngineCache::tier_bit(const std::optional<std::string>& medium) {
  if (!medium || *medium == "GPU") return 1;
  if (*medium == "CPU") return 2;
  return 4;  // any other tier (disk, a connector's store)
}

void EngineCache::apply(const serve::KvEventBatch& batch, CacheChanges& out) {
  for (const serve::KvEvent& e : batch.events) {
    switch (e.kind) {
      case serve::KvEvent::Kind::kStored: {
        if (e.block_size != block_size_tokens_) {
          ++problems_.wrong_block_size;
          break;
        }
        if (e.token_ids.size() != e.block_hashes.size() * static_cast<size_t>(block_size_tokens_)) {
          ++problems_.wrong_token_count;
          break;
        }
        BlockKey parent = model_seed_;
        if (e.parent_block_hash) {
          auto it = by_engine_hash_.find(*e.parent_block_hash);
          if (it == by_engine_hash_.end()) {
            // Its prefix is unknown (stored before the router listened, or lost in a gap): its key cannot
            // be chained, so it is not indexed.
            problems_.unknown_parent_blocks += e.block_hashes.size();
            break;
          }
          parent = it->second.key;
        }
        const uint8_t tier = tier_bit(e.medium);
        std::span<const int64_t> tokens(e.token_ids);
        for (size_t i = 0; i < e.block_hashes.size(); ++i) {
          parent = kv::chain_block_key(
              parent, tokens.subspan(i * static_cast<size_t>(block_size_tokens_), block_size_tokens_));
          Held& held = by_engine_hash_[e.block_hashes[i]];
          if (held.tiers == 0) out.stored.push_back(parent);
          held.key = parent;
          held.tiers |= tier;
        }
        break;
      }
      case serve::KvEvent::Kind::kRemoved: {
        const uint8_t tier = tier_bit(e.medium);
        for (uint64_t hash : e.block_hashes) {
          auto it = by_engine_hash_.find(hash);
          if (it == by_engine_hash_.end()) continue;
          it->second.tiers &= static_cast<uint8_t>(~tier);
          if (it->second.tiers == 0) {
            out.removed.push_back(it->second.key);
            by_engine_hash_.erase(it);
          }
        }
        break;
      }
      case serve::KvEvent::Kind::kAllCleared:
        by_engine_hash_.clear();
        out.stored.clear();
        out.removed.clear();
        out.cleared = true;
        break;
    }
  }
}

void EngineCache::on_prefill_done(std::span<const BlockKey> keys, CacheChanges& out) {
  if (!lru_) return;
  touch_.clear();
  lru_->touch(keys, /*pin=*/false, &touch_);
  out.stored.insert(out.stored.end(), touch_.stored.begin(), touch_.stored.end());
  out.removed.insert(out.removed.end(), touch_.evicted.begin(), touch_.evicted.end());
}

void EngineCache::clear() {
  by_engine_hash_.clear();
  if (lru_) lru_.emplace(lru_->capacity_blocks());
}

int64_t EngineCache::blocks() const {
  return lru_ ? lru_->size_blocks() : static_cast<int64_t>(by_engine_hash_.size());
}

}  // namespace crescent::router
