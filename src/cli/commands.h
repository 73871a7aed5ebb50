// Registration of crescent's subcommands. Each lives in its own file; its callback stores the process exit code
// in `exit_code` (0 ok, 2 bad input, 1 other failure).
#pragma once

#include <CLI/CLI.hpp>

namespace crescent::cli {

/// Exit code for bad input (malformed trace, unknown name, impossible config).
inline constexpr int kExitBadInput = 2;

/// `crescent analyze TRACE...` (cli/analyze.cpp).
void register_analyze(CLI::App& app, int& exit_code);
/// `crescent simulate TRACE` (cli/simulate.cpp).
void register_simulate(CLI::App& app, int& exit_code);

}  // namespace crescent::cli
