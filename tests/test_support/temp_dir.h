// A private temporary directory for one test, removed with everything in it. Shared by every test that
// writes files.
#pragma once

#include <stdlib.h>

#include <filesystem>
#include <string>
#include <system_error>

namespace crescent::test {

/// A fresh directory under the system's temporary directory (mkdtemp: unique, mode 0700), removed with its
/// contents by the destructor.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "crescent-test") {
    std::string pattern = (std::filesystem::temp_directory_path() / (prefix + "-XXXXXX")).string();
    if (::mkdtemp(pattern.data()) != nullptr) path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;

  /// The directory (empty if it could not be created).
  const std::string& path() const { return path_; }
  /// `name` inside it.
  std::string file(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }

 private:
  std::string path_;
};

}  // namespace crescent::test
