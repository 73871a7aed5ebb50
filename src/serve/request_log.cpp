#include "serve/request_log.h"

#include <fcntl.h>
#include <fmt/chrono.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <nlohmann/json.hpp>

namespace crescent::serve {

using nlohmann::json;

Result<std::unique_ptr<RequestLog>> RequestLog::open(const std::string& path, RequestLogContent content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
  if (fd < 0) {
    return Status::io_error(fmt::format("--request-log {}: cannot open: {}", path, std::strerror(errno)));
  }
  // The log holds what users typed: an existing file others may read is refused, not written into.
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || (st.st_mode & 0077) != 0) {
    ::close(fd);
    return Status::invalid_argument(fmt::format(
        "--request-log {}: not a regular file only its owner can read and write (mode {:o}); chmod 600 it "
        "or name a new file",
        path, st.st_mode & 07777));
  }
  return std::unique_ptr<RequestLog>(new RequestLog(fd, content));
}

RequestLog::~RequestLog() {
  ::close(fd_);
}

std::string iso8601_utc_ms(int64_t unix_ms) {
  const int64_t seconds = unix_ms >= 0 ? unix_ms / 1000 : (unix_ms - 999) / 1000;
  const std::chrono::sys_seconds time{std::chrono::seconds(seconds)};
  return fmt::format("{:%FT%H:%M:%S}.{:03}Z", time, unix_ms - seconds * 1000);
}

void RequestLog::append(int64_t arrival_unix_ms, const json& body, std::span<const int64_t> prompt_token_ids,
                        int64_t completion_tokens, int64_t cached_tokens) {
  json line = json::object();
  line["timestamp"] = iso8601_utc_ms(arrival_unix_ms);
  if (content_ == RequestLogContent::kText) {
    line["request"] = body;
  } else {
    // Only fields that hold no text: the prompt, stop strings, `user` and any field this server ignores go.
    json kept = json::object();
    for (const char* name : {"model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "seed",
                             "stream", "n", "min_tokens", "ignore_eos", "logprobs", "top_logprobs"}) {
      if (body.contains(name)) kept[name] = body[name];
    }
    line["request"] = std::move(kept);
  }
  // The ids the model read, in both modes: the import keys them as they are, so the trace holds the prompts
  // this server cached (its chat template, its tokenizer), whatever the importer's own model files say.
  line["prompt_token_ids"] = prompt_token_ids;
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
