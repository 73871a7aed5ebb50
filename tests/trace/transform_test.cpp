#include "trace/transform.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "test_support/temp_dir.h"
#include "trace/reader.h"
#include "trace/stats.h"
#include "trace/writer.h"

namespace crescent::trace {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

constexpr int64_t kBlock = 512;

Request make(int64_t timestamp_ms, int64_t input_tokens, std::vector<BlockKey> keys,
             std::optional<int64_t> session = std::nullopt, int64_t output_tokens = 10) {
  Request r{.timestamp_ms = timestamp_ms,
            .input_tokens = input_tokens,
            .output_tokens = output_tokens,
            .block_keys = std::move(keys)};
  r.session_id = session;
  return r;
}

class TransformTest : public ::testing::Test {
 protected:
  // Writes `requests` as a trace file named `name`.
  std::string write(const std::string& name, const std::vector<Request>& requests) {
    const std::string path = (fs::path(dir_.path()) / name).string();
    auto writer = TraceWriter::open(path);
    EXPECT_TRUE(writer.ok());
    for (const Request& r : requests) EXPECT_TRUE((*writer)->append(r).ok());
    EXPECT_TRUE((*writer)->commit().ok());
    return path;
  }
  // Runs transform_trace over `inputs` into a file and reads it back (validating every line).
  std::vector<Request> transform(const std::vector<std::string>& inputs, const TransformOptions& options,
                                 TransformReport* report = nullptr) {
    const std::string path = (fs::path(dir_.path()) / "out.jsonl").string();
    auto writer = TraceWriter::open(path);
    EXPECT_TRUE(writer.ok());
    Result<TransformReport> done = transform_trace(inputs, options, **writer);
    EXPECT_TRUE(done.ok()) << done.status().to_string();
    if (!done.ok()) return {};
    if (report != nullptr) *report = *done;
    EXPECT_TRUE((*writer)->commit().ok());
    auto read = read_trace(path, {.block_size_tokens = options.merge.block_size_tokens});
    EXPECT_TRUE(read.ok()) << read.status().to_string();
    return read.ok() ? *read : std::vector<Request>{};
  }
  Status transform_error(const std::vector<std::string>& inputs, const TransformOptions& options) {
    auto writer = TraceWriter::open((fs::path(dir_.path()) / "err.jsonl").string());
    EXPECT_TRUE(writer.ok());
    return transform_trace(inputs, options, **writer).status();
  }

  test::TempDir dir_{"crescent-transform-test"};
};

std::vector<Request> drain(RequestSource& source) {
  std::vector<Request> out;
  Request r;
  for (;;) {
    Result<bool> read = source.next(r);
    EXPECT_TRUE(read.ok()) << read.status().to_string();
    if (!read.ok() || !*read) return out;
    out.push_back(r);
  }
}

TraceStats analyze(const std::vector<Request>& requests, int64_t block_size = kBlock) {
  TraceAnalyzer analyzer({.block_size_tokens = block_size, .capacities_tokens = {}, .optimal_curve = false});
  for (const Request& r : requests) analyzer.add(r);
  return analyzer.finish();
}

std::vector<int64_t> timestamps(const std::vector<Request>& requests) {
  std::vector<int64_t> out;
  for (const Request& r : requests) out.push_back(r.timestamp_ms);
  return out;
}

TEST(DeriveKey, IsAFunctionThatKeepsKindsAndIndicesApart) {
  const BlockKey a = derive_key(7, KeyDerivation::kCopy, 1);
  EXPECT_EQ(a, derive_key(7, KeyDerivation::kCopy, 1));
  std::set<BlockKey> distinct{7,
                              a,
                              derive_key(8, KeyDerivation::kCopy, 1),
                              derive_key(7, KeyDerivation::kCopy, 2),
                              derive_key(7, KeyDerivation::kMergeInput, 1),
                              derive_key(7, KeyDerivation::kLengthScale, 1)};
  EXPECT_EQ(distinct.size(), 6u);
}

// The window keeps [start, end): an arrival at the start is in, one at the end is out; the start becomes 0.
// Reading stops at the first arrival past the end: the broken line after it is never read.
TEST_F(TransformTest, WindowKeepsStartDropsEndAndStopsReading) {
  const std::string path = write("w.jsonl", {make(0, 1, {1}), make(999, 1, {2}), make(1000, 1, {3}),
                                             make(1999, 1, {4}), make(2000, 1, {5}), make(2500, 1, {6})});
  std::ofstream(path, std::ios::app) << "not json\n";
  auto merged = open_merged_inputs({path}, {});
  ASSERT_TRUE(merged.ok()) << merged.status().to_string();
  auto window = window_source(std::move(merged).value(), {.start_ms = 1000, .end_ms = 2000});
  const std::vector<Request> kept = drain(*window);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(timestamps(kept), (std::vector<int64_t>{0, 999}));
  EXPECT_EQ(kept[0].block_keys, std::vector<BlockKey>{3});
  EXPECT_EQ(kept[1].block_keys, std::vector<BlockKey>{4});

  // Without an end: to the end of the trace, where the broken line is an error naming it.
  auto rest = window_source(std::move(open_merged_inputs({path}, {})).value(), {.start_ms = 2000});
  Request r;
  ASSERT_TRUE(rest->next(r).ok());
  ASSERT_TRUE(rest->next(r).ok());
  EXPECT_EQ(r.timestamp_ms, 500);
  const Result<bool> broken = rest->next(r);
  ASSERT_FALSE(broken.ok());
  EXPECT_THAT(broken.status().message(), HasSubstr(path + ":7: not JSON"));
}

TEST_F(TransformTest, AnEmptyWindowIsAnError) {
  const std::string path = write("w.jsonl", {make(0, 1, {1}), make(5000, 1, {2})});
  TransformOptions options;
  options.window = TimeWindow{.start_ms = 1000, .end_ms = 2000};
  EXPECT_THAT(transform_error({path}, options).message(),
              HasSubstr("no request arrives in the window [1 s, 2 s)"));
  options.copies = 3;  // the copies' first pass finds it
  EXPECT_THAT(transform_error({path}, options).message(), HasSubstr("no request arrives in the window"));
}

// Merge: arrival order with ties to the first input; each input starts at 0 unless absolute_time; keys of
// the second input derived apart unless shared_keys; sessions numbered apart.
TEST_F(TransformTest, MergeOrdersArrivalsAndKeepsNamespacesApart) {
  const std::string a = write("a.jsonl", {make(1000, 512, {1}, 5), make(1300, 1024, {1, 2}, 5)});
  const std::string b =
      write("b.jsonl", {make(5000, 512, {1}, 5), make(5300, 512, {3}, 0), make(5400, 1, {4})});
  auto merged = open_merged_inputs({a, b}, {});
  ASSERT_TRUE(merged.ok()) << merged.status().to_string();
  std::vector<Request> out = drain(**merged);
  ASSERT_EQ(out.size(), 5u);
  EXPECT_EQ(timestamps(out), (std::vector<int64_t>{0, 0, 300, 300, 400}));
  EXPECT_EQ(out[0].block_keys, (std::vector<BlockKey>{1}));  // a's, first on the tie
  EXPECT_EQ(out[1].block_keys, (std::vector<BlockKey>{derive_key(1, KeyDerivation::kMergeInput, 1)}));
  EXPECT_EQ(out[2].block_keys, (std::vector<BlockKey>{1, 2}));
  EXPECT_EQ(out[3].block_keys, (std::vector<BlockKey>{derive_key(3, KeyDerivation::kMergeInput, 1)}));
  EXPECT_EQ(out[0].session_id, 10);  // 5 x 2 inputs + 0
  EXPECT_EQ(out[1].session_id, 11);  // 5 x 2 + 1: another session
  EXPECT_EQ(out[3].session_id, 1);
  EXPECT_EQ(out[4].session_id, std::nullopt);
  // Apart, b's first request misses although a's has the same key; keyed alike, it hits.
  EXPECT_DOUBLE_EQ(*analyze(out).reuse_ceiling, 512.0 / (512 + 512 + 1024 + 512 + 1));
  std::vector<Request> shared = drain(**open_merged_inputs({a, b}, {.shared_keys = true}));
  EXPECT_EQ(shared[1].block_keys, (std::vector<BlockKey>{1}));
  EXPECT_DOUBLE_EQ(*analyze(shared).reuse_ceiling, 1024.0 / (512 + 512 + 1024 + 512 + 1));

  std::vector<Request> absolute = drain(**open_merged_inputs({a, b}, {.absolute_time = true}));
  EXPECT_EQ(timestamps(absolute), (std::vector<int64_t>{0, 300, 4000, 4300, 4400}));
}

TEST_F(TransformTest, MergeErrorsNameTheInput) {
  const std::string ok = write("ok.jsonl", {make(0, 1, {1})});
  const std::string empty = write("empty.jsonl", {});
  auto merged = open_merged_inputs({ok, empty}, {});
  EXPECT_THAT(merged.status().message(), HasSubstr(empty + ": the trace has no requests"));
  EXPECT_EQ(open_merged_inputs({ok, "/nonexistent/x.jsonl"}, {}).status().code(), StatusCode::kNotFound);
  // 2 inputs x 4 copies: ids up to (2^63 - 1 - 7) / 8.
  const std::string big =
      write("big.jsonl", {make(0, 1, {1}, 1152921504606846975), make(1, 1, {1}, 1152921504606846976)});
  auto source = open_merged_inputs({big}, {.later_session_spread = 8});
  ASSERT_TRUE(source.ok());
  Request r;
  ASSERT_TRUE((*source)->next(r).ok());
  EXPECT_EQ(r.session_id, 1152921504606846975);
  const Result<bool> too_big = (*source)->next(r);
  ASSERT_FALSE(too_big.ok());
  EXPECT_THAT(too_big.status().message(),
              HasSubstr(big + ":2: field 'session_id': 1152921504606846976 is too large"));
  // In a merge, input 1's ids become s x 2 + 1: the largest that fits 4 copies after it still fits.
  source = open_merged_inputs({ok, big}, {.later_session_spread = 4});
  ASSERT_TRUE(source.ok());
  Status error;
  std::vector<int64_t> ids;
  for (;;) {
    Result<bool> read = (*source)->next(r);
    if (!read.ok()) {
      error = read.status();
      break;
    }
    ASSERT_TRUE(*read) << "the second id is refused";
    if (r.session_id) ids.push_back(*r.session_id);
  }
  EXPECT_THAT(ids, ::testing::ElementsAre(1152921504606846975 * 2 + 1));
  EXPECT_THAT(error.message(), HasSubstr(big + ":2: field 'session_id'"));
}

// Three sessions, each a system prompt block P and its own history: turn 1 [P, a], turn 2 [P, a, b]. Keys
// chained, one block each (512 tokens). Unbounded cache, N copies: every request but the very first hits P,
// every turn 2 also hits a, nothing else hits: (6N - 1) + 3N hit blocks of 15N.
std::vector<Request> system_prompt_sessions(bool session_ids) {
  auto session = [&](int64_t s) { return session_ids ? std::optional<int64_t>(s) : std::nullopt; };
  std::vector<Request> requests;
  for (int64_t s = 0; s < 3; ++s) {
    requests.push_back(make(1000 * s, 1024, {100, BlockKey(10 + s)}, session(s)));
  }
  for (int64_t s = 0; s < 3; ++s) {
    requests.push_back(make(5000 + 1000 * s, 1536, {100, BlockKey(10 + s), BlockKey(20 + s)}, session(s)));
  }
  return requests;
}

TEST_F(TransformTest, CopiesShareTheSystemPromptOnly) {
  const std::string path = write("sessions.jsonl", system_prompt_sessions(true));
  for (int64_t n : {1, 2, 4, 7}) {
    SCOPED_TRACE(n);
    TransformOptions options;
    options.copies = n;
    TransformReport report;
    const std::vector<Request> out = transform({path}, options, &report);
    ASSERT_EQ(out.size(), static_cast<size_t>(6 * n));
    const double expected = static_cast<double>(9 * n - 1) / static_cast<double>(15 * n);
    EXPECT_DOUBLE_EQ(*analyze(out).reuse_ceiling, expected);
    // Every session id is a session of its own, with its two turns in order, 5 s apart.
    std::map<int64_t, std::vector<const Request*>> sessions;
    for (const Request& r : out) sessions[r.session_id.value()].push_back(&r);
    ASSERT_EQ(sessions.size(), static_cast<size_t>(3 * n));
    for (const auto& [id, turns] : sessions) {
      ASSERT_EQ(turns.size(), 2u);
      EXPECT_EQ(turns[1]->timestamp_ms - turns[0]->timestamp_ms, 5000);
      EXPECT_EQ(turns[0]->block_keys[0], 100u);                     // the system prompt keeps its key
      EXPECT_EQ(turns[1]->block_keys[1], turns[0]->block_keys[1]);  // within a copy, the history is one
    }
    if (n > 1) {
      ASSERT_TRUE(report.copies);
      EXPECT_EQ(report.copies->shared_keys, 1);
      EXPECT_EQ(report.copies->distinct_keys, 7);
      EXPECT_EQ(report.copies->min_sessions, 2);
      EXPECT_EQ(report.copies->sessions, 3);
      EXPECT_TRUE(report.copies->by_session_ids);
    }
  }
}

// Without session ids each request is a session: by default (1%, at least 2) a session's history, in its two
// turns, would count as shared; a threshold of 50% (3 of 6 requests) picks the system prompt alone again.
TEST_F(TransformTest, CopiesWithoutSessionIdsCountRequests) {
  const std::string path = write("requests.jsonl", system_prompt_sessions(false));
  TransformOptions options;
  options.copies = 4;
  TransformReport report;
  std::vector<Request> out = transform({path}, options, &report);
  EXPECT_EQ(report.copies->min_sessions, 2);
  EXPECT_EQ(report.copies->shared_keys, 4);  // P and every a
  EXPECT_FALSE(report.copies->by_session_ids);
  options.shared = {.min_percent = 50};
  out = transform({path}, options, &report);
  EXPECT_EQ(report.copies->min_sessions, 3);
  EXPECT_EQ(report.copies->shared_keys, 1);
  EXPECT_DOUBLE_EQ(*analyze(out).reuse_ceiling, (9.0 * 4 - 1) / (15.0 * 4));
  for (const Request& r : out) EXPECT_EQ(r.session_id, std::nullopt);
}

// Copy c starts c x period / N later; a session that would start past the period moves to the front whole.
TEST_F(TransformTest, CopiesAreSpreadOverThePeriodAndWrapWholeSessions) {
  const std::string path = write("sessions.jsonl", system_prompt_sessions(true));
  TransformOptions options;
  options.copies = 4;
  const std::vector<Request> out = transform({path}, options);
  // Period: the last arrival + 1 ms = 7001 ms; offsets 0, 1750, 3501 (3500.5 rounded), 5251.
  std::vector<int64_t> expected;
  for (int64_t offset : {0, 1750, 3501, 5251}) {
    for (int64_t start : {0, 1000, 2000}) {
      const int64_t shift = start + offset >= 7001 ? offset - 7001 : offset;
      expected.push_back(start + shift);
      expected.push_back(start + 5000 + shift);
    }
  }
  std::sort(expected.begin(), expected.end());
  EXPECT_EQ(timestamps(out), expected);
  EXPECT_EQ(out.front().timestamp_ms, 0);
  EXPECT_LT(out.back().timestamp_ms, 7001 + 5000);

  // A window with an end sets the period: its length.
  options.window = TimeWindow{.start_ms = 0, .end_ms = 8000};
  TransformReport report;
  transform({path}, options, &report);
  EXPECT_EQ(report.copies->period_ms, 8000);
}

// Sessions interleave: a key is counted once per session however its sessions alternate, and a key repeated
// inside one request once for it.
TEST(CopyPlanner, CountsDistinctSessionsPerKey) {
  CopyPlanner planner;
  for (int64_t session : {1, 2, 1, 3, 2, 1}) planner.add(make(0, 1024, {7, 7}, session));
  planner.add(make(0, 1024, {8, 8}));  // no session id: a session of its own
  planner.add(make(0, 512, {8}));
  for (int64_t threshold : {2, 3, 4}) {
    CopyPlanner copy = planner;
    auto plan = copy.finish(2, {.min_sessions = threshold}, std::nullopt);
    ASSERT_TRUE(plan.ok()) << plan.status().to_string();
    EXPECT_EQ(plan->sessions, 5);
    EXPECT_FALSE(plan->by_session_ids);
    EXPECT_EQ(plan->shared_keys.contains(7), threshold <= 3) << threshold;
    EXPECT_EQ(plan->shared_keys.contains(8), threshold <= 2) << threshold;
  }
  EXPECT_FALSE(CopyPlanner().finish(2, {}, std::nullopt).ok());
}

TEST(CopyRequest, DerivesEveryKeyFromTheFirstUnsharedOne) {
  CopyPlan plan;
  plan.copies = 3;
  plan.period_ms = 900;
  plan.shared_keys = {1, 3};
  // 3 is shared (by other sessions) but follows this session's 2: in a copy it follows the copy's own 2.
  const Request r = make(100, 2048, {1, 2, 3, 4}, 7);
  const Request copy = copy_request(r, 2, plan);
  EXPECT_EQ(copy.block_keys, (std::vector<BlockKey>{1, derive_key(2, KeyDerivation::kCopy, 2),
                                                    derive_key(3, KeyDerivation::kCopy, 2),
                                                    derive_key(4, KeyDerivation::kCopy, 2)}));
  EXPECT_EQ(copy.session_id, 7 * 3 + 2);
  EXPECT_EQ(copy.timestamp_ms, 100 + 600);
  EXPECT_EQ(copy_request(r, 0, plan).block_keys, r.block_keys);
}

TEST(ScaleLengths, DerivesEachNewBlockFromTheOldBlockItsPrefixEndsIn) {
  const Request r = make(0, 1536, {1, 2, 3});
  Request longer = r;
  ASSERT_TRUE(scale_lengths(longer, {.input = 2, .output = 2}, kBlock).ok());
  EXPECT_EQ(longer.input_tokens, 3072);
  EXPECT_EQ(longer.output_tokens, 20);
  auto d = [](BlockKey key, int64_t j) { return derive_key(key, KeyDerivation::kLengthScale, j); };
  EXPECT_EQ(longer.block_keys, (std::vector<BlockKey>{d(1, 0), d(1, 1), d(2, 2), d(2, 3), d(3, 4), d(3, 5)}));
  Request shorter = r;
  ASSERT_TRUE(scale_lengths(shorter, {.input = 0.5, .output = 1}, kBlock).ok());
  EXPECT_EQ(shorter.input_tokens, 768);
  EXPECT_EQ(shorter.output_tokens, 10);
  // New block 0 is old tokens [0, 1024): old blocks 0 and 1, so it is keyed by old block 1.
  EXPECT_EQ(shorter.block_keys, (std::vector<BlockKey>{d(2, 0), d(3, 1)}));
  Request tiny = make(0, 3, {9}, std::nullopt, 1);
  ASSERT_TRUE(scale_lengths(tiny, {.input = 0.1, .output = 0.1}, kBlock).ok());
  EXPECT_EQ(tiny.input_tokens, 1);  // never 0
  EXPECT_EQ(tiny.output_tokens, 1);
  EXPECT_EQ(tiny.block_keys.size(), 1u);
  Request same = r;
  ASSERT_TRUE(scale_lengths(same, {}, kBlock).ok());
  EXPECT_EQ(same.block_keys, r.block_keys);
  Request huge = make(0, int64_t{1} << 40, std::vector<BlockKey>(1, 1));
  EXPECT_THAT(scale_lengths(huge, {.input = 1e6, .output = 1}, int64_t{1} << 40).message(),
              HasSubstr("too long"));
}

// Prompts sharing k blocks share k x X blocks after scaling: the reuse ceiling of a random chained trace does
// not move for X = 2, nor for X = 0.5 when every shared run and length is even in blocks.
TEST(ScaleLengths, KeepsTheHitStructure) {
  std::mt19937_64 rng(3);
  std::vector<Request> requests;
  std::vector<std::vector<BlockKey>> prompts;
  BlockKey next_key = 1;
  for (int64_t i = 0; i < 400; ++i) {
    std::vector<BlockKey> keys;
    if (!prompts.empty() && rng() % 3 != 0) {  // continue an earlier prompt for an even number of blocks
      const auto& base = prompts[rng() % prompts.size()];
      const size_t shared = std::min(base.size(), 2 * (1 + rng() % 4)) / 2 * 2;
      keys.assign(base.begin(), base.begin() + static_cast<std::ptrdiff_t>(shared));
    }
    const size_t own = 2 * (1 + rng() % 3);
    for (size_t j = 0; j < own; ++j) keys.push_back(next_key++);
    prompts.push_back(keys);
    requests.push_back(make(i, static_cast<int64_t>(keys.size()) * kBlock, keys));
  }
  const double ceiling = *analyze(requests).reuse_ceiling;
  ASSERT_GT(ceiling, 0.2);
  for (double x : {2.0, 0.5, 3.0}) {
    SCOPED_TRACE(x);
    std::vector<Request> scaled = requests;
    for (Request& r : scaled) ASSERT_TRUE(scale_lengths(r, {.input = x, .output = 1}, kBlock).ok());
    EXPECT_DOUBLE_EQ(*analyze(scaled).reuse_ceiling, ceiling);
  }
}

TEST(ScaleArrival, DividesAndRoundsKeepingOrder) {
  EXPECT_EQ(*scale_arrival_ms(1001, 2), 501);  // 500.5, rounded away from zero
  EXPECT_EQ(*scale_arrival_ms(1000, 0.5), 2000);
  EXPECT_EQ(*scale_arrival_ms(3536999, 2), 1768500);
  EXPECT_FALSE(scale_arrival_ms(int64_t{1} << 50, 1e-6).ok());
  std::mt19937_64 rng(5);
  for (double x : {3.0, 0.7, 1.3}) {
    int64_t previous = 0;
    for (int64_t t = 0; t < 100000; t += static_cast<int64_t>(rng() % 5)) {
      const int64_t scaled = *scale_arrival_ms(t, x);
      EXPECT_LE(previous, scaled);
      previous = scaled;
    }
  }
}

TEST(DenseKeys, NumbersKeysInFirstSeenOrder) {
  DenseKeys dense;
  std::vector<BlockKey> out;
  for (BlockKey key : {900u, 5u, 900u, 77u, 5u}) out.push_back(dense.map(key));
  EXPECT_EQ(out, (std::vector<BlockKey>{0, 1, 0, 2, 1}));
  EXPECT_EQ(dense.size(), 3u);
}

// Everything at once: the output is a valid trace in arrival order, dense ids from 0.
TEST_F(TransformTest, ThePipelineWritesAValidTrace) {
  const std::string a = write("a.jsonl", system_prompt_sessions(true));
  const std::string b = write("b.jsonl", system_prompt_sessions(false));
  TransformOptions options;
  options.window = TimeWindow{.start_ms = 500};
  options.copies = 3;
  options.length = {.input = 1.5, .output = 2};
  options.rate_scale = 4;
  options.dense_ids = true;
  TransformReport report;
  const std::vector<Request> out = transform({a, b}, options, &report);
  // Merged: 12 requests; from 0.5 s: 10 (session 0's first turn, in both inputs, is out).
  EXPECT_EQ(report.requests_in, 10);
  ASSERT_EQ(out.size(), 30u);
  EXPECT_TRUE(std::is_sorted(out.begin(), out.end(), [](const Request& x, const Request& y) {
    return x.timestamp_ms < y.timestamp_ms;
  }));
  BlockKey largest = 0;
  for (const Request& r : out) {
    EXPECT_EQ(static_cast<int64_t>(r.block_keys.size()), (r.input_tokens + kBlock - 1) / kBlock);
    EXPECT_TRUE(r.input_tokens == 1536 || r.input_tokens == 2304) << r.input_tokens;
    EXPECT_EQ(r.output_tokens, 20);
    for (BlockKey key : r.block_keys) largest = std::max(largest, key);
  }
  EXPECT_EQ(out.front().block_keys.front(), 0u);
  EXPECT_LT(largest, 100u);
  EXPECT_NEAR(report.span_s, static_cast<double>(out.back().timestamp_ms) / 1000, 1e-9);
}

TEST_F(TransformTest, OptionsOutOfRangeAreRefused) {
  const std::string path = write("a.jsonl", system_prompt_sessions(true));
  TransformOptions options;
  options.rate_scale = 0;
  EXPECT_THAT(transform_error({path}, options).message(), HasSubstr("rate scale must be > 0"));
  options = {};
  options.copies = 0;
  EXPECT_THAT(transform_error({path}, options).message(), HasSubstr("copies must be >= 1"));
  options = {};
  options.window = TimeWindow{.start_ms = 5, .end_ms = 5};
  EXPECT_THAT(transform_error({path}, options).message(), HasSubstr("must be after its start"));
  options = {};
  options.copies = 2;
  options.shared = {.min_sessions = 2, .min_percent = 5};
  EXPECT_THAT(transform_error({path}, options).message(), HasSubstr("not both"));
  EXPECT_EQ(transform_error({}, {}).message(), "no input trace");
}

}  // namespace
}  // namespace crescent::trace
