#include "jinja/lexer.h"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <optional>

#include "common/utf8.h"
#include "jinja/text.h"
#include "jinja/value.h"

namespace crescent::jinja {
namespace {

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}
bool is_name_start(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
bool is_name_char(char c) {
  return is_name_start(c) || is_digit(c);
}

// Python's unicode-escape decoding of a string literal's body after jinja2's
// .encode("ascii", "backslashreplace"): every non-ASCII character first becomes \xNN, \uNNNN or \UNNNNNNNN.
std::string decode_string_literal(std::string_view body, int line) {
  std::string ascii;
  ascii.reserve(body.size());
  for (size_t i = 0; i < body.size();) {
    size_t len;
    const char32_t cp = text::decode(body, i, len);
    if (cp < 0x80) {
      ascii += static_cast<char>(cp);
    } else if (cp < 0x100) {
      ascii += fmt::format("\\x{:02x}", static_cast<uint32_t>(cp));
    } else if (cp < 0x10000) {
      ascii += fmt::format("\\u{:04x}", static_cast<uint32_t>(cp));
    } else {
      ascii += fmt::format("\\U{:08x}", static_cast<uint32_t>(cp));
    }
    i += len;
  }
  auto hex_value = [&](size_t at, size_t digits, const char* what) -> char32_t {
    if (at + digits > ascii.size()) throw TemplateError(fmt::format("truncated {} escape", what), line);
    char32_t v = 0;
    for (size_t k = 0; k < digits; ++k) {
      const char c = ascii[at + k];
      int d;
      if (is_digit(c)) {
        d = c - '0';
      } else if (c >= 'a' && c <= 'f') {
        d = c - 'a' + 10;
      } else if (c >= 'A' && c <= 'F') {
        d = c - 'A' + 10;
      } else {
        throw TemplateError(fmt::format("truncated {} escape", what), line);
      }
      v = v * 16 + static_cast<char32_t>(d);
    }
    return v;
  };
  std::string out;
  out.reserve(ascii.size());
  for (size_t i = 0; i < ascii.size();) {
    const char c = ascii[i];
    if (c != '\\' || i + 1 >= ascii.size()) {
      out += c;
      ++i;
      continue;
    }
    const char e = ascii[i + 1];
    i += 2;
    char32_t cp;
    switch (e) {
      case '\n':
        continue;  // a line continuation
      case '\\':
      case '\'':
      case '"':
        out += e;
        continue;
      case 'a':
        out += '\a';
        continue;
      case 'b':
        out += '\b';
        continue;
      case 'f':
        out += '\f';
        continue;
      case 'n':
        out += '\n';
        continue;
      case 'r':
        out += '\r';
        continue;
      case 't':
        out += '\t';
        continue;
      case 'v':
        out += '\v';
        continue;
      case 'x':
        cp = hex_value(i, 2, "\\xXX");
        i += 2;
        break;
      case 'u':
        cp = hex_value(i, 4, "\\uXXXX");
        i += 4;
        break;
      case 'U':
        cp = hex_value(i, 8, "\\UXXXXXXXX");
        i += 8;
        if (cp > 0x10ffff) throw TemplateError("illegal Unicode character in a \\U escape", line);
        break;
      case 'N':
        throw TemplateError("\\N{...} escapes in string literals are not supported", line);
      default:
        if (e >= '0' && e <= '7') {
          cp = static_cast<char32_t>(e - '0');
          for (int k = 0; k < 2 && i < ascii.size() && ascii[i] >= '0' && ascii[i] <= '7'; ++k, ++i) {
            cp = cp * 8 + static_cast<char32_t>(ascii[i] - '0');
          }
          break;
        }
        out += '\\';  // an unknown escape stays as written
        out += e;
        continue;
    }
    if (cp >= 0xd800 && cp <= 0xdfff) {
      throw TemplateError("a string literal escape makes a lone surrogate (not UTF-8)", line);
    }
    append_utf8(out, cp);
  }
  return out;
}

class Lexer {
 public:
  Lexer(std::string_view source, const LexerOptions& options) : src_(source), options_(options) {}

  std::vector<Token> run() {
    while (pos_ < src_.size()) lex_root();
    Token eof;
    eof.type = Token::Type::kEof;
    eof.line = tokens_.empty() ? 1 : tokens_.back().line;  // jinja2's end of stream repeats the last line
    tokens_.push_back(eof);
    return std::move(tokens_);
  }

 private:
  enum class Tag { kVariable, kBlock, kComment, kRaw };

  void emit(Token::Type type, std::string text, int line) {
    Token t;
    t.type = type;
    t.text = std::move(text);
    t.line = line;
    tokens_.push_back(std::move(t));
  }

  // Consumes src_[pos_, end), counting its lines; `line_starting` is whether it ended with a newline (what
  // jinja2 checks of the previous match before lstrip_blocks strips at a line's start).
  void advance(size_t end) {
    line_ += static_cast<int>(std::count(src_.begin() + static_cast<ptrdiff_t>(pos_),
                                         src_.begin() + static_cast<ptrdiff_t>(end), '\n'));
    line_starting_ = end > pos_ && src_[end - 1] == '\n';
    pos_ = end;
  }

  size_t skip_space(size_t at) const { return at + text::leading_space_bytes(src_.substr(at)); }

  // jinja2's OptionalLStrip handling of the text before a tag whose whitespace sign is `sign`.
  std::string_view strip_before_tag(std::string_view text, char sign, bool variable) const {
    if (sign == '-') return text.substr(0, text.size() - text::trailing_space_bytes(text));
    if (sign != '+' && options_.lstrip_blocks && !variable) {
      const size_t newline = text.rfind('\n');
      const size_t l_pos = newline == std::string_view::npos ? 0 : newline + 1;
      if (l_pos > 0 || line_starting_) {
        const std::string_view rest = text.substr(l_pos);
        if (!rest.empty() && text::leading_space_bytes(rest) == rest.size()) return text.substr(0, l_pos);
      }
    }
    return text;
  }

  // `{%[-+]?\s*raw\s*(-%}\s*|%})` at `at`: the end of the match, or nullopt.
  std::optional<size_t> match_raw_begin(size_t at, char& sign) const {
    size_t i = at + 2;
    sign = 0;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) sign = src_[i++];
    i = skip_space(i);
    if (src_.substr(i, 3) != "raw") return std::nullopt;
    i = skip_space(i + 3);
    if (src_.substr(i, 3) == "-%}") return skip_space(i + 3);
    if (src_.substr(i, 2) == "%}") return i + 2;
    return std::nullopt;
  }

  // `{%[-+]?\s*endraw\s*(+%}|-%}\s*|%}\n?)` at `at`.
  std::optional<size_t> match_raw_end(size_t at, char& sign) const {
    size_t i = at + 2;
    sign = 0;
    if (i < src_.size() && (src_[i] == '-' || src_[i] == '+')) sign = src_[i++];
    i = skip_space(i);
    if (src_.substr(i, 6) != "endraw") return std::nullopt;
    i = skip_space(i + 6);
    if (src_.substr(i, 3) == "+%}") return i + 3;
    if (src_.substr(i, 3) == "-%}") return skip_space(i + 3);
    if (src_.substr(i, 2) == "%}") return trim_newline(i + 2);
    return std::nullopt;
  }

  size_t trim_newline(size_t at) const {
    return options_.trim_blocks && at < src_.size() && src_[at] == '\n' ? at + 1 : at;
  }

  void lex_root() {
    size_t k = pos_;
    for (;;) {
      k = src_.find('{', k);
      if (k == std::string_view::npos || k + 1 >= src_.size()) {
        emit(Token::Type::kData, std::string(src_.substr(pos_)), line_);
        advance(src_.size());
        return;
      }
      const char next = src_[k + 1];
      if (next == '{' || next == '%' || next == '#') break;
      ++k;
    }
    Tag tag = src_[k + 1] == '{' ? Tag::kVariable : src_[k + 1] == '%' ? Tag::kBlock : Tag::kComment;
    char sign = 0;
    size_t tag_end = k + 2;
    if (tag == Tag::kBlock) {
      if (auto raw_end = match_raw_begin(k, sign)) {
        tag = Tag::kRaw;
        tag_end = *raw_end;
      }
    }
    if (tag != Tag::kRaw && tag_end < src_.size() && (src_[tag_end] == '-' || src_[tag_end] == '+')) {
      sign = src_[tag_end++];
    }
    const std::string_view data = strip_before_tag(src_.substr(pos_, k - pos_), sign, tag == Tag::kVariable);
    if (!data.empty()) emit(Token::Type::kData, std::string(data), line_);
    advance(k);
    const int tag_line = line_;
    advance(tag_end);
    switch (tag) {
      case Tag::kVariable:
        emit(Token::Type::kVariableBegin, "{{", tag_line);
        lex_tag(false);
        return;
      case Tag::kBlock:
        emit(Token::Type::kBlockBegin, "{%", tag_line);
        lex_tag(true);
        return;
      case Tag::kComment:
        lex_comment(tag_line);
        return;
      case Tag::kRaw:
        lex_raw(tag_line);
        return;
    }
  }

  void lex_comment(int begin_line) {
    const size_t close = src_.find("#}", pos_);
    if (close == std::string_view::npos) throw TemplateError("Missing end of comment tag", begin_line);
    size_t end;
    if (close > pos_ && src_[close - 1] == '-') {
      end = skip_space(close + 2);
    } else if (close > pos_ && src_[close - 1] == '+') {
      end = close + 2;
    } else {
      end = trim_newline(close + 2);
    }
    advance(end);
  }

  void lex_raw(int begin_line) {
    for (size_t k = src_.find("{%", pos_); k != std::string_view::npos; k = src_.find("{%", k + 1)) {
      char sign;
      const auto end = match_raw_end(k, sign);
      if (!end) continue;
      const std::string_view data = strip_before_tag(src_.substr(pos_, k - pos_), sign, false);
      if (!data.empty()) emit(Token::Type::kData, std::string(data), line_);
      advance(*end);
      return;
    }
    throw TemplateError("Missing end of raw directive", begin_line);
  }

  // The tokens of a {{ ... }} or {% ... %} tag up to its end.
  void lex_tag(bool block) {
    std::vector<char> balancing;
    for (;;) {
      if (pos_ >= src_.size()) {
        throw TemplateError(block ? "unexpected end of template: a block tag is not closed"
                                  : "unexpected end of template: a variable tag is not closed",
                            line_);
      }
      if (balancing.empty() && end_tag(block)) return;
      const char c = src_[pos_];
      const size_t space = text::leading_space_bytes(src_.substr(pos_));
      if (space > 0) {
        advance(pos_ + space);
        continue;
      }
      const int line = line_;
      if (size_t end = match_float(); end > 0) {
        std::string digits;
        for (size_t i = pos_; i < end; ++i) {
          if (src_[i] != '_') digits += src_[i];
        }
        double value = 0;
        const auto r = std::from_chars(digits.data(), digits.data() + digits.size(), value);
        if (r.ec == std::errc::result_out_of_range) {
          const size_t e = digits.find_first_of("eE");
          value =
              e != std::string::npos && digits[e + 1] == '-' ? 0.0 : std::numeric_limits<double>::infinity();
        }
        Token t;
        t.type = Token::Type::kFloat;
        t.float_value = value;
        t.text = std::string(src_.substr(pos_, end - pos_));
        t.line = line;
        tokens_.push_back(std::move(t));
        advance(end);
        continue;
      }
      if (is_digit(c)) {
        lex_integer();
        continue;
      }
      if (is_name_start(c)) {
        size_t end = pos_;
        while (end < src_.size() && is_name_char(src_[end])) ++end;
        emit(Token::Type::kName, std::string(src_.substr(pos_, end - pos_)), line);
        advance(end);
        continue;
      }
      if (c == '\'' || c == '"') {
        lex_string(c);
        continue;
      }
      if (static_cast<unsigned char>(c) >= 0x80) {
        throw TemplateError("non-ASCII characters outside string literals are not supported", line);
      }
      lex_operator(balancing);
    }
  }

  bool end_tag(bool block) {
    const std::string_view rest = src_.substr(pos_);
    const int line = line_;
    if (block) {
      if (rest.starts_with("+%}")) {
        advance(pos_ + 3);
      } else if (rest.starts_with("-%}")) {
        advance(skip_space(pos_ + 3));
      } else if (rest.starts_with("%}")) {
        advance(trim_newline(pos_ + 2));
      } else {
        return false;
      }
      emit(Token::Type::kBlockEnd, "%}", line);
      return true;
    }
    if (rest.starts_with("-}}")) {
      advance(skip_space(pos_ + 3));
    } else if (rest.starts_with("}}")) {
      advance(pos_ + 2);
    } else {
      return false;
    }
    emit(Token::Type::kVariableEnd, "}}", line);
    return true;
  }

  // (\d+_)*\d+  at `i`: the end of the digits, or `i` when there are none.
  size_t digits_with_underscores(size_t i) const {
    size_t end = i;
    for (;;) {
      size_t j = end;
      while (j < src_.size() && is_digit(src_[j])) ++j;
      if (j == end) return end;  // no digit run here
      end = j;
      if (end + 1 < src_.size() && src_[end] == '_' && is_digit(src_[end + 1])) {
        ++end;
        continue;
      }
      return end;
    }
  }

  // jinja2's float_re at pos_: the end of the match, or 0.
  size_t match_float() const {
    if (pos_ > 0 && src_[pos_ - 1] == '.') return 0;
    const size_t int_end = digits_with_underscores(pos_);
    if (int_end == pos_) return 0;
    auto exponent = [&](size_t i) -> size_t {
      if (i >= src_.size() || (src_[i] != 'e' && src_[i] != 'E')) return 0;
      ++i;
      if (i < src_.size() && (src_[i] == '+' || src_[i] == '-')) ++i;
      const size_t end = digits_with_underscores(i);
      return end == i ? 0 : end;
    };
    if (int_end < src_.size() && src_[int_end] == '.') {
      const size_t frac_end = digits_with_underscores(int_end + 1);
      if (frac_end > int_end + 1) {
        if (const size_t e = exponent(frac_end)) return e;
        return frac_end;
      }
    }
    if (const size_t e = exponent(int_end)) return e;
    return 0;
  }

  void lex_integer() {
    const int line = line_;
    size_t end = pos_;
    int base = 10;
    auto run = [&](size_t start, auto valid) {
      // (_?[digit])+
      size_t i = start;
      for (;;) {
        size_t j = i;
        if (j < src_.size() && src_[j] == '_') ++j;
        if (j < src_.size() && valid(src_[j])) {
          i = j + 1;
        } else {
          return i;
        }
      }
    };
    const char c = src_[pos_];
    const char x = pos_ + 1 < src_.size() ? static_cast<char>(src_[pos_ + 1] | 0x20) : 0;
    size_t prefixed = 0;
    if (c == '0' && x == 'b') {
      prefixed = run(pos_ + 2, [](char d) { return d == '0' || d == '1'; });
      base = 2;
    } else if (c == '0' && x == 'o') {
      prefixed = run(pos_ + 2, [](char d) { return d >= '0' && d <= '7'; });
      base = 8;
    } else if (c == '0' && x == 'x') {
      prefixed =
          run(pos_ + 2, [](char d) { return is_digit(d) || ((d | 0x20) >= 'a' && (d | 0x20) <= 'f'); });
      base = 16;
    }
    size_t digits_begin = pos_;
    if (prefixed > pos_ + 2) {
      end = prefixed;
      digits_begin = pos_ + 2;
    } else if (c != '0') {
      base = 10;
      end = run(pos_ + 1, is_digit);
    } else {
      base = 10;
      end = run(pos_ + 1, [](char d) { return d == '0'; });
    }
    uint64_t value = 0;
    for (size_t i = digits_begin; i < end; ++i) {
      const char d = src_[i];
      if (d == '_') continue;
      const int digit = is_digit(d) ? d - '0' : (d | 0x20) - 'a' + 10;
      if (value > (std::numeric_limits<uint64_t>::max() - static_cast<uint64_t>(digit)) /
                      static_cast<uint64_t>(base) ||
          value * static_cast<uint64_t>(base) + static_cast<uint64_t>(digit) >
              static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
        throw TemplateError("an integer literal above the 64-bit range is not supported", line);
      }
      value = value * static_cast<uint64_t>(base) + static_cast<uint64_t>(digit);
    }
    Token t;
    t.type = Token::Type::kInteger;
    t.int_value = static_cast<int64_t>(value);
    t.text = std::string(src_.substr(pos_, end - pos_));
    t.line = line;
    tokens_.push_back(std::move(t));
    advance(end);
  }

  void lex_string(char quote) {
    const int line = line_;
    size_t i = pos_ + 1;
    while (i < src_.size() && src_[i] != quote) {
      i += src_[i] == '\\' ? 2 : 1;
    }
    if (i >= src_.size())
      throw TemplateError(fmt::format("unexpected char '{}' (an unterminated string)", quote), line);
    emit(Token::Type::kString, decode_string_literal(src_.substr(pos_ + 1, i - pos_ - 1), line), line);
    advance(i + 1);
  }

  void lex_operator(std::vector<char>& balancing) {
    static constexpr std::string_view kTwo[] = {"//", "**", "==", "!=", ">=", "<="};
    static constexpr std::string_view kOne = "+-/*%~[](){}><=.:|,;";
    const int line = line_;
    const std::string_view rest = src_.substr(pos_);
    std::string op;
    for (const std::string_view two : kTwo) {
      if (rest.starts_with(two)) op = two;
    }
    if (op.empty()) {
      if (kOne.find(rest[0]) == std::string_view::npos) {
        throw TemplateError(fmt::format("unexpected char '{}'", rest[0]), line);
      }
      op = rest.substr(0, 1);
    }
    if (op == "{") balancing.push_back('}');
    if (op == "(") balancing.push_back(')');
    if (op == "[") balancing.push_back(']');
    if (op == "}" || op == ")" || op == "]") {
      if (balancing.empty()) throw TemplateError(fmt::format("unexpected '{}'", op), line);
      if (balancing.back() != op[0]) {
        throw TemplateError(fmt::format("unexpected '{}', expected '{}'", op, balancing.back()), line);
      }
      balancing.pop_back();
    }
    emit(Token::Type::kOperator, op, line);
    advance(pos_ + op.size());
  }

  std::string_view src_;
  const LexerOptions& options_;
  size_t pos_ = 0;
  int line_ = 1;
  bool line_starting_ = true;
  std::vector<Token> tokens_;
};

}  // namespace

std::vector<Token> tokenize(std::string_view source, const LexerOptions& options) {
  if (!text::valid_utf8(source)) throw TemplateError("the template is not valid UTF-8", 1);
  // jinja2 3.x: every \r\n, \r and \n is a line break, written \n; one trailing newline is dropped
  // (keep_trailing_newline off).
  std::string normalized;
  normalized.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      normalized += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      normalized += source[i];
    }
  }
  if (!normalized.empty() && normalized.back() == '\n') normalized.pop_back();
  Lexer lexer(normalized, options);
  return lexer.run();
}

}  // namespace crescent::jinja
