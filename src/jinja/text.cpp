#include "jinja/text.h"

#include <unicode/ucasemap.h>
#include <unicode/utypes.h>

#include <algorithm>
#include <memory>
#include <stdexcept>

namespace crescent::jinja::text {

bool is_space(char32_t cp) {
  if (cp < 0x80) return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20);
  return cp == 0x85 || cp == 0xa0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202f || cp == 0x205f || cp == 0x3000;
}

char32_t decode(std::string_view s, size_t pos, size_t& length) {
  const auto b = static_cast<unsigned char>(s[pos]);
  if (b < 0x80) {
    length = 1;
    return b;
  }
  size_t n = b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : 2;
  n = std::min(n, s.size() - pos);
  char32_t cp = b & (n == 4 ? 0x07 : n == 3 ? 0x0f : 0x1f);
  for (size_t i = 1; i < n; ++i) cp = (cp << 6) | (static_cast<unsigned char>(s[pos + i]) & 0x3f);
  length = n;
  return cp;
}

bool valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    size_t n;
    char32_t min;
    if (b >= 0xc2 && b <= 0xdf) {
      n = 2;
      min = 0x80;
    } else if (b >= 0xe0 && b <= 0xef) {
      n = 3;
      min = 0x800;
    } else if (b >= 0xf0 && b <= 0xf4) {
      n = 4;
      min = 0x10000;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    for (size_t k = 1; k < n; ++k) {
      if ((static_cast<unsigned char>(s[i + k]) & 0xc0) != 0x80) return false;
    }
    size_t len;
    const char32_t cp = decode(s, i, len);
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
    i += n;
  }
  return true;
}

size_t leading_space_bytes(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t len;
    if (!is_space(decode(s, i, len))) break;
    i += len;
  }
  return i;
}

namespace {

// Start of the code point that ends at byte `end` (exclusive).
size_t previous_start(std::string_view s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xc0) == 0x80) --i;
  return i;
}

std::vector<char32_t> code_points(std::string_view s) {
  std::vector<char32_t> out;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    out.push_back(decode(s, i, len));
    i += len;
  }
  return out;
}

}  // namespace

size_t trailing_space_bytes(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    const size_t start = previous_start(s, end);
    size_t len;
    if (!is_space(decode(s, start, len))) break;
    end = start;
  }
  return s.size() - end;
}

int64_t length(std::string_view s) {
  int64_t n = 0;
  for (const char c : s) n += (static_cast<unsigned char>(c) & 0xc0) != 0x80;
  return n;
}

std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> out;
  out.reserve(s.size() + 1);
  for (size_t i = 0; i < s.size(); ++i) {
    if ((static_cast<unsigned char>(s[i]) & 0xc0) != 0x80) out.push_back(i);
  }
  out.push_back(s.size());
  return out;
}

std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right) {
  std::vector<char32_t> set;
  if (chars) set = code_points(*chars);
  auto strippable = [&](char32_t cp) {
    return chars ? std::find(set.begin(), set.end(), cp) != set.end() : is_space(cp);
  };
  size_t begin = 0;
  size_t end = s.size();
  if (left) {
    while (begin < end) {
      size_t len;
      if (!strippable(decode(s, begin, len))) break;
      begin += len;
    }
  }
  if (right) {
    while (end > begin) {
      const size_t start = previous_start(s, end);
      size_t len;
      if (!strippable(decode(s, start, len))) break;
      end = start;
    }
  }
  return std::string(s.substr(begin, end - begin));
}

namespace {

// Whitespace split (CPython's split_whitespace / rsplit_whitespace): runs of whitespace separate; once
// `maxsplit` words are cut, the rest (less its leading, or for rsplit trailing, whitespace) is one more word.
std::vector<std::string> split_whitespace(std::string_view s, int64_t maxsplit, bool from_right) {
  std::vector<std::string> out;
  int64_t remaining = maxsplit < 0 ? INT64_MAX : maxsplit;
  size_t len;
  if (!from_right) {
    size_t i = 0;
    while (remaining-- > 0) {
      while (i < s.size() && is_space(decode(s, i, len))) i += len;
      if (i == s.size()) break;
      const size_t j = i;
      while (i < s.size() && !is_space(decode(s, i, len))) i += len;
      out.emplace_back(s.substr(j, i - j));
    }
    if (i < s.size()) {
      while (i < s.size() && is_space(decode(s, i, len))) i += len;
      if (i != s.size()) out.emplace_back(s.substr(i));
    }
    return out;
  }
  size_t end = s.size();  // exclusive end of the unsplit part
  while (remaining-- > 0) {
    while (end > 0 && is_space(decode(s, previous_start(s, end), len))) end = previous_start(s, end);
    if (end == 0) break;
    const size_t word_end = end;
    while (end > 0 && !is_space(decode(s, previous_start(s, end), len))) end = previous_start(s, end);
    out.emplace_back(s.substr(end, word_end - end));
  }
  if (end > 0) {
    while (end > 0 && is_space(decode(s, previous_start(s, end), len))) end = previous_start(s, end);
    if (end > 0) out.emplace_back(s.substr(0, end));
  }
  std::reverse(out.begin(), out.end());
  return out;
}

}  // namespace

std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit,
                               bool from_right) {
  if (!sep) return split_whitespace(s, maxsplit, from_right);
  const std::string& d = *sep;
  std::vector<std::string> out;
  if (!from_right) {
    size_t start = 0;
    int64_t splits = 0;
    while (maxsplit < 0 || splits < maxsplit) {
      const size_t at = s.find(d, start);
      if (at == std::string_view::npos) break;
      out.emplace_back(s.substr(start, at - start));
      start = at + d.size();
      ++splits;
    }
    out.emplace_back(s.substr(start));
    return out;
  }
  size_t end = s.size();
  int64_t splits = 0;
  std::vector<std::string> reversed;
  while (maxsplit < 0 || splits < maxsplit) {
    if (end < d.size()) break;
    const size_t at = s.rfind(d, end - d.size());
    if (at == std::string_view::npos) break;
    reversed.emplace_back(s.substr(at + d.size(), end - at - d.size()));
    end = at;
    ++splits;
  }
  reversed.emplace_back(s.substr(0, end));
  out.assign(reversed.rbegin(), reversed.rend());
  return out;
}

std::string replace(std::string_view s, std::string_view old_text, std::string_view new_text, int64_t count) {
  std::string out;
  if (old_text.empty()) {
    // Python inserts `new` before every code point and at the end, up to `count` times.
    int64_t done = 0;
    size_t i = 0;
    while (i <= s.size()) {
      if (count < 0 || done < count) {
        out += new_text;
        ++done;
      }
      if (i == s.size()) break;
      size_t len;
      decode(s, i, len);
      out += s.substr(i, len);
      i += len;
    }
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(old_text, start);
    if (at == std::string_view::npos) break;
    out += s.substr(start, at - start);
    out += new_text;
    start = at + old_text.size();
    ++done;
  }
  out += s.substr(start);
  return out;
}

int64_t find(std::string_view s, std::string_view sub, bool from_right) {
  const size_t at = from_right ? s.rfind(sub) : s.find(sub);
  if (at == std::string_view::npos) return -1;
  return length(s.substr(0, at));
}

int64_t count(std::string_view s, std::string_view sub) {
  if (sub.empty()) return length(s) + 1;
  int64_t n = 0;
  for (size_t at = s.find(sub); at != std::string_view::npos; at = s.find(sub, at + sub.size())) ++n;
  return n;
}

namespace {

bool is_ascii(std::string_view s) {
  return std::all_of(s.begin(), s.end(), [](char c) { return static_cast<unsigned char>(c) < 0x80; });
}

enum class CaseOp { kLower, kUpper, kTitleWhole };

std::string icu_case(std::string_view s, CaseOp op) {
  UErrorCode status = U_ZERO_ERROR;
  const uint32_t options =
      op == CaseOp::kTitleWhole ? (U_TITLECASE_WHOLE_STRING | U_TITLECASE_NO_BREAK_ADJUSTMENT) : 0;
  std::unique_ptr<UCaseMap, decltype(&ucasemap_close)> map(ucasemap_open("", options, &status),
                                                           ucasemap_close);
  if (U_FAILURE(status)) throw std::runtime_error("ICU case map: " + std::string(u_errorName(status)));
  std::string out(s.size() * 3 + 16, '\0');
  for (int attempt = 0; attempt < 2; ++attempt) {
    status = U_ZERO_ERROR;
    const auto dest = out.data();
    const auto capacity = static_cast<int32_t>(out.size());
    const auto n = static_cast<int32_t>(s.size());
    int32_t written = 0;
    if (op == CaseOp::kLower) {
      written = ucasemap_utf8ToLower(map.get(), dest, capacity, s.data(), n, &status);
    } else if (op == CaseOp::kUpper) {
      written = ucasemap_utf8ToUpper(map.get(), dest, capacity, s.data(), n, &status);
    } else {
      written = ucasemap_utf8ToTitle(map.get(), dest, capacity, s.data(), n, &status);
    }
    if (status == U_BUFFER_OVERFLOW_ERROR) {
      out.assign(static_cast<size_t>(written), '\0');
      continue;
    }
    if (U_FAILURE(status)) throw std::runtime_error("ICU case mapping: " + std::string(u_errorName(status)));
    out.resize(static_cast<size_t>(written));
    return out;
  }
  throw std::runtime_error("ICU case mapping: buffer size");
}

}  // namespace

std::string lower(std::string_view s) {
  if (!is_ascii(s)) return icu_case(s, CaseOp::kLower);
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

std::string upper(std::string_view s) {
  if (!is_ascii(s)) return icu_case(s, CaseOp::kUpper);
  std::string out(s);
  for (char& c : out) {
    if (c >= 'a' && c <= 'z') c = static_cast<char>(c - 'a' + 'A');
  }
  return out;
}

std::string capitalize(std::string_view s) {
  if (!is_ascii(s)) return icu_case(s, CaseOp::kTitleWhole);
  std::string out = lower(s);
  if (!out.empty() && out[0] >= 'a' && out[0] <= 'z') out[0] = static_cast<char>(out[0] - 'a' + 'A');
  return out;
}

}  // namespace crescent::jinja::text
