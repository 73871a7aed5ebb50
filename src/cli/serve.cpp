// `crescent serve`: the OpenAI-compatible front end over a disaggregated cluster. Today the cluster runs in
// this process (serve::LocalCluster: the real Conductor, mock prefill and decode engines on the steady
// clock); the separate instance processes moving KV through the store come next (docs/serving.md).
#include <fmt/format.h>
#include <sys/resource.h>

#include <cstdio>
#include <filesystem>
#include <string>

#include "cli/commands.h"
#include "cli/replay.h"
#include "conductor/conductor.h"
#include "serve/frontend.h"
#include "serve/http_server.h"
#include "serve/local_cluster.h"
#include "sim/cluster_config.h"

namespace crescent::cli {
namespace {

struct ServeArgs {
  std::string config_path;  // empty: the bundled kDefaultClusterConfig
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;
  std::string model_name = "mock";
  std::string policy = "global-cache-aware";
  std::string admission = "none";
  int64_t block_size_tokens = 512;
  uint64_t body_limit_bytes = 16ull << 20;
  // --replay: serve, replay this trace against it, print the report, stop.
  std::string replay_trace;
  int64_t replay_limit = 0;
  double replay_time_scale = 1.0;
  bool json = false;
};

int run_serve(const ServeArgs& args) {
  auto policy = conductor::parse_prefill_policy(args.policy);
  if (!policy.ok()) return fail(policy.status());
  auto admission = conductor::parse_admission(args.admission);
  if (!admission.ok()) return fail(admission.status());
  if (args.block_size_tokens < 1) return fail(Status::invalid_argument("--block-size must be >= 1"));
  auto config = load_cluster_config_or_default(args.config_path, args.block_size_tokens);
  if (!config.ok()) return fail(config.status());
  if (!args.replay_trace.empty() && !std::filesystem::is_regular_file(args.replay_trace)) {
    return fail(with_bundled_trace_hint(
        Status::not_found(fmt::format("cannot open '{}': no such file", args.replay_trace)),
        args.replay_trace));
  }

  const sigset_t signals = block_stop_signals();
  serve::LocalClusterOptions cluster_options{.config = *config,
                                             .policy = *policy,
                                             .admission = *admission,
                                             .block_size_tokens = args.block_size_tokens,
                                             .model_name = args.model_name};
  auto cluster = serve::LocalCluster::start(cluster_options);
  if (!cluster.ok()) return fail(cluster.status());
  serve::FrontendOptions frontend{.model_name = args.model_name, .api_key = args.api_key};
  serve::HttpServerOptions http{
      .host = args.host, .port = args.port, .body_limit_bytes = args.body_limit_bytes};
  auto server = serve::HttpServer::start(http, serve::make_frontend(**cluster, frontend));
  if (!server.ok()) {
    fmt::print(stderr, "error: {}\n", server.status().message());
    return server.status().code() == StatusCode::kInvalidArgument ? kExitBadInput : 1;
  }
  const std::string url = fmt::format("http://{}:{}", args.host, (*server)->port());
  fmt::print(
      args.json ? stderr : stdout,
      "crescent serve: model '{}' on {} ({} prefill + {} decode mock instances of {} on {}, policy {}, "
      "admission {}){}\n",
      args.model_name, url, config->prefill_instances, config->decode_instances, config->model.name,
      config->hardware.name, args.policy, args.admission,
      args.replay_trace.empty() ? "; Ctrl-C stops" : "; replaying " + args.replay_trace);
  std::fflush(stdout);
  if (!args.replay_trace.empty()) {
    ReplayArgs replay{.trace_path = args.replay_trace,
                      .url = url,
                      .model = args.model_name,
                      .api_key = args.api_key,
                      .config_path = args.config_path,
                      .time_scale = args.replay_time_scale,
                      .limit = args.replay_limit,
                      .block_size_tokens = args.block_size_tokens,
                      .json = args.json};
    const int code = run_replay(replay);
    (*server)->stop();
    rusage usage{};
    ::getrusage(RUSAGE_SELF, &usage);
    fmt::print(stderr, "crescent serve: peak RSS {:.0f} MiB (server, cluster and replay client together)\n",
               static_cast<double>(usage.ru_maxrss) / 1024);
    return code;
  }
  const int signal = wait_for_stop_signal(signals);
  fmt::print("crescent serve: stopping ({})\n", signal == SIGINT ? "SIGINT" : "SIGTERM");
  (*server)->stop();
  return 0;
}

}  // namespace

void register_serve(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand("serve", "Serve an OpenAI-compatible API over a disaggregated cluster");
  cmd->add_option("--config", args->config_path,
                  fmt::format("Cluster config JSON (default: the bundled {}; fields: docs/config.md)",
                              kDefaultClusterConfig));
  cmd->add_option("--host", args->host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", args->port, "HTTP port (0: any free port)")
      ->capture_default_str()
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", args->api_key, "Require \"Authorization: Bearer KEY\" on /v1 routes");
  cmd->add_option("--model-name", args->model_name, "The model id clients must name")->capture_default_str();
  cmd->add_option("--policy", args->policy,
                  "Prefill policy: random, least-loaded, cache-aware, global-cache-aware")
      ->capture_default_str();
  cmd->add_option("--admission", args->admission, "Admission: none, slo, early, predictive")
      ->capture_default_str();
  cmd->add_option("--block-size", args->block_size_tokens, "Tokens per KV block")->capture_default_str();
  cmd->add_option("--body-limit", args->body_limit_bytes, "Largest request body in bytes (else 413)")
      ->capture_default_str();
  cmd->add_option("--replay", args->replay_trace,
                  "Replay this trace against the cluster, print the report (as `crescent replay`) and stop");
  cmd->add_option("--limit", args->replay_limit, "With --replay: only the first N valid requests (0 = all)")
      ->capture_default_str();
  cmd->add_option("--time-scale", args->replay_time_scale,
                  "With --replay: send arrivals this many times faster")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "With --replay: print JSON instead of a table");
  cmd->callback([args, &exit_code] { run_guarded(exit_code, [&] { return run_serve(*args); }); });
}

}  // namespace crescent::cli
