// `crescent experiment NAME --out DIR`: runs one of the paper's experiments and writes DIR/NAME.json and
// DIR/NAME.svg (src/experiment).
#include <fmt/format.h>

#include <memory>
#include <string>

#include "cli/commands.h"
#include "experiment/experiments.h"

namespace crescent::cli {

void register_experiment(CLI::App& app, int& exit_code) {
  struct Args {
    std::string name;
    experiment::ExperimentOptions options;
  };
  auto args = std::make_shared<Args>();
  CLI::App* cmd = app.add_subcommand("experiment", "Run an experiment; write DIR/NAME.json and DIR/NAME.svg");
  cmd->add_option("name", args->name,
                  fmt::format("Experiment: {}", fmt::join(experiment::experiment_names(), ", ")))
      ->required();
  cmd->add_option("--out", args->options.out_dir, "Output directory (created when missing)")->required();
  cmd->add_option("--trace", args->options.traces,
                  "Mooncake JSONL trace; repeat for several (default: the bundled conversation trace, or "
                  "both bundled traces for cache-capacity)")
      ->allow_extra_args(false);  // one path per --trace, so a positional NAME may follow
  cmd->add_option(
      "--config", args->options.config_path,
      "Cluster config JSON (default: the bundled configs/paper-fig5.json; fields: docs/config.md)");
  add_profile_flag(cmd, args->options.profile_path);
  cmd->add_option("--time-scale", args->options.time_scale,
                  "Replay arrivals this many times faster (default: the experiment's)");
  cmd->add_option("--block-size", args->options.block_size_tokens, "Tokens per trace block (hash_id)")
      ->capture_default_str();
  cmd->callback([args, &exit_code] {
    run_guarded(exit_code, [&] {
      const auto summary = experiment::run_experiment(args->name, args->options);
      if (!summary.ok()) return fail(summary.status());
      for (const std::string& warning : summary->warnings) fmt::print(stderr, "warning: {}\n", warning);
      fmt::print("{}\nwrote {} and {}\n", summary->table, summary->json_path, summary->svg_path);
      return 0;
    });
  });
}

}  // namespace crescent::cli
