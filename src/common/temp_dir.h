// Private temporary directories: the one way crescent makes one, in src and in tests
// (tests/test_support/temp_dir.h wraps it).
#pragma once

#include <string>
#include <string_view>
#include <utility>

#include "common/status.h"

namespace crescent {

/// A fresh directory of its own under the system's temporary directory ($TMPDIR, else /tmp), made by
/// mkdtemp (a unique name, mode 0700), removed with everything in it when the object is destroyed unless
/// release() gave it up first. Movable (the moved-from object owns nothing), not copyable.
class TempDir {
 public:
  /// Creates TMP/`prefix`-XXXXXX (XXXXXX: mkdtemp's unique suffix). kIoError naming the path and the errno
  /// text when it cannot be created (e.g. the temporary directory is missing or not writable).
  static Result<TempDir> create(std::string_view prefix);

  /// Owns no directory: path() is empty and destruction does nothing.
  TempDir() = default;
  TempDir(TempDir&& other) noexcept;
  /// Removes the directory this object held, then takes `other`'s.
  TempDir& operator=(TempDir&& other) noexcept;
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  /// Removes the directory and its contents, if it still owns one (errors ignored: a destructor cannot
  /// report them).
  ~TempDir();

  /// The directory; empty when this object owns none.
  const std::string& path() const { return path_; }
  /// `name` inside the directory (nothing is created).
  std::string file(std::string_view name) const;
  /// Gives the directory up: it stays on disk when this object is destroyed (e.g. `crescent serve`'s run
  /// directory, whose logs outlive the run). Returns its path; path() is empty afterwards.
  std::string release();

 private:
  explicit TempDir(std::string path) : path_(std::move(path)) {}

  std::string path_;
};

/// Makes `path` (and missing parents) a directory private to this user: created if absent, owned by this
/// user (else kPermissionDenied: another user made it and could rewrite what is put in it), mode set to
/// 0700; its parent must be this user's or root's (a directory in /tmp, not one another user controls and
/// could swap). kIoError naming the path when it cannot be created or its mode changed.
Status make_private_directory(const std::string& path);

}  // namespace crescent
