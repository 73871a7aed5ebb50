#include "common/json_util.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <clocale>
#include <cmath>
#include <cstdlib>
#include <fstream>

#include "common/utf8.h"

namespace crescent {
namespace {

// A SAX pass that only counts nesting; false from a handler stops the parse.
struct DepthCheck : nlohmann::json_sax<nlohmann::json> {
  int depth = 0, limit = 0;
  bool exceeded = false;
  bool push() {
    exceeded = ++depth > limit;
    return !exceeded;
  }
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override { return push(); }
  bool key(string_t&) override { return true; }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override { return push(); }
  bool end_array() override { return --depth, true; }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
    return false;
  }
};

// parse_json_bounded's parser: recursive descent over the text, building nlohmann::json values as
// nlohmann's own parser (lexer.hpp, parser.hpp, json_sax.hpp) would: numbers converted as its lexer does,
// strings validated as it validates them (RFC 3629's UTF-8, escapes, surrogate pairs), a duplicate key's
// last value kept.
class BoundedJsonParser {
 public:
  BoundedJsonParser(std::string_view text, int max_depth)
      : begin_(text.data()), p_(text.data()), end_(text.data() + text.size()), max_depth_(max_depth) {}

  Result<nlohmann::json> parse() {
    // A UTF-8 byte order mark is skipped; a first byte 0xEF that does not start one is an error.
    if (p_ != end_ && byte(0) == 0xEF) {
      if (end_ - p_ < 3 || byte(1) != 0xBB || byte(2) != 0xBF) return invalid("invalid byte order mark");
      p_ += 3;
    }
    nlohmann::json value;
    if (!parse_value(value, 0)) return failure_;
    skip_white_space();
    if (p_ != end_) return invalid("text after the value");
    return value;
  }

 private:
  unsigned char byte(ptrdiff_t k) const { return static_cast<unsigned char>(p_[k]); }

  bool fail(Status status) {
    failure_ = std::move(status);
    return false;
  }
  Status invalid(std::string_view why) const {
    return Status::invalid_argument(fmt::format("not valid JSON at byte {}: {}", p_ - begin_, why));
  }

  void skip_white_space() {
    while (p_ != end_ && (*p_ == ' ' || *p_ == '\t' || *p_ == '\n' || *p_ == '\r')) ++p_;
  }

  bool expect_literal(std::string_view literal) {
    if (static_cast<size_t>(end_ - p_) < literal.size() || std::string_view(p_, literal.size()) != literal) {
      return fail(invalid("an unknown literal"));
    }
    p_ += literal.size();
    return true;
  }

  bool parse_value(nlohmann::json& out, int depth) {
    skip_white_space();
    if (p_ == end_) return fail(invalid("a value is missing"));
    switch (*p_) {
      case '{':
        return parse_object(out, depth + 1);
      case '[':
        return parse_array(out, depth + 1);
      case '"': {
        std::string s;
        if (!parse_string(s)) return false;
        out = std::move(s);
        return true;
      }
      case 't':
        out = true;
        return expect_literal("true");
      case 'f':
        out = false;
        return expect_literal("false");
      case 'n':
        out = nullptr;
        return expect_literal("null");
      default:
        return parse_number(out);
    }
  }

  bool parse_object(nlohmann::json& out, int depth) {
    if (depth > max_depth_) {
      return fail(Status::out_of_range(
          fmt::format("nests deeper than {} levels at byte {}", max_depth_, p_ - begin_)));
    }
    ++p_;  // '{'
    out = nlohmann::json::object();
    auto& object = out.get_ref<nlohmann::json::object_t&>();
    skip_white_space();
    if (p_ != end_ && *p_ == '}') {
      ++p_;
      return true;
    }
    for (;;) {
      skip_white_space();
      if (p_ == end_ || *p_ != '"') return fail(invalid("an object key is missing"));
      std::string key;
      if (!parse_string(key)) return false;
      skip_white_space();
      if (p_ == end_ || *p_ != ':') return fail(invalid("':' is missing after an object key"));
      ++p_;
      nlohmann::json value;
      if (!parse_value(value, depth)) return false;
      object.insert_or_assign(std::move(key), std::move(value));  // a duplicate key: the last value
      skip_white_space();
      if (p_ != end_ && *p_ == ',') {
        ++p_;
        continue;
      }
      if (p_ != end_ && *p_ == '}') {
        ++p_;
        return true;
      }
      return fail(invalid("',' or '}' is missing in an object"));
    }
  }

  bool parse_array(nlohmann::json& out, int depth) {
    if (depth > max_depth_) {
      return fail(Status::out_of_range(
          fmt::format("nests deeper than {} levels at byte {}", max_depth_, p_ - begin_)));
    }
    ++p_;  // '['
    out = nlohmann::json::array();
    auto& array = out.get_ref<nlohmann::json::array_t&>();
    skip_white_space();
    if (p_ != end_ && *p_ == ']') {
      ++p_;
      return true;
    }
    for (;;) {
      if (!parse_value(array.emplace_back(), depth)) return false;
      skip_white_space();
      if (p_ != end_ && *p_ == ',') {
        ++p_;
        continue;
      }
      if (p_ != end_ && *p_ == ']') {
        ++p_;
        return true;
      }
      return fail(invalid("',' or ']' is missing in an array"));
    }
  }

  // Four hex digits at p_ (any case) as a number, or -1.
  int32_t hex4() {
    if (end_ - p_ < 4) return -1;
    int32_t value = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = p_[k];
      const int digit = c >= '0' && c <= '9'   ? c - '0'
                        : c >= 'a' && c <= 'f' ? c - 'a' + 10
                        : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                               : -1;
      if (digit < 0) return -1;
      value = value * 16 + digit;
    }
    p_ += 4;
    return value;
  }

  // The length of the well-formed UTF-8 sequence at p_ (a byte from 0x80 on), by RFC 3629's table as
  // nlohmann's lexer checks it, or 0.
  size_t utf8_length() const {
    const unsigned char c = byte(0);
    const ptrdiff_t left = end_ - p_;
    const auto in = [&](ptrdiff_t k, unsigned char lo, unsigned char hi) {
      return k < left && byte(k) >= lo && byte(k) <= hi;
    };
    if (c >= 0xC2 && c <= 0xDF) return in(1, 0x80, 0xBF) ? 2 : 0;
    if (c == 0xE0) return in(1, 0xA0, 0xBF) && in(2, 0x80, 0xBF) ? 3 : 0;
    if ((c >= 0xE1 && c <= 0xEC) || c == 0xEE || c == 0xEF)
      return in(1, 0x80, 0xBF) && in(2, 0x80, 0xBF) ? 3 : 0;
    if (c == 0xED) return in(1, 0x80, 0x9F) && in(2, 0x80, 0xBF) ? 3 : 0;
    if (c == 0xF0) return in(1, 0x90, 0xBF) && in(2, 0x80, 0xBF) && in(3, 0x80, 0xBF) ? 4 : 0;
    if (c >= 0xF1 && c <= 0xF3) return in(1, 0x80, 0xBF) && in(2, 0x80, 0xBF) && in(3, 0x80, 0xBF) ? 4 : 0;
    if (c == 0xF4) return in(1, 0x80, 0x8F) && in(2, 0x80, 0xBF) && in(3, 0x80, 0xBF) ? 4 : 0;
    return 0;
  }

  bool parse_string(std::string& out) {
    ++p_;  // '"'
    for (;;) {
      // A run of bytes copied as they are: printable ASCII but '"' and '\\', and valid UTF-8 sequences.
      const char* run = p_;
      while (p_ != end_) {
        const unsigned char c = byte(0);
        if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
          ++p_;
        } else if (c >= 0x80) {
          const size_t n = utf8_length();
          if (n == 0) break;
          p_ += n;
        } else {
          break;
        }
      }
      out.append(run, p_);
      if (p_ == end_) return fail(invalid("a string is not terminated"));
      const unsigned char c = byte(0);
      if (c == '"') {
        ++p_;
        return true;
      }
      if (c >= 0x80) return fail(invalid("invalid UTF-8 in a string"));
      if (c < 0x20) return fail(invalid("a control character in a string"));
      ++p_;  // '\\'
      if (p_ == end_) return fail(invalid("a string is not terminated"));
      const char escape = *p_++;
      switch (escape) {
        case '"':
          out += '"';
          break;
        case '\\':
          out += '\\';
          break;
        case '/':
          out += '/';
          break;
        case 'b':
          out += '\b';
          break;
        case 'f':
          out += '\f';
          break;
        case 'n':
          out += '\n';
          break;
        case 'r':
          out += '\r';
          break;
        case 't':
          out += '\t';
          break;
        case 'u': {
          int32_t code_point = hex4();
          if (code_point < 0) return fail(invalid("\\u is not followed by four hex digits"));
          if (code_point >= 0xD800 && code_point <= 0xDBFF) {
            // A high surrogate must be followed by an escaped low one: together one code point.
            if (end_ - p_ < 2 || p_[0] != '\\' || p_[1] != 'u') return fail(invalid("a lone high surrogate"));
            p_ += 2;
            const int32_t low = hex4();
            if (low < 0xDC00 || low > 0xDFFF) return fail(invalid("a high surrogate without its low one"));
            code_point = 0x10000 + ((code_point - 0xD800) << 10) + (low - 0xDC00);
          } else if (code_point >= 0xDC00 && code_point <= 0xDFFF) {
            return fail(invalid("a lone low surrogate"));
          }
          append_utf8(out, static_cast<char32_t>(code_point));
          break;
        }
        default:
          return fail(invalid("an unknown escape in a string"));
      }
    }
  }

  // -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?, converted as nlohmann's lexer does: an integer that
  // strtoll (negative) or strtoull (else) takes without overflow is one; anything else is strtod's double,
  // refused when it is not finite.
  bool parse_number(nlohmann::json& out) {
    const char* start = p_;
    const auto digit = [&] { return p_ != end_ && *p_ >= '0' && *p_ <= '9'; };
    const bool negative = p_ != end_ && *p_ == '-';
    if (negative) ++p_;
    if (!digit()) return fail(invalid("an unexpected character"));
    if (*p_ == '0') {
      ++p_;
    } else {
      while (digit()) ++p_;
    }
    bool integer = true;
    if (p_ != end_ && *p_ == '.') {
      integer = false;
      ++p_;
      if (!digit()) return fail(invalid("a number's fraction has no digit"));
      while (digit()) ++p_;
    }
    if (p_ != end_ && (*p_ == 'e' || *p_ == 'E')) {
      integer = false;
      ++p_;
      if (p_ != end_ && (*p_ == '+' || *p_ == '-')) ++p_;
      if (!digit()) return fail(invalid("a number's exponent has no digit"));
      while (digit()) ++p_;
    }
    std::string token(start, p_);
    char* parsed_end = nullptr;
    errno = 0;
    if (integer && negative) {
      const long long x = std::strtoll(token.c_str(), &parsed_end, 10);
      if (errno == 0) {
        out = static_cast<nlohmann::json::number_integer_t>(x);
        return true;
      }
    } else if (integer) {
      const unsigned long long x = std::strtoull(token.c_str(), &parsed_end, 10);
      if (errno == 0) {
        out = static_cast<nlohmann::json::number_unsigned_t>(x);
        return true;
      }
    }
    // As the lexer does: the locale's decimal point for '.', for strtod.
    const lconv* locale = std::localeconv();
    const char point = locale == nullptr || locale->decimal_point == nullptr ? '.' : *locale->decimal_point;
    std::replace(token.begin(), token.end(), '.', point);
    const double value = std::strtod(token.c_str(), &parsed_end);
    if (!std::isfinite(value)) return fail(invalid("a number overflows a double"));
    out = value;
    return true;
  }

  const char* const begin_;
  const char* p_;
  const char* const end_;
  const int max_depth_;
  Status failure_;
};

}  // namespace

Result<nlohmann::json> parse_json_bounded(std::string_view text, int max_depth) {
  return BoundedJsonParser(text, max_depth).parse();
}

bool json_depth_exceeds(std::string_view text, int limit) {
  DepthCheck check;
  check.limit = limit;
  nlohmann::json::sax_parse(text, &check, nlohmann::json::input_format_t::json, /*strict=*/true);
  return check.exceeded;
}

Result<nlohmann::json> read_json_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status::not_found(fmt::format("{}: cannot open file", path));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::parse_error& e) {
    return Status::invalid_argument(fmt::format("{}: not valid JSON (byte {}): {}", path, e.byte, e.what()));
  } catch (const nlohmann::json::exception& e) {  // e.g. a number too large for a double
    return Status::invalid_argument(fmt::format("{}: not valid JSON: {}", path, e.what()));
  }
}

std::string preset_override_name(std::string_view preset, const nlohmann::json& object) {
  std::vector<std::string> overrides;
  for (const auto& [key, value] : object.items()) {
    if (key != "preset" && key != "name") overrides.push_back(fmt::format("{}={}", key, value.dump()));
  }
  if (overrides.empty()) return std::string(preset);
  return fmt::format("{} with {}", preset, fmt::join(overrides, ", "));
}

Status JsonFields::positive_number(std::string_view key, double& out, bool required, bool allow_zero) const {
  auto it = object_.find(key);
  if (it == object_.end()) {
    return required ? Status::invalid_argument(fmt::format("{}: missing field '{}'", where_, key)) : Status();
  }
  if (!it->is_number()) {
    return Status::invalid_argument(
        fmt::format("{}: field '{}' must be a number, got {}", where_, key, it->dump()));
  }
  double v = it->get<double>();
  if (!std::isfinite(v) || v < 0 || (!allow_zero && v == 0)) {
    return Status::invalid_argument(fmt::format("{}: field '{}' must be {}, got {}", where_, key,
                                                allow_zero ? ">= 0" : "> 0", it->dump()));
  }
  out = v;
  return Status();
}

Status JsonFields::integer(std::string_view key, int64_t& out, int64_t min_value, bool required) const {
  auto it = object_.find(key);
  if (it == object_.end()) {
    return required ? Status::invalid_argument(fmt::format("{}: missing field '{}'", where_, key)) : Status();
  }
  if (!it->is_number_integer() || (it->is_number_unsigned() && it->get<uint64_t>() > INT64_MAX)) {
    return Status::invalid_argument(
        fmt::format("{}: field '{}' must be an integer, got {}", where_, key, it->dump()));
  }
  int64_t v = it->get<int64_t>();
  if (v < min_value) {
    return Status::invalid_argument(
        fmt::format("{}: field '{}' must be >= {}, got {}", where_, key, min_value, v));
  }
  out = v;
  return Status();
}

Status JsonFields::string(std::string_view key, std::string& out, bool required) const {
  auto it = object_.find(key);
  if (it == object_.end()) {
    return required ? Status::invalid_argument(fmt::format("{}: missing field '{}'", where_, key)) : Status();
  }
  if (!it->is_string()) {
    return Status::invalid_argument(
        fmt::format("{}: field '{}' must be a string, got {}", where_, key, it->dump()));
  }
  out = it->get<std::string>();
  return Status();
}

Status JsonFields::no_unknown_keys(std::span<const std::string_view> known) const {
  if (!object_.is_object()) return Status::invalid_argument(fmt::format("{}: must be a JSON object", where_));
  for (const auto& [key, value] : object_.items()) {
    if (std::find(known.begin(), known.end(), key) == known.end()) {
      std::string names;
      for (auto k : known) names += fmt::format("{}{}", names.empty() ? "" : ", ", k);
      return Status::invalid_argument(fmt::format("{}: unknown field '{}' (known: {})", where_, key, names));
    }
  }
  return Status();
}

Status JsonFields::no_missing_keys(std::span<const std::string_view> required) const {
  if (!object_.is_object()) return Status::invalid_argument(fmt::format("{}: must be a JSON object", where_));
  std::vector<std::string> missing;
  for (std::string_view key : required) {
    if (!object_.contains(key)) missing.push_back(fmt::format("'{}'", key));
  }
  if (missing.empty()) return Status();
  return Status::invalid_argument(fmt::format("{}: missing field{} {}", where_,
                                              missing.size() == 1 ? "" : "s", fmt::join(missing, ", ")));
}

}  // namespace crescent
