// `crescent simulate TRACE`: replays a trace through a simulated cluster (disaggregated and placed by the
// Conductor, one run per prefill policy on the same input, or a colocated baseline) and prints one table or
// JSON.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "cli/commands.h"
#include "cluster/cluster_config.h"
#include "cluster/report.h"
#include "common/atomic_file.h"
#include "common/parallel.h"
#include "common/text_format.h"
#include "conductor/conductor.h"
#include "model/llama.h"
#include "sim/simulator.h"

namespace crescent::cli {
namespace {

struct SimulateArgs {
  std::string trace_path;
  std::string config_path;   // empty: the bundled kDefaultClusterConfig
  std::string profile_path;  // --profile
  int64_t length_divisor = 1;
  std::string model_dir;  // --model: a model directory's spec replaces the config's model
  std::string policy = "global-cache-aware";
  bool policy_given = false;
  std::string compare;
  int threads = 0;  // policies simulated at once; 0: the cores this process may use
  bool threads_given = false;
  std::string admission = "none";
  std::string system = "disaggregated";
  int64_t chunk_tokens = 512;
  bool chunk_tokens_given = false;
  double time_scale = 1.0;
  int64_t block_size_tokens = 512;
  int64_t limit = 0;
  bool skip_invalid = false;
  bool json = false;
  std::string requests_out;
};

std::vector<std::string> split_list(const std::string& list) {
  std::vector<std::string> out;
  std::stringstream ss(list);
  for (std::string item; std::getline(ss, item, ',');) {
    if (!item.empty()) out.push_back(item);
  }
  return out;
}

// Where --requests-out FILE puts one policy's lines: FILE itself for a single run; with --compare, the
// policy's name before FILE's extension (out/req.jsonl -> out/req.cache-aware.jsonl).
std::string requests_out_path(const std::string& file, const std::string& policy, bool several) {
  if (!several) return file;
  const std::filesystem::path path(file);
  std::filesystem::path named = path;
  named.replace_filename(path.stem().string() + "." + policy + path.extension().string());
  return named.string();
}

int run_simulate(const SimulateArgs& args) {
  if (args.limit < 0) return fail(Status::invalid_argument("--limit must be >= 0"));
  if (args.threads < 0)
    return fail(Status::invalid_argument(fmt::format("--threads {}: must be >= 0", args.threads)));
  // Options that would be ignored are errors, and every name is checked before the trace is read.
  if (args.threads_given && args.compare.empty()) {
    return fail(
        Status::invalid_argument("--threads applies to --compare (it runs the compared policies at once)"));
  }
  if (args.policy_given && !args.compare.empty()) {
    return fail(
        Status::invalid_argument("--policy and --compare both choose prefill policies: give one (--compare "
                                 "A,B runs each of A and B)"));
  }
  std::vector<std::string> names =
      args.compare.empty() ? std::vector<std::string>{args.policy} : split_list(args.compare);
  if (names.empty()) return fail(Status::invalid_argument("--compare needs at least one policy name"));
  std::vector<conductor::PrefillPolicy> policies;
  for (const auto& n : names) {
    auto p = conductor::parse_prefill_policy(n);
    if (!p.ok()) return fail(p.status());
    if (std::find(policies.begin(), policies.end(), *p) != policies.end()) {
      return fail(Status::invalid_argument(fmt::format("--compare names policy '{}' twice", n)));
    }
    policies.push_back(*p);
  }
  auto admission = conductor::parse_admission(args.admission);
  if (!admission.ok()) return fail(admission.status());
  auto system = sim::parse_system(args.system);
  if (!system.ok()) return fail(system.status());
  if (args.chunk_tokens_given && *system != sim::System::kColocatedChunkedPrefill) {
    return fail(Status::invalid_argument(
        fmt::format("--chunk-tokens applies to --system colocated-chunked-prefill only, not '{}' (a "
                    "disaggregated cluster's KV streaming chunk is the config's prefill_chunk_tokens)",
                    args.system)));
  }
  if (*system != sim::System::kDisaggregated) {
    // Colocated baselines have no Conductor: one run, named after the system.
    if (!args.compare.empty() || args.policy_given || args.admission != "none") {
      return fail(Status::invalid_argument(
          "--compare, --policy and --admission apply to --system disaggregated (colocated baselines have no "
          "Conductor)"));
    }
    names = {args.system};
  }
  const bool requests_to_stdout = args.requests_out == "-";
  if (!args.requests_out.empty() && !requests_to_stdout) {
    std::error_code ec;
    const std::filesystem::path dir = std::filesystem::absolute(args.requests_out).parent_path();
    if (!std::filesystem::is_directory(dir, ec)) {
      return fail(Status::invalid_argument(
          fmt::format("--requests-out {}: directory '{}' does not exist", args.requests_out, dir.string())));
    }
    if (std::filesystem::is_directory(args.requests_out, ec)) {
      return fail(Status::invalid_argument(
          fmt::format("--requests-out {}: is a directory; give a file name", args.requests_out)));
    }
  }
  auto config = load_cluster_config_or_default(args.config_path, args.block_size_tokens,
                                               kDefaultClusterConfig, args.profile_path);
  if (!config.ok()) return fail(config.status());
  if (!args.model_dir.empty()) {
    auto llama = model::read_llama_config(args.model_dir);
    if (!llama.ok()) return fail(llama.status());
    config->model = model::model_spec(*llama, std::filesystem::path(args.model_dir).filename().string());
  }
  auto requests = read_command_trace(args.trace_path, args.block_size_tokens, args.skip_invalid, args.limit,
                                     args.length_divisor);
  if (!requests.ok()) return fail(requests.status());

  sim::SimOptions options{.system = *system,
                          .policy = policies.front(),
                          .admission = *admission,
                          .block_size_tokens = args.block_size_tokens,
                          .time_scale = args.time_scale,
                          .chunked_prefill_tokens = args.chunk_tokens};
  // The policies' runs are independent (each its own Conductor and cluster over the same requests): run at
  // once, one per thread; reported and written in the order given, so the output is the same.
  std::vector<std::optional<Result<cluster::RunResult>>> results(names.size());
  parallel_for(names.size(), static_cast<unsigned>(args.threads), [&](size_t i) {
    sim::SimOptions run = options;
    run.policy = policies[i];
    results[i].emplace(sim::simulate(*config, *requests, run));
  });
  std::vector<cluster::PolicyReport> reports;
  for (size_t i = 0; i < names.size(); ++i) {
    Result<cluster::RunResult>& result = *results[i];
    if (!result.ok()) return fail(result.status());
    reports.push_back(cluster::summarize(names[i], *result, config->slo));
    if (const std::string warning = cluster::no_completion_warning(reports.back()); !warning.empty()) {
      fmt::print(stderr, "warning: {}\n", warning);
    }
    // Line by line: a million requests' lines are ~400 MB, more than the simulation held.
    if (requests_to_stdout) {
      cluster::for_each_request_line(*result, names[i], [](std::string_view line) {
        return std::fwrite(line.data(), 1, line.size(), stdout) == line.size();
      });
      if (std::fflush(stdout) != 0 || std::ferror(stdout)) {
        return fail(Status::io_error(
            fmt::format("--requests-out -: cannot write to stdout: {}", std::strerror(errno))));
      }
    } else if (!args.requests_out.empty()) {
      const std::string path = requests_out_path(args.requests_out, names[i], names.size() > 1);
      Result<std::unique_ptr<AtomicFileWriter>> writer = AtomicFileWriter::open(path);
      if (!writer.ok()) return fail(writer.status());
      Status written;
      cluster::for_each_request_line(*result, names[i], [&](std::string_view line) {
        written = (*writer)->write(line);
        return written.ok();
      });
      if (written.ok()) written = (*writer)->commit();
      if (!written.ok()) return fail(written);
      fmt::print(stderr, "wrote {} per-request lines ({}) to {}\n", result->requests.size(), names[i], path);
    }
  }
  // With the per-request lines on stdout, the report goes to stderr.
  std::FILE* report = requests_to_stdout ? stderr : stdout;

  if (args.json) {
    nlohmann::json out;
    out["trace"] = args.trace_path;
    out["requests"] = requests->size();
    out["time_scale"] = args.time_scale;
    out["system"] = args.system;
    out["admission"] = args.admission;
    out["config"] = cluster::to_json(*config);
    out["policies"] = nlohmann::json::array();
    for (const auto& r : reports) out["policies"].push_back(cluster::to_json(r));
    fmt::print(report, "{}\n", dump_json(out, 2));
  } else {
    const auto& c = *config;
    fmt::print(report, "trace {}: {} requests, time scale {:g}\n", args.trace_path, requests->size(),
               args.time_scale);
    if (*system == sim::System::kDisaggregated) {
      fmt::print(
          report,
          "cluster {}: {} prefill + {} decode instances of {} serving {}, prefill cache {} each, admission "
          "{}\n\n",
          c.name, c.prefill_instances, c.decode_instances, c.hardware.name, c.model.name,
          grouped(c.prefill_cache_capacity_tokens) + " tokens", args.admission);
    } else {
      fmt::print(report, "cluster {}: {} colocated instances of {} serving {} ({})\n\n", c.name,
                 c.prefill_instances + c.decode_instances, c.hardware.name, c.model.name, args.system);
    }
    fmt::print(report, "{}", cluster::format_table(reports, c.slo));
  }
  return 0;
}

}  // namespace

void register_simulate(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<SimulateArgs>();
  CLI::App* cmd = app.add_subcommand("simulate", "Replay a trace through a simulated prefill/decode cluster");
  cmd->add_option("trace", args->trace_path, "Mooncake JSONL trace (.jsonl or .jsonl.gz)")->required();
  add_profile_flag(cmd, args->profile_path);
  add_length_divisor_flag(cmd, args->length_divisor);
  cmd->add_option("--model", args->model_dir,
                  "A model directory (crescent model init): its shape replaces the config's model, as `serve "
                  "--executor cpu --model` does");
  cmd->add_option("--config", args->config_path,
                  fmt::format("Cluster config JSON (default: the bundled {}; fields: docs/config.md)",
                              kDefaultClusterConfig));
  CLI::Option* policy =
      cmd->add_option("--policy", args->policy,
                      "Prefill policy: random, round-robin, least-loaded, cache-aware, global-cache-aware")
          ->capture_default_str();
  cmd->add_option("--compare", args->compare, "Comma-separated policies, run on the same input, one table");
  CLI::Option* threads = cmd->add_option(
      "--threads", args->threads,
      "Policies of --compare simulated at once, one per thread (default 0: one per core this process "
      "may use); the output is the same whatever the number");
  cmd->add_option("--admission", args->admission, "Admission: none, slo, early, predictive")
      ->capture_default_str();
  cmd->add_option(
         "--system", args->system,
         "disaggregated, colocated, colocated-prefix-cache, colocated-chunked-prefill (same node count)")
      ->capture_default_str();
  CLI::Option* chunk = cmd->add_option("--chunk-tokens", args->chunk_tokens,
                                       "Prefill tokens per iteration for --system colocated-chunked-prefill")
                           ->capture_default_str();
  cmd->add_option("--time-scale", args->time_scale, "Replay arrivals this many times faster")
      ->capture_default_str();
  cmd->add_option("--block-size", args->block_size_tokens, "Tokens per trace block (hash_id)")
      ->capture_default_str();
  cmd->add_option("--limit", args->limit, "Read and simulate only the first N valid requests (0 = all)");
  cmd->add_option("--requests-out", args->requests_out,
                  "Write one JSON line per request to FILE; with --compare of several policies, to FILE's "
                  "stem.POLICY.ext "
                  "each; '-': to stdout (the report then goes to stderr)");
  cmd->add_flag("--skip-invalid", args->skip_invalid, "Skip invalid trace lines and report them");
  cmd->add_flag("--json", args->json, "Print JSON instead of a table");
  cmd->callback([args, policy, chunk, threads, &exit_code] {
    args->policy_given = policy->count() > 0;
    args->threads_given = threads->count() > 0;
    args->chunk_tokens_given = chunk->count() > 0;
    run_guarded(exit_code, [&] { return run_simulate(*args); });
  });
}

}  // namespace crescent::cli
