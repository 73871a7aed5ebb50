// `crescent bench transfer`: throughput and latency of the transfer engine between two engines in two
// processes over loopback, beside same-run baselines (single-thread memcpy, raw loopback TCP); see
// docs/benchmarks.md. `crescent bench transfer-target` (hidden) is the process the bench starts to serve
// the remote segment. This file parses the flags and prints; the measurement code is bench/transfer_bench.h.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <tuple>
#include <vector>

#include "bench/transfer_bench.h"
#include "cli/commands.h"
#include "cli/flags.h"

namespace crescent::cli {
namespace {

using bench::TransferBaseline;
using bench::TransferBenchOptions;
using bench::TransferBenchReport;
using bench::TransferPath;
using bench::TransferRunResult;
using bench::TransferRunSpec;
using transfer::TransferOp;
using transfer::TransportKind;

constexpr uint64_t kMaxRunBytes = kGiB;  // per side and run: the target's segment and the local memory
constexpr double kTcpGoal = 0.70;        // tcp >= 70% of raw loopback TCP (1 MiB blocks, batch 64)
constexpr double kShmGoal = 0.60;        // shm >= 60% of single-thread memcpy

// ---------------------------------------------------------------------------------------------------------
// Flag values.

Result<double> parse_seconds(const std::string& text) {
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(value) || value < 0.01 ||
      value > 600) {
    return Status::invalid_argument(
        fmt::format("--seconds: '{}' is not a number of seconds in 0.01..600", text));
  }
  return value;
}

// The batch used for `block` when --batch is not given: 128 below 64 KiB, 64 up to 4 MiB, then 256 MiB
// per batch.
size_t default_batch(uint64_t block) {
  if (block < 64 * kKiB) return 128;
  return static_cast<size_t>(std::clamp<uint64_t>(256 * kMiB / block, 1, 64));
}

struct Config {
  uint64_t block_bytes;
  size_t batch;
  int threads;
};

// The matrix without --block-sizes/--batch/--threads: latency (4 KiB x 1), small transfers (4 KiB x 128),
// the goals' configuration (1 MiB x 64) with one and two threads, and both ends of the size range.
std::vector<Config> representative_configs() {
  return {{4 * kKiB, 1, 1},  {4 * kKiB, 128, 1}, {64 * kKiB, 64, 1},
          {1 * kMiB, 64, 1}, {1 * kMiB, 64, 2},  {64 * kMiB, 4, 1}};
}

struct Args {
  std::string transports = "tcp,shm,ucx";
  std::string block_sizes;
  std::string batch;
  std::string threads;
  std::string op = "read";
  std::string seconds = "1";
  std::string working_set = "256MiB";
  std::vector<std::string> ucx_tls = {"tcp", "posix,sysv,cma,self"};
  bool json = false;
};

Result<TransferBenchOptions> build_options(const Args& args) {
  TransferBenchOptions options;
  Result<double> seconds = parse_seconds(args.seconds);
  if (!seconds.ok()) return seconds.status();
  options.seconds = *seconds;
  Result<uint64_t> working_set = parse_size("--working-set", args.working_set);
  if (!working_set.ok()) return working_set.status();
  if (*working_set < kMiB || *working_set > kMaxRunBytes) {
    return Status::invalid_argument(
        fmt::format("--working-set: '{}' is outside 1MiB..1GiB", args.working_set));
  }
  options.working_set_bytes = *working_set;

  std::vector<TransferPath> paths;
  Result<std::vector<std::string>> transports = parse_list("--transports", args.transports);
  if (!transports.ok()) return transports.status();
  for (const std::string& name : *transports) {
    Result<TransportKind> kind = transfer::parse_transport(name);
    if (!kind.ok()) return Status::invalid_argument("--transports: " + kind.status().message());
    if (std::any_of(paths.begin(), paths.end(), [&](const TransferPath& p) { return p.kind == *kind; })) {
      return Status::invalid_argument(fmt::format("--transports: '{}' listed twice", name));
    }
    if (*kind != TransportKind::kUcx) {
      paths.push_back({.kind = *kind, .ucx_tls = ""});
      continue;
    }
    if (args.ucx_tls.empty()) return Status::invalid_argument("--ucx-tls: no value");
    for (const std::string& tls : args.ucx_tls) {
      if (tls.empty() || tls.find_first_of(" \t\n") != std::string::npos) {
        return Status::invalid_argument(fmt::format("--ucx-tls: '{}' is not a UCX_TLS list", tls));
      }
      paths.push_back({.kind = TransportKind::kUcx, .ucx_tls = tls});
    }
  }

  std::vector<TransferOp> ops;
  Result<std::vector<std::string>> op_names = parse_list("--op", args.op);
  if (!op_names.ok()) return op_names.status();
  for (const std::string& name : *op_names) {
    if (name != "read" && name != "write") {
      return Status::invalid_argument(fmt::format("--op: '{}' is not read or write", name));
    }
    const TransferOp op = name == "read" ? TransferOp::kRead : TransferOp::kWrite;
    if (std::find(ops.begin(), ops.end(), op) == ops.end()) ops.push_back(op);
  }

  std::vector<Config> configs;
  if (args.block_sizes.empty() && args.batch.empty() && args.threads.empty()) {
    configs = representative_configs();
  } else {
    std::vector<uint64_t> blocks = {4 * kKiB, 64 * kKiB, kMiB, 64 * kMiB};
    std::vector<size_t> batches;  // empty: default_batch(block)
    std::vector<int> thread_counts = {1};
    if (!args.block_sizes.empty()) {
      Result<std::vector<std::string>> items = parse_list("--block-sizes", args.block_sizes);
      if (!items.ok()) return items.status();
      blocks.clear();
      for (const std::string& item : *items) {
        Result<uint64_t> size = parse_size("--block-sizes", item);
        if (!size.ok()) return size.status();
        if (*size == 0 || *size > kMaxRunBytes) {
          return Status::invalid_argument(fmt::format("--block-sizes: '{}' is outside 1B..1GiB", item));
        }
        blocks.push_back(*size);
      }
    }
    if (!args.batch.empty()) {
      Result<std::vector<long>> values = parse_int_list("--batch", args.batch, 1, 65536);
      if (!values.ok()) return values.status();
      for (long value : *values) batches.push_back(static_cast<size_t>(value));
    }
    if (!args.threads.empty()) {
      Result<std::vector<long>> values = parse_int_list("--threads", args.threads, 1, 16);
      if (!values.ok()) return values.status();
      thread_counts.clear();
      for (long value : *values) thread_counts.push_back(static_cast<int>(value));
    }
    for (uint64_t block : blocks) {
      const std::vector<size_t> block_batches =
          batches.empty() ? std::vector<size_t>{default_batch(block)} : batches;
      for (size_t batch : block_batches) {
        for (int threads : thread_counts) configs.push_back({block, batch, threads});
      }
    }
  }
  for (const Config& c : configs) {
    if (c.block_bytes * c.batch * static_cast<uint64_t>(c.threads) > kMaxRunBytes) {
      return Status::invalid_argument(
          fmt::format("block {} x batch {} x {} thread(s) = {} in flight exceeds the 1 GiB limit per run",
                      format_size(c.block_bytes), c.batch, c.threads,
                      format_size(c.block_bytes * c.batch * static_cast<uint64_t>(c.threads))));
    }
  }
  for (const TransferPath& path : paths) {
    for (const Config& c : configs) {
      for (TransferOp op : ops) {
        options.runs.push_back(
            {.path = path, .block_bytes = c.block_bytes, .batch = c.batch, .threads = c.threads, .op = op});
      }
    }
  }
  return options;
}

// ---------------------------------------------------------------------------------------------------------
// Output.

// `value` rounded to `decimals` decimal places.
double round_to(double value, int decimals) {
  const double scale = std::pow(10.0, decimals);
  return std::round(value * scale) / scale;
}

const TransferBaseline* baseline_of(const TransferBenchReport& report, uint64_t block) {
  for (const TransferBaseline& b : report.baselines) {
    if (b.block_bytes == block) return &b;
  }
  return nullptr;
}

// The run's baseline name and GB/s (0 when unmeasured).
std::pair<std::string, double> run_baseline(const TransferBenchReport& report, const TransferRunResult& run) {
  const TransferBaseline* b = baseline_of(report, run.spec.block_bytes);
  if (run.spec.path.compares_to_tcp()) return {"tcp_loopback", b ? b->tcp_loopback_gbps : 0};
  return {"memcpy", b ? b->memcpy_gbps : 0};
}

// The parallel-sockets loopback GB/s for a run compared to TCP (0 otherwise or when unmeasured).
double streams_baseline(const TransferBenchReport& report, const TransferRunResult& run) {
  const TransferBaseline* b = baseline_of(report, run.spec.block_bytes);
  return run.spec.path.compares_to_tcp() && b ? b->tcp_loopback_streams_gbps : 0;
}

// Runs in display order: by configuration, then transport (paths in the order given).
std::vector<size_t> display_order(const TransferBenchReport& report) {
  std::vector<size_t> order(report.runs.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const TransferRunSpec& x = report.runs[a].spec;
    const TransferRunSpec& y = report.runs[b].spec;
    return std::tuple(x.block_bytes, x.batch, x.threads, x.op) <
           std::tuple(y.block_bytes, y.batch, y.threads, y.op);
  });
  return order;
}

bool is_goal_config(const TransferRunSpec& spec) {
  return spec.block_bytes == kMiB && spec.batch == 64 && spec.threads == 1 && spec.op == TransferOp::kRead;
}

bool is_small_config(const TransferRunSpec& spec) {
  return spec.block_bytes == 4 * kKiB && spec.batch == 128 && spec.threads == 1 &&
         spec.op == TransferOp::kRead;
}

// The goal a path is held to at the goals' configuration: required ratio, or 0 for "reported beside".
double goal_for(const TransferPath& path) {
  if (path.kind == TransportKind::kTcp) return kTcpGoal;
  if (path.kind == TransportKind::kShm) return kShmGoal;
  return 0;
}

nlohmann::ordered_json report_json(const TransferBenchReport& report, const TransferBenchOptions& options) {
  nlohmann::ordered_json j;
  const TransferBaseline* mib = baseline_of(report, kMiB);
  auto gbps_or_null = [](double gbps, const std::string& error) {
    return error.empty() ? nlohmann::ordered_json(round_to(gbps, 4)) : nlohmann::ordered_json(nullptr);
  };
  j["baselines"]["memcpy_gbps"] = mib ? round_to(mib->memcpy_gbps, 4) : 0.0;
  j["baselines"]["tcp_loopback_gbps"] =
      mib ? gbps_or_null(mib->tcp_loopback_gbps, mib->tcp_loopback_error) : nullptr;
  j["baselines"]["block_bytes"] = kMiB;
  if (options.loopback_streams > 1) {
    j["baselines"]["tcp_loopback_streams"] = options.loopback_streams;
    j["baselines"]["tcp_loopback_streams_gbps"] =
        mib ? gbps_or_null(mib->tcp_loopback_streams_gbps, mib->tcp_loopback_error) : nullptr;
  }
  j["baselines"]["by_block_bytes"] = nlohmann::ordered_json::object();
  for (const TransferBaseline& b : report.baselines) {
    nlohmann::ordered_json entry = {
        {"batch", b.batch},
        {"memcpy_gbps", round_to(b.memcpy_gbps, 4)},
        {"tcp_loopback_gbps", gbps_or_null(b.tcp_loopback_gbps, b.tcp_loopback_error)}};
    if (options.loopback_streams > 1) {
      entry["tcp_loopback_streams_gbps"] = gbps_or_null(b.tcp_loopback_streams_gbps, b.tcp_loopback_error);
    }
    if (!b.tcp_loopback_error.empty()) entry["tcp_loopback_error"] = b.tcp_loopback_error;
    j["baselines"]["by_block_bytes"][std::to_string(b.block_bytes)] = entry;
  }
  j["runs"] = nlohmann::ordered_json::array();
  for (const TransferRunResult& run : report.runs) {
    nlohmann::ordered_json r;
    r["transport"] = transfer::transport_name(run.spec.path.kind);
    if (run.spec.path.kind == TransportKind::kUcx) r["ucx_tls"] = run.spec.path.ucx_tls;
    r["block_bytes"] = run.spec.block_bytes;
    r["batch"] = run.spec.batch;
    r["threads"] = run.spec.threads;
    r["op"] = bench::op_name(run.spec.op);
    const auto [baseline, baseline_gbps] = run_baseline(report, run);
    if (run.error.empty()) {
      r["gbps"] = round_to(run.gbps, 4);
      r["requests_per_s"] = round_to(run.requests_per_s, 1);
      r["p50_us"] = round_to(run.p50_us, 1);
      r["p99_us"] = round_to(run.p99_us, 1);
      r["latency_samples"] = run.latency_samples;
      r["batch_p50_us"] = round_to(run.batch_p50_us, 1);
      r["batch_p99_us"] = round_to(run.batch_p99_us, 1);
      r["seconds"] = round_to(run.seconds, 4);
      r["bytes"] = run.bytes;
      r["requests"] = run.requests;
      r["verified_bytes"] = run.verified_bytes;
    } else {
      for (const char* key : {"gbps", "requests_per_s", "p50_us", "p99_us"}) r[key] = nullptr;
    }
    r["working_set_bytes"] = run.working_set_bytes;
    r["baseline"] = baseline;
    r["baseline_gbps"] = round_to(baseline_gbps, 4);
    r["baseline_ratio"] = run.error.empty() && baseline_gbps > 0
                              ? nlohmann::ordered_json(round_to(run.gbps / baseline_gbps, 4))
                              : nlohmann::ordered_json(nullptr);
    const double streams_gbps = streams_baseline(report, run);
    if (run.error.empty() && streams_gbps > 0)
      r["tcp_loopback_streams_ratio"] = round_to(run.gbps / streams_gbps, 4);
    if (is_goal_config(run.spec) && goal_for(run.spec.path) > 0) {
      r["goal_ratio"] = goal_for(run.spec.path);
      r["goal_met"] =
          run.error.empty() && baseline_gbps > 0 && run.gbps / baseline_gbps >= goal_for(run.spec.path);
    }
    if (!run.error.empty()) r["error"] = run.error;
    j["runs"].push_back(r);
  }
  nlohmann::ordered_json target = {{"pid", report.target_pid},
                                   {"segment_bytes", report.segment_bytes},
                                   {"transports", report.target_transports}};
  if (!report.target_unavailable.empty()) target["unavailable"] = report.target_unavailable;
  j["config"] = {{"seconds_per_run", options.seconds},
                 {"working_set_bytes", options.working_set_bytes},
                 {"target", target},
                 {"wall_seconds", round_to(report.wall_seconds, 2)}};
  return j;
}

std::string format_gbps(double gbps) {
  return fmt::format("{:.2f}", gbps);
}

std::string format_rate(double per_s) {
  if (per_s >= 1e6) return fmt::format("{:.2f}M", per_s / 1e6);
  if (per_s >= 1e4) return fmt::format("{:.0f}k", per_s / 1e3);
  return fmt::format("{:.0f}", per_s);
}

std::string format_us(double us) {
  return us >= 1000 ? fmt::format("{:.0f}", us) : fmt::format("{:.1f}", us);
}

std::string baseline_text(const std::string& baseline) {
  return baseline == "tcp_loopback" ? "raw loopback TCP" : "single-thread memcpy";
}

void print_human(const TransferBenchReport& report, const TransferBenchOptions& options) {
  fmt::print(
      "crescent bench transfer: two engines in two processes over loopback (target pid {}, {} segment)\n",
      report.target_pid, format_size(report.segment_bytes));
  fmt::print("{:g} s per run and per baseline; each side rotates over >= {}; GB/s = 1e9 bytes/s\n\n",
             options.seconds, format_size(options.working_set_bytes));

  fmt::print("Baselines (this run; same block size and batch):\n");
  const std::string streams_header =
      options.loopback_streams > 1 ? fmt::format("{} sockets GB/s", options.loopback_streams) : "";
  fmt::print("  {:>8} {:>6} {:>12} {:>18} {:>16}\n", "block", "batch", "memcpy GB/s", "loopback TCP GB/s",
             streams_header);
  for (const TransferBaseline& b : report.baselines) {
    if (!b.tcp_loopback_error.empty()) {
      fmt::print("  {:>8} {:>6} {:>12} error: {}\n", format_size(b.block_bytes), b.batch,
                 format_gbps(b.memcpy_gbps), b.tcp_loopback_error);
      continue;
    }
    fmt::print("  {:>8} {:>6} {:>12} {:>18} {:>16}\n", format_size(b.block_bytes), b.batch,
               format_gbps(b.memcpy_gbps), format_gbps(b.tcp_loopback_gbps),
               options.loopback_streams > 1 ? format_gbps(b.tcp_loopback_streams_gbps) : "");
  }
  fmt::print("  (loopback TCP: one plain blocking socket, the goals' baseline{})\n",
             options.loopback_streams > 1
                 ? fmt::format("; {} sockets: as many as the tcp transport's lanes per peer",
                               options.loopback_streams)
                 : "");

  fmt::print("\nTransfers:\n");
  size_t width = 9;
  for (const TransferRunResult& run : report.runs) width = std::max(width, run.spec.path.label().size());
  fmt::print("  {:<{}} {:>7} {:>6} {:>4} {:<5} {:>8} {:>9} {:>9} {:>9}  {}\n", "transport", width, "block",
             "batch", "thr", "op", "GB/s", "req/s", "p50 us", "p99 us", "vs baseline");
  uint64_t previous_block = 0;
  for (size_t index : display_order(report)) {
    const TransferRunResult& run = report.runs[index];
    if (previous_block != 0 && run.spec.block_bytes != previous_block) fmt::print("\n");
    previous_block = run.spec.block_bytes;
    const std::string head = fmt::format("  {:<{}} {:>7} {:>6} {:>4} {:<5}", run.spec.path.label(), width,
                                         format_size(run.spec.block_bytes), run.spec.batch, run.spec.threads,
                                         bench::op_name(run.spec.op));
    if (!run.error.empty()) {
      fmt::print("{} error: {}\n", head, run.error);
      continue;
    }
    const auto [baseline, baseline_gbps] = run_baseline(report, run);
    const std::string ratio = baseline_gbps > 0
                                  ? fmt::format("{:.0f}% of {}", 100 * run.gbps / baseline_gbps,
                                                baseline == "tcp_loopback" ? "loopback TCP" : "memcpy")
                                  : "-";
    fmt::print("{} {:>8} {:>9} {:>9} {:>9}  {}\n", head, format_gbps(run.gbps),
               format_rate(run.requests_per_s), format_us(run.p50_us), format_us(run.p99_us), ratio);
  }

  bool any_goal = false;
  for (const TransferRunResult& run : report.runs) {
    if (!is_goal_config(run.spec)) continue;
    if (!any_goal) fmt::print("\nGoals (1 MiB blocks, batch 64, 1 thread, reads):\n");
    any_goal = true;
    const auto [baseline, baseline_gbps] = run_baseline(report, run);
    const double goal = goal_for(run.spec.path);
    const std::string label = fmt::format("  {:<{}}", run.spec.path.label(), width);
    if (!run.error.empty()) {
      fmt::print("{} not measured: {}\n", label, run.error);
      continue;
    }
    const double ratio = baseline_gbps > 0 ? run.gbps / baseline_gbps : 0;
    const double streams_gbps = streams_baseline(report, run);
    const std::string streams =
        streams_gbps > 0 ? fmt::format(", {:.0f}% of {} sockets ({} GB/s)", 100 * run.gbps / streams_gbps,
                                       options.loopback_streams, format_gbps(streams_gbps))
                         : "";
    fmt::print("{} {} GB/s = {:.0f}% of {} ({} GB/s){}; {}\n", label, format_gbps(run.gbps), 100 * ratio,
               baseline_text(baseline), format_gbps(baseline_gbps), streams,
               goal > 0 ? fmt::format("goal >= {:.0f}%: {}", 100 * goal, ratio >= goal ? "met" : "NOT MET")
                        : std::string("reported beside (no goal)"));
  }
  bool any_small = false;
  for (const TransferRunResult& run : report.runs) {
    if (!is_small_config(run.spec)) continue;
    if (!any_small) fmt::print("\nSmall transfers (4 KiB reads, batch 128, 1 thread):\n");
    any_small = true;
    const std::string label = fmt::format("  {:<{}}", run.spec.path.label(), width);
    if (!run.error.empty()) {
      fmt::print("{} not measured: {}\n", label, run.error);
      continue;
    }
    fmt::print("{} {} requests/s, p50 {} us, p99 {} us (batch p50 {} us)\n", label,
               format_rate(run.requests_per_s), format_us(run.p50_us), format_us(run.p99_us),
               format_us(run.batch_p50_us));
  }
  fmt::print(
      "\nGB/s and req/s: first 3/4 of each run, waiting per batch. p50/p99: each request's submit -> "
      "completion,\n"
      "polled with status() in the last 1/4. Every run checks XXH3 checksums of sampled blocks in both "
      "processes.\n"
      "Wall time {:.1f} s.\n",
      report.wall_seconds);
}

}  // namespace

void register_bench(CLI::App& app, int& exit_code) {
  CLI::App* bench_cmd = app.add_subcommand("bench", "Benchmarks of crescent's components");
  bench_cmd->require_subcommand(1);

  auto args = std::make_shared<Args>();
  CLI::App* cmd = bench_cmd->add_subcommand(
      "transfer",
      "Transfer engine throughput and latency, two processes over loopback, beside memcpy and loopback TCP");
  cmd->add_option("--transports", args->transports, "Transports to measure: tcp, shm, ucx")
      ->capture_default_str();
  cmd->add_option("--block-sizes", args->block_sizes,
                  "Bytes per request, e.g. 4KiB,64KiB,1MiB,64MiB (default: a representative matrix)");
  cmd->add_option("--batch", args->batch, "Requests per batch, e.g. 1,64 (default: by block size)");
  cmd->add_option("--threads", args->threads, "Initiator threads, each with its own batches, e.g. 1,2");
  cmd->add_option("--op", args->op, "read, write or read,write")->capture_default_str();
  cmd->add_option("--seconds", args->seconds, "Seconds per run and per baseline")->capture_default_str();
  cmd->add_option("--working-set", args->working_set,
                  "Minimum bytes each side rotates over (keep above the caches)")
      ->capture_default_str();
  cmd->add_option("--ucx-tls", args->ucx_tls,
                  "UCX transports of the ucx runs (UCX_TLS syntax), one set of runs per value; repeatable "
                  "(default: 'tcp' and 'posix,sysv,cma,self')");
  cmd->add_flag("--json", args->json, "Print JSON instead of tables");
  cmd->callback([args, &exit_code] {
    run_guarded(exit_code, [&] {
      Result<TransferBenchOptions> options = build_options(*args);
      if (!options.ok()) return fail(options.status());
      if (::isatty(STDERR_FILENO)) {
        options->progress = [](const std::string& line) { fmt::print(stderr, "{}\n", line); };
      }
      Result<TransferBenchReport> report = bench::run_transfer_bench(*options);
      if (!report.ok()) {
        fmt::print(stderr, "error: {}\n", report.status().message());
        return 1;
      }
      if (args->json) {
        fmt::print("{}\n", dump_json(report_json(*report, *options), 2));
      } else {
        print_human(*report, *options);
      }
      std::fflush(stdout);
      const auto failed = std::count_if(report->runs.begin(), report->runs.end(),
                                        [](const TransferRunResult& run) { return !run.error.empty(); });
      if (failed > 0) {
        fmt::print(stderr, "error: {} of {} runs failed (see their 'error')\n", failed, report->runs.size());
        return 1;
      }
      return 0;
    });
  });

  register_bench_store(*bench_cmd, exit_code);
  register_bench_serve(*bench_cmd, exit_code);
  register_bench_router(*bench_cmd, exit_code);
  register_bench_model(*bench_cmd, exit_code);

  auto target = std::make_shared<bench::TransferTargetOptions>();
  auto target_transports = std::make_shared<std::string>();
  CLI::App* target_cmd = bench_cmd->add_subcommand("transfer-target", "The process `bench transfer` starts");
  target_cmd->group("");  // hidden: started by `bench transfer` only
  target_cmd->add_option("--metadata-dir", target->metadata_dir)->required();
  target_cmd->add_option("--name", target->engine_name)->required();
  target_cmd->add_option("--segment", target->segment)->required();
  target_cmd->add_option("--transports", *target_transports)->required();
  target_cmd->add_option("--bytes", target->segment_bytes)->required();
  target_cmd->add_option("--ucx-tls", target->ucx_tls);
  target_cmd->callback([target, target_transports, &exit_code] {
    run_guarded(exit_code, [&] {
      for (const std::string& name : split(*target_transports, ',')) {
        Result<TransportKind> kind = transfer::parse_transport(name);
        if (!kind.ok()) return fail(kind.status());
        target->transports.push_back(*kind);
      }
      return bench::run_transfer_target(*target).ok() ? 0 : 1;
    });
  });
}

}  // namespace crescent::cli
