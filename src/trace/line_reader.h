// Lines of a text file, plain or gzip-compressed, one at a time: what every line-oriented input of crescent
// (traces, request logs, CSV) reads through. Memory is one chunk plus the longest line, not the file.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "common/status.h"

namespace crescent::trace {

/// Reads `path` line by line. A line ends in "\n" or "\r\n" (the last one may lack it); neither is part of
/// the line. A UTF-8 byte-order mark at the very start of the (decompressed) input is skipped. gzip input is
/// detected by its magic bytes, not by the file name.
class LineReader {
 public:
  /// Opens `path`; lines longer than `max_line_bytes` are reported (line_too_long) rather than held. Errors:
  /// kNotFound if it does not exist, kIoError if it cannot be opened.
  static Result<std::unique_ptr<LineReader>> open(const std::string& path, size_t max_line_bytes);
  ~LineReader();
  LineReader(const LineReader&) = delete;
  LineReader& operator=(const LineReader&) = delete;

  /// Reads the next line: true when there is one, false at the end of the input. Errors (kIoError): a read
  /// error, a corrupt or truncated gzip stream (naming the last good line).
  Result<bool> next();
  /// The current line, without its ending. Empty (and line_too_long() true) when it was too long to hold.
  std::string& line() { return line_; }
  /// Whether the current line was longer than max_line_bytes (its content is dropped).
  bool line_too_long() const { return line_too_long_; }
  /// 1-based number of the current line (0 before the first).
  int64_t line_number() const { return line_number_; }
  /// Bytes of the file consumed so far (compressed bytes for gzip): progress against the file's size.
  int64_t file_bytes_read() const;

 private:
  struct Impl;
  explicit LineReader(std::unique_ptr<Impl> impl, size_t max_line_bytes);

  std::unique_ptr<Impl> impl_;
  size_t max_line_bytes_;
  std::string line_;
  bool line_too_long_ = false;
  int64_t line_number_ = 0;
};

}  // namespace crescent::trace
