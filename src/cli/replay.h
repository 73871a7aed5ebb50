// `crescent replay` as a function, for `crescent serve --replay` too.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace crescent::cli {

/// What `crescent replay` reads from its command line.
struct ReplayArgs {
  std::string trace_path;
  std::vector<std::string> urls = {"http://127.0.0.1:8000"};  // serve::ReplayOptions::servers
  std::string model;                                          // empty: the first the server lists
  std::string api_key;                                        // sent as a Bearer token when set
  std::string config_path;  // whose SLOs the report judges against; empty: the bundled default
  double time_scale = 1.0;
  int64_t limit = 0;
  int64_t block_size_tokens = 512;
  int64_t length_divisor = 1;  // trace::ReadOptions::length_divisor
  int64_t vocab_size = 256;
  double request_timeout_s = 600;  // serve::ReplayOptions::timeout_s
  bool skip_invalid = false;
  bool json = false;
  bool check_mock_output = false;  // serve::ReplayOptions::check_mock_output
  std::string requests_out;        // non-empty: one JSON line per request, as `simulate --requests-out`
};

/// Replays and prints the report (stdout; warnings on stderr). Returns the exit code: 0, 2 for bad input, 1
/// when the server cannot be reached or requests failed.
int run_replay(const ReplayArgs& args);

}  // namespace crescent::cli
