// Writing result files so that no reader ever sees a partial one.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace crescent::experiment {

/// Writes `content` to `path` through a temporary file in the same directory and a rename, so `path` ends up
/// holding all of `content` or stays as it was. Errors (kIoError) name the path and the OS's reason; the
/// temporary file is removed.
Status write_file_atomically(const std::string& path, std::string_view content);

/// Creates directory `dir` and its parents when missing, and checks that files can be created in it.
/// Errors (kIoError) name the directory and the OS's reason.
Status ensure_writable_directory(const std::string& dir);

}  // namespace crescent::experiment
