#include "cli/commands.h"

#include <fmt/format.h>
#include <pthread.h>

#include <cstdio>
#include <exception>
#include <filesystem>

#include "common/bundled_files.h"

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

sigset_t block_stop_signals() {
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

}  // namespace crescent::cli
