// A tokenizer.json pre-tokenizer's regex split (Hugging Face's Split with behavior Isolated): each match of
// the pattern is a piece, and so is each stretch of text between matches. The pattern runs on PCRE2 (UTF +
// UCP, JIT when available), except for the three patterns byte-level BPE tokenizers ship with, GPT-2's
// (ByteLevel's use_regex), Llama 3's and Qwen 2/3's: on ASCII text their matches are found by a hand-written
// matcher of the same alternatives, and PCRE2 decides any match whose extent depends on a non-ASCII byte. The
// pieces are the same either way (tests/model/split_pattern_test.cpp checks them against PCRE2 alone); the
// matcher only avoids a pcre2_match call per piece, most of a 32 KiB English prompt's tokenizing time.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace crescent::model {

/// GPT-2's split pattern: what a ByteLevel pre-tokenizer's use_regex means (HF's ByteLevel).
inline constexpr std::string_view kGpt2SplitPattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class SplitPattern {
 public:
  /// Compiles `pattern` (a regex, or with `literal` a string to match as is). `hand_matcher` false keeps
  /// every match on PCRE2 (for tests that compare the two). Errors: kInvalidArgument naming the pattern
  /// and PCRE2's message when it does not compile.
  static Result<SplitPattern> compile(const std::string& pattern, bool literal, bool hand_matcher = true);

  /// Appends the pieces of `text` to `out` (views into `text`), in order: every match, and every stretch
  /// between matches. An empty match splits nothing. REQUIRES: `text` is valid UTF-8. When PCRE2 fails on
  /// a match (its heap limit), the rest of the text is one piece. Thread-safe.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

  /// Whether the hand-written matcher runs this pattern's ASCII matches (it is one of the three above).
  bool hand_matched() const { return known_ != Known::kNone; }

  /// How many bytes past a cut (below) the text must be the same for the cut to hold: one code point.
  static constexpr size_t kCutLookaheadBytes = 4;

  /// Whether the pieces of any text, up to and including `piece` (one split() gave for a text), are the same
  /// whatever comes more than kCutLookaheadBytes after its end, so a tokenizer may reuse their ids for a text
  /// that starts the same way. True for a hand-matched pattern's piece holding an ASCII character other than
  /// white space; false otherwise (split_pattern.cpp says why it holds). Such a cut also splits the text's
  /// rest as it splits alone: none of the three patterns looks behind.
  bool cut_after(std::string_view piece) const;

 private:
  enum class Known { kNone, kGpt2, kLlama3, kQwen2 };
  struct Code;

  // The end of the match at text[at] (at < text.size()) of a known pattern, or npos when it depends on a
  // non-ASCII byte.
  size_t ascii_match_end(std::string_view text, size_t at) const;

  std::shared_ptr<Code> code_;  // PCRE2's compiled pattern
  Known known_ = Known::kNone;
};

}  // namespace crescent::model
