#include "trace/writer.h"

#include <fmt/format.h>

#include <iterator>

#include "trace/reader.h"

namespace crescent::trace {

std::string format_trace_line(const Request& request) {
  fmt::memory_buffer out;
  fmt::format_to(
      std::back_inserter(out), R"({{"timestamp":{},"input_length":{},"output_length":{},"hash_ids":[{}])",
      request.timestamp_ms, request.input_tokens, request.output_tokens, fmt::join(request.block_keys, ","));
  if (request.session_id) fmt::format_to(std::back_inserter(out), R"(,"session_id":{})", *request.session_id);
  if (!request.token_ids.empty()) {
    fmt::format_to(std::back_inserter(out), R"(,"token_ids":[{}])", fmt::join(request.token_ids, ","));
  }
  out.append(std::string_view("}\n"));
  return fmt::to_string(out);
}

Result<std::unique_ptr<TraceWriter>> TraceWriter::open(const std::string& path, unsigned mode) {
  auto file = AtomicFileWriter::open(path, mode);
  if (!file.ok()) return file.status();
  return std::unique_ptr<TraceWriter>(new TraceWriter(std::move(file).value()));
}

Status TraceWriter::append(const Request& request) {
  const std::string line = format_trace_line(request);
  if (line.size() > kMaxLineBytes) {
    return Status::invalid_argument(
        fmt::format("a request of {} input tokens makes a trace line of {} bytes, more than the {} a trace "
                    "reader accepts",
                    request.input_tokens, line.size(), kMaxLineBytes));
  }
  CRESCENT_RETURN_IF_ERROR(file_->write(line));
  ++requests_;
  return Status();
}

Status TraceWriter::commit() {
  return file_->commit();
}

}  // namespace crescent::trace
