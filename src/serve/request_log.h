// `crescent serve --request-log FILE` (issue 23 §3): each answered request as one line of the openai-log
// format that `crescent trace import` reads (trace/log_import.h), so a deployment's own traffic goes straight
// back into analysis and planning. docs/traces.md, "crescent trace import".
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <nlohmann/json_fwd.hpp>
#include <span>
#include <string>

#include "common/status.h"

namespace crescent::serve {

/// What a request log keeps of each prompt.
enum class RequestLogContent {
  kText,      // the request body as received (messages or prompt): the text itself
  kTokenIds,  // of the body only fields that hold no text (model, max_tokens, sampling settings): the prompt
              // only as "prompt_token_ids", ids anyone with the tokenizer can decode
};

/// An append-only request log, safe to call from any thread. Each line is written with one write(2), so a
/// crash loses at most the line being written and readers never see half a line.
class RequestLog {
 public:
  /// Opens (creating with mode 0600, appending when it exists) `path`. Errors name the path: kIoError when
  /// it cannot be opened (a symlink is refused), kInvalidArgument when it exists and is not a regular file
  /// that only its owner may read and write.
  static Result<std::unique_ptr<RequestLog>> open(const std::string& path, RequestLogContent content);
  ~RequestLog();
  RequestLog(const RequestLog&) = delete;
  RequestLog& operator=(const RequestLog&) = delete;

  /// Appends a request that arrived at `arrival_unix_ms` with `body`, read as `prompt_token_ids`, answered
  /// with `completion_tokens` of which `cached_tokens` of the prompt were a prefix hit:
  /// {"timestamp": "<ISO 8601, ms, UTC>", "request": body (kTokenIds: its fields without text),
  /// "prompt_token_ids": [...], "usage": {...}}.
  /// A failed write is counted (write_errors) and otherwise ignored: logging never fails a request.
  void append(int64_t arrival_unix_ms, const nlohmann::json& body, std::span<const int64_t> prompt_token_ids,
              int64_t completion_tokens, int64_t cached_tokens);
  /// Lines that could not be written.
  int64_t write_errors() const;

 private:
  RequestLog(int fd, RequestLogContent content) : fd_(fd), content_(content) {}

  int fd_;
  RequestLogContent content_;
  mutable std::mutex mutex_;
  int64_t write_errors_ = 0;
};

/// `unix_ms` as "2026-12-03T07:00:00.250Z".
std::string iso8601_utc_ms(int64_t unix_ms);

}  // namespace crescent::serve
