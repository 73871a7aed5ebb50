#include "model/token_prefix_cache.h"

#include <xxhash.h>

#include <cstring>

namespace crescent::model {

namespace {

constexpr uint64_t kWholeSeed = 0x9E3779B97F4A7C15ULL;  // keeps whole-text keys apart from checkpoint keys

// What an entry costs beyond its bytes: the list node, its keys in the two maps.
constexpr size_t kEntryOverheadBytes = 256;
constexpr size_t kKeyOverheadBytes = 48;

}  // namespace

TokenPrefixCache::TokenPrefixCache(size_t capacity_bytes, size_t margin_bytes)
    : capacity_bytes_(capacity_bytes), margin_bytes_(margin_bytes) {}

TokenPrefixCache::TextKeys TokenPrefixCache::keys_of(std::string_view text) {
  TextKeys keys;
  keys.checkpoints.resize(text.size() / kChunkBytes);
  uint64_t key = 0;
  for (size_t k = 0; k < keys.checkpoints.size(); ++k) {
    key = XXH3_64bits_withSeed(text.data() + k * kChunkBytes, kChunkBytes, key);
    keys.checkpoints[k] = key;
  }
  // The whole text's: the chunks' chain and the bytes after the last checkpoint (XXH3 mixes in their length).
  const size_t tail = keys.checkpoints.size() * kChunkBytes;
  keys.whole = XXH3_64bits_withSeed(text.data() + tail, text.size() - tail, key ^ kWholeSeed);
  return keys;
}

TokenPrefixCache::Match TokenPrefixCache::find(std::string_view text, const TextKeys& keys,
                                               std::vector<int64_t>& ids) {
  Match match;
  if (text.size() < kMinTextBytes || text.size() > kMaxTextBytes ||
      keys.checkpoints.size() != text.size() / kChunkBytes) {
    return match;
  }
  std::lock_guard lock(mu_);
  if (auto it = whole_.find(keys.whole); it != whole_.end() && it->second->text == text) {
    const Entry& entry = *it->second;
    ids.insert(ids.end(), entry.ids.begin(), entry.ids.end());
    lru_.splice(lru_.begin(), lru_, it->second);
    match.whole = true;
    ++stats_.whole_hits;
    return match;
  }
  for (size_t k = keys.checkpoints.size(); k-- > 0;) {
    auto it = checkpoints_.find(keys.checkpoints[k]);
    if (it == checkpoints_.end() || it->second.checkpoint != k) continue;
    const Entry& entry = *it->second.entry;
    const size_t shared = (k + 1) * kChunkBytes;
    if (entry.text.size() < shared || std::memcmp(entry.text.data(), text.data(), shared) != 0) continue;
    match.cut = entry.cuts[k];
    match.cuts.assign(entry.cuts.begin(), entry.cuts.begin() + static_cast<std::ptrdiff_t>(k + 1));
    ids.insert(ids.end(), entry.ids.begin(), entry.ids.begin() + match.cut.id_count);
    lru_.splice(lru_.begin(), lru_, it->second.entry);
    ++stats_.prefix_hits;
    return match;
  }
  ++stats_.misses;
  return match;
}

void TokenPrefixCache::insert(std::string_view text, TextKeys keys, std::span<const int64_t> ids,
                              std::vector<TextCut> cuts) {
  const size_t checkpoints = text.size() / kChunkBytes;
  if (text.size() < kMinTextBytes || text.size() > kMaxTextBytes || cuts.size() != checkpoints ||
      keys.checkpoints.size() != checkpoints) {
    return;
  }
  Entry entry;
  entry.keys = std::move(keys);
  size_t registered = 0;
  for (size_t k = 0; k < cuts.size(); ++k) {
    const size_t checkpoint = (k + 1) * kChunkBytes;
    if (cuts[k].text_bytes == 0 || cuts[k].text_bytes + margin_bytes_ > checkpoint ||
        cuts[k].id_count > ids.size()) {
      cuts[k] = {};  // none (or not one this cache can vouch for)
    } else {
      ++registered;
    }
  }
  entry.bytes = text.size() + ids.size() * sizeof(int32_t) +
                cuts.size() * (sizeof(TextCut) + sizeof(uint64_t)) + kEntryOverheadBytes +
                registered * kKeyOverheadBytes;
  if (entry.bytes > capacity_bytes_ / 8) return;
  entry.text.assign(text);
  entry.ids.assign(ids.begin(), ids.end());
  entry.cuts = std::move(cuts);

  std::lock_guard lock(mu_);
  if (auto it = whole_.find(entry.keys.whole); it != whole_.end() && it->second->text == text) {
    lru_.splice(lru_.begin(), lru_, it->second);  // kept already (another thread tokenized it meanwhile)
    return;
  }
  lru_.push_front(std::move(entry));
  const Lru::iterator kept = lru_.begin();
  bytes_ += kept->bytes;
  whole_[kept->keys.whole] = kept;
  for (size_t k = 0; k < kept->cuts.size(); ++k) {
    if (kept->cuts[k].text_bytes != 0)
      checkpoints_[kept->keys.checkpoints[k]] = Slot{kept, static_cast<uint32_t>(k)};
  }
  evict_locked();
}

void TokenPrefixCache::evict_locked() {
  while (bytes_ > capacity_bytes_ && !lru_.empty()) {
    const Lru::iterator last = std::prev(lru_.end());
    if (auto it = whole_.find(last->keys.whole); it != whole_.end() && it->second == last) whole_.erase(it);
    for (size_t k = 0; k < last->keys.checkpoints.size(); ++k) {
      if (last->cuts[k].text_bytes == 0) continue;  // not registered
      auto it = checkpoints_.find(last->keys.checkpoints[k]);
      if (it != checkpoints_.end() && it->second.entry == last) checkpoints_.erase(it);
    }
    bytes_ -= last->bytes;
    lru_.erase(last);
  }
}

TokenPrefixCache::Stats TokenPrefixCache::stats() const {
  std::lock_guard lock(mu_);
  Stats s = stats_;
  s.entries = lru_.size();
  s.bytes = bytes_;
  return s;
}

}  // namespace crescent::model
