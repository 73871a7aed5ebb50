#include "kv/block_cache.h"

#include <cassert>
#include <ranges>

namespace crescent::kv {

BlockCache::BlockCache(int64_t capacity_blocks) : capacity_blocks_(capacity_blocks) {
  assert(capacity_blocks >= 1);
}

int64_t BlockCache::prefix_match_blocks(std::span<const BlockKey> keys) const {
  int64_t run = 0;
  for (BlockKey key : keys) {
    if (entries_.find(key) == nullptr) break;
    ++run;
  }
  return run;
}

void BlockCache::list_remove(uint32_t slot) {
  Slot& s = slots_[slot];
  (s.prev == kNil ? lru_head_ : slots_[s.prev].next) = s.next;
  (s.next == kNil ? lru_tail_ : slots_[s.next].prev) = s.prev;
  s.prev = s.next = kNil;
}

void BlockCache::list_push_back(uint32_t slot) {
  Slot& s = slots_[slot];
  s.prev = lru_tail_;
  s.next = kNil;
  (lru_tail_ == kNil ? lru_head_ : slots_[lru_tail_].next) = slot;
  lru_tail_ = slot;
}

void BlockCache::reserve(int64_t blocks) {
  if (blocks <= 0) return;
  const auto n = static_cast<size_t>(blocks);
  entries_.reserve(n);
  if (slots_.size() < n) {
    // Written once so their pages are mapped now, then given back to the size in use (capacity is kept).
    const size_t in_use = slots_.size();
    slots_.resize(n);
    slots_.resize(in_use);
  }
}

uint32_t BlockCache::allocate_slot(BlockKey key) {
  uint32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
    slots_[slot] = Slot{key};
  } else {
    slot = static_cast<uint32_t>(slots_.size());
    slots_.push_back(Slot{key});
  }
  return slot;
}

void BlockCache::evict_lru(TouchEvents* events) {
  const uint32_t victim = lru_head_;
  const BlockKey victim_key = slots_[victim].key;
  list_remove(victim);
  free_slots_.push_back(victim);
  entries_.erase(victim_key);
  if (events) events->evicted.push_back(victim_key);
}

bool BlockCache::erase_unpinned(BlockKey key) {
  const Entry* e = entries_.find(key);
  if (e == nullptr || e->ref_count > 0) return false;
  list_remove(e->slot);
  free_slots_.push_back(e->slot);
  entries_.erase(key);
  return true;
}

int64_t BlockCache::evict_unpinned(int64_t blocks, TouchEvents* events) {
  int64_t evicted = 0;
  for (; evicted < blocks && lru_head_ != kNil; ++evicted) evict_lru(events);
  return evicted;
}

void BlockCache::touch(std::span<const BlockKey> keys, bool pin, TouchEvents* events) {
  // Pass 1, first to last: take each key out of the LRU list (pinned, or held until pass 2) or store it, so
  // later keys of the same request can never evict earlier ones. Pass 2 puts the held keys back, last to
  // first: keys[0] ends up the most recent. A slot's `touch_call` marks it held by this call (repeated keys).
  // The leading hits are found before anything is stored, and nothing is evicted before a key is stored.
  const uint64_t call = ++touch_calls_;
  held_.clear();
  bool leading = true;
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i + kPrefetchAheadKeys < keys.size()) entries_.prefetch(keys[i + kPrefetchAheadKeys]);
    const BlockKey key = keys[i];
    if (Entry* found = entries_.find(key)) {
      if (leading && events) ++events->hit_blocks;
      Entry& e = *found;
      if (pin) {
        if (e.ref_count++ == 0) {
          list_remove(e.slot);
          ++pinned_blocks_;
        }
        if (events) events->pinned.push_back(key);
      } else if (e.ref_count == 0 && slots_[e.slot].touch_call != call) {
        list_remove(e.slot);
        slots_[e.slot].touch_call = call;
        held_.push_back(e.slot);
      }
      continue;
    }
    leading = false;
    if (size_blocks() >= capacity_blocks_) {
      if (lru_head_ == kNil) {  // every other cached block is in use or this request's: skip it
        if (events) events->skipped.push_back(key);
        continue;
      }
      evict_lru(events);
    }
    const uint32_t slot = allocate_slot(key);
    slots_[slot].touch_call = call;
    entries_.try_emplace(key, Entry{slot, pin ? 1u : 0u});
    if (pin) {
      ++pinned_blocks_;
      if (events) events->pinned.push_back(key);
    } else {
      held_.push_back(slot);
    }
    if (events) events->stored.push_back(key);
  }
  for (auto slot = held_.rbegin(); slot != held_.rend(); ++slot) list_push_back(*slot);
}

void BlockCache::unpin(std::span<const BlockKey> keys) {
  for_each_prefetched(
      std::views::reverse(keys),
      [&](BlockKey key) {
        Entry* e = entries_.find(key);
        assert(e != nullptr && e->ref_count > 0);
        if (e == nullptr || e->ref_count == 0) return;
        if (--e->ref_count == 0) {
          --pinned_blocks_;
          list_push_back(e->slot);
        }
      },
      entries_);
}

}  // namespace crescent::kv
