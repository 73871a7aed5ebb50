#include "common/json_util.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "test_support/temp_dir.h"

namespace crescent {
namespace {

using nlohmann::json;
using ::testing::HasSubstr;

TEST(JsonFields, ReadsTypedFieldsAndNamesBadOnes) {
  json j = {{"n", 4}, {"x", 2.5}, {"s", "hi"}, {"neg", -1}, {"str", "7"}};
  JsonFields f(j, "c.json");
  int64_t n = 0;
  double x = 0;
  std::string s;
  EXPECT_TRUE(f.integer("n", n, 1).ok());
  EXPECT_EQ(n, 4);
  EXPECT_TRUE(f.positive_number("x", x).ok());
  EXPECT_EQ(x, 2.5);
  EXPECT_TRUE(f.string("s", s).ok());
  EXPECT_EQ(s, "hi");
  EXPECT_THAT(f.integer("neg", n, 0).message(), HasSubstr("c.json: field 'neg' must be >= 0, got -1"));
  EXPECT_THAT(f.integer("x", n, 0).message(), HasSubstr("'x' must be an integer"));
  EXPECT_THAT(f.positive_number("str", x).message(), HasSubstr("'str' must be a number"));
  EXPECT_THAT(f.positive_number("neg", x).message(), HasSubstr("'neg' must be > 0"));
  EXPECT_THAT(f.integer("missing", n, 0).message(), HasSubstr("missing field 'missing'"));
  EXPECT_TRUE(f.integer("missing", n, 0, /*required=*/false).ok());
  EXPECT_EQ(n, 4);  // unchanged when absent
}

TEST(JsonFields, UnknownKeysAreNamed) {
  json j = {{"a", 1}, {"typo", 2}};
  auto st = JsonFields(j, "c.json").no_unknown_keys({"a", "b"});
  EXPECT_THAT(st.message(), HasSubstr("unknown field 'typo' (known: a, b)"));
  EXPECT_FALSE(JsonFields(json::array(), "c.json").no_unknown_keys({"a"}).ok());
}

TEST(JsonFields, MissingKeysAreNamedAllAtOnce) {
  json j = {{"a", 1}};
  EXPECT_TRUE(JsonFields(j, "c.json").no_missing_keys({"a"}).ok());
  EXPECT_EQ(JsonFields(j, "c.json").no_missing_keys({"a", "b", "c"}).message(),
            "c.json: missing fields 'b', 'c'");
  EXPECT_EQ(JsonFields(j, "c.json").no_missing_keys({"b"}).message(), "c.json: missing field 'b'");
}

TEST(ReadJsonFile, ReportsMissingAndMalformedFiles) {
  EXPECT_EQ(read_json_file("/nonexistent/file.json").status().code(), StatusCode::kNotFound);
  test::TempDir dir;
  const std::string path = dir.file("crescent_json_util_test.json");
  std::ofstream(path) << "{\"a\": ";
  auto r = read_json_file(path);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(r.status().message(), HasSubstr("not valid JSON"));
}

// Whether `a` and `b` are the same tree, integer or float included (json's == takes 1 and 1.0 as equal); a
// signed and an unsigned integer of the same value are the same ("-0": parse_json_bounded's comment).
bool same_tree(const json& a, const json& b) {
  if (a.is_number_integer() && b.is_number_integer()) return a == b;
  if (a.type() != b.type()) return false;
  if (a.is_object()) {
    if (a.size() != b.size()) return false;
    for (auto ia = a.begin(), ib = b.begin(); ia != a.end(); ++ia, ++ib) {
      if (ia.key() != ib.key() || !same_tree(*ia, *ib)) return false;
    }
    return true;
  }
  if (a.is_array()) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); ++i) {
      if (!same_tree(a[i], b[i])) return false;
    }
    return true;
  }
  if (a.is_number_float()) return std::signbit(a.get<double>()) == std::signbit(b.get<double>()) && a == b;
  return a == b;
}

// Whether nlohmann reads an integer literal of `text` as a float: it is beyond 64 bits, which simdjson (and so
// parse_json_bounded) refuses.
bool has_integer_beyond_64_bits(const std::string& text) {
  struct Finder : nlohmann::json_sax<json> {
    bool found = false;
    bool number_float(number_float_t, const string_t& literal) override {
      found = found || literal.find_first_of(".eE") == string_t::npos;
      return true;
    }
    bool null() override { return true; }
    bool boolean(bool) override { return true; }
    bool number_integer(number_integer_t) override { return true; }
    bool number_unsigned(number_unsigned_t) override { return true; }
    bool string(string_t&) override { return true; }
    bool binary(binary_t&) override { return true; }
    bool start_object(std::size_t) override { return true; }
    bool key(string_t&) override { return true; }
    bool end_object() override { return true; }
    bool start_array(std::size_t) override { return true; }
    bool end_array() override { return true; }
    bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) override {
      return false;
    }
  } finder;
  json::sax_parse(text, &finder);
  return finder.found;
}

// parse_json_bounded against nlohmann's parse and json_depth_exceeds on `text`; "" when they agree.
std::string disagreement(const std::string& text, int limit = 64) {
  const Result<json> fast = parse_json_bounded(text, limit);
  const bool deep = json_depth_exceeds(text, limit);
  if (deep) {
    // Too deep and broken: refused either way (simdjson finds unclosed brackets before the depth).
    const bool refused = fast.status().code() == StatusCode::kOutOfRange ||
                         (fast.status().code() == StatusCode::kInvalidArgument && !json::accept(text));
    return refused ? "" : "nlohmann finds it too deep, the parser does not";
  }
  const json slow = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (slow.is_discarded()) {
    return fast.status().code() == StatusCode::kInvalidArgument
               ? ""
               : "nlohmann refuses it, the parser answers " +
                     (fast.ok() ? fast->dump() : fast.status().to_string());
  }
  if (!fast.ok()) {
    if (has_integer_beyond_64_bits(text) && fast.status().message().find("out of range") != std::string::npos) {
      return "";
    }
    return "nlohmann parses it, the parser refuses it: " + fast.status().to_string();
  }
  return same_tree(slow, *fast) ? ""
                                : "trees differ: nlohmann " + slow.dump() + ", the parser " + fast->dump();
}

TEST(ParseJsonBounded, AgreesWithNlohmannOnEdgeCases) {
  const std::vector<std::string> cases = {"",
                                          " ",
                                          "{}",
                                          "[]",
                                          "[1,2]",
                                          "[1,]",
                                          "{\"a\":1,}",
                                          "01",
                                          "-",
                                          "-0",
                                          "-0.0",
                                          "0.5",
                                          "1e400",
                                          "-1e400",
                                          "1e-400",
                                          "18446744073709551615",
                                          "18446744073709551616",
                                          "-9223372036854775808",
                                          "-9223372036854775809",
                                          "9223372036854775808",
                                          "1.5E+3",
                                          "1e",
                                          "1e+",
                                          "1.",
                                          ".1",
                                          "+1",
                                          "--1",
                                          "[-]",
                                          "2.",
                                          "0x10",
                                          "\"\\ud83d\\ude00\"",
                                          "\"\\ud83d\"",
                                          "\"\\ude00\"",
                                          "\"\\ud83dx\"",
                                          "\"\\ud83d\\u0041\"",
                                          "\"\\u00e9\\u00E9\"",
                                          std::string("\"\\u0000\"", 8),
                                          "\"\x01\"",
                                          "\"\x7f\"",
                                          "\"\xc3\xa9\"",
                                          "\"\xc3\"",
                                          "\"\xed\xa0\x80\"",
                                          "\"\xf4\x90\x80\x80\"",
                                          "\"\xf0\x9f\x98\x80\"",
                                          "\"\xe0\x80\xaf\"",
                                          "\"\xc0\xaf\"",
                                          "\"\x80\"",
                                          "\"\xff\"",
                                          "\xef\xbb\xbf{}",
                                          "\xef\xbb{}",
                                          "\xef{}",
                                          "{\"a\":1,\"a\":2}",
                                          "{\"a\":[1],\"a\":{\"b\":2}}",
                                          "tru",
                                          "true ",
                                          "nul",
                                          "null",
                                          "false",
                                          "[true false]",
                                          "{\"a\" 1}",
                                          "{\"a\":}",
                                          "{a:1}",
                                          "\"abc",
                                          "[",
                                          "{",
                                          "1 2",
                                          "\t\n\r 5 \t",
                                          " \f5",
                                          "\"\\x\"",
                                          "\"\\u12\"",
                                          "\"\\uGGGG\"",
                                          "\"\\/\\b\\f\\n\\r\\t\"",
                                          "\"tab\there\"",
                                          std::string("[1,\0]", 5),
                                          "{\"k\":{\"k\":[null,{},[]]}}",
                                          "[1.0e-5,2E2,-3.25]",
                                          "\"\\\"quoted\\\" and \\\\\""};
  for (const std::string& text : cases)
    EXPECT_EQ(disagreement(text), "") << json(text).dump(-1, ' ', false, json::error_handler_t::replace);
}

TEST(ParseJsonBounded, AgreesWithNlohmannOnNestingAtTheLimit) {
  for (int depth : {1, 2, 63, 64, 65, 1000}) {
    EXPECT_EQ(disagreement(std::string(depth, '[') + std::string(depth, ']')), "") << depth;
    std::string objects;
    for (int i = 0; i < depth; ++i) objects += "{\"a\":";
    objects += '1';
    objects.append(static_cast<size_t>(depth), '}');
    EXPECT_EQ(disagreement(objects), "") << depth;
    // Too deep and broken, and broken then too deep: refused.
    EXPECT_EQ(disagreement(std::string(depth, '[') + "x"), "") << depth;
    std::string broken = "[x";
    broken.append(static_cast<size_t>(depth), '[');
    EXPECT_EQ(disagreement(broken), "") << depth;
  }
  EXPECT_EQ(parse_json_bounded(std::string(65, '[') + std::string(65, ']'), 64).status().code(),
            StatusCode::kOutOfRange);
  EXPECT_TRUE(parse_json_bounded(std::string(64, '[') + std::string(64, ']'), 64).ok());
}

// Random documents (request bodies with long strings, numbers of every shape, nesting), whole and with random
// bytes changed, inserted or deleted: the same tree, or the same refusal.
TEST(ParseJsonBounded, AgreesWithNlohmannOnRandomAndBrokenDocuments) {
  std::mt19937_64 rng(17);
  const auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const std::vector<std::string> strings = {"",
                                            "a",
                                            "prompt text with spaces",
                                            "caf\u00e9 \u65e5\u672c \U0001F600",
                                            "quote \" backslash \\ slash / tab \t nl \n",
                                            std::string(300, 'x')};
  const std::vector<std::string> keys = {"model", "prompt", "max_tokens", "stream", "caf\u00e9", ""};
  const std::vector<std::string> numbers = {"0",
                                            "-0",
                                            "7",
                                            "-12",
                                            "3.5",
                                            "-0.25",
                                            "1e3",
                                            "2.5E-4",
                                            "18446744073709551615",
                                            "18446744073709551616",
                                            "-9223372036854775809",
                                            "1e308",
                                            "1e309"};
  std::function<json(int)> make = [&](int depth) -> json {
    switch (depth > 3 ? pick(4) : pick(7)) {
      case 0:
        return strings[pick(strings.size())];
      case 1:
        return json::parse(numbers[pick(numbers.size()) % 12]);  // not 1e309: it does not parse
      case 2:
        return pick(2) == 0;
      case 3:
        return nullptr;
      case 4: {
        json a = json::array();
        for (size_t n = pick(4); n > 0; --n) a.push_back(make(depth + 1));
        return a;
      }
      default: {
        json o = json::object();
        for (size_t n = pick(4); n > 0; --n) o[keys[pick(keys.size())]] = make(depth + 1);
        return o;
      }
    }
  };
  const std::string alphabet = "{}[]:,\"\\ 0123456789-+.eEtrufalsn\t\n";
  const std::vector<std::string> odd_bytes = {"\xc3", "\xa9",    "\xed\xa0\x80", "\x01",
                                              "\\u",  "\\ud83d", "\xff",         "1e999"};
  size_t disagreements = 0;
  for (int i = 0; i < 20000; ++i) {
    std::string text = make(0).dump(pick(3) == 0 ? 2 : -1);
    if (pick(4) == 0) {  // a number text json cannot hold, spliced in
      std::string spliced = "[";
      spliced.append(numbers[pick(numbers.size())]).append(",").append(text).append("]");
      text = std::move(spliced);
    }
    for (size_t edits = pick(3); edits > 0 && !text.empty(); --edits) {
      const size_t at = pick(text.size());
      switch (pick(3)) {
        case 0:
          text.erase(at, 1 + pick(3));
          break;
        case 1:
          text.insert(at, pick(3) == 0 ? odd_bytes[pick(odd_bytes.size())]
                                       : std::string(1, alphabet[pick(alphabet.size())]));
          break;
        default:
          text[at] = alphabet[pick(alphabet.size())];
          break;
      }
    }
    const std::string why = disagreement(text);
    if (!why.empty() && ++disagreements <= 10) {
      ADD_FAILURE() << json(text).dump(-1, ' ', false, json::error_handler_t::replace) << ": " << why;
    }
  }
  EXPECT_EQ(disagreements, 0u);
}

}  // namespace
}  // namespace crescent
