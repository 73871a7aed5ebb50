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
  Slot& s = slots_[victim];
  if (s.touch_call == kRunSlot) {  // an unkeyed run: one block of it goes, unreported
    --unkeyed_blocks_;
    if (--s.key > 0) return;
    list_remove(victim);
    free_slots_.push_back(victim);
    return;
  }
  const BlockKey victim_key = s.key;
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

uint32_t BlockCache::store_unkeyed(int64_t blocks, bool pin, TouchEvents* events) {
  int64_t stored = 0;
  for (; stored < blocks; ++stored) {
    if (size_blocks() >= capacity_blocks_) {
      if (lru_head_ == kNil) break;  // no room left that is not in use: the rest are skipped
      evict_lru(events);
    }
    ++unkeyed_blocks_;
  }
  if (events) events->stored_unkeyed += stored;
  if (stored == 0) return kNil;
  const uint32_t slot = allocate_slot(static_cast<BlockKey>(stored));
  slots_[slot].touch_call = kRunSlot;
  if (pin) {
    pinned_blocks_ += stored;
    if (events) events->pinned_unkeyed = {slot};
  }
  return slot;
}

void BlockCache::touch(std::span<const BlockKey> keys, bool pin, TouchEvents* events, size_t keyed_blocks) {
  // The unkeyed tail: from `keyed_blocks` on, the keys after the last one cached. Those keys are absent
  // and, being named nowhere else in `keys`, stay absent while the others are stored: they are stored after
  // them, as the keyed loop below would store them, but as one run.
  size_t keyed = keys.size();
  if (keyed_blocks < keys.size()) {
    for (size_t i = keyed; i > keyed_blocks && keys.size() - i < kPrefetchAheadKeys; --i)
      entries_.prefetch(keys[i - 1]);
    for (; keyed > keyed_blocks && entries_.find(keys[keyed - 1]) == nullptr; --keyed) {
      if (keyed > keyed_blocks + kPrefetchAheadKeys) entries_.prefetch(keys[keyed - 1 - kPrefetchAheadKeys]);
    }
  }
  if (events) events->unkeyed_from = keyed;
  // Pass 1, first to last: take each key out of the LRU list (pinned, or held until pass 2) or store it, so
  // later keys of the same request can never evict earlier ones. Pass 2 puts the held keys back, last to
  // first: keys[0] ends up the most recent. A slot's `touch_call` marks it held by this call (repeated keys).
  // The leading hits are found before anything is stored, and nothing is evicted before a key is stored.
  const uint64_t call = ++touch_calls_;
  held_.clear();
  bool leading = true;
  for (size_t i = 0; i < keyed; ++i) {
    if (i + kPrefetchAheadKeys < keyed) entries_.prefetch(keys[i + kPrefetchAheadKeys]);
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
  if (keyed < keys.size()) {
    const uint32_t run = store_unkeyed(static_cast<int64_t>(keys.size() - keyed), pin, events);
    if (run != kNil && !pin) held_.push_back(run);
  }
  for (auto slot = held_.rbegin(); slot != held_.rend(); ++slot) list_push_back(*slot);
}

void BlockCache::erase(UnkeyedRun unkeyed) {
  if (unkeyed.empty()) return;
  const Slot& s = slots_[unkeyed.slot];
  assert(s.touch_call == kRunSlot && s.prev == kNil && s.next == kNil && lru_head_ != unkeyed.slot &&
         lru_tail_ != unkeyed.slot);
  const auto blocks = static_cast<int64_t>(s.key);
  pinned_blocks_ -= blocks;
  unkeyed_blocks_ -= blocks;
  free_slots_.push_back(unkeyed.slot);
}

void BlockCache::unpin(std::span<const BlockKey> keys, UnkeyedRun unkeyed) {
  if (!unkeyed.empty()) {  // after the keys in the request: the least recent of them
    [[maybe_unused]] const Slot& s = slots_[unkeyed.slot];
    assert(s.touch_call == kRunSlot && s.prev == kNil && s.next == kNil && lru_head_ != unkeyed.slot &&
           lru_tail_ != unkeyed.slot);
    pinned_blocks_ -= static_cast<int64_t>(slots_[unkeyed.slot].key);
    list_push_back(unkeyed.slot);
  }
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
