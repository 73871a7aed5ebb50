// Registration of crescent's subcommands. Each lives in its own file; its callback stores the process exit
// code in `exit_code` (0 ok, 2 bad input, 1 other failure).
#pragma once

#include <CLI/CLI.hpp>
#include <csignal>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "cluster/cluster_config.h"
#include "common/status.h"
#include "trace/request.h"

namespace crescent::cli {

/// Exit code for bad input (malformed trace, unknown name, impossible config).
inline constexpr int kExitBadInput = 2;

/// Prints "error: <message>" (one line) on stderr and returns kExitBadInput.
int fail(const Status& status);

/// `status` of opening trace `path`, with a hint when `path` is relative, not found here, and one of the
/// bundled traces (e.g. "data/traces/conversation_trace.jsonl.gz" run from outside the source tree):
/// where the bundled copy is.
Status with_bundled_trace_hint(const Status& status, const std::string& path);

/// Runs a subcommand's body and stores its exit code; an exception escaping it (stdout closed, out of memory)
/// becomes one "error: ..." line and exit code 1 instead of a crash.
void run_guarded(int& exit_code, const std::function<int()>& body);

/// `j` (nlohmann::json or ordered_json) as text (`indent` < 0: one line). Invalid UTF-8 in strings, e.g. a
/// path, is replaced instead of thrown.
template <typename Json>
std::string dump_json(const Json& j, int indent = -1) {
  return j.dump(indent, ' ', false, nlohmann::json::error_handler_t::replace);
}

/// The cluster config the subcommands use without --config.
inline constexpr std::string_view kDefaultClusterConfig = "configs/paper-fig5.json";
/// The cluster `crescent serve` starts without --config: 2 prefill + 2 decode processes and a store.
inline constexpr std::string_view kServeClusterConfig = "configs/local.json";
/// `path`, or the bundled `bundled_default` when `path` is empty (bundled_file's error when not found).
Result<std::string> config_path_or_default(const std::string& path,
                                           std::string_view bundled_default = kDefaultClusterConfig);
/// The cluster config at `path`, or the bundled `bundled_default` when `path` is empty, with the profile at
/// `profile_path` (--profile) when it is not empty. Errors as cluster::load_cluster_config, bundled_file and
/// perf::load_profile.
Result<cluster::ClusterConfig> load_cluster_config_or_default(
    const std::string& path, int64_t block_size_tokens,
    std::string_view bundled_default = kDefaultClusterConfig, const std::string& profile_path = "");
/// Adds --profile FILE to `cmd`, into `path`.
void add_profile_flag(CLI::App* cmd, std::string& path);
/// A subcommand's trace: the first `limit` valid requests (0: all) of `path`, invalid lines skipped and
/// summarised on stderr when `skip_invalid`, lengths divided by `length_divisor` (trace::ReadOptions).
/// Errors: the reader's (with the bundled-trace hint), and a trace with no valid request.
Result<std::vector<trace::Request>> read_command_trace(const std::string& path, int64_t block_size_tokens,
                                                       bool skip_invalid, int64_t limit,
                                                       int64_t length_divisor = 1);
/// Adds --length-divisor to `cmd`, into `divisor`.
void add_length_divisor_flag(CLI::App* cmd, int64_t& divisor);

/// Blocks SIGINT and SIGTERM in this thread and every thread started after it, so wait_for_stop_signal can
/// take them (servers: call before starting threads).
sigset_t block_stop_signals();
/// Waits for one of `set`'s signals; returns its number.
int wait_for_stop_signal(const sigset_t& set);
/// Wakes wait_for_stop_signal with SIGTERM, sent to the thread that called block_stop_signals (a signal sent
/// to the process may land on a thread a library started with the signal unblocked, which SIGTERM then
/// kills). Safe from any thread. REQUIRES: block_stop_signals was called.
void wake_stop_signal_wait();

/// `crescent analyze TRACE...` (cli/analyze.cpp).
void register_analyze(CLI::App& app, int& exit_code);
/// `crescent simulate TRACE` (cli/simulate.cpp).
void register_simulate(CLI::App& app, int& exit_code);
/// `crescent plan TRACE` (cli/plan.cpp).
void register_plan(CLI::App& app, int& exit_code);
/// `crescent experiment NAME --out DIR` (cli/experiment.cpp).
void register_experiment(CLI::App& app, int& exit_code);
/// `crescent bench transfer [...]` and the other benches under `bench` (cli/bench.cpp; drivers in src/bench).
void register_bench(CLI::App& app, int& exit_code);
/// `crescent bench store` under `bench` (cli/bench_store.cpp).
void register_bench_store(CLI::App& bench_cmd, int& exit_code);
/// `crescent bench serve` under `bench` (cli/bench_serve.cpp).
void register_bench_serve(CLI::App& bench_cmd, int& exit_code);
/// `crescent bench router` (cli/bench_router.cpp).
void register_bench_router(CLI::App& bench_cmd, int& exit_code);
/// `crescent bench model` (bench_model.cpp).
void register_bench_model(CLI::App& bench_cmd, int& exit_code);
/// `crescent store master|node|stat|put|get|rm` (cli/store.cpp).
void register_store(CLI::App& app, int& exit_code);
/// `crescent serve` (cli/serve.cpp).
void register_serve(CLI::App& app, int& exit_code);
/// `crescent replay TRACE --url URL` (cli/replay.cpp).
void register_replay(CLI::App& app, int& exit_code);
/// `crescent profile` (cli/profile.cpp).
void register_profile(CLI::App& app, int& exit_code);
/// `crescent model init|check`: model directories for the real executor (cli/model.cpp).
void register_model(CLI::App& app, int& exit_code);
/// `crescent trace import|transform` (cli/trace.cpp).
void register_trace(CLI::App& app, int& exit_code);
/// `crescent trace import` under `trace` (cli/trace_import.cpp).
void register_trace_import(CLI::App& trace_cmd, int& exit_code);
/// `crescent trace transform` under `trace` (cli/trace_transform.cpp).
void register_trace_transform(CLI::App& trace_cmd, int& exit_code);
/// `crescent tokenize` (tokenize.cpp).
void register_tokenize(CLI::App& app, int& exit_code);

}  // namespace crescent::cli
