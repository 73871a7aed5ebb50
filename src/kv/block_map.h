// A hash map from block key to per-block state, for the Conductor's index of cached blocks (BlockIndex), its
// per-instance ready times (conductor::ClusterState) and LRU block caches (BlockCache): open addressing with
// linear probing, so a lookup touches one or two cache lines and an insert allocates nothing but a table's
// growth. std::unordered_map spent most of a 32 KiB prompt's placement on its node allocations and pointer
// chasing (docs/benchmarks.md, "Router mode: routing overhead"). The keys are spread over 256 tables by their
// hash, so a table that doubles rehashes 1/256 of the entries: growing never stalls the caller for long (one
// table of half a million entries took 30 ms to double, a router's whole request path under its lock). A
// small map (one prefill instance's cache in a simulation: a few thousand blocks) uses one table, because 256
// tables of a few keys each round up to much more room than one table of them all (256 tables for 5,859 keys
// took 16,384 slots; one takes 8,192). It spreads over all 256 when it reaches kSpreadAtKeys (one rehash of
// 7,168 entries, well under a millisecond), or when reserved for more. Block keys are hashes already: a
// multiplicative mix of one picks its table and slot.
#pragma once

#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <ranges>
#include <type_traits>
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
    return table(key).find(key, mix(key));
  }
  const V* find(BlockKey key) const { return const_cast<BlockMap*>(this)->find(key); }

  /// Starts loading the slot `key` would be found in (a hint: for a loop over many keys, a few keys ahead).
  /// Always inlined: g++ 12 judges a function that only prefetches to have no effect and drops calls to it.
  [[gnu::always_inline]] void prefetch(BlockKey key) const {
    const uint64_t m = mix(key);
    const Table& t = tables_[table_of(m)];
    if (!t.slots.empty()) __builtin_prefetch(&t.slots[t.home(m)]);
  }

  /// The value of `key`, inserted as `value` when absent; whether it was inserted.
  std::pair<V*, bool> try_emplace(BlockKey key, V value) {
    if (key == kEmpty) {
      if (zero_) return {&*zero_, false};
      zero_.emplace(std::move(value));
      ++size_;
      return {&*zero_, true};
    }
    if (table_bits_ == 0 && size_ >= kSpreadAtKeys) spread_over_all_tables();
    auto inserted = table(key).try_emplace(key, mix(key), std::move(value));
    size_ += inserted.second;
    return inserted;
  }

  /// Removes `key`; whether it was there.
  bool erase(BlockKey key) {
    bool erased = false;
    if (key == kEmpty) {
      erased = zero_.has_value();
      zero_.reset();
    } else {
      erased = table(key).erase(key, mix(key));
    }
    size_ -= erased;
    return erased;
  }

  /// Sizes the tables to hold `entries` keys in all (those already in included) without growing (a table gets
  /// its share and room for the spread of the hash), and writes their memory now: a map that fills up to a
  /// known size then takes neither a table's doubling nor a page fault while it is being used (each fault a
  /// trip into the kernel). Room for fewer than kOneTableKeys keys is one table; for more, 256 (entries
  /// already in move to the tables their keys then pick). Lookups and inserts behave the same; only the order
  /// of for_each changes.
  void reserve(size_t entries) {
    if (entries > kOneTableKeys && table_bits_ == 0) {
      spread_over_all_tables();
    } else if (entries <= kOneTableKeys && size_ == 0 && table_bits_ != 0) {
      for (Table& t : tables_)
        t = Table{};  // an emptied map reserved small again: one table, its memory only
      table_bits_ = 0;
    }
    const size_t tables = size_t{1} << table_bits_;
    const double share = static_cast<double>(entries) / static_cast<double>(tables);
    // Keys per table are binomial around `share`: 4 standard deviations more cover every table in practice.
    const auto per_table = static_cast<size_t>(share + 4 * std::sqrt(share) + 8);
    for (size_t t = 0; t < tables; ++t) tables_[t].reserve(per_table);
  }

  /// Removes every entry (keeping the tables' memory).
  void clear() {
    for (Table& t : tables_) t.clear();
    zero_.reset();
    size_ = 0;
  }

  size_t size() const { return size_; }
  /// Slots over all tables, used or free: what the map's memory holds room for (a table grows by doubling
  /// its slots).
  size_t slot_count() const {
    size_t n = 0;
    for (const Table& t : tables_) n += t.slots.size();
    return n;
  }

  /// Calls f(key, value) for each entry, in no particular order. `f` must not insert or erase.
  template <typename F>
  void for_each(F&& f) const {
    if (zero_) f(kEmpty, *zero_);
    for (const Table& t : tables_) {
      for (const Slot& s : t.slots) {
        if (s.key != kEmpty) f(s.key, s.value);
      }
    }
  }

 private:
  static constexpr BlockKey kEmpty = 0;    // marks a free slot; key 0 itself lives in zero_
  static constexpr int kMaxTableBits = 8;  // 256 tables
  // A map of one table spreads over 256 when it reaches this many keys (7/8 of 8,192 slots), or when it is
  // reserved for more than kOneTableKeys.
  static constexpr size_t kSpreadAtKeys = 7168;
  static constexpr size_t kOneTableKeys = 4096;
  struct Slot {
    BlockKey key = kEmpty;
    [[no_unique_address]] V value{};  // a set's empty value takes no room: 8-byte slots
  };

  // One table: linear probing in a power-of-two array at most 7/8 full; a slot's home comes from bits of the
  // key's mix below those that pick the table.
  struct Table {
    std::vector<Slot> slots;
    size_t mask = 0;
    size_t size = 0;

    size_t home(uint64_t m) const { return static_cast<size_t>(m >> 20) & mask; }

    V* find(BlockKey key, uint64_t m) {
      if (slots.empty()) return nullptr;
      for (size_t i = home(m);; i = (i + 1) & mask) {
        if (slots[i].key == key) return &slots[i].value;
        if (slots[i].key == kEmpty) return nullptr;
      }
    }

    std::pair<V*, bool> try_emplace(BlockKey key, uint64_t m, V value) {
      if (V* found = find(key, m)) return {found, false};
      if ((size + 1) * 8 > slots.size() * 7) grow();
      size_t i = home(m);
      while (slots[i].key != kEmpty) i = (i + 1) & mask;
      slots[i].key = key;
      slots[i].value = std::move(value);
      ++size;
      return {&slots[i].value, true};
    }

    bool erase(BlockKey key, uint64_t m) {
      if (slots.empty()) return false;
      size_t i = home(m);
      for (;; i = (i + 1) & mask) {
        if (slots[i].key == key) break;
        if (slots[i].key == kEmpty) return false;
      }
      // Backward-shift deletion: later entries of the run that may live at the hole move into it, so no
      // tombstones are left. An entry may move back to i when its home is not in the cyclic range (i, j].
      for (size_t j = (i + 1) & mask; slots[j].key != kEmpty; j = (j + 1) & mask) {
        const size_t want = home(mix(slots[j].key));
        if (((j - want) & mask) >= ((j - i) & mask)) {
          slots[i] = std::move(slots[j]);
          i = j;
        }
      }
      slots[i].key = kEmpty;
      slots[i].value = V{};
      --size;
      return true;
    }

    void clear() {
      for (Slot& s : slots) {
        if (s.key != kEmpty) {
          s.key = kEmpty;
          s.value = V{};
        }
      }
      size = 0;
    }

    // Room for `entries` without growing (at most 7/8 full).
    void reserve(size_t entries) {
      size_t wanted = slots.empty() ? 8 : slots.size();
      while (entries * 8 > wanted * 7) wanted *= 2;
      if (wanted > slots.size()) rehash(wanted);
    }

    void grow() { rehash(slots.empty() ? 8 : slots.size() * 2); }

    // Moves the entries to a table of `count` slots (a power of two, more than the entries).
    void rehash(size_t count) {
      std::vector<Slot> old = std::move(slots);
      slots = std::vector<Slot>(count);
      mask = slots.size() - 1;
      for (Slot& s : old) {
        if (s.key == kEmpty) continue;
        size_t i = home(mix(s.key));
        while (slots[i].key != kEmpty) i = (i + 1) & mask;
        slots[i] = std::move(s);
      }
    }
  };

  static uint64_t mix(BlockKey key) { return key * 0x9E3779B97F4A7C15ull; }
  // The top table_bits_ bits of the mix (none: table 0).
  size_t table_of(uint64_t m) const { return static_cast<size_t>((m >> 1) >> (63 - table_bits_)); }
  Table& table(BlockKey key) { return tables_[table_of(mix(key))]; }

  // Moves every entry of the one table into the table its key picks among 256 (a small map that grew, or is
  // reserved for more). REQUIRES: table_bits_ == 0.
  void spread_over_all_tables() {
    std::vector<Slot> entries;
    entries.reserve(size_);
    for (Slot& slot : tables_[0].slots) {
      if (slot.key != kEmpty) entries.push_back(std::move(slot));
    }
    tables_[0] = Table{};
    table_bits_ = kMaxTableBits;
    for (Slot& slot : entries) table(slot.key).try_emplace(slot.key, mix(slot.key), std::move(slot.value));
  }

  std::array<Table, size_t{1} << kMaxTableBits> tables_;
  int table_bits_ = 0;  // tables in use: the first 2^table_bits_ (0: one table, or 8: all 256)
  size_t size_ = 0;
  std::optional<V> zero_;
};

/// How many keys ahead of a loop over a request's keys their lookups are started (for_each_prefetched).
inline constexpr size_t kPrefetchAheadKeys = 8;

/// Calls visit(key) for each key of `keys` (a random-access range of BlockKey), in order, having started
/// loading where each of `maps` keeps the key (their prefetch(key): BlockMap, BlockIndex) kPrefetchAheadKeys
/// keys earlier: a loop over a request's keys in maps of megabytes then waits on memory for several keys at
/// once instead of one after another (a DRAM miss is ~250 ns here; docs/benchmarks.md). A `visit` that
/// returns bool stops the walk by returning false.
template <std::ranges::random_access_range Keys, typename Visit, typename... Maps>
void for_each_prefetched(Keys&& keys, Visit&& visit, const Maps&... maps) {
  const auto n = static_cast<size_t>(std::ranges::size(keys));
  const auto first = std::ranges::begin(keys);
  for (size_t i = 0; i < std::min(n, kPrefetchAheadKeys); ++i) (maps.prefetch(first[i]), ...);
  for (size_t i = 0; i < n; ++i) {
    if (i + kPrefetchAheadKeys < n) (maps.prefetch(first[i + kPrefetchAheadKeys]), ...);
    using Returns = decltype(visit(first[i]));
    static_assert(std::is_void_v<Returns> || std::is_same_v<Returns, bool>,
                  "visit returns nothing, or bool to say whether to go on");
    if constexpr (std::is_same_v<Returns, bool>) {
      if (!visit(first[i])) return;
    } else {
      visit(first[i]);
    }
  }
}

}  // namespace crescent::kv
