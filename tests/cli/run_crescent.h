// Runs the built `crescent` binary for end-to-end tests: exit code, stdout and stderr.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>

#include "test_support/temp_dir.h"

namespace crescent::cli_test {

struct CliRun {
  int exit_code = -1;
  std::string out;
  std::string err;
};

/// Single-quotes one shell word.
inline std::string quote(const std::string& arg) {
  return "'" + arg + "'";
}

/// A path for a temporary file of this test process: `stem` in the process's own temporary directory,
/// removed with what is left in it when the process exits (nothing is created at the path).
inline std::filesystem::path temp_path(const std::string& stem) {
  static const test::TempDir dir("crescent-cli-test");
  return std::filesystem::path(dir.path()) / stem;
}

/// Runs a shell command line (words quoted by the caller where needed): exit code, stdout, stderr.
inline CliRun run_shell(const std::string& command_line) {
  const auto err_path = temp_path("crescent_cli_test.err");
  const std::string command = "{ " + command_line + " ; } 2>" + quote(err_path.string());
  CliRun run;
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  for (size_t n; (n = fread(buffer, 1, sizeof buffer, pipe)) > 0;) run.out.append(buffer, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::ifstream err(err_path);
  run.err.assign(std::istreambuf_iterator<char>(err), std::istreambuf_iterator<char>());
  std::filesystem::remove(err_path);
  return run;
}

/// Runs `crescent <args>` (args are shell words, quoted by the caller where needed).
inline CliRun run_crescent(const std::string& args) {
  return run_shell(quote(CRESCENT_BINARY) + " " + args);
}

}  // namespace crescent::cli_test
