// Writing Mooncake-format traces (trace/reader.h has the format): what `crescent trace import` and
// `crescent trace transform` produce, one line per request, streamed to a file that appears whole or not at
// all.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "common/atomic_file.h"
#include "common/status.h"
#include "trace/request.h"

namespace crescent::trace {

/// `request` as one trace line ending in "\\n": {"timestamp", "input_length", "output_length", "hash_ids"},
/// then "session_id" when set and "token_ids" when not empty. Fields in that order, no spaces.
std::string format_trace_line(const Request& request);

/// Writes a trace one request at a time (memory: one line); readers of `path` see it only after commit().
class TraceWriter {
 public:
  /// Starts writing `path` ("-": standard output, as the lines come), created with `mode` (minus the umask;
  /// 0600 for a trace that holds token ids). Errors (kIoError) name the path.
  static Result<std::unique_ptr<TraceWriter>> open(const std::string& path, unsigned mode = 0666);

  /// Appends one request. Errors: kIoError naming the path; kInvalidArgument for a line longer than the
  /// reader accepts (kMaxLineBytes), which is not written.
  Status append(const Request& request);
  /// Completes the file. Errors (kIoError) name the path; the target is then unchanged.
  Status commit();
  /// Requests appended so far.
  int64_t requests() const { return requests_; }

 private:
  explicit TraceWriter(std::unique_ptr<AtomicFileWriter> file) : file_(std::move(file)) {}

  std::unique_ptr<AtomicFileWriter> file_;
  int64_t requests_ = 0;
};

}  // namespace crescent::trace
