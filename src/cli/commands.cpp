#include "cli/commands.h"

#include <fmt/format.h>

#include <cstdio>
#include <exception>

namespace crescent::cli {

int fail(const Status& status) {
  fmt::print(stderr, "error: {}\n", status.message());
  return kExitBadInput;
}

void run_guarded(int& exit_code, const std::function<int()>& body) {
  try {
    exit_code = body();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    exit_code = 1;
  }
}

}  // namespace crescent::cli
