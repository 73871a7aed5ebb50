#include "serve/request_log.h"

#include <fcntl.h>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

namespace crescent::serve {

using nlohmann::json;

Result<std::unique_ptr<RequestLog>> RequestLog::open(const std::string& path, RequestLogContent content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
  if (fd < 0) {
    return Status::io_error(fmt::format("--request-log {}: cannot open: {}", path, std::strerror(errno)));
  }
  return std::unique_ptr<RequestLog>(new RequestLog(fd, content));
}

RequestLog::~RequestLog() {
  ::close(fd_);
}

std::string iso8601_utc_ms(int64_t unix_ms) {
  const std::chrono::sys_time<std::chrono::milliseconds> time{std::chrono::milliseconds(unix_ms)};
  return fmt::format("{:%FT%T}Z", time);
}

void RequestLog::append(int64_t arrival_unix_ms, const json& body, std::span<const int64_t> prompt_token_ids,
                        int64_t completion_tokens, int64_t cached_tokens) {
  json line = json::object();
  line["timestamp"] = iso8601_utc_ms(arrival_unix_ms);
  if (content_ == RequestLogContent::kText) {
    line["request"] = body;
  } else {
    json stripped = body;
    stripped.erase("messages");
    stripped.erase("prompt");
    line["request"] = std::move(stripped);
    line["prompt_token_ids"] = prompt_token_ids;
  }
  line["usage"] = {{"prompt_tokens", prompt_token_ids.size()},
                   {"completion_tokens", completion_tokens},
                   {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}};
  std::string text = line.dump(-1, ' ', false, json::error_handler_t::replace);
  text += '\n';
  std::lock_guard lock(mutex_);
  // O_APPEND: one write lands whole at the end, even beside other writers of the file.
  const ssize_t n = ::write(fd_, text.data(), text.size());
  if (n != static_cast<ssize_t>(text.size())) ++write_errors_;
}

int64_t RequestLog::write_errors() const {
  std::lock_guard lock(mutex_);
  return write_errors_;
}

}  // namespace crescent::serve
