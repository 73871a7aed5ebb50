#include "model/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "test_support/corpus.h"
#include "test_support/temp_dir.h"

namespace crescent::model {
namespace {

using ::testing::HasSubstr;

std::string decode(const Tokenizer& t, const std::vector<int64_t>& ids) {
  std::string text;
  for (int64_t id : ids) text += t.token_bytes(id);
  return text;
}

TEST(Tokenizer, BytesAreTokens) {
  const auto t = byte_tokenizer();
  const std::string text = "Hé\n\x01";
  const std::vector<int64_t> ids = t->encode(text);
  ASSERT_EQ(ids.size(), text.size());
  EXPECT_EQ(ids[0], 'H');
  EXPECT_EQ(ids[1], 0xC3);  // é's first UTF-8 byte
  EXPECT_EQ(decode(*t, ids), text);
  EXPECT_EQ(t->token_bytes(256), "");
  EXPECT_EQ(t->vocab_size(), 256);
  test::TempDir dir;
  EXPECT_EQ(load_tokenizer(dir.path(), 256).value()->kind(), "bytes");
  EXPECT_THAT(load_tokenizer(dir.path(), 100).status().message(),
              HasSubstr("the byte-level tokenizer has 256 tokens, the model's vocabulary only 100"));
}

// A trained SentencePiece model (through libsentencepiece, in crescent's module) encodes with BOS first and
// its ids render the text back: words as pieces with their leading space, characters it never saw as bytes.
TEST(Tokenizer, SentencePieceEncodesAndRendersTextBack) {
  test::TempDir dir;
  test::write_corpus(dir.file("corpus.txt"));
  ASSERT_TRUE(train_sentencepiece(dir.file("corpus.txt"), 400, dir.file("tokenizer.model")).ok());
  auto loaded = load_tokenizer(dir.path(), 400);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const Tokenizer& t = **loaded;
  EXPECT_EQ(t.kind(), "sentencepiece");
  EXPECT_EQ(t.vocab_size(), 400);

  const std::vector<int64_t> ids = t.encode("the quick brown fox");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 1);       // <s>, SentencePiece's default BOS id
  EXPECT_LE(ids.size(), 5u);  // BOS + a piece a word (all four are frequent in the corpus)
  EXPECT_EQ(t.token_bytes(ids[0]), "");
  EXPECT_EQ(decode(t, ids), " the quick brown fox");  // each word's piece carries its space ("▁the")
  // "ß" and "🙂" are not in the corpus: byte fallback spells them in UTF-8 bytes, one token each.
  const std::vector<int64_t> rare = t.encode("ß🙂");
  EXPECT_EQ(rare.size(), 1u + 1u + 2u + 4u);  // BOS, "▁", 2 + 4 bytes
  EXPECT_EQ(decode(t, rare), " ß🙂");
  for (int64_t id : t.encode("über 長い café")) EXPECT_LT(id, 400);
  EXPECT_EQ(decode(t, t.encode("über 長い café")), " über 長い café");
  EXPECT_EQ(t.token_bytes(400), "");
  EXPECT_EQ(t.token_bytes(-1), "");
}

// Bad tokenizers are refused naming the file: not a SentencePiece model, a vocabulary the model's embedding
// does not cover; training names what is missing.
TEST(Tokenizer, BadSentencePieceModelsAreRefused) {
  test::TempDir dir;
  std::ofstream(dir.file("tokenizer.model")) << "not a model";
  EXPECT_THAT(load_tokenizer(dir.path(), 256).status().message(),
              HasSubstr("tokenizer.model: not a SentencePiece model that libsentencepiece can load"));
  test::write_corpus(dir.file("corpus.txt"));
  ASSERT_TRUE(train_sentencepiece(dir.file("corpus.txt"), 400, dir.file("tokenizer.model")).ok());
  EXPECT_THAT(load_tokenizer(dir.path(), 300).status().message(),
              HasSubstr("tokenizer.model has 400 tokens, the model's vocabulary only 300"));
  EXPECT_THAT(train_sentencepiece(dir.file("corpus.txt"), 100, dir.file("small.model")).message(),
              HasSubstr("Vocabulary size is smaller than required_chars"));
  EXPECT_THAT(train_sentencepiece(dir.file("missing.txt"), 400, dir.file("x.model")).message(),
              HasSubstr("missing.txt: no text to train a tokenizer on"));
  EXPECT_FALSE(std::filesystem::exists(dir.file("small.model")));
}

}  // namespace
}  // namespace crescent::model
