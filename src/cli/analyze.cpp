#include "cli/commands.h"
namespace crescent::cli {
void register_analyze(CLI::App& app, int& exit_code) { (void)app; (void)exit_code; }
}  // namespace crescent::cli
