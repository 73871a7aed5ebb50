#include "model/split_pattern.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <fmt/format.h>
#include <pcre2.h>

#include <array>
#include <nlohmann/json.hpp>

namespace crescent::model {

struct SplitPattern::Code {
  explicit Code(pcre2_code* c) : code(c) {}
  ~Code() { pcre2_code_free(code); }
  Code(const Code&) = delete;
  Code& operator=(const Code&) = delete;
  pcre2_code* code;
};

namespace {

constexpr size_t kNoMatch = std::string_view::npos;

// The patterns the hand-written matcher knows besides GPT-2's, as tokenizer.json files spell them (Split
// regexes).
constexpr const char* kLlama3Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr const char* kQwen2Pattern =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr uint32_t kCompileOptions = PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK;

// What a byte is to the known patterns: \p{L}, \p{N}, \s, anything else; kNonAscii for bytes from 0x80 on,
// which only PCRE2 classifies.
enum CharClass : uint8_t { kLetter, kDigit, kSpace, kOther, kNonAscii };

// The class of every ASCII byte as PCRE2 with the patterns' options sees it, asked of PCRE2 itself (so \s is
// its UCP \s, whatever that holds). Should PCRE2 fail to answer, every byte is kNonAscii: PCRE2 then decides
// every match.
const std::array<uint8_t, 256>& char_classes() {
  static const std::array<uint8_t, 256> classes = [] {
    std::array<uint8_t, 256> c{};
    c.fill(kNonAscii);
    const char* patterns[] = {R"(\p{L})", R"(\p{N})", R"(\s)"};  // kLetter, kDigit, kSpace
    std::array<pcre2_code*, 3> codes{};
    pcre2_match_data* data = pcre2_match_data_create(1, nullptr);
    bool compiled = data != nullptr;
    for (size_t k = 0; k < codes.size(); ++k) {
      int error = 0;
      PCRE2_SIZE offset = 0;
      codes[k] = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(patterns[k]), PCRE2_ZERO_TERMINATED,
                               kCompileOptions, &error, &offset, nullptr);
      compiled = compiled && codes[k] != nullptr;
    }
    if (compiled) {
      for (int b = 0; b < 0x80; ++b) {
        const auto byte = static_cast<unsigned char>(b);
        c[b] = kOther;
        for (size_t k = 0; k < codes.size(); ++k) {
          if (pcre2_match(codes[k], &byte, 1, 0, PCRE2_ANCHORED, data, nullptr) >= 0) {
            c[b] = static_cast<uint8_t>(k);
            break;
          }
        }
      }
    }
    for (pcre2_code* code : codes) pcre2_code_free(code);  // null is fine
    pcre2_match_data_free(data);
    return c;
  }();
  return classes;
}

bool is_cr_or_lf(char c) {
  return c == '\r' || c == '\n';
}

}  // namespace

Result<SplitPattern> SplitPattern::compile(const std::string& pattern, bool literal, bool hand_matcher) {
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(
      reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
      // PCRE2 refuses UCP with LITERAL (a literal has no classes for it to change)
      literal ? (kCompileOptions & ~PCRE2_UCP) | PCRE2_LITERAL : kCompileOptions, &error, &offset, nullptr);
  if (code == nullptr) {
    PCRE2_UCHAR message[256];
    pcre2_get_error_message(error, message, sizeof message);
    return Status::invalid_argument(fmt::format("the regex {} does not compile at offset {}: {}",
                                                nlohmann::json(pattern).dump(), offset,
                                                reinterpret_cast<char*>(message)));
  }
  (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);  // without JIT (not built in), pcre2_match interprets
  SplitPattern split;
  split.code_ = std::make_shared<Code>(code);
  if (hand_matcher && !literal) {
    if (pattern == kGpt2SplitPattern) split.known_ = Known::kGpt2;
    if (pattern == kLlama3Pattern) split.known_ = Known::kLlama3;
    if (pattern == kQwen2Pattern) split.known_ = Known::kQwen2;
  }
  return split;
}

// Each branch follows the pattern's alternatives in order, as PCRE2 tries them at one position (the first
// that matches wins, each quantifier greedy and backtracking as the regex would); a byte from 0x80 on that
// could change the outcome returns kNoMatch, for PCRE2 to decide.
size_t SplitPattern::ascii_match_end(std::string_view text, size_t at) const {
  const std::array<uint8_t, 256>& classes = char_classes();
  const size_t n = text.size();
  const auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  const auto class_at = [&](size_t i) { return classes[byte(i)]; };
  // The end of the run of class `k` from `i`, or kNoMatch when it reaches a non-ASCII byte (maybe of `k`).
  const auto run = [&](size_t i, uint8_t k) -> size_t {
    for (; i < n; ++i) {
      const uint8_t c = class_at(i);
      if (c == kNonAscii) return kNoMatch;
      if (c != k) break;
    }
    return i;
  };
  const uint8_t c = class_at(at);
  if (c == kNonAscii) return kNoMatch;
  const char first = text[at];

  if (known_ == Known::kGpt2) {
    // 's|'t|'re|'ve|'m|'ll|'d (case-sensitive: a non-ASCII byte is none of them)
    if (first == '\'' && at + 1 < n) {
      const char b = text[at + 1];
      if (b == 's' || b == 't' || b == 'm' || b == 'd') return at + 2;
      if (at + 2 < n &&
          (((b == 'r' || b == 'v') && text[at + 2] == 'e') || (b == 'l' && text[at + 2] == 'l'))) {
        return at + 3;
      }
    }
    // ` ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+`: an optional space, then a run of one class.
    if (first == ' ' && at + 1 < n) {
      const uint8_t next = class_at(at + 1);
      if (next == kNonAscii) return kNoMatch;
      if (next != kSpace) return run(at + 1, next);
    }
    if (c != kSpace) return run(at, c);
    // \s+(?!\S)|\s+: a run of white space, less its last character when something follows it.
    const size_t end = run(at, kSpace);
    if (end == kNoMatch) return kNoMatch;
    return end == n || end - at == 1 ? end : end - 1;
  }

  // Llama 3 and Qwen 2: (?i:'s|'t|'re|'ve|'m|'ll|'d), case-insensitive (a non-ASCII byte may be a case
  // variant: U+017F folds to s).
  if (first == '\'' && at + 1 < n) {
    const unsigned char b = byte(at + 1);
    if (b >= 0x80) return kNoMatch;
    const int lower =
        b | 0x20;  // an ASCII letter's lower case (other bytes compare unequal below either way)
    if (lower == 's' || lower == 't' || lower == 'm' || lower == 'd') return at + 2;
    if ((lower == 'r' || lower == 'v' || lower == 'l') && at + 2 < n) {
      const unsigned char b2 = byte(at + 2);
      if (b2 >= 0x80) return kNoMatch;
      if ((b2 | 0x20) == (lower == 'l' ? 'l' : 'e')) return at + 3;
    }
  }
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (c == kLetter) return run(at, kLetter);
  if (c != kDigit && !is_cr_or_lf(first) && at + 1 < n) {
    const uint8_t next = class_at(at + 1);
    if (next == kNonAscii) return kNoMatch;
    if (next == kLetter) return run(at + 1, kLetter);
  }
  // \p{N}{1,3} (Llama 3), \p{N} (Qwen 2)
  if (c == kDigit) {
    const size_t most = known_ == Known::kLlama3 ? 3 : 1;
    size_t end = at + 1;
    for (; end < n && end - at < most; ++end) {
      const uint8_t k = class_at(end);
      if (k == kNonAscii) return kNoMatch;
      if (k != kDigit) break;
    }
    return end;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]* (the byte after a space is ASCII: non-ASCII returned above)
  size_t others = kNoMatch;  // where its run of others starts
  if (first == ' ' && at + 1 < n && class_at(at + 1) == kOther) {
    others = at + 1;
  } else if (c == kOther) {
    others = at;
  }
  if (others != kNoMatch) {
    size_t end = run(others, kOther);
    if (end == kNoMatch) return kNoMatch;
    while (end < n && is_cr_or_lf(text[end])) ++end;
    return end;
  }
  // White space: \s*[\r\n]+ ends at its last CR or LF; else \s+(?!\S) takes it less its last character when
  // something follows; else \s+ (one character).
  const size_t end = run(at, kSpace);
  if (end == kNoMatch) return kNoMatch;
  for (size_t i = end; i > at; --i) {
    if (is_cr_or_lf(text[i - 1])) return i;
  }
  return end == n || end - at == 1 ? end : end - 1;
}

// A cut after a piece holding a non-white-space character holds (kCutLookaheadBytes). Each of the three
// patterns' alternatives is tried at the end of the previous match (every character starts a match, so there
// are no stretches between matches) and decides from the characters it matches and at most the one after:
// the contractions look 3 bytes ahead at most; the runs of letters, digits and others (and their [\r\n]*)
// end at the first character of another class; \p{N}{1,3} stops after 3. White space is matched only by
// the last alternatives (\s*[\r\n]+, \s+(?!\S), \s+), which look through the whole run of white space and
// at the character after it. So a piece with a non-white-space character was matched by one of the former
// and looked at most one code point past its end; any white-space piece before it looked at most at the
// first non-white-space character after its run, which is at or before that piece's. The cut is made only
// where the hand matcher knows these alternatives, and a piece with a non-ASCII character but no ASCII one
// (CJK text) is not taken: its class would need PCRE2 to tell.
bool SplitPattern::cut_after(std::string_view piece) const {
  if (known_ == Known::kNone) return false;
  const std::array<uint8_t, 256>& classes = char_classes();
  for (char c : piece) {
    const uint8_t k = classes[static_cast<unsigned char>(c)];
    if (k != kSpace && k != kNonAscii) return true;
  }
  return false;
}

void SplitPattern::split(std::string_view text, std::vector<std::string_view>& out) const {
  thread_local std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> data(
      pcre2_match_data_create(8, nullptr), pcre2_match_data_free);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t offset = 0, last = 0;
  while (offset < text.size()) {
    if (known_ != Known::kNone) {
      // Every character starts a match of these patterns: the match is at `offset` itself.
      if (const size_t end = ascii_match_end(text, offset); end != kNoMatch) {
        if (offset > last) out.push_back(text.substr(last, offset - last));
        out.push_back(text.substr(offset, end - offset));
        last = offset = end;
        continue;
      }
    }
    int rc = pcre2_match(code_->code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK, data.get(), nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {  // e.g. JIT stack exhausted: the interpreter keeps its own
      rc = pcre2_match(code_->code, subject, text.size(), offset, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT,
                       data.get(), nullptr);
    }
    if (rc < 0) break;  // no more matches (or the interpreter's heap limit: the rest is one piece)
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(data.get());
    const size_t start = ovector[0], end = ovector[1];
    if (end == start) {  // an empty match splits nothing: move on one code point
      offset = start + 1;
      while (offset < text.size() && (static_cast<unsigned char>(text[offset]) & 0xC0) == 0x80) ++offset;
      continue;
    }
    if (start > last) out.push_back(text.substr(last, start - last));
    out.push_back(text.substr(start, end - start));
    last = offset = end;
  }
  if (last < text.size()) out.push_back(text.substr(last));
}

}  // namespace crescent::model
