#include "common/bundled_files.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdlib>
#include <filesystem>
#include <system_error>

namespace crescent {

namespace fs = std::filesystem;

std::vector<std::string> bundled_file_dirs() {
  std::vector<std::string> dirs;
  if (const char* env = std::getenv("CRESCENT_DATA_DIR"); env != nullptr && *env != '\0')
    dirs.emplace_back(env);
  std::error_code ec;
  const fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  if (!ec) dirs.push_back((exe.parent_path() / CRESCENT_DATA_FROM_BIN).lexically_normal().string());
  dirs.emplace_back(CRESCENT_SOURCE_DIR);
  return dirs;
}

Result<std::string> bundled_file(std::string_view relative) {
  const std::vector<std::string> dirs = bundled_file_dirs();
  for (const std::string& dir : dirs) {
    const fs::path path = fs::path(dir) / relative;
    std::error_code ec;
    if (fs::is_regular_file(path, ec)) return path.string();
  }
  return Status::not_found(
      fmt::format("bundled file '{}' not found in {} (set CRESCENT_DATA_DIR to the directory "
                  "holding configs/ and data/, or pass the path)",
                  relative, fmt::join(dirs, ", ")));
}

}  // namespace crescent
