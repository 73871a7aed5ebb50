// `crescent plan TRACE`: the fewest nodes (split, cache, admission) meeting the SLOs on a trace at a load, or
// the highest load a node budget sustains (src/experiment/plan.h, docs/plan.md).
#include "experiment/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cluster/cluster_config.h"
#include "common/atomic_file.h"
#include "common/text_format.h"
#include "conductor/conductor.h"
#include "experiment/plot.h"

namespace crescent::cli {
namespace {

struct PlanArgs {
  std::string trace_path;
  std::string config_path;
  std::string profile_path;
  std::optional<double> ttft_slo_s;
  std::optional<double> tbt_slo_s;
  double attainment = 0.99;
  std::optional<double> rate_scale;
  std::optional<double> rate_rps;
  std::optional<uint32_t> nodes;
  std::optional<uint32_t> max_nodes;
  double cache_dram_bytes = 1e12;
  std::string admissions;
  unsigned threads = 0;
  bool no_prune = false;
  bool json = false;
  std::string out_dir;
  int64_t block_size_tokens = 512;
  int64_t limit = 0;
  bool skip_invalid = false;
};

std::string slo_text(const cluster::SloConfig& slo, double attainment) {
  return fmt::format("TTFT <= {:g} s and TBT <= {:g} ms for {:g}% of requests", slo.ttft_s,
                     slo.tbt_s.front() * 1000, attainment * 100);
}

// `word` as one shell word: as it is when a shell would read nothing in it, else single-quoted.
std::string shell_word(const std::string& word) {
  const bool plain = !word.empty() && std::all_of(word.begin(), word.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) ||
           std::string_view("/._-+=:,@").find(ch) != std::string_view::npos;
  });
  if (plain) return word;
  std::string quoted = "'";
  for (char ch : word) quoted += ch == '\'' ? std::string("'\\''") : std::string(1, ch);
  return quoted + "'";
}

// The `crescent simulate` command that reruns `candidate` from `config_file`.
std::string check_command(const PlanArgs& args, const experiment::PlanCandidate& c,
                          const std::string& config_file) {
  std::string cmd = fmt::format("crescent simulate {} --config {} --time-scale {:.17g}",
                                shell_word(args.trace_path), shell_word(config_file), c.rate_scale);
  if (c.system == sim::System::kDisaggregated) {
    cmd += fmt::format(" --admission {}", conductor::to_string(c.admission));
  } else {
    cmd += fmt::format(" --system {}", sim::to_string(c.system));
  }
  if (args.block_size_tokens != 512) cmd += fmt::format(" --block-size {}", args.block_size_tokens);
  if (args.limit > 0) cmd += fmt::format(" --limit {}", args.limit);
  if (args.skip_invalid) cmd += " --skip-invalid";
  return cmd;
}

int run_plan(const PlanArgs& args) {
  if (args.rate_scale && args.rate_rps) {
    return fail(Status::invalid_argument("--rate-scale and --rate both set the load: give one"));
  }
  if (args.limit < 0) return fail(Status::invalid_argument("--limit must be >= 0"));
  if (args.ttft_slo_s && !(*args.ttft_slo_s > 0)) {
    return fail(
        Status::invalid_argument(fmt::format("--ttft-slo {}: must be > 0 seconds", *args.ttft_slo_s)));
  }
  if (args.tbt_slo_s && !(*args.tbt_slo_s > 0)) {
    return fail(Status::invalid_argument(fmt::format("--tbt-slo {}: must be > 0 seconds", *args.tbt_slo_s)));
  }
  if (args.rate_rps && !(*args.rate_rps > 0)) {
    return fail(Status::invalid_argument(fmt::format("--rate {}: must be > 0 requests/s", *args.rate_rps)));
  }
  if (args.nodes && *args.nodes < 2) {
    return fail(Status::invalid_argument(
        fmt::format("--nodes {}: a disaggregated cluster needs at least 2 nodes", *args.nodes)));
  }
  if (args.nodes && args.max_nodes) {
    return fail(Status::invalid_argument(
        "--max-nodes bounds the search for the fewest nodes; with --nodes the node count is given"));
  }
  experiment::PlanOptions options{.attainment_target = args.attainment,
                                  .node_budget = args.nodes.value_or(0),
                                  .max_nodes = args.max_nodes.value_or(64),
                                  .cache_dram_bytes = args.cache_dram_bytes,
                                  .prune = !args.no_prune,
                                  .threads = args.threads,
                                  .block_size_tokens = args.block_size_tokens};
  if (!args.admissions.empty()) {
    options.admissions.clear();
    std::stringstream list(args.admissions);
    for (std::string name; std::getline(list, name, ',');) {
      auto admission = conductor::parse_admission(name);
      if (!admission.ok()) return fail(admission.status());
      options.admissions.push_back(*admission);
    }
  }
  auto config = load_cluster_config_or_default(args.config_path, args.block_size_tokens,
                                               kDefaultClusterConfig, args.profile_path);
  if (!config.ok()) return fail(config.status());
  if (args.ttft_slo_s) config->slo.ttft_s = *args.ttft_slo_s;
  if (args.tbt_slo_s) config->slo.tbt_s = {*args.tbt_slo_s};
  auto requests = read_command_trace(args.trace_path, args.block_size_tokens, args.skip_invalid, args.limit);
  if (!requests.ok()) return fail(requests.status());
  const double span_s =
      static_cast<double>(requests->back().timestamp_ms - requests->front().timestamp_ms) / 1e3;
  const double trace_rate_rps = span_s > 0 ? static_cast<double>(requests->size()) / span_s : 0;
  if (args.rate_rps) {
    if (trace_rate_rps <= 0) {
      return fail(
          Status::invalid_argument("--rate: the trace's requests all arrive at once; use --rate-scale"));
    }
    options.rate_scale = *args.rate_rps / trace_rate_rps;
  } else {
    options.rate_scale = args.rate_scale.value_or(1.0);
  }

  // The first line says what is planned for, and which of it are defaults.
  const std::string config_origin = args.config_path.empty()
                                        ? fmt::format("the bundled default {}", kDefaultClusterConfig)
                                        : args.config_path;
  const std::string slo_origin = args.ttft_slo_s || args.tbt_slo_s ? "" : " (the config's)";
  const std::string load =
      options.node_budget > 0 ? fmt::format("the highest load {} nodes sustain", options.node_budget)
      : trace_rate_rps <= 0
          ? fmt::format("once: all {} requests arrive at the same instant", requests->size())
      : args.rate_scale || args.rate_rps
          ? fmt::format("x{:.3g} the trace's rate ({:.2f} requests/s)", options.rate_scale,
                        trace_rate_rps * options.rate_scale)
          : fmt::format("the trace's own rate ({:.2f} requests/s)", trace_rate_rps);
  const std::string header =
      fmt::format("plan: {} on {} nodes from {}; SLOs{}: {}; at {}; {} requests of {}", config->model.name,
                  config->hardware.name, config_origin, slo_origin, slo_text(config->slo, args.attainment),
                  load, requests->size(), args.trace_path);
  fmt::print(args.json ? stderr : stdout, "{}\n", header);
  std::fflush(stdout);

  if (!args.out_dir.empty()) {
    if (Status s = ensure_writable_directory(args.out_dir); !s.ok()) return fail(s);
  }
  auto result = experiment::plan(*config, *requests, options);
  if (!result.ok()) return fail(result.status());

  nlohmann::json j;
  j["trace"] = args.trace_path;
  j["requests"] = requests->size();
  j["trace_rate_rps"] = trace_rate_rps;
  j["config"] = cluster::to_json(*config);
  j.update(experiment::to_json(*result, options));

  std::vector<std::string> written;
  std::string check;
  if (!args.out_dir.empty()) {
    const std::filesystem::path dir(args.out_dir);
    std::vector<std::string> contents;
    std::vector<std::string> paths;
    auto add_config = [&](const experiment::PlanCandidate& c, const std::string& file,
                          const std::string& what) {
      cluster::ClusterConfig chosen = experiment::candidate_config(*config, c);
      chosen.name = std::filesystem::path(file).stem().string();
      chosen.description = fmt::format("crescent plan: {} for {} at x{:.6g} its rate ({})", what,
                                       args.trace_path, c.rate_scale, experiment::candidate_name(c));
      paths.push_back((dir / file).string());
      contents.push_back(dump_json(cluster::to_json(chosen), 2) + "\n");
    };
    if (result->recommended) {
      const auto& rec = result->candidates[*result->recommended];
      add_config(rec, "recommended.json", "the recommended cluster");
      check = check_command(args, rec, paths.back());
      j["recommended_check"] = check;
    }
    if (result->next_smaller) {
      const auto& next = result->candidates[*result->next_smaller];
      add_config(next, "next-smaller.json", "the best cluster of one node fewer (misses the target)");
      j["next_smaller_check"] = check_command(args, next, paths.back());
    }
    auto svg = experiment::render_svg(experiment::plan_plot(
        *result, options,
        fmt::format("crescent plan: {} on {}, {}", config->model.name, config->hardware.name,
                    options.node_budget > 0 ? fmt::format("{} nodes", options.node_budget)
                                            : fmt::format("x{:.3g} load", options.rate_scale))));
    if (!svg.ok()) return fail(svg.status());
    paths.push_back((dir / "plan.svg").string());
    contents.push_back(*svg);
    paths.push_back((dir / "plan.json").string());
    contents.push_back(dump_json(j, 2) + "\n");
    std::vector<FileContent> files;
    for (size_t i = 0; i < paths.size(); ++i) files.push_back({paths[i], contents[i]});
    if (Status s = write_files_atomically(files); !s.ok()) return fail(s);
    written = paths;
    // A config an earlier plan wrote there and this one did not would be taken for this plan's.
    for (const char* file : {"recommended.json", "next-smaller.json"}) {
      const std::string path = (dir / file).string();
      std::error_code ignored;
      if (std::find(paths.begin(), paths.end(), path) == paths.end()) std::filesystem::remove(path, ignored);
    }
  }

  if (args.json) {
    fmt::print("{}\n", dump_json(j, 2));
  } else {
    fmt::print("{}", experiment::format_plan(*result, options, config->slo));
    if (!check.empty()) fmt::print("Check: {}\n", check);
  }
  std::fflush(stdout);
  if (!written.empty()) {
    fmt::print(stderr, "wrote {}\n", fmt::join(written, ", "));
  } else if (!args.json) {
    fmt::print("(--out DIR writes plan.json, plan.svg and the recommended config)\n");
  }
  return 0;
}

}  // namespace

void register_plan(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<PlanArgs>();
  CLI::App* cmd = app.add_subcommand(
      "plan",
      "The fewest nodes, split and cache meeting your SLOs on a trace (or the most load N nodes take)");
  cmd->add_option("trace", args->trace_path, "Mooncake JSONL trace (.jsonl or .jsonl.gz)")->required();
  cmd->add_option(
      "--config", args->config_path,
      fmt::format("Cluster config JSON: model, hardware, SLOs, scheduler (default: the bundled {}; "
                  "docs/config.md)",
                  kDefaultClusterConfig));
  add_profile_flag(cmd, args->profile_path);
  cmd->add_option("--ttft-slo", args->ttft_slo_s, "TTFT SLO, seconds (default: the config's slo.ttft_s)");
  cmd->add_option("--tbt-slo", args->tbt_slo_s, "TBT SLO, seconds (default: the config's first slo.tbt_s)");
  cmd->add_option("--attainment", args->attainment,
                  "Share of all requests that must meet both SLOs, in (0, 1]")
      ->capture_default_str();
  cmd->add_option("--rate-scale", args->rate_scale,
                  "Target load: the trace's arrivals this many times faster (default 1: its own rate)");
  cmd->add_option("--rate", args->rate_rps, "Target load in requests/s (the trace's arrivals scaled to it)");
  cmd->add_option("--nodes", args->nodes,
                  "A node budget: find the highest load this many nodes sustain instead of the fewest nodes");
  cmd->add_option("--max-nodes", args->max_nodes, "Give up past this many nodes")->capture_default_str();
  cmd->add_option(
         "--cache-dram-bytes", args->cache_dram_bytes,
         "DRAM per prefill node for its prefix cache, bytes: the largest cache searched (also its half "
         "and quarter)")
      ->capture_default_str();
  cmd->add_option("--admissions", args->admissions,
                  "Comma-separated admission policies to search (default: none,slo,early,predictive)");
  cmd->add_option("--threads", args->threads, "Candidates simulated at once (default 0: one per core)");
  cmd->add_flag("--no-prune", args->no_prune,
                "Simulate every candidate, also those the bound rules out (docs/plan.md: checks the bound)");
  cmd->add_option(
      "--out", args->out_dir,
      "Write DIR/plan.json, DIR/plan.svg, DIR/recommended.json (a config for `crescent simulate`) "
      "and DIR/next-smaller.json");
  cmd->add_flag("--json", args->json, "Print the plan as JSON instead of a table");
  cmd->add_option("--block-size", args->block_size_tokens, "Tokens per trace block (hash_id)")
      ->capture_default_str();
  cmd->add_option("--limit", args->limit, "Plan for the first N valid requests only (0 = all)");
  cmd->add_flag("--skip-invalid", args->skip_invalid, "Skip invalid trace lines and report them");
  cmd->callback([args, &exit_code] { run_guarded(exit_code, [&] { return run_plan(*args); }); });
}

}  // namespace crescent::cli
