// OutputText: output ids → the client's text, with EOS, stop strings, min_tokens and held-back tails.
#include "serve/output_text.h"

#include <gtest/gtest.h>

namespace crescent::serve {
namespace {

// Bytes, plus an EOS id (256) whose text is nothing, as SentencePiece's </s>.
class BytesWithEos final : public model::Tokenizer {
 public:
  std::vector<int64_t> encode(std::string_view text) const override { return bytes_->encode(text); }
  std::string token_bytes(int64_t id) const override { return bytes_->token_bytes(id); }
  std::optional<int64_t> eos_token() const override { return 256; }
  int64_t vocab_size() const override { return 257; }
  std::string_view kind() const override { return "bytes+eos"; }

 private:
  std::unique_ptr<model::Tokenizer> bytes_ = model::byte_tokenizer();
};

std::vector<int64_t> ids(std::string_view text) {
  std::vector<int64_t> out;
  for (unsigned char c : text) out.push_back(c);
  return out;
}

// Feeds `tokens` one at a time, as the cluster delivers them; the pieces handed out, then flush()'s rest.
std::vector<std::string> feed(OutputText& out, const std::vector<int64_t>& tokens) {
  std::vector<std::string> pieces;
  for (int64_t t : tokens) pieces.push_back(out.add(std::span<const int64_t>(&t, 1)));
  pieces.push_back(out.flush());
  return pieces;
}

std::string joined(const std::vector<std::string>& pieces) {
  std::string s;
  for (const auto& p : pieces) s += p;
  return s;
}

TEST(OutputText, WithoutStopsEveryByteGoesOutAsItComes) {
  OutputText out(model::byte_tokenizer(), {});
  const auto pieces = feed(out, ids("abc"));
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "b", "c", ""}));
  EXPECT_FALSE(out.stopped());
  EXPECT_EQ(out.finish_reason(), "length");
}

// A character of several bytes goes out whole, when its last byte came: never half of it.
TEST(OutputText, AUtf8CharacterIsHeldUntilItIsWhole) {
  OutputText out(model::byte_tokenizer(), {});
  const auto pieces = feed(out, ids("a長b"));  // 長 is E9 95 B7
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "", "", "長", "b", ""}));
  // A character cut short by the end goes out as it is, with flush().
  OutputText cut(model::byte_tokenizer(), {});
  EXPECT_EQ(feed(cut, {'x', 0xE9, 0x95}), (std::vector<std::string>{"x", "", "", "\xE9\x95"}));
  // Bytes that start nothing (continuation bytes alone, 0xFF) are not waited on.
  OutputText invalid(model::byte_tokenizer(), {});
  EXPECT_EQ(feed(invalid, {0x95, 0xFF}), (std::vector<std::string>{"\x95", "\xFF", ""}));
}

TEST(OutputText, Utf8CompletePrefix) {
  EXPECT_EQ(utf8_complete_prefix(""), 0u);
  EXPECT_EQ(utf8_complete_prefix("ab"), 2u);
  EXPECT_EQ(utf8_complete_prefix("a\xC3"), 1u);              // é's first byte
  EXPECT_EQ(utf8_complete_prefix("a\xC3\xA9"), 3u);          // é whole
  EXPECT_EQ(utf8_complete_prefix("a\xF0\x9F\x99"), 1u);      // 🙂 without its last byte
  EXPECT_EQ(utf8_complete_prefix("a\xF0\x9F\x99\x82"), 5u);  // 🙂 whole
  EXPECT_EQ(utf8_complete_prefix("\x80\x80\x80\x80\x80"), 5u);
}

// The text ends before the first stop string; a tail that may become one is held back, then let go when it
// does not.
TEST(OutputText, AStopStringEndsTheTextBeforeIt) {
  OutputText out(model::byte_tokenizer(), {.stop = {"END", "xyz"}});
  const auto pieces = feed(out, ids("abEcdENxEND tail"));
  // "E" held (it may start END), let go with "c"; "EN" held, let go at "x", which is held (it may start
  // xyz) until "E"; "EN" of END held, then the stop.
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "b", "", "Ec", "d", "", "", "EN", "x", "", "", "", "", "",
                                              "", "", ""}));
  EXPECT_EQ(joined(pieces), "abEcdENx");
  EXPECT_TRUE(out.stopped());
  EXPECT_EQ(out.finish_reason(), "stop");
  // Tokens after the stop are ignored.
  EXPECT_EQ(out.add(ids("more")), "");
}

// A stop string spread over tokens of several bytes, and the earliest of two stops, count.
TEST(OutputText, TheEarliestStopCountsWhereverTokensSplitIt) {
  OutputText out(model::byte_tokenizer(), {.stop = {"lo w", "o"}});
  EXPECT_EQ(out.add(ids("hel")), "he");       // "l" may start "lo w"
  EXPECT_EQ(out.add(ids("lo world")), "ll");  // "o" at 4 ends the text before "lo w" is whole
  EXPECT_TRUE(out.stopped());
}

TEST(OutputText, EosEndsTheOutputUnlessIgnored) {
  auto tokenizer = std::make_shared<BytesWithEos>();
  OutputText out(tokenizer, {});
  EXPECT_EQ(joined(feed(out, {'h', 'i', 256, 'x'})), "hi");
  EXPECT_TRUE(out.stopped());
  OutputText ignoring(tokenizer, {.ignore_eos = true});
  EXPECT_EQ(joined(feed(ignoring, {'h', 'i', 256, 'x'})), "hix");
  EXPECT_FALSE(ignoring.stopped());
  // Bytes have no EOS: no id stops them.
  OutputText bytes(model::byte_tokenizer(), {});
  EXPECT_EQ(joined(feed(bytes, {'a', 0, 255})), std::string("a\0\xFF", 3));
  EXPECT_FALSE(bytes.stopped());
}

// Before the min_tokens-th token neither EOS nor a stop string ends the output.
TEST(OutputText, MinTokensComeFirst) {
  auto tokenizer = std::make_shared<BytesWithEos>();
  OutputText eos(tokenizer, {.min_tokens = 3});
  EXPECT_EQ(joined(feed(eos, {'a', 256, 'b', 256, 'c'})), "ab");  // the first EOS is token 2, the second 4
  EXPECT_TRUE(eos.stopped());
  OutputText stop(tokenizer, {.stop = {"a"}, .min_tokens = 4});
  EXPECT_EQ(joined(feed(stop, ids("abcdaz"))), "abcd");  // the "a" of token 1 does not count, that of 5 does
  EXPECT_TRUE(stop.stopped());
  // A short stop that ended before the min_tokens-th token does not count later, when a longer one's
  // search would still reach back over it.
  OutputText short_stop(tokenizer, {.stop = {"ab", "wxyz"}, .min_tokens = 4});
  EXPECT_EQ(joined(feed(short_stop, ids("xabc"))), "xabc");
  EXPECT_FALSE(short_stop.stopped());
  OutputText unmet(tokenizer, {.stop = {"a"}, .min_tokens = 10});
  EXPECT_EQ(joined(feed(unmet, ids("abca"))), "abca");
  EXPECT_FALSE(unmet.stopped());
}

}  // namespace
}  // namespace crescent::serve
