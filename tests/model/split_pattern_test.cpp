// The hand-written matcher of the GPT-2, Llama 3 and Qwen 2/3 split patterns (model/split_pattern.h) against
// PCRE2 alone: the same pieces for every string of a seeded random corpus weighted toward what the
// alternatives turn on (spaces before letters, CR/LF in white space, contractions in both cases, digit runs,
// punctuation), with non-ASCII letters, digits, spaces and case variants (U+017F folds to s) in between.
#include "model/split_pattern.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

namespace crescent::model {
namespace {

const std::string kLlama3 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const std::string kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

std::vector<std::string_view> pieces(const SplitPattern& pattern, std::string_view text) {
  std::vector<std::string_view> out;
  pattern.split(text, out);
  return out;
}

std::string printable(std::string_view s) {
  return nlohmann::json(std::string(s)).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string describe(const std::vector<std::string_view>& p) {
  std::string out;
  for (std::string_view s : p) out += printable(s) + " ";
  return out;
}

// Strings of up to 40 units, each an ASCII byte (any of the 128, the interesting ones more often) or a
// non-ASCII character.
std::vector<std::string> random_corpus(size_t count, uint64_t seed) {
  const std::vector<std::string> frequent = {
      " ", " ", " ", "\n", "\r", "\t", "'", "'", "s", "S", "t", "T", "r", "R", "e",  "E",  "v", "m",  "l",
      "L", "d", "D", "a",  "z",  "Q",  "0", "7", "9", ".", ",", "!", "-", "(", "\v", "\f", "_", "\"", "<"};
  const std::vector<std::string> non_ascii = {"é",
                                              "ß",
                                              "Ω",
                                              "ж",
                                              "日",
                                              "\u017F" /* ſ */,
                                              "\u212A" /* K */,
                                              "\u0661" /* ١ */,
                                              "²",
                                              "½",
                                              "\u00A0",
                                              "\u2003",
                                              "\u3000",
                                              "\u0085",
                                              "\u180E",
                                              "\uFEFF",
                                              "\u2028",
                                              "—",
                                              "“",
                                              "😀",
                                              "\u0301" /* combining */,
                                              "\u200D"};
  std::mt19937_64 rng(seed);
  std::vector<std::string> corpus;
  for (size_t i = 0; i < count; ++i) {
    std::string s;
    const size_t units = rng() % 41;
    for (size_t k = 0; k < units; ++k) {
      const uint64_t kind = rng() % 10;
      if (kind < 6) {
        s += frequent[rng() % frequent.size()];
      } else if (kind < 8) {
        s += static_cast<char>(rng() % 0x80);
      } else if (kind < 9) {
        s += non_ascii[rng() % non_ascii.size()];
      } else {  // a run
        const std::string unit = frequent[rng() % frequent.size()];
        for (uint64_t r = 1 + rng() % 6; r > 0; --r) s += unit;
      }
    }
    corpus.push_back(std::move(s));
  }
  return corpus;
}

class SplitPatternTest : public ::testing::TestWithParam<std::string> {};

TEST_P(SplitPatternTest, HandMatcherSplitsAsPcre2Does) {
  const std::string pattern = GetParam() == "gpt2"     ? std::string(kGpt2SplitPattern)
                              : GetParam() == "llama3" ? kLlama3
                                                       : kQwen2;
  auto fast = SplitPattern::compile(pattern, false);
  auto pcre2 = SplitPattern::compile(pattern, false, /*hand_matcher=*/false);
  ASSERT_TRUE(fast.ok() && pcre2.ok());
  EXPECT_TRUE(fast->hand_matched());
  EXPECT_FALSE(pcre2->hand_matched());
  size_t mismatches = 0;
  std::vector<std::string> corpus = random_corpus(100'000, 11);
  // And every pair of ASCII bytes, and every ASCII byte between letters and before a non-ASCII letter.
  for (int a = 0; a < 0x80; ++a) {
    for (int b = 0; b < 0x80; ++b) corpus.push_back({static_cast<char>(a), static_cast<char>(b)});
    corpus.push_back(std::string("ab") + static_cast<char>(a) + "cd");
    corpus.push_back(std::string(1, static_cast<char>(a)) + "é");
  }
  for (const std::string& s : corpus) {
    const auto want = pieces(*pcre2, s), got = pieces(*fast, s);
    if (want != got && ++mismatches <= 10) {
      ADD_FAILURE() << GetParam() << " " << printable(s) << "\n  pcre2: " << describe(want)
                    << "\n  hand:  " << describe(got);
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

INSTANTIATE_TEST_SUITE_P(KnownPatterns, SplitPatternTest, ::testing::Values("gpt2", "llama3", "qwen2"));

TEST(SplitPattern, OtherPatternsRunOnPcre2) {
  auto digits = SplitPattern::compile(R"(\p{N}+)", false);
  ASSERT_TRUE(digits.ok());
  EXPECT_FALSE(digits->hand_matched());
  EXPECT_EQ(pieces(*digits, "ab12c3"), (std::vector<std::string_view>{"ab", "12", "c", "3"}));
  // The GPT-2 pattern as a literal string is not the pattern.
  auto literal = SplitPattern::compile(std::string(kGpt2SplitPattern), true);
  ASSERT_TRUE(literal.ok()) << literal.status().message();
  EXPECT_FALSE(literal->hand_matched());
  const std::string text = "a" + std::string(kGpt2SplitPattern) + "b";
  EXPECT_EQ(pieces(*literal, text), (std::vector<std::string_view>{"a", kGpt2SplitPattern, "b"}));
  EXPECT_EQ(SplitPattern::compile("(?<x", false).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace crescent::model
