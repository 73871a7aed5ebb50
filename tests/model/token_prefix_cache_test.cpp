// model/token_prefix_cache.h: what is found, what is kept, what is dropped.
#include "model/token_prefix_cache.h"

#include <gtest/gtest.h>

namespace crescent::model {
namespace {

constexpr size_t kChunk = TokenPrefixCache::kChunkBytes;

// A text of `bytes` bytes whose ids are its bytes' values, cut at each checkpoint less `margin` (a text of
// one byte a token can be cut anywhere).
struct Text {
  std::string text;
  std::vector<int64_t> ids;
  std::vector<TextCut> cuts;
};
Text make_text(size_t bytes, char first, size_t margin) {
  Text t;
  for (size_t i = 0; i < bytes; ++i) t.text += static_cast<char>(first + static_cast<char>(i % 7));
  t.ids.assign(t.text.begin(), t.text.end());
  for (size_t k = 0; k < bytes / kChunk; ++k) {
    const auto cut = static_cast<uint32_t>((k + 1) * kChunk - margin);
    t.cuts.push_back({cut, cut});
  }
  return t;
}

TokenPrefixCache::Match find(TokenPrefixCache& cache, std::string_view text, std::vector<int64_t>& ids) {
  return cache.find(text, TokenPrefixCache::keys_of(text), ids);
}
void keep(TokenPrefixCache& cache, const Text& t) {
  cache.insert(t.text, TokenPrefixCache::keys_of(t.text), t.ids, t.cuts);
}

TEST(TokenPrefixCache, FindsTheWholeTextOrItsLongestSharedCheckpoint) {
  TokenPrefixCache cache(1 << 20, 4);
  const Text a = make_text(5 * kChunk + 10, 'a', 4);
  std::vector<int64_t> ids;
  EXPECT_EQ(find(cache, a.text, ids).cut.text_bytes, 0u);  // nothing kept yet
  EXPECT_TRUE(ids.empty());
  keep(cache, a);

  TokenPrefixCache::Match whole = find(cache, a.text, ids);
  EXPECT_TRUE(whole.whole);
  EXPECT_EQ(ids, a.ids);

  // The same first 3 chunks and 20 bytes, then different bytes: checkpoint 3 (768 bytes) is the last shared.
  std::string b = a.text.substr(0, 3 * kChunk + 20) + std::string(400, '#');
  ids = {-1};  // appended after what is there
  TokenPrefixCache::Match prefix = find(cache, b, ids);
  EXPECT_FALSE(prefix.whole);
  EXPECT_EQ(prefix.cut, (TextCut{3 * kChunk - 4, 3 * kChunk - 4}));
  ASSERT_EQ(prefix.cuts.size(), 3u);
  EXPECT_EQ(prefix.cuts[0], a.cuts[0]);
  ASSERT_EQ(ids.size(), 1 + prefix.cut.id_count);
  EXPECT_TRUE(std::equal(ids.begin() + 1, ids.end(), a.ids.begin()));

  // A text that differs in its first chunk shares nothing; a short one is not looked up.
  std::string c = a.text;
  c[5] = '#';
  ids.clear();
  EXPECT_EQ(find(cache, c, ids).cut.text_bytes, 0u);
  EXPECT_EQ(find(cache, a.text.substr(0, kChunk - 1), ids).cut.text_bytes, 0u);
  EXPECT_TRUE(ids.empty());
  const TokenPrefixCache::Stats stats = cache.stats();
  EXPECT_EQ(stats.whole_hits, 1u);
  EXPECT_EQ(stats.prefix_hits, 1u);
  EXPECT_EQ(stats.entries, 1u);
}

TEST(TokenPrefixCache, RefusesCutsTooCloseToTheirCheckpointAndMisshapenInput) {
  TokenPrefixCache cache(1 << 20, 8);
  const Text a = make_text(3 * kChunk, 'a', 4);  // 4 bytes before each checkpoint, where 8 are needed
  keep(cache, a);
  std::vector<int64_t> ids;
  EXPECT_EQ(find(cache, a.text.substr(0, 2 * kChunk + 1), ids).cut.text_bytes, 0u);
  EXPECT_TRUE(find(cache, a.text, ids).whole);  // the whole text needs no cut
  Text b = make_text(3 * kChunk, 'b', 8);
  b.cuts.pop_back();  // one cut short of its checkpoints: not kept
  keep(cache, b);
  EXPECT_EQ(cache.stats().entries, 1u);
}

TEST(TokenPrefixCache, DropsTheLeastRecentlyUsedBeyondItsCapacity) {
  std::vector<Text> texts;
  for (char first = 'a'; first < 'a' + 9; ++first) texts.push_back(make_text(4 * kChunk, first, 4));
  TokenPrefixCache probe(1 << 20, 4);
  keep(probe, texts[0]);
  const size_t one = probe.stats().bytes;        // what one of these texts costs (all cost the same)
  TokenPrefixCache cache(8 * one + one / 2, 4);  // room for 8
  for (size_t i = 0; i < 8; ++i) keep(cache, texts[i]);
  std::vector<int64_t> ids;
  EXPECT_TRUE(find(cache, texts[0].text, ids).whole);  // 0 is now the most recent, 1 the least
  keep(cache, texts[8]);
  EXPECT_EQ(cache.stats().entries, 8u);
  EXPECT_LE(cache.stats().bytes, 8 * one + one / 2);
  EXPECT_FALSE(find(cache, texts[1].text, ids).whole);  // 1 went, with its checkpoints
  EXPECT_EQ(find(cache, texts[1].text.substr(0, 2 * kChunk + 10), ids).cut.text_bytes, 0u);
  for (size_t i : {0, 2, 8}) EXPECT_TRUE(find(cache, texts[i].text, ids).whole) << i;

  // A text of more than an eighth of the capacity is not kept.
  TokenPrefixCache small(8 * one - 1, 4);
  keep(small, texts[0]);
  EXPECT_EQ(small.stats().entries, 0u);
}

}  // namespace
}  // namespace crescent::model
