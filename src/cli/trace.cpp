// `crescent trace`: making traces. `trace import` (cli/trace_import.cpp) turns request logs into a Mooncake
// trace; `trace transform` (cli/trace_transform.cpp) derives what-if traces from one.
#include "cli/commands.h"

namespace crescent::cli {

void register_trace(CLI::App& app, int& exit_code) {
  CLI::App* trace_cmd = app.add_subcommand("trace", "Make Mooncake-format traces: import request logs, transform");
  trace_cmd->require_subcommand(1);
  register_trace_import(*trace_cmd, exit_code);
  register_trace_transform(*trace_cmd, exit_code);
}

}  // namespace crescent::cli
