// Reading request logs for `crescent trace import` (issue 23 §3; docs/traces.md, "crescent trace import"):
// the three formats, each record turned into a LoggedRequest (token ids through the model's tokenizer and
// chat template) and handed to a TraceImporter (trace/import.h), which keys and writes it.
//
// - openai-log: JSONL, one request a line: {"timestamp": T, "request": BODY, "usage": {...}} where BODY is
//   the body of /v1/chat/completions (`messages`) or /v1/completions (`prompt`: a string, or token ids);
//   without "request" the line itself is the body. "prompt_token_ids" (the ids the model read) replaces
//   tokenizing BODY when present. Output length: "usage".completion_tokens (or "response".usage's), else
//   BODY's max_completion_tokens / max_tokens, else the default. Session: "session_id" (string or integer),
//   else BODY's "user". What `crescent serve --request-log` writes.
// - sharegpt: a JSON array of conversations, or JSONL with one a line: {"conversations": [{"from": "human" |
//   "gpt" | "system", "value": TEXT}]} (or "messages": [{"role", "content"}]). Each user turn is a request
//   whose prompt is the conversation so far through the chat template with the generation prompt, and whose
//   output is the next assistant turn's tokens. Conversations start as a Poisson process
//   (session_rate_per_s); a conversation's turn k arrives k × think_time_s after its start.
// - csv: a header row, then one request a row with a timestamp and input and output token counts (Azure's
//   LLM inference trace, BurstGPT, or any columns named by CsvColumns). Lengths only: every request gets
//   keys of its own, so the trace carries no reuse.
// A timestamp is ISO 8601 / RFC 3339 ("2026-12-03T07:00:00.250Z", an offset such as "+01:00", a space for
// the "T", no zone meaning UTC) or a number: Unix seconds, or milliseconds when >= 1e11 (a date after 1973 in
// ms; seconds that large are past the year 5000). Fractions are kept to the millisecond.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/tokenizer.h"
#include "trace/import.h"
#include "trace/reader.h"

namespace crescent::trace {

/// A request log's format.
enum class LogFormat { kOpenAiLog, kShareGpt, kCsv };

/// "openai-log", "sharegpt", "csv"; std::nullopt for anything else.
std::optional<LogFormat> parse_log_format(std::string_view name);

/// The header names of a lengths-only CSV's columns.
struct CsvColumns {
  std::string timestamp = "TIMESTAMP";
  std::string input_tokens = "ContextTokens";
  std::string output_tokens = "GeneratedTokens";
  std::string session;  // optional column
};

/// "azure" (TIMESTAMP, ContextTokens, GeneratedTokens: Azure's public LLM inference trace), "burstgpt"
/// (Timestamp, Request tokens, Response tokens), or "timestamp=COL,input=COL,output=COL[,session=COL]".
/// Errors (kInvalidArgument) name the part that is wrong.
Result<CsvColumns> parse_csv_columns(std::string_view spec);

/// Unix milliseconds of a timestamp written as the header comment says: a JSON number or string. Errors
/// (kInvalidArgument) say what was expected, with the value.
Result<int64_t> parse_timestamp_ms(const nlohmann::json& value);
/// The same for text (a CSV cell): a number or an ISO 8601 date-time.
Result<int64_t> parse_timestamp_ms(std::string_view text);

/// How a request's prompt becomes token ids.
struct PromptEncoder {
  const model::Tokenizer* tokenizer = nullptr;  // required for text prompts
  /// OpenAI messages -> the prompt text, with the generation prompt (the model's chat template). Empty when
  /// the model has none: messages are then an error.
  std::function<Result<std::string>(const nlohmann::json& messages)> render_chat;
};

/// How logs are read.
struct LogImportOptions {
  LogFormat format = LogFormat::kOpenAiLog;
  bool skip_invalid = false;            // skip invalid records (counted) instead of failing
  int64_t default_output_tokens = 256;  // output length when a record does not say; >= 1
  /// openai-log and csv: how far out of order (ms) records may be; a record arriving earlier than the
  /// latest one seen minus this is an error.
  int64_t reorder_window_ms = 300'000;
  double session_rate_per_s = 1.0;  // sharegpt: conversations starting per second (> 0)
  double think_time_s = 30;         // sharegpt: between a conversation's turns (>= 0)
  uint64_t seed = 1;                // sharegpt: the start times' random stream
  CsvColumns csv_columns = {};
  /// Called after each record with the bytes of the current file read so far (for a progress bar).
  std::function<void(int64_t file_bytes_read)> progress = {};
};

/// Reads logs into a TraceImporter, one file after another (sessions and sharegpt's arrival clock go on
/// across files).
class LogImporter {
 public:
  /// REQUIRES: `encoder`'s tokenizer and `importer` outlive this.
  LogImporter(LogImportOptions options, PromptEncoder encoder, TraceImporter& importer);
  ~LogImporter();

  /// Reads every record of `path` (plain or gzip) into the importer; does not call finish(). Errors
  /// (kInvalidArgument) start with "path:line:" (sharegpt JSON arrays: "path: conversation N:") and name the
  /// field and value; with skip_invalid an invalid record is counted in skipped() instead. I/O errors:
  /// kNotFound / kIoError naming the path.
  Status read(const std::string& path);
  /// The records skipped so far under skip_invalid.
  const SkipReport& skipped() const { return skipped_; }

  /// Why a record is invalid (defined in log_import.cpp).
  struct Problem;

 private:
  // Each line of `path` to `on_line` after the checks every line-oriented format shares: a line too long is
  // a problem; with `json_lines`, blank lines are skipped and nesting deeper than the limit is a problem.
  // Reports progress after each line.
  Status each_line(const std::string& path, bool json_lines,
                   const std::function<Status(std::string& line, int64_t line_number)>& on_line);
  // Adds a request of a log in time order give or take the reorder window; writes what the window passed.
  Status add_in_window(LoggedRequest request);
  Status read_openai_log(const std::string& path);
  Status read_sharegpt(const std::string& path);
  Status read_csv(const std::string& path);
  // A sharegpt conversation `conversation`, its record named `where`, session `session`.
  Status add_conversation(const nlohmann::json& conversation, const std::string& where,
                          const std::string& session);
  // What to do with a record's problem: skip it (skip_invalid and not fatal) or fail with it.
  Status on_problem(Problem problem);

  LogImportOptions options_;
  PromptEncoder encoder_;
  TraceImporter& importer_;
  SkipReport skipped_;
  int64_t latest_ms_ = 0;            // openai-log / csv: the latest arrival seen
  double next_session_start_s_ = 0;  // sharegpt
  int64_t conversations_ = 0;        // sharegpt conversations read, over all files
  struct Random;
  std::unique_ptr<Random> random_;
};

}  // namespace crescent::trace
