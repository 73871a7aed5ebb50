// `crescent serve`: the OpenAI-compatible front end over a disaggregated cluster.
//   crescent serve                      a supervisor of child processes: a store master and node, the
//                                       Conductor, and the config's prefill and decode instances
//   crescent serve --in-process         the same Conductor over mock instances inside this process
//   crescent serve conductor|prefill|decode   one role alone, for clusters spread over several machines
#include <fmt/format.h>
#include <httplib.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <unistd.h>
#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "cli/flags.h"
#include "cli/prompt_tokenizer.h"
#include "cli/replay.h"
#include "cli/supervisor.h"
#include "cluster/cluster_config.h"
#include "cluster/local_cluster.h"
#include "cluster/serve_options.h"
#include "common/atomic_file.h"
#include "common/process_usage.h"
#include "common/secret.h"
#include "common/socket_io.h"
#include "common/temp_dir.h"
#include "conductor/conductor.h"
#include "model/llama.h"
#include "perf/cost_model.h"
#include "router/router.h"
#include "serve/frontend.h"
#include "serve/http_server.h"
#include "serve/instance_server.h"
#include "serve/kv_blocks.h"
#include "serve/leader_forward.h"
#include "serve/remote_cluster.h"

namespace crescent::cli {
namespace {

struct ServeArgs {
  std::string config_path;  // empty: the bundled kServeClusterConfig
  std::string host = "127.0.0.1";
  int port = -1;             // -1: the config's serve.http_port
  std::string api_key;       // --api-key, $CRESCENT_API_KEY, or --api-key-file's contents (resolve_api_key)
  std::string api_key_file;  // --api-key-file
  std::string model_name;    // empty: "mock", or the cpu executor's model directory's name
  std::string policy;        // empty: the config's serve.policy
  std::string admission;     // empty: the config's serve.admission
  int64_t block_size_tokens = 512;
  std::string executor;        // empty: the config's serve.executor
  std::string profile_path;    // --profile
  std::string model_dir;       // empty: the config's serve.model
  std::string kv_cache_bytes;  // --kv-cache-bytes SIZE; empty: the config's serve.kv_cache_bytes
  uint64_t body_limit_bytes = 16ull << 20;
  bool in_process = false;
  bool pin_cores = false;  // the supervisor: each instance on its own core
  int cpu = -1;            // a role: run on this core only
  bool no_restart = false;
  std::string run_dir;  // children's logs and transfer metadata; empty: a new /tmp/crescent-serve-XXXXXX
  // --replay: serve, replay this trace against it, print the report, stop.
  std::string replay_trace;
  int64_t replay_limit = 0;
  int64_t replay_length_divisor = 1;
  double replay_time_scale = 1.0;
  bool json = false;
  std::string requests_out;
  std::string request_log;                   // --request-log FILE: every answered request, openai-log format
  std::string request_log_content = "text";  // --request-log-content: text | token-ids
  // Roles started alone.
  std::string control;       // conductor: where instances connect (empty: control_endpoint_default)
  std::string conductor;     // prefill/decode: the Conductor's control endpoint
  std::string store_master;  // prefill: the store master's host:port
  std::string store_etcd_prefix = "/crescent-store";  // prefill --store-etcd-prefix
  std::string cache_file;                             // prefill --cache-file (InstanceOptions::cache_file)
  uint32_t index = 0;
  std::string advertise_host;     // roles: the address peers reach this one on (empty: found)
  std::string transfer_metadata;  // decode: where its KV segment is published (empty: etcd or default)
  std::string etcd;               // roles: the registry (etcd_registry.h); "" = none
  std::string etcd_prefix = "/crescent-serve";
  std::string cluster_secret_file;  // roles: the members' secret (`crescent serve secret FILE` makes one)
  // Router mode: the Conductor in front of engines crescent does not own (docs/router.md).
  std::string engines_file;     // conductor --engines FILE
  std::string tokenizer_file;   // conductor --tokenizer FILE (a tokenizer.json), or --model DIR's
  int leader_ttl_s = 5;         // conductor --leader-ttl-s: with --etcd, the leading Conductor's lease
  double drain_timeout_s = 30;  // --drain-timeout-s: a SIGTERM's drain waits this long at most
  double engines_wait_s = 30;   // conductor --engines-wait-s: how long the engines have to answer at start
};

// The members' secret of a role started alone: required (docs/serving.md, "Who may talk to what").
Result<ClusterSecret> role_secret(const ServeArgs& args) {
  return load_cluster_secret(args.cluster_secret_file);
}

// Where the API key may come from instead of the command line; how the supervisor hands it to the Conductor.
constexpr const char* kApiKeyVariable = "CRESCENT_API_KEY";

// The API key of `cmd`'s run: --api-key (or $CRESCENT_API_KEY) or --api-key-file's first line. A key that is
// given but empty (an unset shell variable) is an error, never a server without authentication.
Status resolve_api_key(const CLI::App& cmd, ServeArgs& args) {
  const bool flag = cmd.count("--api-key") > 0 || std::getenv(kApiKeyVariable) != nullptr;
  if (!args.api_key_file.empty()) {
    if (flag && !args.api_key.empty()) {
      return Status::invalid_argument(
          fmt::format("give the API key once: --api-key (or ${}) or --api-key-file", kApiKeyVariable));
    }
    auto text = read_small_file(args.api_key_file);
    if (!text.ok())
      return Status::invalid_argument(fmt::format("--api-key-file: {}", text.status().message()));
    std::string key = text->substr(0, text->find_first_of("\r\n"));
    if (key.empty()) {
      return Status::invalid_argument(
          fmt::format("--api-key-file {}: its first line is empty", args.api_key_file));
    }
    args.api_key = std::move(key);
    return Status::ok_status();
  }
  if (flag && args.api_key.empty()) {
    return Status::invalid_argument(fmt::format(
        "--api-key (or ${}) is empty (an unset variable?): give a key, or leave it out to serve without one",
        kApiKeyVariable));
  }
  return Status::ok_status();
}

// The config, with the flags given on the command line taking precedence over its "serve" section.
// `all_instances_here`: the supervisor, whose instances share this machine.
Result<cluster::ServeSetup> setup(const ServeArgs& args, bool all_instances_here = false) {
  if (args.block_size_tokens < 1) return Status::invalid_argument("--block-size must be >= 1");
  uint64_t kv_cache_bytes = 0;
  if (!args.kv_cache_bytes.empty()) {
    auto parsed = parse_size("--kv-cache-bytes", args.kv_cache_bytes);
    if (!parsed.ok()) return parsed.status();
    kv_cache_bytes = *parsed;
  }
  auto path = config_path_or_default(args.config_path, kServeClusterConfig);
  if (!path.ok()) return path.status();
  auto config =
      load_cluster_config_or_default(*path, args.block_size_tokens, kServeClusterConfig, args.profile_path);
  if (!config.ok()) return config.status();
  return cluster::resolve_serve_options(std::move(*config), *path,
                                        {.policy = args.policy,
                                         .admission = args.admission,
                                         .executor = args.executor,
                                         .model_dir = args.model_dir,
                                         .model_name = args.model_name,
                                         .port = args.port,
                                         .block_size_tokens = args.block_size_tokens,
                                         .kv_cache_bytes = static_cast<int64_t>(kv_cache_bytes),
                                         .all_instances_on_this_machine = all_instances_here});
}

// The policy and admission of a run, for the lines that say what runs.
std::string_view policy_name(const cluster::ServeSetup& s) {
  return conductor::to_string(s.cluster.config.serve.policy);
}
std::string_view admission_name(const cluster::ServeSetup& s) {
  return conductor::to_string(s.cluster.config.serve.admission);
}

// What `crescent replay` needs to replay --replay against `url`.
ReplayArgs replay_args(const ServeArgs& args, const cluster::ServeSetup& s, const std::string& url) {
  return {.trace_path = args.replay_trace,
          .urls = {url},
          .model = s.cluster.model_name,
          .api_key = args.api_key,
          .config_path = args.config_path,
          .time_scale = args.replay_time_scale,
          .limit = args.replay_limit,
          .block_size_tokens = args.block_size_tokens,
          .length_divisor = args.replay_length_divisor,
          .json = args.json,
          .requests_out = args.requests_out};
}

// Opens --request-log into `frontend` when it is given.
Status open_request_log(const ServeArgs& args, serve::FrontendOptions& frontend) {
  if (args.request_log.empty()) return Status::ok_status();
  auto log = serve::RequestLog::open(args.request_log, args.request_log_content == "token-ids"
                                                           ? serve::RequestLogContent::kTokenIds
                                                           : serve::RequestLogContent::kText);
  if (!log.ok()) return log.status();
  frontend.request_log = std::move(*log);
  return Status::ok_status();
}

// The front end's options for crescent's own instances: the cpu executor's model's tokenizer and chat
// template, or the mock's; the request log.
Result<serve::FrontendOptions> cluster_frontend_options(const ServeArgs& args, const cluster::ServeSetup& s) {
  serve::FrontendOptions frontend{.model_name = s.cluster.model_name,
                                  .api_key = args.api_key,
                                  .executor = s.cluster.config.serve.executor};
  if (s.cluster.config.serve.executor == cluster::ExecutorKind::kCpu) {
    auto llama = model::read_llama_config(s.cluster.config.serve.model_dir);
    if (!llama.ok()) return llama.status();
    auto tokenizer = model::load_tokenizer(s.cluster.config.serve.model_dir, llama->vocab_size);
    if (!tokenizer.ok()) return tokenizer.status();
    frontend.tokenizer = std::move(*tokenizer);
    auto chat_template = model::load_model_chat_template(s.cluster.config.serve.model_dir);
    if (!chat_template.ok()) return chat_template.status();
    if (chat_template->has_value()) {
      frontend.chat_template = std::make_shared<const model::ChatTemplate>(std::move(**chat_template));
    }
  }
  CRESCENT_RETURN_IF_ERROR(open_request_log(args, frontend));
  return frontend;
}

// After a SIGTERM began a drain: waits until `drained()`, --drain-timeout-s (`timeout_s`) passes, or a
// second stop signal arrives, polling every 20 ms, and says which under `name`; `left` says what becomes of
// what is still under way when the wait ends early.
void wait_for_drain(const std::string& name, const std::function<bool()>& drained, double timeout_s,
                    const sigset_t& signals, std::string_view left) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                             std::chrono::duration<double>(timeout_s));
  const timespec poll{.tv_sec = 0, .tv_nsec = 20'000'000};
  for (;;) {
    if (drained()) {
      fmt::print("{}: drained; stopping\n", name);
      return;
    }
    if (std::chrono::steady_clock::now() >= deadline) {
      fmt::print("{}: still busy after --drain-timeout-s {}; stopping ({})\n", name, timeout_s, left);
      return;
    }
    if (const int again = ::sigtimedwait(&signals, nullptr, &poll); again > 0) {
      fmt::print("{}: stopping ({} while draining; {})\n", name, again == SIGINT ? "SIGINT" : "SIGTERM",
                 left);
      return;
    }
  }
}

// Serves HTTP with `handler` (the front end built with `frontend`) until a stop signal, or replays --replay
// against it; returns the exit code. `who` starts its lines ("crescent serve", or "conductor" for the role
// alone).
int serve_http(const ServeArgs& args, const cluster::ServeSetup& s, const serve::FrontendOptions& frontend,
               serve::HttpHandler handler, const sigset_t& signals, const std::string& who,
               const std::string& what) {
  serve::HttpServerOptions http{.host = args.host,
                                .port = s.port,
                                .body_limit_bytes = args.body_limit_bytes,
                                .check_head = serve::frontend_head_check(frontend)};
  auto server = serve::HttpServer::start(http, std::move(handler));
  if (!server.ok()) {
    fmt::print(stderr, "error: {}\n", server.status().message());
    return server.status().code() == StatusCode::kInvalidArgument ? kExitBadInput : 1;
  }
  const std::string url = fmt::format("http://{}:{}", args.host, (*server)->port());
  fmt::print(args.json ? stderr : stdout,
             "{}: model '{}' on {} ({}, {} tokenizer, {} chat template, policy {}, admission {}){}\n", who,
             s.cluster.model_name, url, what, frontend.tokenizer->kind(),
             frontend.chat_template ? "the model's" : "the mock's", policy_name(s), admission_name(s),
             args.replay_trace.empty() ? "; Ctrl-C stops" : "; replaying " + args.replay_trace);
  std::fflush(stdout);
  if (!args.replay_trace.empty()) {
    ReplayArgs replay = replay_args(args, s, url);
    replay.vocab_size = frontend.tokenizer->vocab_size();  // the trace's prompts as ids the model has
    const int code = run_replay(replay);
    (*server)->stop();
    fmt::print(stderr,
               "crescent serve: peak RSS of this process {:.0f} MiB (the Conductor and the replay client)\n",
               peak_rss_mib());
    return code;
  }
  if (wait_for_stop_signal(signals) == SIGINT) {
    (*server)->stop();
    fmt::print("{}: stopping (SIGINT)\n", who);
    return 0;
  }
  // SIGTERM drains: no new connections, requests under way finish (a second signal, or --drain-timeout-s,
  // stops at once).
  fmt::print(
      "{}: draining (SIGTERM: new connections are refused, requests under way finish; a second "
      "signal stops at once)\n",
      who);
  std::fflush(stdout);
  (*server)->begin_drain();
  serve::HttpServer& http_server = **server;
  wait_for_drain(
      who, [&] { return http_server.responses_in_flight() == 0; }, args.drain_timeout_s, signals,
      "the responses still under way end with their connections");
  std::fflush(stdout);
  (*server)->stop();
  return 0;
}

// serve_http over crescent's own `cluster`; `wrap` (optional) wraps the front end's handler.
int serve_cluster_http(const ServeArgs& args, const cluster::ServeSetup& s, cluster::Cluster& cluster,
                       const sigset_t& signals, const std::string& who, const std::string& what,
                       const std::function<serve::HttpHandler(serve::HttpHandler)>& wrap = nullptr) {
  auto frontend = cluster_frontend_options(args, s);
  if (!frontend.ok()) return fail(frontend.status());
  serve::HttpHandler handler = serve::make_frontend(cluster, *frontend);
  if (wrap) handler = wrap(std::move(handler));
  return serve_http(args, s, *frontend, std::move(handler), signals, who, what);
}

Status check_replay_trace(const ServeArgs& args) {
  if (!args.replay_trace.empty() && !std::filesystem::is_regular_file(args.replay_trace)) {
    return with_bundled_trace_hint(
        Status::not_found(fmt::format("cannot open '{}': no such file", args.replay_trace)),
        args.replay_trace);
  }
  return Status();
}

int run_in_process(const ServeArgs& args, const cluster::ServeSetup& s) {
  if (s.cluster.config.serve.executor != cluster::ExecutorKind::kMock) {
    return fail(Status::invalid_argument(
        "--in-process runs mock instances only; the cpu executor runs in `crescent serve`'s processes"));
  }
  const sigset_t signals = block_stop_signals();
  auto cluster = cluster::LocalCluster::start(s.cluster);
  if (!cluster.ok()) return fail(cluster.status());
  const cluster::ClusterConfig& c = s.cluster.config;
  return serve_cluster_http(
      args, s, **cluster, signals, "crescent serve",
      fmt::format("in process: {} prefill + {} decode mock instances of {} on {}", c.prefill_instances,
                  c.decode_instances, c.model.name, c.hardware.name));
}

// What runs the instances, for the lines saying they are up.
std::string describe_executor(const cluster::ClusterConfig& c) {
  const perf::CostModel cost = cluster::cost_model(c);
  if (c.serve.executor == cluster::ExecutorKind::kCpu) {
    return fmt::format("the cpu executor on model {}; KV {} bytes per token", c.serve.model_dir,
                       cost.kv_bytes_per_token());
  }
  return fmt::format("mock {} on {}, KV bytes scaled 1/{} ({} bytes per token)", c.model.name,
                     c.hardware.name, c.serve.kv_bytes_scale,
                     serve::scaled_kv_bytes_per_token(cost.kv_bytes_per_token(), c.serve.kv_bytes_scale));
}

std::string self_path() {
  std::error_code ec;
  const auto path = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? "crescent" : path.string();
}

// Waits until the Conductor at host:port says (GET /health) that every instance of `config` is up.
Status wait_until_all_up(const std::string& host, int port, const cluster::ClusterConfig& config,
                         std::chrono::seconds timeout) {
  httplib::Client client(host, port);
  client.set_connection_timeout(1, 0);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  std::string last = "no answer";
  while (std::chrono::steady_clock::now() < deadline) {
    if (auto res = client.Get("/health")) {
      const auto body = nlohmann::json::parse(res->body, nullptr, false);
      // At least: an instance started by hand may have joined meanwhile.
      if (!body.is_discarded() && body.value("prefill_instances_up", 0u) >= config.prefill_instances &&
          body.value("decode_instances_up", 0u) >= config.decode_instances) {
        return Status();
      }
      last = res->body;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return Status::unavailable(fmt::format(
      "not every instance reached the Conductor within {} s (GET /health: {})", timeout.count(), last));
}

// The supervisor: store master and node, the Conductor and the instances, all children.
int run_cluster(const ServeArgs& args, const cluster::ServeSetup& s) {
  std::string run_dir = args.run_dir;
  if (run_dir.empty()) {
    Result<TempDir> created = TempDir::create("crescent-serve");
    if (!created.ok()) return fail(created.status());
    run_dir = created->release();  // kept: the logs outlive the run
  }
  // Private to this user: it holds the cluster's secret, the children's logs and the transfer metadata.
  if (Status made = make_private_directory(run_dir); !made.ok())
    return fail(Status(made.code(), "--run-dir: " + made.message()));
  std::error_code perms_error;
  // The members' secret, made afresh for this run: the children read it, nobody else can.
  const std::string secret_path = run_dir + "/cluster-secret";
  std::filesystem::remove(secret_path, perms_error);  // a reused run directory's
  if (Status written = ClusterSecret::generate().write_to(secret_path); !written.ok()) return fail(written);
  const sigset_t signals = block_stop_signals();
  std::atomic<bool> failed{false};
  Supervisor supervisor(run_dir, !args.no_restart, {.restarts = 5, .window = std::chrono::minutes(1)},
                        [&failed](const std::string&) {
                          failed = true;
                          wake_stop_signal_wait();
                        });
  const std::string self = self_path();
  const cluster::ClusterConfig& c = s.cluster.config;
  fmt::print(stderr, "crescent serve: starting a store, {} prefill and {} decode instances (logs in {})\n",
             c.prefill_instances, c.decode_instances, run_dir);
  if (!s.kv_cache_note.empty()) fmt::print(stderr, "crescent serve: {}\n", s.kv_cache_note);
  constexpr auto kStartTimeout = std::chrono::seconds(20);
  const std::string metadata_spec = "dir:" + run_dir + "/metadata";  // segments of this run's members
  // The master's port is fixed now, so a restarted master is found where the node and the prefill
  // instances look; the node mounts its segment again with what it holds, which rebuilds the master's view
  // (docs/store.md). Meanwhile the pool only misses: it is a cache.
  const uint16_t master_port = net::free_tcp_port();
  if (master_port == 0) return fail(Status::unavailable("no free TCP port on this machine"));
  auto master = supervisor.start(
      "store-master",
      {self, "store", "master", "--listen", fmt::format("127.0.0.1:{}", master_port), "--metrics", "",
       "--transfer-metadata", metadata_spec, "--cluster-secret-file", secret_path},
      "store master on ", kStartTimeout);
  if (!master.ok()) return fail(master.status());
  // "store master on HOST:PORT (metrics ..."
  const std::string master_address =
      master->substr(master->find(" on ") + 4, master->find(" (") - master->find(" on ") - 4);
  // A fixed name: a restarted node replaces its dead segment at once, and with an SSD tier adopts its files.
  std::vector<std::string> node_argv = {self,
                                        "store",
                                        "node",
                                        "--master",
                                        master_address,
                                        "--name",
                                        "store-node",
                                        "--dram",
                                        std::to_string(c.serve.store_dram_bytes),
                                        "--metrics",
                                        "",
                                        "--cluster-secret-file",
                                        secret_path};
  if (c.serve.store_ssd_bytes > 0) {
    node_argv.insert(node_argv.end(), {"--ssd", run_dir + "/store-ssd", "--ssd-capacity",
                                       std::to_string(c.serve.store_ssd_bytes)});
  }
  auto node = supervisor.start("store-node", node_argv, "store node: segment", kStartTimeout);
  if (!node.ok()) return fail(node.status());

  // The Conductor is a child too: its ports are fixed now, so a restarted Conductor is found where the
  // instances and clients already look (its control socket is the registry: no etcd on one machine).
  const uint16_t control_port = net::free_tcp_port();
  const uint16_t http_port = s.port != 0 ? static_cast<uint16_t>(s.port) : net::free_tcp_port();
  if (control_port == 0 || http_port == 0)
    return fail(Status::unavailable("no free TCP port on this machine"));
  const std::string control = fmt::format("tcp://127.0.0.1:{}", control_port);
  std::vector<std::string> conductor_argv{self,
                                          "serve",
                                          "conductor",
                                          "--control",
                                          control,
                                          "--host",
                                          args.host,
                                          "--port",
                                          std::to_string(http_port),
                                          "--config",
                                          s.config_path,
                                          "--block-size",
                                          std::to_string(args.block_size_tokens),
                                          "--policy",
                                          std::string(policy_name(s)),
                                          "--admission",
                                          std::string(admission_name(s)),
                                          "--model-name",
                                          s.cluster.model_name,
                                          "--body-limit",
                                          std::to_string(args.body_limit_bytes),
                                          "--drain-timeout-s",
                                          fmt::format("{}", args.drain_timeout_s),
                                          "--cluster-secret-file",
                                          secret_path};
  // The key reaches the Conductor in its environment (readable by this user only), not on its command line
  // (which every local user can read in /proc).
  if (!args.api_key.empty() && ::setenv(kApiKeyVariable, args.api_key.c_str(), 1) != 0) {
    return fail(Status::io_error("could not pass the API key to the Conductor's process"));
  }
  // The executor, model and profile as resolved here (a relative path in the config is relative to it).
  std::vector<std::string> child_flags;
  if (c.serve.executor == cluster::ExecutorKind::kCpu) {
    // The budget as resolved here, where every instance's share of this machine is known.
    child_flags = {"--executor",       std::string(cluster::to_string(c.serve.executor)),
                   "--model",          c.serve.model_dir,
                   "--kv-cache-bytes", std::to_string(c.serve.kv_cache_bytes)};
  }
  if (!args.profile_path.empty()) {
    child_flags.insert(child_flags.end(),
                       {"--profile", std::filesystem::absolute(args.profile_path).string()});
  }
  conductor_argv.insert(conductor_argv.end(), child_flags.begin(), child_flags.end());
  auto conductor = supervisor.start("conductor", conductor_argv, "conductor: model '", kStartTimeout);
  if (!conductor.ok()) return fail(conductor.status());
  // An instance's command line but its --index.
  auto instance_argv = [&](const char* role) {
    std::vector<std::string> argv{self,
                                  "serve",
                                  role,
                                  "--conductor",
                                  control,
                                  "--config",
                                  s.config_path,
                                  "--block-size",
                                  std::to_string(args.block_size_tokens),
                                  "--cluster-secret-file",
                                  secret_path};
    // A prefill instance uses the pool; a decode instance only publishes its KV segment where the store's
    // members look segments up.
    if (std::string_view(role) == "prefill") {
      argv.insert(argv.end(), {"--store-master", master_address});
    } else {
      argv.insert(argv.end(), {"--transfer-metadata", metadata_spec});
    }
    argv.insert(argv.end(), child_flags.begin(), child_flags.end());
    return argv;
  };
  // --pin-cores: prefill instances on the first cores, decode instances on the next (round robin).
  const long cores = std::max(1L, ::sysconf(_SC_NPROCESSORS_ONLN));
  uint32_t next_core = 0;
  const auto numbered = [&](const char* role, uint32_t index) {
    std::vector<std::string> argv = instance_argv(role);
    argv.insert(argv.end(), {"--index", std::to_string(index)});
    if (args.pin_cores) argv.insert(argv.end(), {"--cpu", std::to_string(next_core++ % cores)});
    return argv;
  };
  // serve.keep_prefill_cache: each prefill instance's cache file in shared memory, named after this run;
  // deleted when the run stops (it is memory).
  std::vector<std::string> cache_files;
  for (uint32_t i = 0; i < c.prefill_instances; ++i) {
    std::vector<std::string> argv = numbered("prefill", i);
    if (c.serve.keep_prefill_cache) {
      cache_files.push_back(fmt::format("/dev/shm/crescent-{:016x}-prefill-{}",
                                        std::hash<std::string>{}(std::filesystem::absolute(run_dir)), i));
      argv.insert(argv.end(), {"--cache-file", cache_files.back()});
    }
    auto started = supervisor.start(fmt::format("prefill-{}", i), argv, ": ready (", kStartTimeout);
    if (!started.ok()) return fail(started.status());
  }
  for (uint32_t i = 0; i < c.decode_instances; ++i) {
    auto started =
        supervisor.start(fmt::format("decode-{}", i), numbered("decode", i), ": ready (", kStartTimeout);
    if (!started.ok()) return fail(started.status());
  }
  const std::string host = args.host == "0.0.0.0" || args.host == "::" ? "127.0.0.1" : args.host;
  if (Status up = wait_until_all_up(host, http_port, c, kStartTimeout); !up.ok()) return fail(up);
  supervisor.watch();
  const std::string url = fmt::format("http://{}:{}", host, http_port);
  // How to add instances to this run by hand (membership at run time, docs/serving.md): each role's command
  // line, to which the user appends --index N (an N no instance of the role has).
  const nlohmann::json joining = {
      {"url", url},
      {"conductor", control},
      {"store_master", master_address},
      {"transfer_metadata", metadata_spec},
      {"cluster_secret_file", secret_path},
      {"prefill_argv", instance_argv("prefill")},
      {"decode_argv", instance_argv("decode")},
  };
  if (Status written = write_file_atomically(run_dir + "/cluster.json", joining.dump(2) + "\n");
      !written.ok())
    return fail(written);
  fmt::print(args.json ? stderr : stdout,
             "crescent serve: model '{}' on {} ({} prefill + {} decode processes of {}, policy {}, admission "
             "{}){}\n",
             s.cluster.model_name, url, c.prefill_instances, c.decode_instances, describe_executor(c),
             policy_name(s), admission_name(s),
             args.replay_trace.empty() ? "; Ctrl-C stops" : "; replaying " + args.replay_trace);
  std::fflush(stdout);
  int code = 0;
  if (!args.replay_trace.empty()) {
    code = run_replay(replay_args(args, s, url));
    supervisor.stop_all();
  } else if (wait_for_stop_signal(signals) == SIGINT || failed) {
    if (!failed) fmt::print("crescent serve: stopping (SIGINT)\n");
    supervisor.stop_all();
  } else {
    // SIGTERM: the Conductor drains its front end while the instances still serve its streams, then
    // everything stops.
    fmt::print(
        "crescent serve: draining the Conductor's front end (SIGTERM; at most --drain-timeout-s {}), "
        "then stopping\n",
        args.drain_timeout_s);
    std::fflush(stdout);
    supervisor.stop_all("conductor", std::chrono::duration_cast<std::chrono::milliseconds>(
                                         std::chrono::duration<double>(args.drain_timeout_s + 5)));
  }
  for (const std::string& file : cache_files) std::filesystem::remove(file, perms_error);
  if (failed) fmt::print(stderr, "error: a child process could not be kept running; logs in {}\n", run_dir);
  return failed ? 1 : code;
}

int run_serve(const ServeArgs& args) {
  auto s = setup(args, /*all_instances_here=*/!args.in_process);
  if (!s.ok()) return fail(s.status());
  if (Status trace = check_replay_trace(args); !trace.ok()) return fail(trace);
  return args.in_process ? run_in_process(args, *s) : run_cluster(args, *s);
}

// The Conductor's control endpoint: --control, or port 5600 on loopback (one machine), or with etcd on the
// interface that reaches etcd (the instances are elsewhere).
Result<std::string> control_endpoint(const ServeArgs& args) {
  if (!args.control.empty()) return args.control;
  if (args.etcd.empty()) return std::string("tcp://127.0.0.1:5600");
  if (!args.advertise_host.empty()) return fmt::format("tcp://{}:5600", args.advertise_host);
  auto etcd = net::url_host_port(args.etcd);
  if (!etcd.ok()) return Status::invalid_argument(fmt::format("--etcd: {}", etcd.status().message()));
  auto local = net::local_address_toward(etcd->first, etcd->second);
  if (!local.ok()) {
    return Status(local.status().code(), fmt::format("finding this Conductor's address toward etcd at {}: {} "
                                                     "(give --control or --advertise-host)",
                                                     args.etcd, local.status().message()));
  }
  return fmt::format("tcp://{}:5600", *local);
}

// `crescent serve conductor --engines FILE`: router mode, the Conductor and HTTP front end in front of
// inference engines crescent does not own (docs/router.md). --model DIR (or --tokenizer FILE) is the served
// model's tokenizer and chat template, so the router sees the engines' tokens; without, prompts are routed by
// their bytes.
int run_router_role(const ServeArgs& args) {
  auto engines = router::load_engines_file(args.engines_file);
  if (!engines.ok()) return fail(engines.status());
  if (Status trace = check_replay_trace(args); !trace.ok()) return fail(trace);
  ServeArgs config_args = args;
  config_args.model_dir.clear();  // the tokenizer's directory here, not a model for the cpu executor
  config_args.block_size_tokens = engines->front().block_size_tokens;
  auto s = setup(config_args);
  if (!s.ok()) return fail(s.status());
  s->cluster.model_name = engines->front().model;
  s->cluster.block_size_tokens = engines->front().block_size_tokens;
  const sigset_t signals = block_stop_signals();

  serve::FrontendOptions frontend{
      .model_name = engines->front().model, .api_key = args.api_key, .token_ids_within_vocabulary = false};
  std::string tokenizer_source = "the bytes of the prompt (no --model or --tokenizer)";
  if (!args.model_dir.empty() || !args.tokenizer_file.empty()) {
    auto loaded = load_prompt_tokenizer(args.model_dir, args.tokenizer_file);
    if (!loaded.ok()) return fail(loaded.status());
    frontend.tokenizer = std::shared_ptr<const model::Tokenizer>(std::move(loaded->tokenizer));
    if (loaded->chat_template) {
      frontend.chat_template = std::make_shared<const model::ChatTemplate>(std::move(*loaded->chat_template));
    }
    tokenizer_source = loaded->source;
    frontend.token_ids_within_vocabulary = true;
  }
  if (!args.request_log.empty()) {
    return fail(Status::invalid_argument("--request-log is not written in router mode yet (docs/router.md)"));
  }

  const size_t engine_count = engines->size();
  router::RouterOptions options;
  options.engines = std::move(*engines);
  options.config = s->cluster.config;
  options.block_key_seed = XXH3_64bits(frontend.model_name.data(), frontend.model_name.size());
  options.etcd_endpoint = args.etcd;
  options.etcd_prefix = args.etcd_prefix;
  options.startup_timeout_s = args.engines_wait_s;
  const conductor::PrefillPolicy policy = router::placement_policy(options);
  std::string placed_by(conductor::to_string(policy));
  if (policy != options.config.serve.policy) {
    placed_by = fmt::format("{} ({} without a kv_pool the engines share)", placed_by,
                            conductor::to_string(options.config.serve.policy));
  }
  s->cluster.config.serve.policy = policy;  // what the front end's start line names
  auto router = router::Router::start(std::move(options));
  if (!router.ok()) return fail(router.status());
  const auto [prefill, decode] = (*router)->instances_up();
  return serve_http(
      args, *s, frontend, serve::make_router_frontend(**router, frontend), signals, "router",
      fmt::format(
          "router mode: {} engines from {} ({} prefill, {} decode), placed by {}, prompts tokenized by {}",
          engine_count, args.engines_file, prefill, decode, placed_by, tokenizer_source));
}

// `crescent serve conductor`: the Conductor and HTTP front end alone; instances connect to --control.
int run_conductor_role(const ServeArgs& args) {
  if (!args.engines_file.empty()) return run_router_role(args);
  auto s = setup(args);
  if (!s.ok()) return fail(s.status());
  if (Status trace = check_replay_trace(args); !trace.ok()) return fail(trace);
  const sigset_t signals = block_stop_signals();
  auto secret = role_secret(args);
  if (!secret.ok()) return fail(secret.status());
  serve::RemoteClusterOptions remote;
  remote.cluster = s->cluster;
  remote.secret = *secret;
  auto control = control_endpoint(args);
  if (!control.ok()) return fail(control.status());
  remote.control_endpoint = *control;
  remote.advertise_host = args.advertise_host;
  remote.etcd_endpoint = args.etcd;
  remote.etcd_prefix = args.etcd_prefix;
  remote.leader_ttl = std::chrono::seconds(args.leader_ttl_s);
  if (!args.etcd.empty()) {
    // Standbys forward to the leader's HTTP, published in etcd: its port is fixed now, and its host is the
    // one clients reach (--advertise-host, or the interface toward etcd, when bound to every address).
    if (s->port == 0) s->port = net::free_tcp_port();
    if (s->port == 0) return fail(Status::unavailable("no free TCP port on this machine"));
    std::string host = args.host;
    if (net::is_wildcard_host(host)) {
      auto advertised = net::url_host_port(*control);
      if (!advertised.ok()) return fail(advertised.status());
      host = advertised->first;
    }
    if (!net::is_wildcard_host(host)) {
      remote.http_url =
          fmt::format("http://{}:{}", host.find(':') != std::string::npos ? "[" + host + "]" : host, s->port);
    }
  }
  // A deposed leader stops at once: a standby leads now, and the instances go to it.
  remote.on_leadership_lost = [] {
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(1);
  };
  auto cluster = serve::RemoteCluster::start(remote);
  if (!cluster.ok()) return fail(cluster.status());
  const cluster::ClusterConfig& c = s->cluster.config;
  // Standing by (with etcd), every request but /metrics goes to the leader.
  std::unique_ptr<serve::HttpClient> forwarder = args.etcd.empty() ? nullptr : serve::HttpClient::start();
  serve::RemoteCluster& conductor = **cluster;
  const auto wrap = [&](serve::HttpHandler local) {
    if (!forwarder) return local;
    return serve::forward_unless_leading(
        std::move(local), [&conductor] { return conductor.leader_http_url(); }, *forwarder);
  };
  return serve_cluster_http(
      args, *s, conductor, signals, "conductor",
      fmt::format("Conductor of {} prefill + {} decode instances, which connect to {}", c.prefill_instances,
                  c.decode_instances, conductor.control_endpoint()),
      wrap);
}

// `crescent serve prefill|decode`: one instance.
int run_instance_role(const ServeArgs& args, serve::InstanceRole role) {
  auto s = setup(args);
  if (!s.ok()) return fail(s.status());
  if (args.conductor.empty() && args.etcd.empty()) {
    return fail(
        Status::invalid_argument("--conductor tcp://HOST:PORT or --etcd URL (to find it) is required"));
  }
  if (role == serve::InstanceRole::kPrefill && args.store_master.empty() && args.etcd.empty()) {
    return fail(
        Status::invalid_argument("--store-master HOST:PORT (or --etcd, to find the leading master there) is "
                                 "required for a prefill instance"));
  }
  if (args.cpu >= 0) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(args.cpu, &set);
    if (::sched_setaffinity(0, sizeof(set), &set) != 0) {
      return fail(Status::invalid_argument(fmt::format("--cpu {}: {}", args.cpu, std::strerror(errno))));
    }
  }
  auto secret = role_secret(args);
  if (!secret.ok()) return fail(secret.status());
  const sigset_t signals = block_stop_signals();
  serve::InstanceOptions options;
  options.secret = *secret;
  options.role = role;
  options.index = args.index;
  options.conductor_endpoint = args.conductor;
  options.store_master = args.store_master;
  options.store_etcd_prefix = args.store_etcd_prefix;
  options.cache_file = args.cache_file;
  options.cluster = s->cluster;
  options.advertise_host = args.advertise_host;
  options.transfer_metadata = args.transfer_metadata;
  options.etcd_endpoint = args.etcd;
  options.etcd_prefix = args.etcd_prefix;
  auto instance = serve::InstanceServer::start(options);
  if (!instance.ok()) return fail(instance.status());
  const cluster::ClusterConfig& c = s->cluster.config;
  fmt::print(
      "{}-{}: ready ({}; Conductor {}; {})\n", serve::to_string(role), args.index, describe_executor(c),
      args.conductor.empty() ? "from etcd " + args.etcd : args.conductor,
      role == serve::InstanceRole::kPrefill
          ? (args.store_master.empty() ? "store master from etcd " + args.etcd : "store " + args.store_master)
          : "KV segment published in " +
                (args.transfer_metadata.empty()
                     ? (args.etcd.empty() ? "the default metadata" : "etcd " + args.etcd)
                     : args.transfer_metadata));
  if (!s->kv_cache_note.empty())
    fmt::print("{}-{}: {}\n", serve::to_string(role), args.index, s->kv_cache_note);
  std::fflush(stdout);
  const std::string name = fmt::format("{}-{}", serve::to_string(role), args.index);
  if (wait_for_stop_signal(signals) == SIGINT) {
    fmt::print("{}: stopping (SIGINT)\n", name);
    return 0;
  }
  // SIGTERM drains: nothing new comes, what is here finishes, then the instance leaves (a second signal, or
  // --drain-timeout-s, leaves at once: the Conductor places again what is left).
  fmt::print("{}: draining (SIGTERM; a second signal stops at once)\n", name);
  std::fflush(stdout);
  (*instance)->begin_drain();
  wait_for_drain(
      name, [&] { return (*instance)->drained(); }, args.drain_timeout_s, signals,
      "the Conductor places again what is left");
  return 0;
}

void add_cluster_flags(CLI::App* cmd, ServeArgs& args) {
  cmd->add_option("--config", args.config_path,
                  fmt::format("Cluster config JSON (default: the bundled {}; fields: docs/config.md)",
                              kServeClusterConfig));
  cmd->add_option("--model-name", args.model_name,
                  "The model id clients must name (default: mock, or the --model directory's name)");
  cmd->add_option("--policy", args.policy,
                  "Prefill policy: random, round-robin, least-loaded, cache-aware, global-cache-aware "
                  "(default: the config's "
                  "serve.policy, global-cache-aware)");
  cmd->add_option("--admission", args.admission,
                  "Admission: none, slo, early, predictive (default: the config's serve.admission, none)");
  cmd->add_option("--block-size", args.block_size_tokens, "Tokens per KV block")->capture_default_str();
  add_profile_flag(cmd, args.profile_path);
  cmd->add_option(
      "--executor", args.executor,
      "What computes iterations: mock (the cost model's time) or cpu (the model on this machine's "
      "CPUs; needs --model) (default: the config's serve.executor, mock)");
  cmd->add_option(
      "--model", args.model_dir,
      "With --executor cpu: the model directory (config.json + model.safetensors; `crescent model "
      "init` writes one)");
  cmd->add_option(
      "--kv-cache-bytes", args.kv_cache_bytes,
      "With --executor cpu: KV an instance may hold, e.g. 2GiB (default: the config's "
      "serve.kv_cache_bytes, or half of this machine's available memory shared by its instances)");
}

void add_http_flags(CLI::App* cmd, ServeArgs& args) {
  cmd->add_option("--host", args.host, "Address to listen on")->capture_default_str();
  cmd->add_option("--port", args.port,
                  "HTTP port, 0: any free port (default: the config's serve.http_port, 8000)")
      ->check(CLI::Range(0, 65535));
  cmd->add_option("--api-key", args.api_key,
                  fmt::format("Require \"Authorization: Bearer KEY\" on /v1 routes (or ${}; prefer "
                              "--api-key-file: a command line is visible to every local user)",
                              kApiKeyVariable))
      ->envname(kApiKeyVariable);
  cmd->add_option("--api-key-file", args.api_key_file,
                  "Read the API key from this file (its first line), instead of --api-key");
  cmd->add_option("--body-limit", args.body_limit_bytes, "Largest request body in bytes (else 413)")
      ->capture_default_str();
  cmd->add_option("--drain-timeout-s", args.drain_timeout_s,
                  "On SIGTERM the front end drains (refuses new connections, answers new requests on open "
                  "ones 503, lets the responses under way finish): for this long at most")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--replay", args.replay_trace,
                  "Replay this trace against the cluster, print the report (as `crescent replay`) and stop");
  cmd->add_option("--limit", args.replay_limit, "With --replay: only the first N valid requests (0 = all)")
      ->capture_default_str();
  add_length_divisor_flag(cmd, args.replay_length_divisor);
  cmd->add_option("--time-scale", args.replay_time_scale,
                  "With --replay: send arrivals this many times faster")
      ->capture_default_str();
  cmd->add_flag("--json", args.json, "With --replay: print JSON instead of a table");
  cmd->add_option("--requests-out", args.requests_out, "With --replay: write one JSON line per request here");
  cmd->add_option("--request-log", args.request_log,
                  "Append every answered request to this file (mode 0600) in the openai-log format "
                  "`crescent trace import` reads");
  cmd->add_option(
         "--request-log-content", args.request_log_content,
         "What --request-log keeps of a prompt: text (the request body) or token-ids (the ids instead "
         "of messages/prompt)")
      ->check(CLI::IsMember({"text", "token-ids"}))
      ->capture_default_str();
}

}  // namespace

void register_serve(CLI::App& app, int& exit_code) {
  auto args = std::make_shared<ServeArgs>();
  CLI::App* cmd = app.add_subcommand(
      "serve",
      "Serve an OpenAI-compatible API over a disaggregated cluster (store, prefill and decode processes)");
  add_cluster_flags(cmd, *args);
  add_http_flags(cmd, *args);
  cmd->add_flag("--in-process", args->in_process,
                "Run the instances as mock engines inside this process (no store, no KV bytes moved)");
  cmd->add_flag(
      "--pin-cores", args->pin_cores,
      "Run each instance on its own core (prefill instances first), as separate GPUs would not share "
      "compute; the cpu executor then uses one BLAS thread per instance");
  cmd->add_flag("--no-restart", args->no_restart,
                "Stop everything when a child process dies (default: restart it)");
  cmd->add_option("--run-dir", args->run_dir,
                  "Children's logs and transfer metadata (default: a new /tmp dir)");
  cmd->require_subcommand(0, 1);

  CLI::App* conductor = cmd->add_subcommand("conductor", "Run the Conductor and HTTP front end alone");
  add_cluster_flags(conductor, *args);
  add_http_flags(conductor, *args);
  conductor->add_option("--control", args->control,
                        "Where instances connect, a ZeroMQ endpoint (default: tcp://127.0.0.1:5600; with "
                        "--etcd, port 5600 on the interface that reaches etcd)");
  conductor->add_option("--advertise-host", args->advertise_host,
                        "With --control on every address (tcp://0.0.0.0:P): the host instances reach it on");
  conductor->add_option("--etcd", args->etcd,
                        "Campaign in this etcd to lead (the leader publishes --control there; others stand "
                        "by) and take as up only instances registered there");
  conductor->add_option("--etcd-prefix", args->etcd_prefix, "Key prefix of this cluster in etcd")
      ->capture_default_str();
  conductor
      ->add_option(
          "--leader-ttl-s", args->leader_ttl_s,
          "With --etcd: Conductors campaign for PREFIX/conductor and one leads under a lease of this "
          "many seconds; a standby leads within it (and a tenth of it) of the leader's death")
      ->capture_default_str()
      ->check(CLI::Range(1, 60));
  add_cluster_secret_option(conductor, args->cluster_secret_file, "only instances holding it may connect");
  conductor->add_option("--engines", args->engines_file,
                        "Router mode: route to the inference engines this file names (vLLM/SGLang-style "
                        "OpenAI servers; docs/router.md) instead of crescent's own instances");
  conductor
      ->add_option("--engines-wait-s", args->engines_wait_s,
                   "Router mode: how long the engines have to answer at start (an engine still "
                   "unreachable then is an error naming it)")
      ->capture_default_str()
      ->check(CLI::NonNegativeNumber);
  conductor->add_option("--tokenizer", args->tokenizer_file,
                        "Router mode: the served model's tokenizer.json (or --model DIR with it and its "
                        "tokenizer_config.json)");
  conductor->callback([conductor, args, &exit_code] {
    run_guarded(exit_code, [&] {
      if (Status key = resolve_api_key(*conductor, *args); !key.ok()) return fail(key);
      return run_conductor_role(*args);
    });
  });

  for (const serve::InstanceRole role : {serve::InstanceRole::kPrefill, serve::InstanceRole::kDecode}) {
    const std::string name(serve::to_string(role));
    CLI::App* instance = cmd->add_subcommand(name, fmt::format("Run one {} instance", name));
    add_cluster_flags(instance, *args);
    instance
        ->add_option("--index", args->index,
                     fmt::format("Its number: the config's {0} instances are 0 .. count-1, and a {0} "
                                 "instance with another index joins the running cluster",
                                 name))
        ->required();
    instance
        ->add_option("--drain-timeout-s", args->drain_timeout_s,
                     "On SIGTERM the instance drains (takes nothing new, finishes what it has, then leaves): "
                     "for this long at most")
        ->capture_default_str()
        ->check(CLI::NonNegativeNumber);
    instance->add_option("--conductor", args->conductor,
                         "The Conductor's control endpoint, tcp://HOST:PORT (or found in --etcd)");
    instance->add_option("--etcd", args->etcd,
                         "Register in this etcd under a lease (and find the Conductor there)");
    instance->add_option("--etcd-prefix", args->etcd_prefix, "Key prefix of this cluster in etcd")
        ->capture_default_str();
    if (role == serve::InstanceRole::kPrefill) {
      instance->add_option("--store-master", args->store_master,
                           "The store master's HOST:PORT (default with --etcd: the leading master in etcd, "
                           "followed through a failover)");
      instance
          ->add_option("--store-etcd-prefix", args->store_etcd_prefix,
                       "With --etcd and no --store-master: the store masters' key prefix in etcd")
          ->capture_default_str();
      instance->add_option("--cache-file", args->cache_file,
                           "Keep the prefix cache in this file too (a path in /dev/shm), and adopt what a "
                           "previous run left in it: a restarted instance keeps its cache");
    } else {
      instance->add_option("--transfer-metadata", args->transfer_metadata,
                           "Where this instance's KV segment is published: dir:PATH or etcd:URL, the store's "
                           "(default: etcd:URL with --etcd, else the store's default directory)");
    }
    add_cluster_secret_option(instance, args->cluster_secret_file, "the Conductor's, from the same file");
    instance->add_option("--cpu", args->cpu, "Run on this core only (sched_setaffinity)");
    instance->add_option("--advertise-host", args->advertise_host,
                         "Address the Conductor and the other instances reach this one on (its KV event "
                         "sockets, its transfer engine) (default: the interface that reaches the Conductor)");
    instance->callback(
        [args, role, &exit_code] { run_guarded(exit_code, [&] { return run_instance_role(*args, role); }); });
  }

  auto secret_out = std::make_shared<std::string>();
  CLI::App* secret = cmd->add_subcommand(
      "secret", "Write a new cluster secret to FILE (mode 0600) for the roles of a cluster started alone");
  secret->add_option("file", *secret_out, "Where to write it (must not exist)")->required();
  secret->callback([secret_out, &exit_code] {
    run_guarded(exit_code, [&] {
      if (Status written = ClusterSecret::generate().write_to(*secret_out); !written.ok())
        return fail(written);
      fmt::print("wrote a cluster secret to {}: give it to every role with --cluster-secret-file\n",
                 *secret_out);
      return 0;
    });
  });

  cmd->callback([cmd, args, &exit_code] {
    if (!cmd->get_subcommands().empty()) return;  // a role ran
    run_guarded(exit_code, [&] {
      if (Status key = resolve_api_key(*cmd, *args); !key.ok()) return fail(key);
      return run_serve(*args);
    });
  });
}

}  // namespace crescent::cli
