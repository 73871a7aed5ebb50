// A small deterministic text corpus, for the tests that train a SentencePiece tokenizer on it.
#pragma once

#include <fstream>
#include <string>

namespace crescent::test {

/// Writes 2,000 lines of words (English, a few accented and CJK) drawn by a fixed linear congruential
/// sequence to `path`: the same bytes every run.
inline void write_corpus(const std::string& path) {
  static constexpr const char* kWords[] = {
      "the",   "quick", "brown",   "fox",    "jumps", "over",    "lazy",  "dog",       "serving",
      "cache", "block", "prefill", "decode", "token", "request", "store", "conductor", "instance",
      "café",  "über",  "naïve",   "長い",   "文脈",  "once",    "upon",  "a",         "time"};
  std::ofstream out(path);
  uint64_t state = 12345;
  for (int line = 0; line < 2000; ++line) {
    for (int w = 0; w < 10; ++w) {
      state = state * 6364136223846793005ULL + 1442695040888963407ULL;
      out << (w > 0 ? " " : "") << kWords[(state >> 33) % std::size(kWords)];
    }
    out << '\n';
  }
}

}  // namespace crescent::test
