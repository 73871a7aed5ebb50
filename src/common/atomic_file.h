// Writing result files so that no reader ever sees a partial one; reading small files (keys, secrets) whole.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "common/status.h"

namespace crescent {

/// One file to write: where, and what.
struct FileContent {
  std::string path;
  std::string_view content;
};

/// Writes every file through a temporary file beside it, renaming them into place only once all are complete:
/// on an error while writing, no target has changed (a failing rename, rarer, leaves the earlier files
/// renamed). A symlink is followed: its target is replaced, the link stays. A target that exists and is not a
/// regular file (a pipe, a terminal, /dev/stdout) is written in place, after the others. Errors (kIoError) name
/// the path and the OS's reason; the temporary files are removed.
Status write_files_atomically(std::span<const FileContent> files);

/// Writes `content` to `path` through a temporary file in the same directory and a rename, so `path` ends up
/// holding all of `content` or stays as it was. Errors (kIoError) name the path and the OS's reason; the
/// temporary file is removed.
Status write_file_atomically(const std::string& path, std::string_view content);

/// A file written piece by piece (an output too large to hold, such as an imported trace) that readers see
/// whole or not at all: the pieces go to a temporary file beside the target, renamed onto it by commit(). A
/// target that exists and is not a regular file (a pipe, a terminal, /dev/stdout) is written in place as the
/// pieces come. Destroyed without commit(), the temporary file is removed and the target is unchanged.
class AtomicFileWriter {
 public:
  /// Starts writing `path` ("-": standard output, written as the pieces come, never renamed), created with
  /// `mode` (minus the umask; 0600 for a file only its owner may read). Errors (kIoError) name the path and
  /// the OS's reason.
  static Result<std::unique_ptr<AtomicFileWriter>> open(const std::string& path, unsigned mode = 0666);
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  /// Appends `content` (buffered). Errors (kIoError) name the path; after one, commit() fails.
  Status write(std::string_view content);
  /// Flushes and renames the file into place. Errors (kIoError) name the path; the temporary file is removed.
  Status commit();

 private:
  AtomicFileWriter(std::string path, std::string target, std::string temp, int fd);
  Status flush();

  std::string path_;    // as given, for messages
  std::string target_;  // symlinks resolved
  std::string temp_;    // empty when written in place
  int fd_ = -1;
  std::string buffer_;
  Status error_;
};

/// Creates directory `dir` and its parents when missing, and checks that files can be created in it.
/// Errors (kIoError) name the directory and the OS's reason.
Status ensure_writable_directory(const std::string& dir);

/// The whole of the regular file `path`, at most `max_bytes` long (a key or a secret: a larger file is an
/// error, not read). Errors (kIoError, kInvalidArgument) name the path and what is wrong.
Result<std::string> read_small_file(const std::string& path, size_t max_bytes = 64 << 10);

}  // namespace crescent
