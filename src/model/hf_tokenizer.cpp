#include "model/hf_tokenizer.h"

#include <fmt/format.h>
#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <xxhash.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <span>
#include <sstream>
#include <unordered_map>

#include "common/utf8.h"
#include "model/split_pattern.h"
#include "model/token_prefix_cache.h"

namespace crescent::model {
namespace {

using nlohmann::json;

// GPT-2's bytes_to_unicode: each byte stands for one printable code point in the vocab's strings (the
// printable Latin-1 bytes for themselves, the others for U+0100 on, in order).
std::array<char32_t, 256> byte_to_code_point() {
  std::array<char32_t, 256> map{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
    map[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return map;
}

// The length of the well-formed UTF-8 sequence at s[i], or 0 when it is ill-formed; `*maximal` gets the
// length of the maximal subpart to replace by one U+FFFD (Unicode §3.9, the WHATWG decoder's rule: at least
// 1).
size_t utf8_sequence(std::string_view s, size_t i, size_t* maximal) {
  const auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = byte(i);
  *maximal = 1;
  if (c < 0x80) return 1;
  size_t need;
  unsigned char lo = 0x80, hi = 0xBF;
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return 0;
    const unsigned char b = byte(i + k);
    if (b < (k == 1 ? lo : 0x80) || b > (k == 1 ? hi : 0xBF)) return 0;
    *maximal = k + 1;
  }
  return need + 1;
}

// `text` with each maximal ill-formed subsequence replaced by U+FFFD; `text` itself when it is valid.
std::string_view valid_utf8(std::string_view text, std::string& storage) {
  size_t i = 0;
  size_t maximal = 0;
  while (i < text.size()) {
    uint64_t eight = 0;
    if (i + 8 <= text.size() &&
        (std::memcpy(&eight, text.data() + i, 8), (eight & 0x8080808080808080ull) == 0)) {
      i += 8;  // eight ASCII bytes
      continue;
    }
    const unsigned char c = static_cast<unsigned char>(text[i]);
    if (c < 0x80) {
      ++i;
      continue;
    }
    const size_t n = utf8_sequence(text, i, &maximal);
    if (n == 0) break;
    i += n;
  }
  if (i == text.size()) return text;
  storage.assign(text.substr(0, i));
  while (i < text.size()) {
    const size_t n = utf8_sequence(text, i, &maximal);
    if (n == 0) {
      storage += "\xEF\xBF\xBD";
      i += maximal;
    } else {
      storage.append(text.substr(i, n));
      i += n;
    }
  }
  return storage;
}

// Strings keyed by their bytes, looked up by string_view without a copy.
struct BytesHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using BytesMap = std::unordered_map<std::string, int32_t, BytesHash, std::equal_to<>>;

// The model's vocabulary maps strings of byte-level code points; crescent keeps ids by their bytes.
constexpr int32_t kNone = -1;

uint64_t pair_key(int32_t left, int32_t right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

struct Merge {
  int32_t rank;
  int32_t merged_id;
};

// Merges by (left id, right id): open addressing, linear probing, a power-of-two table at most half full.
// std::unordered_map spent a third of encode's time in its bucket arithmetic.
class MergeTable {
 public:
  void reserve(size_t n) {
    size_t capacity = 16;
    while (capacity < 2 * n) capacity *= 2;
    slots_.assign(capacity, Slot{kEmpty, {}});
    mask_ = capacity - 1;
  }
  // A pair listed twice keeps its last rank, as HF's (Rust HashMap collect) and the oracle's (JS Map) do.
  void insert(uint64_t key, Merge merge) {
    for (size_t i = index(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) {
        slots_[i].merge = merge;
        return;
      }
      if (slots_[i].key == kEmpty) {
        slots_[i] = {key, merge};
        return;
      }
    }
  }
  const Merge* find(uint64_t key) const {
    for (size_t i = index(key);; i = (i + 1) & mask_) {
      if (slots_[i].key == key) return &slots_[i].merge;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};  // ids are >= 0: no pair has this key
  struct Slot {
    uint64_t key;
    Merge merge;
  };
  size_t index(uint64_t key) const {
    return static_cast<size_t>((key * 0x9E3779B97F4A7C15ull) >> 20) & mask_;
  }
  std::vector<Slot> slots_;
  size_t mask_ = 0;
};

// Added tokens in a byte trie: leftmost-longest match, as HF's aho-corasick (MatchKind::LeftmostLongest).
struct AddedToken {
  std::string content;
  int32_t id;
  bool lstrip, rstrip, special;
};

class Trie {
 public:
  void insert(std::string_view s, int32_t value) {
    int32_t node = 0;
    for (unsigned char c : s) {
      auto& child = nodes_[node].next[c];
      if (child == 0) {
        child = static_cast<int32_t>(nodes_.size());
        nodes_.emplace_back();
      }
      node = nodes_[node].next[c];  // nodes_ may have moved
    }
    nodes_[node].value = value;
    const auto first = static_cast<unsigned char>(s[0]);
    if (!first_bytes_[first]) {
      first_bytes_[first] = true;
      first_byte_count_ += 1;
      a_first_byte_ = first;
    }
  }
  // The first position from `i` on where a key may start (text.size() when none): memchr when every key
  // starts with the same byte (Llama 3's and Qwen's added tokens all start with '<').
  size_t next_start(std::string_view text, size_t i) const {
    if (first_byte_count_ == 0) return text.size();
    if (first_byte_count_ == 1) {
      const void* at =
          i < text.size() ? std::memchr(text.data() + i, a_first_byte_, text.size() - i) : nullptr;
      return at == nullptr ? text.size() : static_cast<size_t>(static_cast<const char*>(at) - text.data());
    }
    while (i < text.size() && !first_bytes_[static_cast<unsigned char>(text[i])]) ++i;
    return i;
  }
  // The value and length of the longest key at text[i], or {kNone, 0}.
  std::pair<int32_t, size_t> longest(std::string_view text, size_t i) const {
    int32_t node = 0;
    std::pair<int32_t, size_t> best{kNone, 0};
    for (size_t k = i; k < text.size(); ++k) {
      auto it = nodes_[node].next.find(static_cast<unsigned char>(text[k]));
      if (it == nodes_[node].next.end()) break;
      node = it->second;
      if (nodes_[node].value != kNone) best = {nodes_[node].value, k + 1 - i};
    }
    return best;
  }

 private:
  struct Node {
    std::unordered_map<unsigned char, int32_t> next;
    int32_t value = kNone;
  };
  std::vector<Node> nodes_ = std::vector<Node>(1);
  std::array<bool, 256> first_bytes_{};
  int first_byte_count_ = 0;        // distinct first bytes of the keys
  unsigned char a_first_byte_ = 0;  // one of them
};

// Unicode's White_Space property (what HF's Rust char::is_whitespace and JS's trim take off for
// lstrip/rstrip).
bool is_white_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// The code point of the valid UTF-8 sequence of `n` bytes at s[i].
char32_t decode_at(std::string_view s, size_t i, size_t n) {
  char32_t c = static_cast<unsigned char>(s[i]);
  if (n == 1) return c;
  c &= (0xFF >> (n + 1));
  for (size_t k = 1; k < n; ++k) c = (c << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return c;
}

// Bytes of white space in valid UTF-8 `s` from `i` on (rstrip), or ending at `end` (lstrip).
size_t white_space_after(std::string_view s, size_t i) {
  size_t at = i, maximal = 0;
  while (at < s.size()) {
    const size_t n = utf8_sequence(s, at, &maximal);
    if (n == 0 || !is_white_space(decode_at(s, at, n))) break;
    at += n;
  }
  return at - i;
}
size_t white_space_before(std::string_view s, size_t begin, size_t end) {
  size_t at = end, maximal = 0;
  while (at > begin) {
    size_t start = at - 1;
    while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    const size_t n = utf8_sequence(s, start, &maximal);
    if (n != at - start || !is_white_space(decode_at(s, start, n))) break;
    at = start;
  }
  return end - at;
}

std::atomic<uint64_t> next_serial{1};

class HuggingFaceTokenizer final : public Tokenizer {
 public:
  static Result<std::unique_ptr<Tokenizer>> load(const std::string& path, size_t prefix_cache_bytes);

  std::vector<int64_t> encode(std::string_view raw) const override {
    std::vector<int64_t> ids;
    ids.reserve(raw.size() / 3 + 8);  // English runs ~4 bytes a token
    std::string storage;
    const std::string_view text = valid_utf8(raw, storage);
    // Added tokens first, on the raw text: the sections between them go through the pipeline.
    size_t section_start = 0;
    size_t i = 0;
    while ((i = added_.next_start(text, i)) < text.size()) {
      const auto [index, length] = added_.longest(text, i);
      if (index == kNone) {
        ++i;
        continue;
      }
      const AddedToken& token = added_tokens_[index];
      size_t end = i;
      if (token.lstrip) {
        end -= white_space_before(text, section_start, end);
      }
      encode_section(text.substr(section_start, end - section_start), ids);
      ids.push_back(token.id);
      i += length;
      if (token.rstrip) {
        i += white_space_after(text, i);
      }
      section_start = i;
    }
    encode_section(text.substr(section_start), ids);
    return ids;
  }

  std::string token_bytes(int64_t id) const override {
    return id >= 0 && id < static_cast<int64_t>(bytes_.size()) ? bytes_[id] : std::string();
  }
  std::optional<int64_t> eos_token() const override { return eos_; }
  int64_t vocab_size() const override { return static_cast<int64_t>(bytes_.size()); }
  std::string_view kind() const override { return "huggingface"; }

  std::optional<TokenPrefixCache::Stats> prefix_cache_stats() const {
    if (prefix_cache_ == nullptr) return std::nullopt;
    return prefix_cache_->stats();
  }

 private:
  // A section of text between added tokens: normalize, pre-tokenize, BPE each piece.
  void encode_section(std::string_view section, std::vector<int64_t>& ids) const {
    if (section.empty()) return;
    std::string normalized;
    if (nfc_ && needs_nfc(section)) {
      UErrorCode status = U_ZERO_ERROR;
      icu::StringByteSink<std::string> sink(&normalized);
      nfc_->normalizeUTF8(0, icu::StringPiece(section.data(), static_cast<int32_t>(section.size())), sink,
                          nullptr, status);
      if (U_SUCCESS(status)) section = normalized;  // valid UTF-8 in: ICU does not fail
    }
    if (prefix_cache_ != nullptr && section.size() >= TokenPrefixCache::kMinTextBytes &&
        section.size() <= TokenPrefixCache::kMaxTextBytes) {
      encode_section_cached(section, ids);
      return;
    }
    // The pieces' views, kept by the thread: a 32 KiB prompt has ~8,000 of them.
    thread_local std::vector<std::string_view> pieces, next;
    pieces.assign(1, section);
    for (const SplitPattern& split : splits_) {
      next.clear();
      for (std::string_view piece : pieces) split.split(piece, next);
      pieces.swap(next);
    }
    encode_words(pieces, ids);
  }

  // A long section (normalized) through the prefix cache: the ids of its longest start a section seen before
  // vouches for, then the rest pre-tokenized and encoded from that cut, and the section kept with a cut for
  // each of its checkpoints (the last piece end SplitPattern::cut_after takes at least kCutLookaheadBytes
  // before it). Sections are encoded independently of one another, so a section's ids depend on its bytes
  // alone, and the cache is keyed by the section, not the prompt.
  void encode_section_cached(std::string_view section, std::vector<int64_t>& ids) const {
    constexpr size_t kChunk = TokenPrefixCache::kChunkBytes;
    constexpr size_t kLookahead = SplitPattern::kCutLookaheadBytes;
    const size_t first = ids.size();
    TokenPrefixCache::TextKeys keys = TokenPrefixCache::keys_of(section);
    TokenPrefixCache::Match match = prefix_cache_->find(section, keys, ids);
    if (match.whole) return;
    const size_t start = match.cut.text_bytes;
    thread_local std::vector<std::string_view> pieces;
    thread_local std::vector<uint32_t> piece_ends;
    pieces.clear();
    splits_[0].split(section.substr(start), pieces);
    encode_words(pieces, ids, &piece_ends);

    // The cuts of the checkpoints after the matched ones, from the pieces' ends: each takes the last piece
    // end SplitPattern::cut_after takes at least kLookahead bytes before it, found looking back from the
    // first piece that ends too late (few pieces back, and never below where the last search began).
    std::vector<TextCut> cuts = std::move(match.cuts);
    const size_t checkpoints = section.size() / kChunk;
    size_t k = cuts.size();  // the next checkpoint: (k + 1) * kChunk
    cuts.resize(checkpoints);
    TextCut last = match.cut;  // the last cut found ({0, 0}: none)
    size_t searched = 0;       // pieces below this were searched for `last`
    size_t end = start;        // the end of piece i in the section
    for (size_t i = 0; i < pieces.size() && k < checkpoints; ++i) {
      const size_t before = end;
      end += pieces[i].size();
      if ((k + 1) * kChunk >= end + kLookahead) continue;
      size_t cut_end = before;
      for (size_t j = i; j-- > searched;) {
        if (splits_[0].cut_after(pieces[j])) {
          last = TextCut{static_cast<uint32_t>(cut_end), static_cast<uint32_t>(piece_ends[j] - first)};
          break;
        }
        cut_end -= pieces[j].size();
      }
      searched = i;
      for (; k < checkpoints && (k + 1) * kChunk < end + kLookahead; ++k) cuts[k] = last;
    }
    prefix_cache_->insert(section, std::move(keys), std::span(ids).subspan(first), std::move(cuts));
  }

  // Code points below U+0300 are NFC and never combine with what follows: text of only those is left as is.
  static bool needs_nfc(std::string_view s) {
    for (unsigned char c : s) {
      if (c >= 0xCC) return true;
    }
    return false;
  }

  // A word (a pre-tokenized piece) and its ids in this thread's word cache: 32 bytes, two to a cache line.
  // Words longer than kMaxWordBytes (0.2% of English text's pieces), or of more than kMaxIds ids, go to the
  // long-word cache.
  struct CachedWord {
    static constexpr size_t kMaxWordBytes = 14;
    static constexpr size_t kMaxIds = 3;
    uint32_t tag = 0;  // the high half of the word's hash with its low bit set; 0: an empty slot
    uint8_t word_bytes = 0;
    uint8_t id_count = 0;
    char word[kMaxWordBytes];
    int32_t ids[kMaxIds];
  };
  static_assert(sizeof(CachedWord) == 32);
  // The word cache is 2-way set-associative, a set one cache line (a word missing from its set takes the
  // first way, the first way's word moves to the second): 32,768 sets, 65,536 words, 2 MiB per thread and
  // tokenizer.
  struct alignas(64) CacheSet {
    CachedWord way[2];
  };
  static constexpr size_t kCacheSets = 1 << 15;
  // Longer words (up to kMaxLongWordBytes: a CJK clause is one piece) and words of many ids go to a second,
  // direct-mapped cache of kLongWords.
  struct LongWord {
    std::string word;
    std::vector<int32_t> ids;
  };
  static constexpr size_t kMaxLongWordBytes = 256;
  static constexpr size_t kLongWords = 1 << 12;
  struct WordCache {
    std::unique_ptr<CacheSet[]> sets = std::make_unique<CacheSet[]>(kCacheSets);
    std::vector<LongWord> long_words = std::vector<LongWord>(kLongWords);
  };
  // Words are hashed and their sets prefetched this many at a time before they are looked up, so the
  // lookups of a long prompt's words wait on memory together.
  static constexpr size_t kPrefetchWords = 256;

  // This thread's word cache for this tokenizer: bounded memory, and per thread, so encode() takes no lock; a
  // thread keeps the caches of the last 4 tokenizers it used.
  WordCache& word_cache() const {
    thread_local std::vector<std::pair<uint64_t, std::unique_ptr<WordCache>>> caches;
    thread_local WordCache* cache = nullptr;
    thread_local uint64_t cache_serial = 0;
    if (cache == nullptr || cache_serial != serial_) {
      auto it = std::find_if(caches.begin(), caches.end(), [&](const auto& c) { return c.first == serial_; });
      if (it == caches.end()) {
        if (caches.size() >= 4) caches.erase(caches.begin());
        caches.emplace_back(serial_, std::make_unique<WordCache>());
        it = caches.end() - 1;
      }
      cache = it->second.get();
      cache_serial = serial_;
    }
    return *cache;
  }

  // The ids of pre-tokenized pieces `words`, appended in order; with `ends`, ends[i] is ids.size() after
  // words[i].
  void encode_words(std::span<const std::string_view> words, std::vector<int64_t>& ids,
                    std::vector<uint32_t>* ends = nullptr) const {
    WordCache& cache = word_cache();
    if (ends != nullptr) ends->resize(words.size());
    std::array<uint64_t, kPrefetchWords> hashes;  // 0: not cacheable
    for (size_t first = 0; first < words.size(); first += kPrefetchWords) {
      const size_t n = std::min(kPrefetchWords, words.size() - first);
      for (size_t k = 0; k < n; ++k) {
        const std::string_view word = words[first + k];
        hashes[k] = 0;
        if (word.empty() || word.size() > CachedWord::kMaxWordBytes) continue;
        hashes[k] = XXH3_64bits(word.data(), word.size()) | (uint64_t{1} << 32);
        __builtin_prefetch(&cache.sets[hashes[k] & (kCacheSets - 1)]);
      }
      for (size_t k = 0; k < n; ++k) {
        encode_word(words[first + k], hashes[k], cache, ids);
        if (ends != nullptr) (*ends)[first + k] = static_cast<uint32_t>(ids.size());
      }
    }
  }

  // One piece's ids appended: from the word cache when it has them (`hash`: the piece's hash, 0 when it is
  // too long for the first cache), else from the vocab or BPE, then cached.
  void encode_word(std::string_view word, uint64_t hash, WordCache& cache, std::vector<int64_t>& ids) const {
    if (word.empty()) return;
    CacheSet* set = nullptr;
    const auto tag = static_cast<uint32_t>(hash >> 32);
    if (hash != 0) {
      set = &cache.sets[hash & (kCacheSets - 1)];
      for (const CachedWord& c : set->way) {
        if (c.tag == tag && c.word_bytes == word.size() &&
            std::memcmp(c.word, word.data(), word.size()) == 0) {
          if (c.id_count == 1) {
            ids.push_back(c.ids[0]);  // most words are one token
          } else {
            ids.insert(ids.end(), c.ids, c.ids + c.id_count);
          }
          return;
        }
      }
    }
    LongWord* long_word = nullptr;
    if (word.size() <= kMaxLongWordBytes) {
      const uint64_t long_hash = hash != 0 ? hash : XXH3_64bits(word.data(), word.size());
      long_word = &cache.long_words[(long_hash >> 7) & (kLongWords - 1)];
      if (!long_word->ids.empty() && long_word->word == word) {
        ids.insert(ids.end(), long_word->ids.begin(), long_word->ids.end());
        return;
      }
    }
    const size_t first = ids.size();
    bool whole = false;
    if (ignore_merges_) {  // Llama 3: a piece that is a token is that token, whatever the merges would make
      auto it = vocab_by_bytes_.find(word);
      if (it != vocab_by_bytes_.end()) {
        ids.push_back(it->second);
        whole = true;
      }
    }
    if (!whole) bpe(word, ids);
    const size_t count = ids.size() - first;
    if (set != nullptr && count <= CachedWord::kMaxIds) {
      set->way[1] = set->way[0];
      CachedWord& c = set->way[0];
      c.tag = tag;
      c.word_bytes = static_cast<uint8_t>(word.size());
      c.id_count = static_cast<uint8_t>(count);
      std::memcpy(c.word, word.data(), word.size());
      for (size_t k = 0; k < count; ++k) c.ids[k] = static_cast<int32_t>(ids[first + k]);
    } else if (long_word != nullptr) {
      long_word->word.assign(word);
      long_word->ids.assign(ids.begin() + static_cast<std::ptrdiff_t>(first), ids.end());
    }
  }

  // Byte-pair merging as HF's BPE::merge_word: repeatedly merge the adjacent pair of lowest rank, the
  // leftmost of equal ranks, with a heap of candidate merges checked when popped.
  void bpe(std::string_view word, std::vector<int64_t>& ids) const {
    struct Symbol {
      int32_t id, prev, next;
    };
    struct Candidate {
      int32_t rank, pos, merged_id;
      bool operator>(const Candidate& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    thread_local std::vector<Symbol> symbols;
    thread_local std::vector<Candidate> heap_storage;
    symbols.clear();
    const int32_t n = static_cast<int32_t>(word.size());
    for (int32_t i = 0; i < n; ++i) {
      symbols.push_back({byte_ids_[static_cast<unsigned char>(word[i])], i - 1, i + 1 < n ? i + 1 : kNone});
    }
    std::vector<Candidate>& heap = heap_storage;  // a min-heap (std::greater) reused across calls
    heap.clear();
    auto consider = [&](int32_t pos) {
      const int32_t next = symbols[pos].next;
      if (next == kNone) return;
      if (const Merge* m = merges_.find(pair_key(symbols[pos].id, symbols[next].id))) {
        heap.push_back({m->rank, pos, m->merged_id});
        std::push_heap(heap.begin(), heap.end(), std::greater<>{});
      }
    };
    for (int32_t i = 0; i + 1 < n; ++i) consider(i);
    while (!heap.empty()) {
      std::pop_heap(heap.begin(), heap.end(), std::greater<>{});
      const Candidate top = heap.back();
      heap.pop_back();
      Symbol& left = symbols[top.pos];
      if (left.id == kNone || left.next == kNone) continue;  // merged away, or nothing to its right
      Symbol& right = symbols[left.next];
      const Merge* m = merges_.find(pair_key(left.id, right.id));
      if (m == nullptr || m->merged_id != top.merged_id) continue;  // stale
      left.id = top.merged_id;
      right.id = kNone;
      left.next = right.next;
      if (left.next != kNone) symbols[left.next].prev = top.pos;
      if (left.prev != kNone) consider(left.prev);
      consider(top.pos);
    }
    for (int32_t i = 0; i != kNone; i = symbols[i].next) {
      if (symbols[i].id != kNone) ids.push_back(symbols[i].id);
    }
  }

  const uint64_t serial_ = next_serial.fetch_add(1);  // names this tokenizer in the threads' caches
  std::array<int32_t, 256> byte_ids_{};
  MergeTable merges_;
  BytesMap vocab_by_bytes_;  // for ignore_merges
  bool ignore_merges_ = false;
  const icu::Normalizer2* nfc_ = nullptr;
  std::vector<SplitPattern> splits_;  // the pre-tokenizer's Split steps (ByteLevel's use_regex: GPT-2's)
  std::unique_ptr<TokenPrefixCache> prefix_cache_;  // null: off, or the pre-tokenizer gives no cuts
  std::vector<AddedToken> added_tokens_;
  Trie added_;
  std::vector<std::string> bytes_;  // by id
  std::optional<int64_t> eos_;
};

std::string type_of(const json& j) {
  return j.is_object() && j.contains("type") && j["type"].is_string() ? j["type"].get<std::string>() : "?";
}

bool is_null_or_empty(const json& j, const char* key) {
  return !j.contains(key) || j[key].is_null() || (j[key].is_string() && j[key].get<std::string>().empty());
}

bool is_true(const json& j, const char* key) {
  return j.contains(key) && j[key].is_boolean() && j[key].get<bool>();
}

Result<std::unique_ptr<Tokenizer>> HuggingFaceTokenizer::load(const std::string& path,
                                                              size_t prefix_cache_bytes) {
  auto fail = [&](const std::string& what) -> Status {
    return Status::invalid_argument(fmt::format("{}: {}", path, what));
  };
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail("cannot be read");
  std::stringstream buffer;
  buffer << in.rdbuf();
  json file;
  try {
    file = json::parse(buffer.str());
  } catch (const json::exception& e) {
    return fail(fmt::format("not JSON: {}", e.what()));
  }
  if (!file.is_object() || !file.contains("model") || !file["model"].is_object()) {
    return fail("not a tokenizer.json (no \"model\" object)");
  }
  auto t = std::unique_ptr<HuggingFaceTokenizer>(new HuggingFaceTokenizer());
  try {
    // Normalizer.
    const json normalizer = file.value("normalizer", json());
    std::vector<json> normalizers;
    if (type_of(normalizer) == "Sequence") {
      for (const json& n : normalizer.value("normalizers", json::array())) normalizers.push_back(n);
    } else if (!normalizer.is_null()) {
      normalizers.push_back(normalizer);
    }
    for (const json& n : normalizers) {
      if (type_of(n) != "NFC") {
        return fail(fmt::format("normalizer type \"{}\" is not supported (only NFC, or none)", type_of(n)));
      }
      UErrorCode status = U_ZERO_ERROR;
      t->nfc_ = icu::Normalizer2::getNFCInstance(status);
      if (U_FAILURE(status)) return fail(fmt::format("ICU's NFC is unavailable: {}", u_errorName(status)));
    }

    // Pre-tokenizer: Split steps, then ByteLevel last.
    const json pre = file.value("pre_tokenizer", json());
    std::vector<json> steps;
    if (type_of(pre) == "Sequence") {
      for (const json& p : pre.value("pretokenizers", json::array())) steps.push_back(p);
    } else if (!pre.is_null()) {
      steps.push_back(pre);
    }
    if (steps.empty() || type_of(steps.back()) != "ByteLevel") {
      return fail("pre_tokenizer: only byte-level BPE is supported (a ByteLevel pre-tokenizer, last), got " +
                  (pre.is_null() ? std::string("none") : pre.dump().substr(0, 200)));
    }
    for (size_t i = 0; i < steps.size(); ++i) {
      const json& step = steps[i];
      const std::string type = type_of(step);
      if (type == "ByteLevel") {
        if (i + 1 != steps.size()) return fail("pre_tokenizer: ByteLevel must be the last step");
        if (is_true(step, "add_prefix_space")) {
          return fail("pre_tokenizer ByteLevel with add_prefix_space true is not supported");
        }
        if (step.value("use_regex", true)) {
          auto regex = SplitPattern::compile(std::string(kGpt2SplitPattern), false);
          if (!regex.ok()) return fail(regex.status().message());
          t->splits_.push_back(std::move(*regex));
        }
      } else if (type == "Split") {
        if (step.value("behavior", std::string()) != "Isolated" || is_true(step, "invert")) {
          return fail(fmt::format(
              "pre_tokenizer Split with behavior \"{}\"{} is not supported (only Isolated)",
              step.value("behavior", std::string("?")), is_true(step, "invert") ? " and invert" : ""));
        }
        const json& pattern = step.at("pattern");
        const bool literal = pattern.contains("String");
        if (!literal && !pattern.contains("Regex"))
          return fail("pre_tokenizer Split: no Regex or String pattern");
        auto regex =
            SplitPattern::compile(pattern.at(literal ? "String" : "Regex").get<std::string>(), literal);
        if (!regex.ok()) return fail("pre_tokenizer Split: " + regex.status().message());
        t->splits_.push_back(std::move(*regex));
      } else {
        return fail(
            fmt::format("pre_tokenizer type \"{}\" is not supported (only Split and ByteLevel)", type));
      }
    }

    // Decoder.
    const json decoder = file.value("decoder", json());
    if (!decoder.is_null() && type_of(decoder) != "ByteLevel") {
      return fail(fmt::format("decoder type \"{}\" is not supported (only ByteLevel)", type_of(decoder)));
    }

    // Model.
    const json& model = file["model"];
    if (type_of(model) != "BPE") {
      return fail(fmt::format("model type \"{}\" is not supported (only BPE)", type_of(model)));
    }
    if (!model.value("dropout", json()).is_null()) return fail("model BPE with dropout is not supported");
    if (is_true(model, "byte_fallback")) return fail("model BPE with byte_fallback is not supported");
    if (!is_null_or_empty(model, "continuing_subword_prefix") ||
        !is_null_or_empty(model, "end_of_word_suffix")) {
      return fail("model BPE with continuing_subword_prefix or end_of_word_suffix is not supported");
    }
    t->ignore_merges_ = is_true(model, "ignore_merges");

    std::array<char32_t, 256> to_code_point = byte_to_code_point();
    std::unordered_map<char32_t, unsigned char> to_byte;
    for (int b = 0; b < 256; ++b) to_byte[to_code_point[b]] = static_cast<unsigned char>(b);
    // A vocab string's bytes: each code point is a byte (ByteLevel); a string with any other code point
    // stands for its own UTF-8, as HF's ByteLevel decoder does.
    auto vocab_bytes = [&](const std::string& s) {
      std::string out;
      size_t maximal = 0;
      for (size_t i = 0; i < s.size();) {
        const size_t n = utf8_sequence(s, i, &maximal);
        if (n == 0) return s;
        auto it = to_byte.find(decode_at(s, i, n));
        if (it == to_byte.end()) return s;
        out += static_cast<char>(it->second);
        i += n;
      }
      return out;
    };

    const json& vocab = model.at("vocab");
    if (!vocab.is_object()) return fail("model.vocab is not an object");
    std::unordered_map<std::string, int32_t> vocab_by_string;
    vocab_by_string.reserve(vocab.size());
    int64_t max_id = -1;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      const int64_t id = it.value().get<int64_t>();
      if (id < 0 || id >= (int64_t{1} << 30)) return fail(fmt::format("vocab id {} is out of range", id));
      vocab_by_string.emplace(it.key(), static_cast<int32_t>(id));
      max_id = std::max(max_id, id);
    }
    std::vector<AddedToken> added;
    for (const json& a : file.value("added_tokens", json::array())) {
      AddedToken token{a.at("content").get<std::string>(), a.at("id").get<int32_t>(), is_true(a, "lstrip"),
                       is_true(a, "rstrip"), is_true(a, "special")};
      if (token.content.empty()) return fail("an added token has empty content");
      if (is_true(a, "single_word")) {
        return fail(fmt::format("added token {} has single_word true, which is not supported",
                                json(token.content).dump()));
      }
      if (is_true(a, "normalized") && t->nfc_ != nullptr) {
        return fail(
            fmt::format("added token {} has normalized true with a normalizer, which is not supported",
                        json(token.content).dump()));
      }
      if (token.id < 0)
        return fail(fmt::format("added token {} has a negative id", json(token.content).dump()));
      max_id = std::max<int64_t>(max_id, token.id);
      added.push_back(std::move(token));
    }
    t->bytes_.assign(static_cast<size_t>(max_id + 1), std::string());
    t->vocab_by_bytes_.reserve(vocab_by_string.size());
    for (const auto& [s, id] : vocab_by_string) {
      t->bytes_[id] = vocab_bytes(s);
      t->vocab_by_bytes_.emplace(t->bytes_[id], id);
    }
    for (int b = 0; b < 256; ++b) {
      std::string s;
      append_utf8(s, to_code_point[b]);
      auto it = vocab_by_string.find(s);
      if (it == vocab_by_string.end()) {
        return fail(
            fmt::format("the vocab has no token for byte 0x{:02X} (\"{}\"): not a byte-level BPE", b, s));
      }
      t->byte_ids_[b] = it->second;
    }

    const json& merges = model.at("merges");
    t->merges_.reserve(merges.size());
    for (size_t rank = 0; rank < merges.size(); ++rank) {
      const json& m = merges[rank];
      std::string left, right;
      if (m.is_string()) {
        const std::string s = m.get<std::string>();
        const size_t space = s.find(' ');
        if (space == std::string::npos || s.find(' ', space + 1) != std::string::npos) {
          return fail(fmt::format("merge {} is not two tokens separated by one space", m.dump()));
        }
        left = s.substr(0, space);
        right = s.substr(space + 1);
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        left = m[0].get<std::string>();
        right = m[1].get<std::string>();
      } else {
        return fail(fmt::format("merge {} is neither \"a b\" nor [\"a\", \"b\"]", m.dump()));
      }
      auto l = vocab_by_string.find(left), r = vocab_by_string.find(right),
           merged = vocab_by_string.find(left + right);
      if (l == vocab_by_string.end() || r == vocab_by_string.end() || merged == vocab_by_string.end()) {
        return fail(fmt::format("merge {}: {} is not in the vocab", m.dump(),
                                l == vocab_by_string.end()   ? json(left).dump()
                                : r == vocab_by_string.end() ? json(right).dump()
                                                             : json(left + right).dump()));
      }
      t->merges_.insert(pair_key(l->second, r->second), Merge{static_cast<int32_t>(rank), merged->second});
    }

    for (size_t i = 0; i < added.size(); ++i) {
      const AddedToken& token = added[i];
      t->bytes_[token.id] = token.special ? std::string() : token.content;
      t->added_.insert(token.content, static_cast<int32_t>(i));
    }
    t->added_tokens_ = std::move(added);
  } catch (const json::exception& e) {
    return fail(fmt::format("not a tokenizer.json crescent understands: {}", e.what()));
  }

  // The prefix cache, where the pre-tokenizer says where a text can be cut (one hand-matched Split).
  if (prefix_cache_bytes > 0 && t->splits_.size() == 1 && t->splits_[0].hand_matched()) {
    t->prefix_cache_ =
        std::make_unique<TokenPrefixCache>(prefix_cache_bytes, SplitPattern::kCutLookaheadBytes);
  }

  // EOS: tokenizer_config.json's eos_token beside the file.
  const std::string config_path =
      (std::filesystem::path(path).parent_path() / "tokenizer_config.json").string();
  std::ifstream config_in(config_path);
  if (config_in) {
    try {
      const json config = json::parse(config_in);
      json eos = config.value("eos_token", json());
      if (eos.is_object()) eos = eos.value("content", json());
      if (eos.is_string()) {
        const std::string name = eos.get<std::string>();
        for (const AddedToken& token : t->added_tokens_) {
          if (token.content == name) t->eos_ = token.id;
        }
      }
    } catch (const json::exception& e) {
      return Status::invalid_argument(fmt::format("{}: not JSON: {}", config_path, e.what()));
    }
  }
  return std::unique_ptr<Tokenizer>(std::move(t));
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_huggingface_tokenizer(const std::string& path,
                                                              size_t prefix_cache_bytes) {
  return HuggingFaceTokenizer::load(path, prefix_cache_bytes);
}

std::optional<TokenPrefixCache::Stats> token_prefix_cache_stats(const Tokenizer& tokenizer) {
  const auto* hf = dynamic_cast<const HuggingFaceTokenizer*>(&tokenizer);
  return hf != nullptr ? hf->prefix_cache_stats() : std::nullopt;
}

}  // namespace crescent::model
