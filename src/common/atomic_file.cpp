#include "common/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <vector>

namespace crescent {
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

Status write_files_atomically(std::span<const FileContent> files) {
  // First every content into a temporary file beside its target; only when all are complete, the renames.
  std::vector<std::string> temps;
  auto failure = [&](const std::string& path, int error) {
    for (const std::string& temp : temps) ::unlink(temp.c_str());
    return Status::io_error(fmt::format("cannot write '{}': {}", path, std::strerror(error)));
  };
  for (const FileContent& file : files) {
    std::string temp;
    const int fd = create_temp_beside(file.path, temp);
    if (fd < 0) return failure(file.path, errno);
    temps.push_back(temp);
    bool ok = write_all(fd, file.content);
    int error = errno;
    if (::close(fd) != 0 && ok) {
      ok = false;
      error = errno;
    }
    if (!ok) return failure(file.path, error);
  }
  for (size_t i = 0; i < files.size(); ++i) {
    if (std::rename(temps[i].c_str(), files[i].path.c_str()) != 0) {
      const int error = errno;
      temps.erase(temps.begin(), temps.begin() + static_cast<std::ptrdiff_t>(i));  // those are renamed
      return failure(files[i].path, error);
    }
  }
  return Status();
}

Status write_file_atomically(const std::string& path, std::string_view content) {
  const FileContent file{path, content};
  return write_files_atomically({&file, 1});
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

}  // namespace crescent
