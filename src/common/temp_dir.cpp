#include "common/temp_dir.h"

#include <fmt/format.h>
#include <stdlib.h>

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

}  // namespace crescent
