#include "common/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
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
int create_temp_beside(const std::string& path, std::string& temp_path, unsigned mode = 0666) {
  static std::atomic<int> counter{0};
  temp_path = fmt::format("{}.tmp-{}-{}", path, getpid(), counter++);
  return ::open(temp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
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

// Where a write to `path` lands: a symlink is followed (its target is replaced, not the link).
std::string resolved_target(const std::string& path) {
  std::error_code ec;
  const std::filesystem::path target = std::filesystem::weakly_canonical(path, ec);
  return ec ? path : target.string();
}

// Whether `path` exists and is not a regular file (a terminal, a pipe, /dev/stdout): such a target is written
// in place, since renaming a file over it would replace the device or pipe.
bool is_special(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  return !ec && std::filesystem::exists(status) && !std::filesystem::is_regular_file(status) &&
         !std::filesystem::is_directory(status);
}

Status write_in_place(const std::string& path, std::string_view content) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
  bool ok = fd >= 0 && write_all(fd, content);
  int error = errno;
  if (fd >= 0 && ::close(fd) != 0 && ok) {
    ok = false;
    error = errno;
  }
  if (!ok) return Status::io_error(fmt::format("cannot write '{}': {}", path, std::strerror(error)));
  return Status();
}

}  // namespace

Status write_files_atomically(std::span<const FileContent> files) {
  // First every content into a temporary file beside its target; only when all are complete, the renames.
  // Special files (pipes, terminals) are written in place once the others are complete.
  std::vector<std::string> targets, temps;
  auto failure = [&](const std::string& path, int error) {
    for (const std::string& temp : temps) {
      if (!temp.empty()) ::unlink(temp.c_str());
    }
    return Status::io_error(fmt::format("cannot write '{}': {}", path, std::strerror(error)));
  };
  for (const FileContent& file : files) {
    targets.push_back(resolved_target(file.path));
    if (is_special(targets.back())) {
      temps.emplace_back();
      continue;
    }
    std::string temp;
    const int fd = create_temp_beside(targets.back(), temp);
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
    if (temps[i].empty()) {
      CRESCENT_RETURN_IF_ERROR(write_in_place(targets[i], files[i].content));
      continue;
    }
    if (std::rename(temps[i].c_str(), targets[i].c_str()) != 0) {
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

Result<std::unique_ptr<AtomicFileWriter>> AtomicFileWriter::open(const std::string& path, unsigned mode) {
  std::string target = path == "-" ? path : resolved_target(path);
  std::string temp;
  int fd = -1;
  if (path == "-") {
    fd = ::fcntl(STDOUT_FILENO, F_DUPFD_CLOEXEC, 3);  // whatever stdout is (a file it appends to stays)
  } else if (is_special(target)) {
    fd = ::open(target.c_str(), O_WRONLY | O_CLOEXEC);
  } else {
    fd = create_temp_beside(target, temp, mode);
  }
  if (fd < 0) return Status::io_error(fmt::format("cannot write '{}': {}", path, std::strerror(errno)));
  return std::unique_ptr<AtomicFileWriter>(
      new AtomicFileWriter(path, std::move(target), std::move(temp), fd));
}

AtomicFileWriter::AtomicFileWriter(std::string path, std::string target, std::string temp, int fd)
    : path_(std::move(path)), target_(std::move(target)), temp_(std::move(temp)), fd_(fd) {}

AtomicFileWriter::~AtomicFileWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!temp_.empty()) ::unlink(temp_.c_str());
}

Status AtomicFileWriter::flush() {
  if (error_.ok() && !write_all(fd_, buffer_)) {
    error_ = Status::io_error(fmt::format("cannot write '{}': {}", path_, std::strerror(errno)));
  }
  buffer_.clear();
  return error_;
}

Status AtomicFileWriter::write(std::string_view content) {
  if (!error_.ok() || fd_ < 0) return error_.ok() ? Status::io_error(path_ + ": already committed") : error_;
  buffer_.append(content);
  if (buffer_.size() >= (size_t{1} << 20)) return flush();
  return Status();
}

Status AtomicFileWriter::commit() {
  if (fd_ < 0) return Status::io_error(path_ + ": already committed");
  CRESCENT_RETURN_IF_ERROR(flush());
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    error_ = Status::io_error(fmt::format("cannot write '{}': {}", path_, std::strerror(errno)));
    return error_;
  }
  if (!temp_.empty() && std::rename(temp_.c_str(), target_.c_str()) != 0) {
    error_ = Status::io_error(fmt::format("cannot write '{}': {}", path_, std::strerror(errno)));
    return error_;
  }
  temp_.clear();
  return Status();
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

namespace crescent {

Result<std::string> read_small_file(const std::string& path, size_t max_bytes) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Status::io_error(fmt::format("{}: cannot be read: {}", path, std::strerror(errno)));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    return Status::invalid_argument(fmt::format("{}: not a regular file", path));
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    return Status::invalid_argument(
        fmt::format("{}: {} bytes, more than the {} expected", path, st.st_size, max_bytes));
  }
  std::string content(static_cast<size_t>(st.st_size), '\0');
  size_t done = 0;
  while (done < content.size()) {
    const ssize_t n = ::read(fd, content.data() + done, content.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    done += static_cast<size_t>(n);
  }
  ::close(fd);
  content.resize(done);
  return content;
}

}  // namespace crescent
