// The token ids of long texts, found again by the start of another text (issue 24 §4). Prompts that share a
// long start (a system prompt, a document asked about again, a conversation's earlier turns) are tokenized up
// to a cut the tokenizer vouches for once, and only the rest is tokenized again. The cache knows nothing of
// tokenizing: where a text may be cut is the tokenizer's word (SplitPattern::cut_after in split_pattern.cpp
// says why the cuts hold; hf_tokenizer.cpp takes them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace crescent::model {

/// A place a text can be cut: ids [0, id_count) are the ids of bytes [0, text_bytes) of every text that
/// starts with the same text_bytes + margin bytes (TokenPrefixCache's margin). text_bytes 0: no cut.
struct TextCut {
  uint32_t text_bytes = 0;
  uint32_t id_count = 0;
  bool operator==(const TextCut&) const = default;
};

/// Texts and their ids, found by the longest start another text shares with one of them (the cache's
/// checkpoints: every kChunkBytes of a kept text), or by the whole text. Bounded in bytes, least recently
/// used dropped first. Thread-safe (one mutex, held while looking up and while copying ids out).
class TokenPrefixCache {
 public:
  /// The checkpoints of a kept text are at every multiple of this many bytes.
  static constexpr size_t kChunkBytes = 1024;
  /// Texts shorter than this are neither looked up nor kept (they have no checkpoint).
  static constexpr size_t kMinTextBytes = kChunkBytes;
  /// Nor are texts longer than this (a cut counts bytes and ids in 32 bits).
  static constexpr size_t kMaxTextBytes = size_t{1} << 30;

  /// `capacity_bytes`: texts, ids (4 bytes each) and cuts kept; a text of more than an eighth of it is not
  /// kept. `margin_bytes`: how many bytes past a cut two texts must agree for the cut to hold in both.
  TokenPrefixCache(size_t capacity_bytes, size_t margin_bytes);

  /// A text's keys: of each of its checkpoints (a hash of the bytes before it, chained chunk to chunk) and
  /// of the whole text. Computed once per text for find() and insert().
  struct TextKeys {
    std::vector<uint64_t> checkpoints;  // index k: checkpoint (k + 1) * kChunkBytes
    uint64_t whole = 0;
  };
  static TextKeys keys_of(std::string_view text);

  /// What find() matched.
  struct Match {
    bool whole = false;  // the text itself is kept: all its ids were appended
    TextCut cut;         // else: the ids of text[0, cut.text_bytes) were appended (text_bytes 0: nothing)
    /// The kept text's cuts at the checkpoints `text` shares with it, in order (index k: checkpoint
    /// (k + 1) * kChunkBytes); they hold for `text` too. Empty on a whole match or no match.
    std::vector<TextCut> cuts;
  };

  /// Appends to `ids` the ids of the longest start of `text` a kept text vouches for: all of it when `text`
  /// itself is kept, else up to the cut of the last checkpoint `text` shares with a kept text. Byte-exact
  /// (the kept text is compared, not only hashed).
  /// `keys`: keys_of(text).
  Match find(std::string_view text, const TextKeys& keys, std::vector<int64_t>& ids);

  /// Keeps `text` (its `keys`: keys_of(text)) and its `ids` (each in [0, 2^31)). `cuts[k]` is its cut for
  /// checkpoint (k + 1) * kChunkBytes, with text_bytes + margin <= that checkpoint ({0, 0}: none);
  /// cuts.size() must be text.size() / kChunkBytes, else nothing is kept (nor is a text outside
  /// [kMinTextBytes, kMaxTextBytes]). This text becomes the one each of its checkpoints finds; when an equal
  /// text is kept already, that one only becomes the most recently used.
  void insert(std::string_view text, TextKeys keys, std::span<const int64_t> ids, std::vector<TextCut> cuts);

  /// Counts since construction, for tests and metrics.
  struct Stats {
    uint64_t whole_hits = 0;
    uint64_t prefix_hits = 0;
    uint64_t misses = 0;
    uint64_t entries = 0;
    uint64_t bytes = 0;
  };
  Stats stats() const;

 private:
  struct Entry {
    std::string text;
    std::vector<int32_t> ids;
    std::vector<TextCut> cuts;
    TextKeys keys;  // its checkpoints' are registered only where the cut is not {0, 0}
    size_t bytes = 0;
  };
  using Lru = std::list<Entry>;
  struct Slot {
    Lru::iterator entry;
    uint32_t checkpoint = 0;
  };

  void evict_locked();

  const size_t capacity_bytes_;
  const size_t margin_bytes_;
  mutable std::mutex mu_;
  Lru lru_;  // most recently used first
  std::unordered_map<uint64_t, Lru::iterator> whole_;
  std::unordered_map<uint64_t, Slot> checkpoints_;
  size_t bytes_ = 0;
  Stats stats_;
};

}  // namespace crescent::model
