// `crescent trace transform` (issue 23): being written; until then the command says so and exits 2.
#include "cli/commands.h"

namespace crescent::cli {

void register_trace_transform(CLI::App& trace_cmd, int& exit_code) {
  CLI::App* cmd = trace_cmd.add_subcommand("transform", "Not implemented yet (issue 23)");
  cmd->callback([&exit_code] { exit_code = fail(Status::invalid_argument("trace transform: not implemented yet")); });
}

}  // namespace crescent::cli
