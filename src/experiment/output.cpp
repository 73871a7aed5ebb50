#include "experiment/output.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>

namespace crescent::experiment {
namespace {

// Creates a new file beside `path` (same directory, so a rename onto `path` is atomic) with the usual
// permissions (0666 minus the umask); returns its descriptor, or -1 with errno set.
int create_temp_beside(const std::string& path, std::string& temp_path) {
  static std::atomic<int> counter{0};
  temp_path = fmt::format("{}.tmp-{}-{}", path, getpid(), counter++);
  return ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
}

bool write_all(int fd, std::string_view content) {
  while (!content.empty()) {
    const ssize_t n = ::write(fd, content.data(), content.size());
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    content.remove_prefix(static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

Status write_file_atomically(const std::string& path, std::string_view content) {
  std::string temp;
  const int fd = create_temp_beside(path, temp);
  if (fd < 0) return Status::io_error(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
  bool ok = write_all(fd, content);
  int error = errno;
  if (::close(fd) != 0 && ok) {
    ok = false;
    error = errno;
  }
  if (ok && std::rename(temp.c_str(), path.c_str()) != 0) {
    ok = false;
    error = errno;
  }
  if (ok) return Status();
  ::unlink(temp.c_str());
  return Status::io_error(fmt::format("cannot write '{}': {}", path, std::strerror(error)));
}

Status ensure_writable_directory(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (!ec && !std::filesystem::is_directory(dir, ec)) ec = std::make_error_code(std::errc::not_a_directory);
  if (ec) return Status::io_error(fmt::format("cannot create directory '{}': {}", dir, ec.message()));
  std::string probe;
  const int fd = create_temp_beside((std::filesystem::path(dir) / ".crescent-write-test").string(), probe);
  if (fd < 0) {
    return Status::io_error(fmt::format("cannot write in directory '{}': {}", dir, std::strerror(errno)));
  }
  ::close(fd);
  ::unlink(probe.c_str());
  return Status();
}

}  // namespace crescent::experiment
