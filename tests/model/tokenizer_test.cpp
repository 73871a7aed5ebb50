#include "model/tokenizer.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

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

// A SentencePiece model is refused, naming the file, rather than served with the wrong tokenizer (loading
// Debian's libsentencepiece next to the store's libprotobuf is not done: docs/serving.md).
TEST(Tokenizer, ASentencePieceModelIsRefused) {
  test::TempDir dir;
  std::ofstream(dir.file("tokenizer.model")) << "a model";
  EXPECT_THAT(load_tokenizer(dir.path(), 256).status().message(),
              HasSubstr("tokenizer.model: SentencePiece tokenizers are not supported yet"));
}

}  // namespace
}  // namespace crescent::model
