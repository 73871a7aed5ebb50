#include "cli/commands.h"

#include <fmt/format.h>
#include <pthread.h>

#include <atomic>
#include <cstdio>
#include <exception>
#include <filesystem>

#include "common/bundled_files.h"
#include "perf/profile.h"
#include "trace/reader.h"

namespace crescent::cli {

int fail(const Status& status) {
  fmt::print(stderr, "error: {}\n", status.message());
  return kExitBadInput;
}

Status with_bundled_trace_hint(const Status& status, const std::string& path) {
  if (status.code() != StatusCode::kNotFound || std::filesystem::path(path).is_absolute()) return status;
  auto bundled = bundled_file(path);
  if (!bundled.ok()) return status;
  return Status::not_found(
      fmt::format("{} (the bundled trace of that name is {})", status.message(), *bundled));
}

void run_guarded(int& exit_code, const std::function<int()>& body) {
  try {
    exit_code = body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    exit_code = 1;
  }
}

namespace {
std::atomic<pthread_t> g_stop_waiter{};  // the thread that blocked the stop signals (and waits for them)
}  // namespace

sigset_t block_stop_signals() {
  g_stop_waiter = pthread_self();
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGINT);
  sigaddset(&set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  return set;
}

int wait_for_stop_signal(const sigset_t& set) {
  int signal = 0;
  sigwait(&set, &signal);
  return signal;
}

void wake_stop_signal_wait() {
  pthread_kill(g_stop_waiter.load(), SIGTERM);
}

Result<std::string> config_path_or_default(const std::string& path, std::string_view bundled_default) {
  if (!path.empty()) return path;
  return bundled_file(bundled_default);
}

Result<cluster::ClusterConfig> load_cluster_config_or_default(const std::string& path,
                                                              int64_t block_size_tokens,
                                                              std::string_view bundled_default,
                                                              const std::string& profile_path) {
  auto config_path = config_path_or_default(path, bundled_default);
  if (!config_path.ok()) return config_path.status();
  auto config = cluster::load_cluster_config(*config_path, block_size_tokens);
  if (!config.ok() || profile_path.empty()) return config;
  auto profile = perf::load_profile(profile_path);
  if (!profile.ok()) return profile.status();
  config->profile = *profile;
  return config;
}

void add_length_divisor_flag(CLI::App* cmd, int64_t& divisor) {
  cmd->add_option("--length-divisor", divisor,
                  "Divide every request's input and output length by this (rounded up), to fit a small "
                  "model's context; divide --block-size by it too")
      ->capture_default_str();
}

void add_profile_flag(CLI::App* cmd, std::string& path) {
  cmd->add_option("--profile", path,
                  "A `crescent profile` output: its measured cost-model coefficients replace the config's "
                  "roofline (and its \"profile\")");
}

Result<std::vector<trace::Request>> read_command_trace(const std::string& path, int64_t block_size_tokens,
                                                       bool skip_invalid, int64_t limit,
                                                       int64_t length_divisor) {
  trace::SkipReport skipped;
  auto requests = trace::read_trace(path,
                                    {.block_size_tokens = block_size_tokens,
                                     .skip_invalid = skip_invalid,
                                     .max_requests = limit,
                                     .length_divisor = length_divisor},
                                    &skipped);
  if (!requests.ok()) return with_bundled_trace_hint(requests.status(), path);
  if (skipped.total_lines > 0) fmt::print(stderr, "{}\n", skipped.summary());
  if (requests->empty()) return trace::empty_trace_error(path, skipped);
  return requests;
}

}  // namespace crescent::cli
