#include "common/temp_dir.h"

#include <fmt/format.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

namespace crescent {

Result<TempDir> TempDir::create(std::string_view prefix) {
  std::error_code ec;
  std::filesystem::path parent = std::filesystem::temp_directory_path(ec);
  if (ec) parent = "/tmp";  // $TMPDIR names no directory
  const std::string pattern = (parent / fmt::format("{}-XXXXXX", prefix)).string();
  std::string path = pattern;  // mkdtemp fills in the Xs, even when it fails
  if (::mkdtemp(path.data()) == nullptr) {
    const int error = errno;
    return Status::io_error(
        fmt::format("cannot create a temporary directory {}: {}", pattern, std::strerror(error)));
  }
  return TempDir(std::move(path));
}

TempDir::TempDir(TempDir&& other) noexcept : path_(std::exchange(other.path_, std::string())) {}

TempDir& TempDir::operator=(TempDir&& other) noexcept {
  if (this != &other) {
    TempDir old(std::move(*this));  // removed at the end of this scope
    path_ = std::exchange(other.path_, std::string());
  }
  return *this;
}

TempDir::~TempDir() {
  if (path_.empty()) return;
  std::error_code ignored;
  std::filesystem::remove_all(path_, ignored);
}

std::string TempDir::file(std::string_view name) const {
  return (std::filesystem::path(path_) / name).string();
}

std::string TempDir::release() {
  return std::exchange(path_, std::string());
}

Status make_private_directory(const std::string& path) {
  std::error_code ec;
  std::filesystem::create_directories(path, ec);
  if (ec) return Status::io_error(fmt::format("directory {}: cannot create it: {}", path, ec.message()));
  const auto owned_by_us_or_root = [](const std::string& dir, bool root_ok) -> Status {
    struct stat st {};
    if (::lstat(dir.c_str(), &st) != 0)
      return Status::io_error(fmt::format("directory {}: {}", dir, std::strerror(errno)));
    if (!S_ISDIR(st.st_mode)) return Status::io_error(fmt::format("{} is not a directory", dir));
    if (st.st_uid != ::geteuid() && !(root_ok && st.st_uid == 0)) {
      return Status::permission_denied(fmt::format(
          "directory {} belongs to uid {}, not this user ({}): its owner could rewrite what crescent keeps "
          "there; choose another",
          dir, st.st_uid, ::geteuid()));
    }
    return Status();
  };
  const std::string parent = std::filesystem::absolute(path).parent_path().string();
  if (Status s = owned_by_us_or_root(parent, true); !s.ok()) return s;
  if (Status s = owned_by_us_or_root(path, false); !s.ok()) return s;
  if (::chmod(path.c_str(), 0700) != 0) {
    return Status::io_error(
        fmt::format("directory {}: cannot make it private: {}", path, std::strerror(errno)));
  }
  return Status();
}

}  // namespace crescent
