#include "trace/reader.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <unistd.h>
#include <zlib.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <vector>

#include "test_support/temp_dir.h"

namespace crescent::trace {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A fresh directory per test, removed afterwards; files are written plain or gzip-compressed.
class ReaderTest : public ::testing::Test {
 protected:
  void SetUp() override { dir_ = temp_.path(); }

  std::string write(const std::string& name, const std::string& content, bool gzip = false) {
    const std::string path = (dir_ / name).string();
    if (gzip) {
      gzFile file = gzopen(path.c_str(), "wb");
      EXPECT_NE(file, nullptr);
      if (!content.empty()) {
        EXPECT_EQ(gzwrite(file, content.data(), static_cast<unsigned>(content.size())),
                  static_cast<int>(content.size()));
      }
      EXPECT_EQ(gzclose(file), Z_OK);
    } else {
      std::ofstream(path, std::ios::binary) << content;
    }
    return path;
  }

  test::TempDir temp_{"crescent-reader-test"};
  fs::path dir_;  // temp_'s
};

std::string line(int64_t timestamp, int64_t input, int64_t output, const std::string& hash_ids) {
  return "{\"timestamp\": " + std::to_string(timestamp) + ", \"input_length\": " + std::to_string(input) +
         ", \"output_length\": " + std::to_string(output) + ", \"hash_ids\": [" + hash_ids + "]}\n";
}

// Read with skip_invalid, the trace at `path` (two valid lines around one invalid one) gives the two
// requests and one skipped line, for `reason`, whose message is `message`.
void expect_skipped_once(const std::string& path, const std::string& reason, const std::string& message) {
  SkipReport skipped;
  Result<std::vector<Request>> rest = read_trace(path, {.skip_invalid = true}, &skipped);
  ASSERT_TRUE(rest.ok()) << rest.status().to_string();
  EXPECT_EQ(rest->size(), 2u);
  ASSERT_EQ(skipped.reasons.size(), 1u);
  EXPECT_EQ(skipped.reasons[0].reason, reason);
  EXPECT_EQ(skipped.reasons[0].first_message, message);
}

auto fields(const Request& r) {
  return std::tie(r.timestamp_ms, r.input_tokens, r.output_tokens, r.block_keys);
}

TEST_F(ReaderTest, ParsesValidLinesSkippingBlankOnes) {
  const std::string content =
      line(0, 1024, 500, "0, 1") + "\n   \t\n" +  // then an empty and a whitespace-only line
      R"({"hash_ids": [0, 7, 9], "extra": {"a": [1]}, "output_length": 1, "input_length": 1025, )"
      R"("timestamp": 250})" +
      "\r\n" + line(250, 1, 3, "4") +
      R"({"timestamp": 9223372036854775807, "input_length": 1, "output_length": 1, "hash_ids": [18]})";
  const std::string path = write("ok.jsonl", content);  // no final newline
  SkipReport skipped;
  Result<std::vector<Request>> requests = read_trace(path, {}, &skipped);
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  ASSERT_EQ(requests->size(), 4u);
  const std::vector<Request>& r = *requests;
  EXPECT_EQ(fields(r[0]), fields(Request{0, 1024, 500, {0, 1}}));
  EXPECT_EQ(fields(r[1]), fields(Request{250, 1025, 1, {0, 7, 9}}));  // 1025 tokens: 3 blocks of 512
  EXPECT_EQ(fields(r[2]), fields(Request{250, 1, 3, {4}}));
  EXPECT_EQ(fields(r[3]), fields(Request{9223372036854775807, 1, 1, {18}}));
  EXPECT_EQ(skipped.total_lines, 0);
  EXPECT_EQ(skipped.summary(), "");
}

// session_id is optional, read when present, and absent again on a later line without one.
TEST_F(ReaderTest, SessionIdIsOptional) {
  const std::string with_7 =
      R"({"timestamp": 0, "input_length": 1, "output_length": 1, "hash_ids": [1], "session_id": 7})";
  const std::string with_largest =
      R"({"timestamp": 2, "input_length": 1, "output_length": 1, "hash_ids": [3], )"
      R"("session_id": 9223372036854775807})";
  const std::string path = write("sessions.jsonl", with_7 + "\n" + line(1, 1, 1, "2") + with_largest + "\n");
  Result<std::unique_ptr<TraceReader>> reader = TraceReader::open(path, {});
  ASSERT_TRUE(reader.ok()) << reader.status().to_string();
  Request request;  // one object for every line, as a streaming reader's user has
  std::vector<std::optional<int64_t>> ids;
  for (;;) {
    Result<bool> read = (*reader)->next(request);
    ASSERT_TRUE(read.ok()) << read.status().to_string();
    if (!*read) break;
    ids.push_back(request.session_id);
  }
  EXPECT_EQ(ids, (std::vector<std::optional<int64_t>>{7, std::nullopt, 9223372036854775807}));
}

TEST_F(ReaderTest, BlockSizeOptionSetsExpectedBlockCount) {
  const std::string path = write("bs.jsonl", line(0, 10, 1, "1, 2, 3") + line(1, 12, 1, "1, 2, 3"));
  Result<std::vector<Request>> requests = read_trace(path, {.block_size_tokens = 4});
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  EXPECT_EQ(requests->size(), 2u);
  EXPECT_FALSE(read_trace(path, {.block_size_tokens = 5}).ok());  // ceil(12 / 5) = 3 but ceil(10 / 5) = 2
  EXPECT_EQ(read_trace(path, {.block_size_tokens = 0}).status().code(), StatusCode::kInvalidArgument);
}

// Lengths divided for a small model: rounded up, and a hash id then stands for block / divisor tokens.
TEST_F(ReaderTest, LengthDivisorScalesLengthsAndTheBlock) {
  const std::string path = write("div.jsonl", line(0, 1030, 33, "1, 2, 3") + line(1, 1024, 1, "1, 2"));
  Result<std::vector<Request>> requests = read_trace(path, {.block_size_tokens = 32, .length_divisor = 16});
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  EXPECT_EQ((*requests)[0].input_tokens, 65);  // ceil(1030 / 16)
  EXPECT_EQ((*requests)[0].output_tokens, 3);  // ceil(33 / 16)
  EXPECT_EQ((*requests)[1].input_tokens, 64);
  EXPECT_EQ((*requests)[1].output_tokens, 1);
  EXPECT_EQ((*requests)[0].block_keys.size(), 3u);
  auto wrong = read_trace(path, {.block_size_tokens = 512, .length_divisor = 16});
  EXPECT_THAT(wrong.status().message(),
              ::testing::HasSubstr("lengths divided by 16: divide the block size too"));
  EXPECT_EQ(read_trace(path, {.length_divisor = 0}).status().code(), StatusCode::kInvalidArgument);
}

TEST_F(ReaderTest, PlainAndGzipGiveIdenticalRequests) {
  std::mt19937 rng(7);
  std::string content;
  int64_t timestamp = 0;
  for (int i = 0; i < 500; ++i) {
    timestamp += static_cast<int64_t>(rng() % 1000);
    const int64_t input = 1 + static_cast<int64_t>(rng() % 5000);
    std::string ids;
    for (int64_t b = 0; b < (input + 511) / 512; ++b) {
      if (b > 0) ids += ", ";
      ids += std::to_string(rng() % 100000);
    }
    content += line(timestamp, input, 1 + static_cast<int64_t>(rng() % 900), ids);
  }
  // Names deliberately lie about the format: gzip is detected by its magic bytes.
  Result<std::vector<Request>> plain = read_trace(write("plain.jsonl.gz", content), {});
  Result<std::vector<Request>> gzipped = read_trace(write("gzipped.jsonl", content, /*gzip=*/true), {});
  ASSERT_TRUE(plain.ok()) << plain.status().to_string();
  ASSERT_TRUE(gzipped.ok()) << gzipped.status().to_string();
  ASSERT_EQ(plain->size(), 500u);
  ASSERT_EQ(gzipped->size(), 500u);
  for (size_t i = 0; i < plain->size(); ++i)
    EXPECT_EQ(fields((*plain)[i]), fields((*gzipped)[i])) << "request " << i;
}

struct InvalidCase {
  std::string line;    // written as line 3, after a valid line 1 (timestamp 100) and a blank line 2
  std::string field;   // expected in the message ("" when the line has no field to name)
  std::string reason;  // SkipReport reason
  std::string detail;  // also expected in the message
};

TEST_F(ReaderTest, EachValidationRuleNamesFileLineAndField) {
  const std::vector<InvalidCase> cases = {
      {R"({"timestamp": 100, "input_length": 1)", "", "not JSON", "not JSON"},
      {"\x01\x02garbage", "", "not JSON", "not JSON"},
      {"[1, 2]", "", "not an object", "not a JSON object"},
      {"42", "", "not an object", "not a JSON object"},
      {R"({"input_length": 1, "output_length": 1, "hash_ids": [1]})", "'timestamp'", "missing field",
       "missing"},
      {R"({"timestamp": 100, "output_length": 1, "hash_ids": [1]})", "'input_length'", "missing field",
       "missing"},
      {R"({"timestamp": 100, "input_length": 1, "hash_ids": [1]})", "'output_length'", "missing field",
       "missing"},
      {R"({"timestamp": 100, "input_length": 1, "output_length": 1})", "'hash_ids'", "missing field",
       "missing"},
      {R"({"timestamp": 100, "input_length": 3.5, "output_length": 1, "hash_ids": [1]})",
       "field 'input_length'", "not an integer", "got 3.5"},
      {R"({"timestamp": 100, "input_length": 1e2, "output_length": 1, "hash_ids": [1]})",
       "field 'input_length'", "not an integer", "got 100.0"},
      {R"({"timestamp": true, "input_length": 1, "output_length": 1, "hash_ids": [1]})", "field 'timestamp'",
       "not an integer", "got true"},
      {R"({"timestamp": 100, "input_length": 1, "output_length": "7", "hash_ids": [1]})",
       "field 'output_length'", "not an integer", R"(got "7")"},
      {R"({"timestamp": 100, "input_length": 1, "output_length": null, "hash_ids": [1]})",
       "field 'output_length'", "not an integer", "got null"},
      {R"({"timestamp": 100, "input_length": -5, "output_length": 1, "hash_ids": [1]})",
       "field 'input_length'", "negative value", "must be a non-negative integer, got -5"},
      {R"({"timestamp": 100, "input_length": 1, "output_length": -1, "hash_ids": [1]})",
       "field 'output_length'", "negative value", "got -1"},
      {R"({"timestamp": 9223372036854775808, "input_length": 1, "output_length": 1, "hash_ids": [1]})",
       "field 'timestamp'", "out of range", "got 9223372036854775808"},
      {R"({"timestamp": 100, "input_length": 1, "output_length": 1, "hash_ids": 1})", "field 'hash_ids'",
       "not an array", "got 1"},
      {R"({"timestamp": 100, "input_length": 1, "output_length": 1, "hash_ids": {"0": 1}})",
       "field 'hash_ids'", "not an array", "must be an array"},
      {R"({"timestamp": 100, "input_length": 1025, "output_length": 1, "hash_ids": [1, -2, 3]})",
       "field 'hash_ids[1]'", "negative value", "got -2"},
      {R"({"timestamp": 100, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2, 0.5]})",
       "field 'hash_ids[2]'", "not an integer", "got 0.5"},
      {R"({"timestamp": 100, "input_length": 1025, "output_length": 1, )"
       R"("hash_ids": [1, 2, 18446744073709551616]})",
       "field 'hash_ids[2]'", "out of range", "must be an integer in [0, 2^64), got 18446744073709551616"},
      {R"({"timestamp": 100, "input_length": 1025, "output_length": 1, "hash_ids": [1, 2]})",
       "field 'hash_ids'", "block count mismatch",
       "has 2 entries, expected ceil(input_length 1025 / block size 512) = 3"},
      {R"({"timestamp": 100, "input_length": 0, "output_length": 1, "hash_ids": []})", "field 'input_length'",
       "zero length", "must be >= 1, got 0"},
      {R"({"timestamp": 100, "input_length": 1, "output_length": 0, "hash_ids": [1]})",
       "field 'output_length'", "zero length", "must be >= 1, got 0"},
      {R"({"timestamp": 99, "input_length": 1, "output_length": 1, "hash_ids": [1]})", "field 'timestamp'",
       "timestamp went backwards", "99 is smaller than the previous request's 100"},
      {R"({"timestamp": 100, "input_length": 1, "output_length": 1, "hash_ids": [1], "session_id": -3})",
       "field 'session_id'", "negative value", "must be a non-negative integer, got -3"},
      {R"({"timestamp": 100, "input_length": 1, "output_length": 1, "hash_ids": [1], "session_id": 2.5})",
       "field 'session_id'", "not an integer", "got 2.5"},
      {R"({"timestamp": 100, "input_length": 1, "output_length": 1, "hash_ids": [1], "session_id": "a"})",
       "field 'session_id'", "not an integer", R"(got "a")"},
      {R"({"timestamp": 100, "input_length": 1, "output_length": 1, "hash_ids": [1], "session_id": null})",
       "field 'session_id'", "not an integer", "got null"},
      {R"({"timestamp": 100, "input_length": 1, "output_length": 1, "hash_ids": [1], )"
       R"("session_id": 9223372036854775808})",
       "field 'session_id'", "out of range",
       "must be a non-negative integer below 2^63, got 9223372036854775808"},
  };
  for (bool gzip : {false, true}) {
    for (const InvalidCase& c : cases) {
      SCOPED_TRACE(c.line + (gzip ? " (gzip)" : ""));
      const std::string path =
          write("bad.jsonl", line(100, 1, 1, "1") + "\n" + c.line + "\n" + line(200, 1, 1, "1"), gzip);
      Result<std::unique_ptr<TraceReader>> reader = TraceReader::open(path, {});
      ASSERT_TRUE(reader.ok()) << reader.status().to_string();
      Request request;
      Result<bool> first = (*reader)->next(request);
      ASSERT_TRUE(first.ok() && *first) << first.status().to_string();
      const Result<bool> second = (*reader)->next(request);
      ASSERT_FALSE(second.ok());
      EXPECT_EQ(second.status().code(), StatusCode::kInvalidArgument);
      EXPECT_THAT(second.status().message(), HasSubstr(path + ":3: "));
      EXPECT_THAT(second.status().message(), HasSubstr(c.field));
      EXPECT_THAT(second.status().message(), HasSubstr(c.detail));
      EXPECT_EQ((*reader)->line_number(), 3);
      EXPECT_EQ((*reader)->next(request).status().message(), second.status().message());  // the error sticks

      expect_skipped_once(path, c.reason, second.status().message());
    }
  }
}

TEST_F(ReaderTest, SkipInvalidCountsLinesPerReason) {
  const std::string path = write("mixed.jsonl", line(100, 1, 1, "1") +        // 1 valid
                                                    "not json\n" +            // 2 not JSON
                                                    line(50, 1, 1, "1") +     // 3 went backwards
                                                    line(100, 513, 1, "1") +  // 4 block count mismatch
                                                    "{]\n" +                  // 5 not JSON
                                                    line(100, 1, 1, "2") +    // 6 valid (100 >= 100)
                                                    line(60, 1, 1, "1") +     // 7 went backwards
                                                    line(300, 1, 1, "3"));    // 8 valid
  SkipReport skipped;
  Result<std::vector<Request>> requests = read_trace(path, {.skip_invalid = true}, &skipped);
  ASSERT_TRUE(requests.ok()) << requests.status().to_string();
  ASSERT_EQ(requests->size(), 3u);
  EXPECT_EQ((*requests)[1].block_keys, std::vector<BlockKey>{2});
  EXPECT_EQ((*requests)[2].timestamp_ms, 300);
  EXPECT_EQ(skipped.total_lines, 5);
  ASSERT_EQ(skipped.reasons.size(), 3u);
  EXPECT_EQ(skipped.reasons[0].reason, "not JSON");
  EXPECT_EQ(skipped.reasons[0].lines, 2);
  EXPECT_THAT(skipped.reasons[0].first_message, HasSubstr(path + ":2: not JSON"));
  EXPECT_EQ(skipped.reasons[1].reason, "timestamp went backwards");
  EXPECT_EQ(skipped.reasons[1].lines, 2);
  EXPECT_THAT(skipped.reasons[1].first_message, HasSubstr(path + ":3: field 'timestamp'"));
  EXPECT_EQ(skipped.reasons[2].reason, "block count mismatch");
  EXPECT_EQ(skipped.reasons[2].lines, 1);
  const std::string summary = skipped.summary();
  EXPECT_THAT(summary, HasSubstr("skipped 5 invalid lines: 2 not JSON (first: " + path + ":2: "));
  EXPECT_THAT(summary, HasSubstr(", 2 timestamp went backwards (first: " + path + ":3: "));
  EXPECT_THAT(summary, HasSubstr(", 1 block count mismatch (first: " + path + ":4: "));
}

TEST_F(ReaderTest, MaxRequestsStopsBeforeLaterLines) {
  // Line 3 is invalid, but reading stops after two valid requests, before it.
  const std::string path =
      write("limit.jsonl", line(0, 1, 1, "1") + "\n" + line(5, 1, 1, "2") + "not json\n");
  Result<std::vector<Request>> two = read_trace(path, {.max_requests = 2});
  ASSERT_TRUE(two.ok()) << two.status().to_string();
  ASSERT_EQ(two->size(), 2u);
  EXPECT_EQ((*two)[1].timestamp_ms, 5);
  EXPECT_FALSE(read_trace(path, {.max_requests = 3}).ok());
  EXPECT_FALSE(read_trace(path, {}).ok());
}

TEST_F(ReaderTest, TruncatedGzipIsAnError) {
  std::string content;
  for (int i = 0; i < 2000; ++i)
    content += line(i, 1024, 1, std::to_string(i) + ", " + std::to_string(i + 1));
  const std::string whole = write("whole.jsonl.gz", content, /*gzip=*/true);
  ASSERT_TRUE(read_trace(whole, {}).ok());
  const auto size = fs::file_size(whole);
  for (auto keep : {size - 4, size - 8, size / 2, uintmax_t{11}}) {
    SCOPED_TRACE(keep);
    fs::copy_file(whole, dir_ / "cut.jsonl.gz", fs::copy_options::overwrite_existing);
    fs::resize_file(dir_ / "cut.jsonl.gz", keep);
    Result<std::vector<Request>> cut = read_trace((dir_ / "cut.jsonl.gz").string(), {.skip_invalid = true});
    ASSERT_FALSE(cut.ok());
    EXPECT_EQ(cut.status().code(), StatusCode::kIoError);
    EXPECT_THAT(cut.status().message(), HasSubstr("cut.jsonl.gz"));
  }
}

TEST_F(ReaderTest, CorruptGzipIsAnError) {
  std::string content;
  for (int i = 0; i < 2000; ++i)
    content += line(i, 1024, 1, std::to_string(i) + ", " + std::to_string(i + 1));
  const std::string path = write("corrupt.jsonl.gz", content, /*gzip=*/true);
  std::fstream file(path, std::ios::in | std::ios::out | std::ios::binary);
  file.seekp(-6, std::ios::end);  // inside the CRC-32 trailer
  file.put('\xff').put('\x00');
  file.close();
  Result<std::vector<Request>> requests = read_trace(path, {});
  ASSERT_FALSE(requests.ok());
  EXPECT_EQ(requests.status().code(), StatusCode::kIoError);
}

TEST_F(ReaderTest, MissingFileIsNotFound) {
  const std::string path = (dir_ / "nope.jsonl").string();
  Result<std::vector<Request>> requests = read_trace(path, {});
  ASSERT_FALSE(requests.ok());
  EXPECT_EQ(requests.status().code(), StatusCode::kNotFound);
  EXPECT_THAT(requests.status().message(), HasSubstr(path));
}

TEST_F(ReaderTest, DirectoryIsAnIoError) {
  Result<std::vector<Request>> requests = read_trace(dir_.string(), {});
  ASSERT_FALSE(requests.ok());
  EXPECT_EQ(requests.status().code(), StatusCode::kIoError);
}

TEST_F(ReaderTest, EmptyFilesHaveNoRequests) {
  for (bool gzip : {false, true}) {
    Result<std::vector<Request>> requests = read_trace(write("empty.jsonl", "", gzip), {});
    ASSERT_TRUE(requests.ok()) << requests.status().to_string();
    EXPECT_TRUE(requests->empty());
  }
}

TEST_F(ReaderTest, ReadsALineOfAMillionBlocks) {
  std::string ids;
  for (int i = 0; i < 1'000'000; ++i) {
    if (i > 0) ids += ',';
    ids += std::to_string(i);
  }
  Result<std::vector<Request>> huge =
      read_trace(write("huge.jsonl", line(0, 512'000'000, 1, ids), /*gzip=*/true), {});
  ASSERT_TRUE(huge.ok()) << huge.status().to_string();
  ASSERT_EQ(huge->size(), 1u);
  EXPECT_EQ((*huge)[0].block_keys.size(), 1'000'000u);
  EXPECT_EQ((*huge)[0].block_keys.back(), 999'999u);
}

TEST_F(ReaderTest, RejectsLinesOver16MiB) {
  std::string content(17 << 20, ' ');
  content += "x\n" + line(0, 1, 1, "7");
  const std::string path = write("too_long.jsonl.gz", content, /*gzip=*/true);
  Result<std::unique_ptr<TraceReader>> strict = TraceReader::open(path, {});
  ASSERT_TRUE(strict.ok());
  Request request;
  const Result<bool> rejected = (*strict)->next(request);
  ASSERT_FALSE(rejected.ok());
  EXPECT_THAT(rejected.status().message(), HasSubstr(path + ":1: line longer than"));
  SkipReport skipped;
  Result<std::vector<Request>> rest = read_trace(path, {.skip_invalid = true}, &skipped);
  ASSERT_TRUE(rest.ok()) << rest.status().to_string();
  EXPECT_EQ(rest->size(), 1u);
  ASSERT_EQ(skipped.reasons.size(), 1u);
  EXPECT_EQ(skipped.reasons[0].reason, "line too long");
}

// ---- Trace files as people have them: byte-order marks, CRLF line endings, 64-bit keys, epoch timestamps.

// A small valid trace, LF line endings, ending in a newline.
const std::string kPlainTrace = line(0, 600, 5, "1, 2") + line(10, 1, 3, "3") + line(20, 1025, 7, "1, 2, 4");
const std::string kBom = "\xEF\xBB\xBF";

// `content` with every "\n" replaced by "\r\n".
std::string crlf(const std::string& content) {
  std::string out;
  for (char c : content) {
    if (c == '\n') out += '\r';
    out += c;
  }
  return out;
}

// Reads `path` expecting success, returning the requests.
std::vector<Request> read_ok(const std::string& path, const ReadOptions& options = {}) {
  Result<std::vector<Request>> requests = read_trace(path, options);
  EXPECT_TRUE(requests.ok()) << requests.status().to_string();
  return requests.ok() ? *requests : std::vector<Request>{};
}

void expect_same_requests(const std::vector<Request>& actual, const std::vector<Request>& expected) {
  ASSERT_EQ(actual.size(), expected.size());
  for (size_t i = 0; i < actual.size(); ++i)
    EXPECT_EQ(fields(actual[i]), fields(expected[i])) << "request " << i;
}

TEST_F(ReaderTest, Utf8BomWithLfReadsLikeNoBom) {
  const std::vector<Request> expected = read_ok(write("plain.jsonl", kPlainTrace));
  ASSERT_EQ(expected.size(), 3u);
  EXPECT_EQ(fields(expected[0]), fields(Request{0, 600, 5, {1, 2}}));
  expect_same_requests(read_ok(write("bom.jsonl", kBom + kPlainTrace)), expected);
  // A BOM followed by a blank first line, and a file that is only a BOM.
  expect_same_requests(read_ok(write("bom_blank.jsonl", kBom + "\n" + kPlainTrace)), expected);
  EXPECT_TRUE(read_ok(write("only_bom.jsonl", kBom)).empty());
}

TEST_F(ReaderTest, Utf8BomWithCrlfReadsLikeNoBom) {
  const std::vector<Request> expected = read_ok(write("plain.jsonl", kPlainTrace));
  expect_same_requests(read_ok(write("bom_crlf.jsonl", kBom + crlf(kPlainTrace))), expected);
  expect_same_requests(read_ok(write("crlf.jsonl", crlf(kPlainTrace))), expected);
}

TEST_F(ReaderTest, Utf8BomInGzipFileIsSkipped) {
  const std::vector<Request> expected = read_ok(write("plain.jsonl", kPlainTrace));
  expect_same_requests(read_ok(write("bom.jsonl.gz", kBom + kPlainTrace, /*gzip=*/true)), expected);
  expect_same_requests(read_ok(write("bom_crlf.jsonl.gz", kBom + crlf(kPlainTrace), /*gzip=*/true)),
                       expected);
}

TEST_F(ReaderTest, Utf8BomIsOnlySkippedAtTheStartOfTheFile) {
  for (bool gzip : {false, true}) {
    SCOPED_TRACE(gzip ? "gzip" : "plain");
    const std::string path = write("bom_line2.jsonl", line(0, 1, 1, "1") + kBom + line(5, 1, 1, "2"), gzip);
    Result<std::vector<Request>> strict = read_trace(path, {});
    ASSERT_FALSE(strict.ok());
    EXPECT_THAT(strict.status().message(), HasSubstr(path + ":2: not JSON"));
    SkipReport skipped;
    Result<std::vector<Request>> rest = read_trace(path, {.skip_invalid = true}, &skipped);
    ASSERT_TRUE(rest.ok()) << rest.status().to_string();
    EXPECT_EQ(rest->size(), 1u);
    EXPECT_EQ(skipped.total_lines, 1);
  }
}

TEST_F(ReaderTest, CrlfWithoutFinalNewlineKeepsLineNumbers) {
  // CRLF on every line, a blank CRLF line 2, an invalid line 4, and a last line 6 without a final newline:
  // nothing after it, or a lone "\r".
  const std::string lines = crlf(line(0, 600, 5, "1, 2") + "\n" + line(10, 1, 3, "3") + line(5, 1, 1, "9") +
                                 line(20, 1025, 7, "1, 2, 4")) +
                            R"({"timestamp": 30, "input_length": 1, "output_length": 2, "hash_ids": [5]})";
  for (const std::string ending : {"", "\r"}) {
    for (bool gzip : {false, true}) {
      SCOPED_TRACE(std::string(gzip ? "gzip" : "plain") + (ending.empty() ? "" : ", ends in \\r"));
      const std::string path = write("crlf.jsonl", lines + ending, gzip);
      Result<std::vector<Request>> strict = read_trace(path, {});
      ASSERT_FALSE(strict.ok());
      EXPECT_EQ(strict.status().message(),
                path + ":4: field 'timestamp': 5 is smaller than the previous request's 10");

      Result<std::unique_ptr<TraceReader>> reader = TraceReader::open(path, {.skip_invalid = true});
      ASSERT_TRUE(reader.ok());
      std::vector<Request> requests;
      for (Request request;;) {
        Result<bool> next = (*reader)->next(request);
        ASSERT_TRUE(next.ok()) << next.status().to_string();
        if (!*next) break;
        requests.push_back(request);
      }
      expect_same_requests(requests, {Request{0, 600, 5, {1, 2}}, Request{10, 1, 3, {3}},
                                      Request{20, 1025, 7, {1, 2, 4}}, Request{30, 1, 2, {5}}});
      EXPECT_EQ((*reader)->line_number(), 6);
      const SkipReport& skipped = (*reader)->skipped();
      EXPECT_EQ(skipped.total_lines, 1);
      ASSERT_EQ(skipped.reasons.size(), 1u);
      EXPECT_EQ(skipped.reasons[0].first_message, strict.status().message());
    }
  }
}

TEST_F(ReaderTest, HashIdsAcceptTheWholeUint64Range) {
  const std::string path = write(
      "u64.jsonl", line(0, 2048, 1, "0, 9223372036854775807, 9223372036854775808, 18446744073709551615"));
  const std::vector<Request> requests = read_ok(path);
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].block_keys,
            (std::vector<BlockKey>{0, 9223372036854775807u, 9223372036854775808u, 18446744073709551615u}));
}

TEST_F(ReaderTest, HashIdAbove2To64IsRejectedNamingLineAndField) {
  // simdjson 3.0.1 fails the whole line on an integer it cannot represent; the reader still names the field.
  const std::vector<InvalidCase> cases = {
      {line(5, 1025, 1, "1, 2, 18446744073709551616"), "field 'hash_ids[2]'", "out of range",
       "must be an integer in [0, 2^64), got 18446744073709551616"},
      {line(5, 1025, 1, "1, 99999999999999999999999999, 3"), "field 'hash_ids[1]'", "out of range",
       "must be an integer in [0, 2^64), got 99999999999999999999999999"},
      {line(5, 1025, 1, "-9223372036854775809, 2, 3"), "field 'hash_ids[0]'", "negative value",
       "must be an integer in [0, 2^64), got -9223372036854775809"},
      {R"({"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": 18446744073709551616})",
       "field 'hash_ids'", "not an array",
       "must be an array of integers in [0, 2^64), got 18446744073709551616"},
      {R"({"timestamp": 18446744073709551616, "input_length": 1, "output_length": 1, "hash_ids": [1]})",
       "field 'timestamp'", "out of range",
       "must be a non-negative integer below 2^63, got 18446744073709551616"},
      {R"({"timestamp": 5, "input_length": 1, "output_length": -9223372036854775809, "hash_ids": [1]})",
       "field 'output_length'", "negative value", "must be a non-negative integer, got -9223372036854775809"},
      {R"({"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [1], )"
       R"("session_id": 18446744073709551616})",
       "field 'session_id'", "out of range",
       "must be a non-negative integer below 2^63, got 18446744073709551616"},
      {R"({"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [1], "x": {"hash_ids": [1, )"
       R"(18446744073709551616]}})",
       "number out of range", "out of range",
       "(integers must be in [-2^63, 2^64)), got 18446744073709551616"},
      // The first bad number is malformed, so simdjson's message stands; digits inside a string are no
      // number.
      {R"({"timestamp": 5, "input_length": 1, "output_length": 1, "hash_ids": [01], "s": "18446744073709551616"})",
       "not JSON", "not JSON", "Problem while parsing a number"},
  };
  for (bool gzip : {false, true}) {
    for (const InvalidCase& c : cases) {
      SCOPED_TRACE(c.line + (gzip ? " (gzip)" : ""));
      const std::string path = write("big.jsonl", line(0, 1, 1, "1") + line(1, 1, 1, "1") + c.line, gzip);
      Result<std::vector<Request>> strict = read_trace(path, {});
      ASSERT_FALSE(strict.ok());
      EXPECT_EQ(strict.status().code(), StatusCode::kInvalidArgument);
      EXPECT_THAT(strict.status().message(), HasSubstr(path + ":3: " + c.field));
      EXPECT_THAT(strict.status().message(), HasSubstr(c.detail));
      expect_skipped_once(path, c.reason, strict.status().message());
    }
  }
  // The exact message for the common case.
  const std::string path = write("exact.jsonl", line(5, 1025, 1, "1, 2, 18446744073709551616"));
  EXPECT_EQ(read_trace(path, {}).status().message(),
            path + ":1: field 'hash_ids[2]': must be an integer in [0, 2^64), got 18446744073709551616");
}

TEST_F(ReaderTest, NonIntegerHashIdsAreRejectedNamingTheEntry) {
  const std::vector<std::tuple<std::string, std::string, std::string>> cases = {
      // hash id, SkipReport reason, how the message shows it
      {"-1", "negative value", "-1"},       {"1.5", "not an integer", "1.5"},
      {"1e3", "not an integer", "1000.0"},  {"1.0", "not an integer", "1.0"},
      {"\"7\"", "not an integer", "\"7\""}, {"true", "not an integer", "true"},
      {"null", "not an integer", "null"},
  };
  for (const auto& [id, reason, shown] : cases) {
    SCOPED_TRACE(id);
    const std::string path = write("bad_id.jsonl", line(0, 1, 1, "1") + line(1, 1025, 1, "4, " + id + ", 6"));
    Result<std::vector<Request>> strict = read_trace(path, {});
    ASSERT_FALSE(strict.ok());
    EXPECT_EQ(strict.status().message(),
              path + ":2: field 'hash_ids[1]': must be an integer in [0, 2^64), got " + shown);
    SkipReport skipped;
    Result<std::vector<Request>> rest = read_trace(path, {.skip_invalid = true}, &skipped);
    ASSERT_TRUE(rest.ok()) << rest.status().to_string();
    EXPECT_EQ(rest->size(), 1u);
    ASSERT_EQ(skipped.reasons.size(), 1u);
    EXPECT_EQ(skipped.reasons[0].reason, reason);
  }
}

TEST_F(ReaderTest, ZeroInputOrOutputLengthIsRejected) {
  const std::string path = write("zero.jsonl", line(0, 1, 1, "1") +           // 1 valid
                                                   line(1, 0, 5, "") +        // 2 zero input
                                                   line(2, 600, 0, "1, 2") +  // 3 zero output
                                                   line(3, 0, 0, "") +        // 4 both
                                                   line(4, 600, 1, "1, 2"));  // 5 valid
  Result<std::unique_ptr<TraceReader>> reader = TraceReader::open(path, {});
  ASSERT_TRUE(reader.ok());
  Request request;
  ASSERT_TRUE(*(*reader)->next(request));
  const Result<bool> zero_input = (*reader)->next(request);
  ASSERT_FALSE(zero_input.ok());
  EXPECT_EQ(zero_input.status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(zero_input.status().message(), path + ":2: field 'input_length': must be >= 1, got 0");

  const std::string output_path = write("zero_output.jsonl", line(2, 600, 0, "1, 2"));
  EXPECT_EQ(read_trace(output_path, {}).status().message(),
            output_path + ":1: field 'output_length': must be >= 1, got 0");

  SkipReport skipped;
  Result<std::vector<Request>> rest = read_trace(path, {.skip_invalid = true}, &skipped);
  ASSERT_TRUE(rest.ok()) << rest.status().to_string();
  expect_same_requests(*rest, {Request{0, 1, 1, {1}}, Request{4, 600, 1, {1, 2}}});
  EXPECT_EQ(skipped.total_lines, 3);
  ASSERT_EQ(skipped.reasons.size(), 1u);
  EXPECT_EQ(skipped.reasons[0].reason, "zero length");
  EXPECT_EQ(skipped.reasons[0].lines, 3);
  EXPECT_EQ(skipped.reasons[0].first_message, path + ":2: field 'input_length': must be >= 1, got 0");
  EXPECT_THAT(skipped.summary(),
              HasSubstr("skipped 3 invalid lines: 3 zero length (first: " + path + ":2: "));
}

TEST_F(ReaderTest, EpochMillisecondTimestampsReadExactly) {
  // Not rebased: the reader returns timestamps as written.
  const std::string path =
      write("epoch.jsonl", line(1717171717000, 1, 1, "1") + line(1717171717000, 1, 2, "2") +
                               line(1717171718250, 600, 3, "1, 3"));
  const std::vector<Request> requests = read_ok(path);
  expect_same_requests(requests, {Request{1717171717000, 1, 1, {1}}, Request{1717171717000, 1, 2, {2}},
                                  Request{1717171718250, 600, 3, {1, 3}}});
}

// ---- Fuzz-style: whatever the bytes, the reader yields valid requests or an error, never a crash.

// Reads `path` to the end or the first error, checking each request the reader accepts satisfies the rules.
// Returns how many it accepted.
int expect_valid_requests_or_error(const std::string& path, bool skip_invalid) {
  Result<std::unique_ptr<TraceReader>> reader = TraceReader::open(path, {.skip_invalid = skip_invalid});
  if (!reader.ok()) {
    ADD_FAILURE() << reader.status().to_string();
    return 0;
  }
  Request request;
  int64_t previous_timestamp_ms = 0;
  for (int accepted = 0;; ++accepted) {
    Result<bool> read = (*reader)->next(request);
    if (!read.ok()) {
      const StatusCode code = read.status().code();
      // Skipping leaves only stream errors; strict reading may also stop at an invalid line.
      EXPECT_TRUE(code == StatusCode::kIoError || (!skip_invalid && code == StatusCode::kInvalidArgument))
          << read.status().to_string();
      EXPECT_FALSE(read.status().message().empty());
      return accepted;
    }
    if (!*read) return accepted;
    EXPECT_GE(request.timestamp_ms, previous_timestamp_ms);
    EXPECT_GE(request.input_tokens, 1);
    EXPECT_GE(request.output_tokens, 1);
    EXPECT_EQ(static_cast<int64_t>(request.block_keys.size()), (request.input_tokens + 511) / 512);
    previous_timestamp_ms = request.timestamp_ms;
  }
}

// Each case is one or more lines followed by a valid line; all of them go into one file (files are slow to
// create on some machines), read plain and gzip-compressed, strictly (stops at the first invalid line) and
// skipping.
class ReaderFuzzTest : public ReaderTest {
 protected:
  void check(const std::vector<std::string>& cases) {
    std::string content;
    for (const std::string& c : cases) content += c + "\n" + valid_ + "\n";
    content += cases.back();  // the last case also ends the file without a newline
    for (bool gzip : {false, true}) {
      const std::string path = write("fuzz.jsonl", content, gzip);
      expect_valid_requests_or_error(path, /*skip_invalid=*/false);
      // At least the first valid line, or a mutated line accepted before it, gets through.
      EXPECT_GT(expect_valid_requests_or_error(path, /*skip_invalid=*/true), 0);
    }
  }

  std::mt19937 rng_{12345};
  const std::string valid_ =
      R"({"timestamp": 12, "input_length": 1100, "output_length": 7, "hash_ids": [3, 4, 5]})";
};

TEST_F(ReaderFuzzTest, TruncationAtEveryPosition) {
  std::vector<std::string> cases;
  for (size_t cut = 0; cut <= valid_.size(); ++cut) cases.push_back(valid_.substr(0, cut));
  check(cases);
}

TEST_F(ReaderFuzzTest, ByteFlipsAndInsertedNuls) {
  std::vector<std::string> cases;
  for (int i = 0; i < 3000; ++i) {
    std::string mutated = valid_;
    for (int flips = 1 + static_cast<int>(rng_() % 3); flips > 0; --flips) {
      const size_t at = rng_() % mutated.size();
      if (rng_() % 3 == 0) {
        mutated.insert(at, 1, '\0');
      } else {
        mutated[at] = static_cast<char>(rng_() % 256);
      }
    }
    cases.push_back(mutated);
  }
  check(cases);
}

TEST_F(ReaderFuzzTest, ExtremeNumbers) {
  // Around the int64 and uint64 limits, beyond them, floats, and things that are not JSON numbers.
  std::istringstream numbers(
      "9223372036854775807 9223372036854775808 -9223372036854775808 -9223372036854775809 "
      "18446744073709551615 18446744073709551616 99999999999999999999999999999999 1e308 1e309 -0 0.0 -1 1E2 "
      "0x10 01 +1 NaN Infinity \"\" [] {}");
  std::vector<std::string> cases;
  for (std::string number; numbers >> number;) {
    // Replace, in turn, the timestamp, input_length, output_length and the second hash id.
    for (const std::string target : {" 12,", " 1100,", " 7,", " 4,"}) {
      std::string line = valid_;
      line.replace(line.find(target) + 1, target.size() - 2, number);
      cases.push_back(line);
    }
  }
  check(cases);
}

TEST_F(ReaderFuzzTest, RandomBytes) {
  const std::string json_chars = "{}[]\":,0123456789-+.eE truefalsnul\\\n\t\r";
  std::vector<std::string> cases;
  for (int i = 0; i < 3000; ++i) {
    std::string bytes(rng_() % 200, ' ');
    for (char& c : bytes)
      c = rng_() % 2 ? json_chars[rng_() % json_chars.size()] : static_cast<char>(rng_() % 256);
    cases.push_back(bytes);
  }
  check(cases);
}

TEST_F(ReaderFuzzTest, DeepNesting) {
  std::string deep_object;
  for (int i = 0; i < 20'000; ++i) deep_object += "{\"a\":";
  check({std::string(100'000, '['), deep_object,
         R"({"extra": )" + std::string(100'000, '[') + std::string(100'000, ']') + ", " + valid_.substr(1)});
}

TEST_F(ReaderFuzzTest, CorruptGzipStreams) {
  std::string content;
  for (int i = 0; i < 300; ++i) content += line(i, 1100, 7, "3, 4, " + std::to_string(i));
  const std::string path = write("source.jsonl.gz", content, /*gzip=*/true);
  std::ifstream in(path, std::ios::binary);
  const std::string compressed((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (int i = 0; i < 100; ++i) {
    std::string corrupt = compressed;
    for (int flips = 1 + static_cast<int>(rng_() % 4); flips > 0; --flips) {
      corrupt[rng_() % corrupt.size()] = static_cast<char>(rng_() % 256);
    }
    const std::string corrupt_path = write("corrupt.jsonl.gz", corrupt);
    for (bool skip_invalid : {false, true}) expect_valid_requests_or_error(corrupt_path, skip_invalid);
  }
}

}  // namespace
}  // namespace crescent::trace
