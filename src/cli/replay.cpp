// `crescent replay TRACE --url URL`: replays a trace against a live OpenAI-compatible server (crescent serve,
// or e.g. a vLLM) and prints the simulator's table or JSON for what was measured.
#include "serve/replay.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cstdio>
#include <regex>
#include <string>

#include "cli/commands.h"
#include "cli/replay.h"
#include "cluster/cluster_config.h"
#include "cluster/report.h"
#include "common/atomic_file.h"
#include "experiment/progress.h"

namespace crescent::cli {
int run_replay(const ReplayArgs& args) {
  if (args.limit < 0) return fail(Status::invalid_argument("--limit must be >= 0"));
  std::vector<serve::ServerAddress> servers;
  for (const std::string& url : args.urls) {
    std::smatch m;
    if (!std::regex_match(url, m, std::regex(R"(http://([^:/]+):(\d{1,5})/?)"))) {
      return fail(Status::invalid_argument(
          fmt::format("--url '{}': expected http://HOST:PORT (e.g. http://127.0.0.1:8000)", url)));
    }
    const int port = std::stoi(m[2].str());
    if (port < 1 || port > 65535) {
      return fail(Status::invalid_argument(fmt::format("--url '{}': port {} out of range", url, port)));
    }
    servers.push_back({.host = m[1].str(), .port = port});
  }
  if (servers.empty()) return fail(Status::invalid_argument("--url: no server given"));
  const std::string against = fmt::format("{}", fmt::join(args.urls, ", "));
  auto config = load_cluster_config_or_default(args.config_path, args.block_size_tokens);
  if (!config.ok()) return fail(config.status());
  auto requests = read_command_trace(args.trace_path, args.block_size_tokens, args.skip_invalid, args.limit,
                                     args.length_divisor);
  if (!requests.ok()) return fail(requests.status());

  experiment::ProgressLine progress_line("replay", 1, "elapsed");
  auto report_progress = progress_line.start_run(against);
  const auto started = std::chrono::steady_clock::now();
  serve::ReplayOptions options{.servers = servers,
                               .model = args.model,
                               .api_key = args.api_key,
                               .time_scale = args.time_scale,
                               .block_size_tokens = args.block_size_tokens,
                               .vocab_size = args.vocab_size,
                               .timeout_s = args.request_timeout_s,
                               .check_mock_output = args.check_mock_output};
  if (report_progress) {
    options.progress = [&](int64_t finished, int64_t total) {
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      report_progress({finished, total, elapsed});
    };
  }
  auto replayed = serve::replay(*requests, options);
  if (!replayed.ok()) {
    fmt::print(stderr, "error: {}\n", replayed.status().message());
    return replayed.status().code() == StatusCode::kInvalidArgument ? kExitBadInput : 1;
  }
  if (!args.requests_out.empty()) {
    if (Status written =
            write_file_atomically(args.requests_out, cluster::requests_jsonl(replayed->result, "live"));
        !written.ok()) {
      return fail(written);
    }
    fmt::print(stderr, "wrote {} per-request lines to {}\n", replayed->result.requests.size(),
               args.requests_out);
  }
  cluster::PolicyReport report = cluster::summarize("live", replayed->result, config->slo);
  // A client cannot see how long prefill computed, nor where a prefix hit came from.
  report.prefill_compute_s_per_request.reset();
  report.fetched_ratio.reset();
  if (args.json) {
    nlohmann::json out;
    out["trace"] = args.trace_path;
    out["requests"] = requests->size();
    out["time_scale"] = args.time_scale;
    out["urls"] = args.urls;
    out["model"] = replayed->model;
    out["failed"] = replayed->failed;
    nlohmann::json failures = nlohmann::json::object();
    for (int c = 0; c < serve::kFailureClasses; ++c) {
      failures[serve::to_string(static_cast<serve::FailureClass>(c))] = replayed->failures[c];
    }
    out["failures"] = failures;
    out["first_error"] =
        replayed->first_error.empty() ? nlohmann::json() : nlohmann::json(replayed->first_error);
    out["slo"] = cluster::to_json(*config)["slo"];
    out["policies"] = nlohmann::json::array({cluster::to_json(report)});
    out["kv_exposed_transfer_mean_s"] = replayed->kv_exposed_transfer_mean_s
                                            ? nlohmann::json(*replayed->kv_exposed_transfer_mean_s)
                                            : nlohmann::json();
    out["client"] = {{"schedule_lag_mean_s", replayed->schedule_lag_mean_s},
                     {"schedule_lag_p99_s", replayed->schedule_lag_p99_s},
                     {"schedule_lag_max_s", replayed->schedule_lag_max_s},
                     {"max_in_flight", replayed->max_in_flight}};
    fmt::print("{}\n", dump_json(out, 2));
  } else {
    fmt::print("replay {}: {} requests, time scale {:g}, against {} (model {})\n\n", args.trace_path,
               requests->size(), args.time_scale, against, replayed->model);
    fmt::print("{}", cluster::format_table({report}, config->slo));
    fmt::print(
        "client: requests sent {:.1f} ms late on average (p99 {:.1f} ms, max {:.1f} ms) against the trace's "
        "schedule; at most {} in flight at once\n",
        replayed->schedule_lag_mean_s * 1e3, replayed->schedule_lag_p99_s * 1e3,
        replayed->schedule_lag_max_s * 1e3, replayed->max_in_flight);
  }
  if (replayed->failed > 0) {
    std::vector<std::string> by_class;
    for (int c = 0; c < serve::kFailureClasses; ++c) {
      if (replayed->failures[c] > 0) {
        by_class.push_back(fmt::format("{} {}", replayed->failures[c],
                                       serve::to_string(static_cast<serve::FailureClass>(c))));
      }
    }
    fmt::print(stderr, "warning: {} of {} requests failed (the report's failed column: {}); first: {}\n",
               replayed->failed, requests->size(), fmt::join(by_class, ", "), replayed->first_error);
    return 1;
  }
  return 0;
}

void register_replay(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ReplayArgs>();
  CLI::App* cmd = app.add_subcommand(
      "replay", "Replay a trace against a live OpenAI-compatible server and report as `simulate` does");
  cmd->add_option("trace", args->trace_path, "Mooncake JSONL trace (.jsonl or .jsonl.gz)")->required();
  cmd->add_option("--url", args->urls,
                  "The server, http://HOST:PORT; given several times, requests go to each in turn and one "
                  "that cannot connect is sent to the next")
      ->capture_default_str();
  cmd->add_option("--model", args->model, "Model to request (default: the first the server lists)");
  cmd->add_option("--api-key", args->api_key, "Sent as \"Authorization: Bearer KEY\"");
  cmd->add_option("--request-timeout", args->request_timeout_s,
                  "Seconds a request may take from its send to its last token; later, it fails")
      ->capture_default_str()
      ->check(CLI::PositiveNumber);
  cmd->add_option("--config", args->config_path,
                  fmt::format("Cluster config whose SLOs the report uses (default: the bundled {})",
                              kDefaultClusterConfig));
  cmd->add_option("--time-scale", args->time_scale, "Send arrivals this many times faster")
      ->capture_default_str();
  cmd->add_option("--limit", args->limit, "Replay only the first N valid requests (0 = all)")
      ->capture_default_str();
  cmd->add_option("--block-size", args->block_size_tokens, "Tokens per trace block (hash_id)")
      ->capture_default_str();
  cmd->add_option("--vocab-size", args->vocab_size,
                  "Prompt token ids stay below this (the server's vocabulary)")
      ->capture_default_str();
  add_length_divisor_flag(cmd, args->length_divisor);
  cmd->add_flag("--skip-invalid", args->skip_invalid, "Skip invalid trace lines and report them");
  cmd->add_flag("--json", args->json, "Print JSON instead of a table");
  cmd->add_flag("--check-mock-output", args->check_mock_output,
                "Send each request a seed and check its answer is the mock model's for it (a crescent "
                "cluster with the mock executor): a mismatch fails the request as wrong_output");
  cmd->add_option("--requests-out", args->requests_out,
                  "Write one JSON line per request (as `simulate --requests-out`) to this file");
  cmd->callback([args, &exit_code] { run_guarded(exit_code, [&] { return run_replay(*args); }); });
}

}  // namespace crescent::cli
