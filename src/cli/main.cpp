// crescent: one executable, one file per subcommand (see docs/architecture.md).
#include <CLI/CLI.hpp>
#include <string_view>

#include "cli/commands.h"
#include "common/huge_pages.h"

int main(int argc, char** argv) {
  // The commands that simulate run on a heap of huge pages (common/huge_pages.h).
  if (argc > 1) {
    const std::string_view command = argv[1];
    if (command == "simulate" || command == "plan" || command == "experiment") {
      crescent::reexec_with_huge_page_heap(argv);
    }
  }
  CLI::App app{
      "crescent: KV-cache-centric LLM serving (Mooncake) — trace analysis, cluster simulation, KV cache "
      "pool"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "crescent 0.1.0");
  int exit_code = 0;
  crescent::cli::register_analyze(app, exit_code);
  crescent::cli::register_simulate(app, exit_code);
  crescent::cli::register_plan(app, exit_code);
  crescent::cli::register_experiment(app, exit_code);
  crescent::cli::register_bench(app, exit_code);
  crescent::cli::register_store(app, exit_code);
  crescent::cli::register_serve(app, exit_code);
  crescent::cli::register_replay(app, exit_code);
  crescent::cli::register_model(app, exit_code);
  crescent::cli::register_profile(app, exit_code);
  crescent::cli::register_tokenize(app, exit_code);
  crescent::cli::register_trace(app, exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints usage errors itself; map them to the project's bad-input exit code (2).
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  return exit_code;
}
