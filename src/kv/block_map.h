// A hash map from block key to per-block state, for the Conductor's index of cached blocks (BlockIndex), its
// per-instance ready times (conductor::ClusterState) and LRU block caches (BlockCache): open addressing with
// linear probing in one array, so a lookup touches one or two cache lines and an insert allocates nothing but
// the array's growth. std::unordered_map spent most of a 32 KiB prompt's placement on its node allocations
// and pointer chasing (docs/benchmarks.md, "Router mode: routing overhead"). Block keys are hashes already: a
// multiplicative mix of one picks its slot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "kv/block_key.h"

namespace crescent::kv {

/// Map from BlockKey to V (default-constructible, movable). Not thread-safe. Pointers and references into it
/// are valid until the next try_emplace or erase.
template <typename V>
class BlockMap {
 public:
  /// The value of `key`, or nullptr.
  V* find(BlockKey key) {
    if (key == kEmpty) return zero_ ? &*zero_ : nullptr;
    if (slots_.empty()) return nullptr;
    for (size_t i = home(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i].value;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }
  const V* find(BlockKey key) const { return const_cast<BlockMap*>(this)->find(key); }

  /// Starts loading the slot `key` would be found in (a hint: for a loop over many keys, a few keys ahead).
  void prefetch(BlockKey key) const {
    if (!slots_.empty()) __builtin_prefetch(&slots_[home(key)]);
  }

  /// The value of `key`, inserted as `value` when absent; whether it was inserted.
  std::pair<V*, bool> try_emplace(BlockKey key, V value) {
    if (key == kEmpty) {
      if (zero_) return {&*zero_, false};
      zero_.emplace(std::move(value));
      ++size_;
      return {&*zero_, true};
    }
    if (V* found = find(key)) return {found, false};
    if ((size_ + 1) * 8 > slots_.size() * 7) grow();  // at most 7/8 full
    size_t i = home(key);
    while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
    slots_[i].key = key;
    slots_[i].value = std::move(value);
    ++size_;
    return {&slots_[i].value, true};
  }

  /// Removes `key`; whether it was there.
  bool erase(BlockKey key) {
    if (key == kEmpty) {
      if (!zero_) return false;
      zero_.reset();
      --size_;
      return true;
    }
    if (slots_.empty()) return false;
    size_t i = home(key);
    for (;; i = (i + 1) & mask_) {
      if (slots_[i].key == key) break;
      if (slots_[i].key == kEmpty) return false;
    }
    // Backward-shift deletion: later entries of the run that could live at the hole move into it, so no
    // tombstones are left.
    for (size_t j = (i + 1) & mask_; slots_[j].key != kEmpty; j = (j + 1) & mask_) {
      const size_t want = home(slots_[j].key);
      // slots_[j] may move to i when its home is not in the cyclic range (i, j].
      if (((j - want) & mask_) >= ((j - i) & mask_)) {
        slots_[i] = std::move(slots_[j]);
        i = j;
      }
    }
    slots_[i].key = kEmpty;
    slots_[i].value = V{};
    --size_;
    return true;
  }

  /// Removes every entry (keeping the array).
  void clear() {
    for (Slot& s : slots_) {
      if (s.key != kEmpty) {
        s.key = kEmpty;
        s.value = V{};
      }
    }
    zero_.reset();
    size_ = 0;
  }

  size_t size() const { return size_; }

  /// Calls f(key, value) for each entry, in no particular order. `f` must not insert or erase.
  template <typename F>
  void for_each(F&& f) const {
    if (zero_) f(kEmpty, *zero_);
    for (const Slot& s : slots_) {
      if (s.key != kEmpty) f(s.key, s.value);
    }
  }

 private:
  static constexpr BlockKey kEmpty = 0;  // marks a free slot; key 0 itself lives in zero_
  struct Slot {
    BlockKey key = kEmpty;
    V value{};
  };

  size_t home(BlockKey key) const { return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_; }

  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_ = std::vector<Slot>(old.empty() ? 16 : old.size() * 2);
    mask_ = slots_.size() - 1;
    for (Slot& s : old) {
      if (s.key == kEmpty) continue;
      size_t i = home(s.key);
      while (slots_[i].key != kEmpty) i = (i + 1) & mask_;
      slots_[i] = std::move(s);
    }
  }

  std::vector<Slot> slots_;
  size_t mask_ = 0;
  size_t size_ = 0;
  std::optional<V> zero_;
};

}  // namespace crescent::kv
