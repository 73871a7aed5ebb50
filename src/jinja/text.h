// Python's str operations over UTF-8 strings (internal to the jinja component): a Python str is a sequence of
// code points, so lengths, indexes and slices count code points; whitespace is str.isspace()'s set (which
// Python's re `\s` shares), the set jinja2's lexer strips with. Every function REQUIRES valid UTF-8 (values
// are checked when they enter a template: from_json, string literals).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace crescent::jinja::text {

/// Whether `cp` is whitespace for Python's str.isspace() (and re's `\s`): \t\n\v\f\r, \x1c-\x1f, space,
/// U+0085, U+00A0, U+1680, U+2000-U+200A, U+2028, U+2029, U+202F, U+205F, U+3000.
bool is_space(char32_t cp);

/// The code point starting at byte `pos` of `s` and its length in bytes. REQUIRES: pos < s.size().
char32_t decode(std::string_view s, size_t pos, size_t& length);
/// Whether `s` is valid UTF-8 (no surrogates, nothing above U+10FFFF, shortest forms only).
bool valid_utf8(std::string_view s);

/// Length of the whitespace (is_space) run at the start of `s`, in bytes.
size_t leading_space_bytes(std::string_view s);
/// Length of the whitespace run at the end of `s`, in bytes.
size_t trailing_space_bytes(std::string_view s);

/// Number of code points.
int64_t length(std::string_view s);
/// Byte offset of each code point, plus s.size() at the end (size: length(s) + 1).
std::vector<size_t> code_point_offsets(std::string_view s);

/// str.strip/lstrip/rstrip: `chars` absent strips whitespace, else any code point of `chars`.
std::string strip(std::string_view s, const std::optional<std::string>& chars, bool left, bool right);
/// str.split(sep, maxsplit) (rsplit when `from_right`); `sep` absent splits on whitespace runs. REQUIRES:
/// sep, when given, is not empty (Python: ValueError).
std::vector<std::string> split(std::string_view s, const std::optional<std::string>& sep, int64_t maxsplit,
                               bool from_right);
/// str.replace(old, new, count); count < 0: all.
std::string replace(std::string_view s, std::string_view old_text, std::string_view new_text, int64_t count);
/// str.find(sub) in code points, -1 when absent (rfind when `from_right`).
int64_t find(std::string_view s, std::string_view sub, bool from_right);
/// str.count(sub): non-overlapping occurrences (an empty `sub`: length + 1).
int64_t count(std::string_view s, std::string_view sub);

/// str.lower(), str.upper(), str.capitalize(): full Unicode case mappings (SpecialCasing, final sigma) via
/// ICU for non-ASCII text (ICU's Unicode version may be newer than Python's: only characters assigned in
/// between can differ).
std::string lower(std::string_view s);
std::string upper(std::string_view s);
std::string capitalize(std::string_view s);

}  // namespace crescent::jinja::text
