// Streaming reader of Mooncake JSONL traces, plain or gzip-compressed.
//
// Each non-blank line is one request: {"timestamp": ms, "input_length": tokens, "output_length": tokens,
// "hash_ids": [one integer in [0, 2^64) per block of block_size tokens]}. Extra fields are ignored, as long
// as they are valid JSON whose numbers the parser can hold (an integer outside [-2^63, 2^64) or a float
// beyond a double makes the line invalid, wherever it is). Lines end in "\n" or "\r\n" (the last one may lack
// it); a UTF-8 byte-order mark at the very start of the input (after gzip decompression) is skipped.
// Timestamps are read as written (epoch milliseconds are fine), not rebased. A line is invalid when it is not
// a JSON object; lacks one of those fields; has a timestamp, input_length or output_length that is not an
// integer in [0, 2^63) (floats such as 3.5, 1.0 or 1e3, booleans, strings, null, out-of-range numbers); has
// an input_length or output_length of 0; has hash_ids that are not an array of integers in [0, 2^64) (the
// same non-integers, negative numbers, numbers above 2^64 - 1); has len(hash_ids) != ceil(input_length /
// block_size); has a timestamp smaller than the previous valid line's; or is longer than 16 MiB. Messages
// name the file, the line and the field, e.g. "conv.jsonl:17: field 'input_length': must be a non-negative
// integer, got -5" or "conv.jsonl:18: field 'hash_ids[2]': must be an integer in [0, 2^64), got
// 18446744073709551616".
//
// Two optional fields, written by `crescent trace import`:
// - "session_id": the conversation or user the request belongs to, a non-negative integer (the same rules as
//   timestamp); read into Request::session_id whenever present, and the line is invalid when it is not one.
// - "token_ids": the prompt's token ids (`trace import --keep-tokens`). Ignored, not even validated, unless
//   ReadOptions::keys_from_token_ids: then the line must have them, exactly input_length integers in
//   [0, 2^63), and the request's block keys are computed from them at ReadOptions::block_size_tokens by the
//   block-key recurrence (kv::shipped_block_keys: every full block, then the partial tail, ceil(input_length
//   / block_size) keys, the meaning hash_ids have); hash_ids must still be an array of integers in [0, 2^64),
//   but their count is not checked (they were made at the importer's block size) and they are not used.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "kv/block_key.h"
#include "trace/request.h"

namespace crescent::trace {

/// The longest line the reader accepts (16 MiB): far above any real request (a 10M-token prompt has ~20k
/// hash_ids, ~150 KB); bounds memory on garbage input. Writers of traces stay below it.
inline constexpr size_t kMaxLineBytes = size_t{16} << 20;

/// How to read a trace.
struct ReadOptions {
  int64_t block_size_tokens = 512;  // tokens per hash_ids entry; must be >= 1
  bool skip_invalid = false;        // skip invalid lines (counted in a SkipReport) instead of failing
  int64_t max_requests = 0;  // read_trace(): stop after this many valid requests (0 = all); later lines
                             // are neither read nor validated
  /// Every input and output length is divided by this (rounded up) before it is checked: a trace scaled to
  /// a model with a smaller context. A hash id then stands for block_size_tokens = the trace's / divisor.
  int64_t length_divisor = 1;  // >= 1
  /// Compute each request's block keys from its `token_ids` at block_size_tokens instead of taking its
  /// hash_ids (the header comment has the rules), so a trace imported with its tokens can be analysed at
  /// any block size. The token ids are then kept in Request::token_ids; without this option they are
  /// neither validated nor stored. REQUIRES (checked by TraceReader::open): length_divisor == 1, since
  /// token ids cannot be divided.
  bool keys_from_token_ids = false;
  /// The model seed of the recurrence under keys_from_token_ids (kv/block_key.h). Which requests share which
  /// prefixes does not depend on it, only the keys' values do.
  BlockKey token_key_seed = kv::kMockModelSeed;
};

/// The invalid lines skipped under ReadOptions::skip_invalid, grouped by reason.
struct SkipReport {
  /// One reason, e.g. "not JSON", "missing field", "block count mismatch".
  struct Reason {
    std::string reason;
    int64_t lines = 0;
    std::string first_message;  // full error message of the first line skipped for this reason
  };

  int64_t total_lines = 0;
  std::vector<Reason> reasons;  // in order of first occurrence

  /// Records one skipped line.
  void add(std::string_view reason, std::string message);
  /// "skipped 3 invalid lines: 2 not JSON (first: f:4: ...), 1 block count mismatch (first: ...)"; empty when
  /// nothing was skipped.
  std::string summary() const;
};

/// Reads a trace file one line at a time; memory is proportional to the longest line, not the file.
/// gzip input is detected by its magic bytes, not by the file name.
class TraceReader {
 public:
  /// Opens `path`. Errors: kNotFound if it does not exist, kIoError if it cannot be opened,
  /// kInvalidArgument if options.block_size_tokens < 1, options.length_divisor < 1, or keys_from_token_ids
  /// with a length_divisor other than 1.
  static Result<std::unique_ptr<TraceReader>> open(const std::string& path, ReadOptions options);
  ~TraceReader();
  TraceReader(const TraceReader&) = delete;
  TraceReader& operator=(const TraceReader&) = delete;

  /// Reads the next valid request into `out`: true when one was read, false at the end of the input.
  /// Errors: kInvalidArgument for an invalid line (unless skip_invalid), kIoError for a read error or a
  /// corrupt or truncated gzip stream. After an error every later call returns the same error.
  Result<bool> next(Request& out);

  /// Lines skipped so far (always empty without skip_invalid).
  const SkipReport& skipped() const;
  /// 1-based number of the last line read (0 before the first).
  int64_t line_number() const;

 private:
  struct Impl;
  explicit TraceReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

/// The error for a trace at `path` with no valid request (kInvalidArgument): "<path>: the trace has no
/// requests", or "... no valid requests (all N lines were skipped as invalid)" after `skipped` lines.
Status empty_trace_error(const std::string& path, const SkipReport& skipped);

/// Reads the whole trace at `path` into memory; errors as TraceReader::open and TraceReader::next.
/// `skipped` (optional) receives the lines skipped under skip_invalid.
Result<std::vector<Request>> read_trace(const std::string& path, const ReadOptions& options,
                                        SkipReport* skipped = nullptr);

}  // namespace crescent::trace
