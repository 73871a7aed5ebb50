// `crescent experiment NAME`: named experiments after the paper's figures. Each runs the simulator or the
// trace analyzer on a trace and a cluster config and writes DIR/NAME.json (the numbers, and how they were
// made) and DIR/NAME.svg (a plot).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace crescent::experiment {

/// What an experiment runs on and where it writes. Empty traces or config select the bundled defaults
/// (common/bundled_files.h: beside the installed binary or in the source tree, whatever the current
/// directory): data/traces/conversation_trace.jsonl.gz (experiments over several traces: both bundled traces)
/// and configs/paper-fig5.json. Every member has an initializer, so designated
/// initializers may leave any out.
struct ExperimentOptions {
  std::string out_dir{};
  std::vector<std::string> traces{};
  std::string config_path{};
  std::string profile_path{};  // non-empty: a `crescent profile` output replacing the config's profile
  std::optional<double> time_scale{};  // arrivals this many times faster; default: the experiment's own
  int64_t block_size_tokens = 512;     // tokens per trace block (hash_id)
};

/// What a finished experiment tells the user beyond its files.
struct ExperimentSummary {
  std::string table;                  // its main numbers, one short text table for the terminal
  std::vector<std::string> warnings;  // e.g. a run in which no request completed, and why
  std::string json_path;              // the files written
  std::string svg_path;
};

/// The registered experiments, in registry order.
std::vector<std::string> experiment_names();

/// Runs experiment `name`, writes `out_dir`/NAME.json and NAME.svg (creating `out_dir` when missing) and
/// returns its summary.
/// Inputs and the output directory are checked before anything runs. No file is ever half-written, and
/// nothing is written when the run or the plot fails (NAME.svg is removed again if NAME.json cannot be
/// written). Same inputs give byte-identical JSON. Errors: kNotFound for an unknown name (listing the valid
/// ones) or a missing file; kInvalidArgument for bad options, traces or configs; kIoError when `out_dir`
/// cannot be written; kInternal when gnuplot fails.
Result<ExperimentSummary> run_experiment(std::string_view name, const ExperimentOptions& options);

}  // namespace crescent::experiment
