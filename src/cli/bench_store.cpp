// `crescent bench store`: the KV cache pool's put and get throughput and latency against Redis in the same
// run (docs/benchmarks.md). This file parses the flags and prints; the measurement code is
// bench/store_bench.h.
#include <fmt/format.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/store_bench.h"
#include "cli/commands.h"
#include "cli/flags.h"

namespace crescent::cli {
namespace {

using bench::KvRunResult;
using bench::StoreBenchOptions;
using bench::StoreBenchReport;

struct StoreBenchArgs {
  std::string systems = "crescent-tcp,crescent-shm,redis";
  std::string ops = "put,get";
  std::string values = "4KiB,512KiB,4MiB";
  std::string threads = "1,4";
  std::string batch = "1,16";
  double seconds = 1.0;
  std::string node_dram = "1GiB";
  long metadata_objects = 1000000;
  bool json = false;
};

Result<StoreBenchOptions> store_bench_options(const StoreBenchArgs& args) {
  StoreBenchOptions options;
  char self[4096] = {};
  const ssize_t n = ::readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) return Status::io_error("bench store: cannot find its own executable (/proc/self/exe)");
  options.crescent_binary.assign(self, static_cast<size_t>(n));
  auto systems = parse_list("--systems", args.systems);
  if (!systems.ok()) return systems.status();
  options.systems = *systems;
  auto ops = parse_list("--ops", args.ops);
  if (!ops.ok()) return ops.status();
  options.ops = *ops;
  auto values = parse_list("--values", args.values);
  if (!values.ok()) return values.status();
  options.value_bytes.clear();
  for (const std::string& v : *values) {
    auto size = parse_size("--values", v);
    if (!size.ok()) return size.status();
    if (*size == 0 || *size > 64 * kMiB)
      return Status::invalid_argument(fmt::format("--values: '{}' is outside 1B..64MiB", v));
    options.value_bytes.push_back(*size);
  }
  auto threads = parse_int_list("--threads", args.threads, 1, 64);
  if (!threads.ok()) return threads.status();
  options.threads.assign(threads->begin(), threads->end());
  auto batches = parse_int_list("--batch", args.batch, 1, 1024);
  if (!batches.ok()) return batches.status();
  options.batches.assign(batches->begin(), batches->end());
  if (!(args.seconds >= 0.05 && args.seconds <= 600)) {
    return Status::invalid_argument(fmt::format("--seconds: {} is outside 0.05..600", args.seconds));
  }
  options.duration = std::chrono::milliseconds(static_cast<long>(args.seconds * 1000));
  auto dram = parse_size("--node-dram", args.node_dram);
  if (!dram.ok()) return dram.status();
  options.node_dram_bytes = *dram;
  if (args.metadata_objects < 0) return Status::invalid_argument("--metadata-objects: must be >= 0");
  options.metadata_objects = static_cast<uint64_t>(args.metadata_objects);
  return options;
}

/// The Redis run with the same op, value size, threads and batch as `run`, if measured.
const KvRunResult* redis_twin(const StoreBenchReport& report, const KvRunResult& run) {
  for (const KvRunResult& r : report.runs) {
    if (r.spec.system == "redis" && r.error.empty() && r.spec.op == run.spec.op &&
        r.spec.value_bytes == run.spec.value_bytes && r.spec.threads == run.spec.threads &&
        r.spec.batch == run.spec.batch) {
      return &r;
    }
  }
  return nullptr;
}

/// Goals of issue 9 §6 at 512 KiB and 4 threads: get >= 2x and put >= 1.5x Redis over tcp.
struct Goal {
  std::string what;
  double ratio = 0;
  double goal = 0;
  bool measured = false;
};

std::vector<Goal> goals(const StoreBenchReport& report) {
  std::vector<Goal> out;
  for (const KvRunResult& r : report.runs) {
    if (r.spec.system != "crescent-tcp" || r.spec.value_bytes != (512u << 10) || r.spec.threads != 4 ||
        !r.error.empty())
      continue;
    const KvRunResult* redis = redis_twin(report, r);
    Goal g{fmt::format("{} 512 KiB, 4 threads, batch {} (tcp vs redis)", r.spec.op, r.spec.batch), 0,
           r.spec.op == "get" ? 2.0 : 1.5, redis != nullptr && redis->gbps > 0};
    if (g.measured) g.ratio = r.gbps / redis->gbps;
    out.push_back(g);
  }
  return out;
}

nlohmann::ordered_json store_report_json(const StoreBenchReport& report) {
  nlohmann::ordered_json out;
  out["runs"] = nlohmann::ordered_json::array();
  for (const KvRunResult& r : report.runs) {
    nlohmann::ordered_json j{
        {"system", r.spec.system},   {"op", r.spec.op},       {"value_bytes", r.spec.value_bytes},
        {"threads", r.spec.threads}, {"batch", r.spec.batch}, {"gbps", r.gbps},
        {"ops_per_s", r.ops_per_s},  {"p50_us", r.p50_us},    {"p99_us", r.p99_us},
        {"seconds", r.seconds},      {"ops", r.ops}};
    if (const KvRunResult* redis = redis_twin(report, r);
        redis != nullptr && r.spec.system != "redis" && redis->gbps > 0) {
      j["vs_redis"] = r.gbps / redis->gbps;
    }
    if (!r.error.empty()) j["error"] = r.error;
    out["runs"].push_back(j);
  }
  double best = 0;
  out["metadata_runs"] = nlohmann::ordered_json::array();
  for (const auto& m : report.metadata_runs) {
    best = std::max(best, m.ops_per_s);
    out["metadata_runs"].push_back({{"op", "batch_exists(1 key)"},
                                    {"threads", m.threads},
                                    {"ops_per_s", m.ops_per_s},
                                    {"p50_us", m.p50_us},
                                    {"p99_us", m.p99_us}});
  }
  out["metadata_ops_per_s"] = best;
  out["master_objects"] = report.master_objects;
  out["master_rss_bytes_per_object"] = report.master_rss_bytes_per_object;
  out["get_replica_list_p50_us"] = report.get_replica_list_p50_us;
  out["get_replica_list_p99_us"] = report.get_replica_list_p99_us;
  out["goals"] = nlohmann::ordered_json::array();
  for (const Goal& g : goals(report)) {
    out["goals"].push_back({{"what", g.what},
                            {"ratio", g.measured ? nlohmann::ordered_json(g.ratio) : nullptr},
                            {"goal", g.goal},
                            {"met", g.measured && g.ratio >= g.goal}});
  }
  out["goals"].push_back({{"what", "metadata ops/s (batch_exists of 1 key)"},
                          {"value", best},
                          {"goal", 50000},
                          {"met", best >= 50000}});
  if (report.master_objects > 0) {
    out["goals"].push_back({{"what", "master RSS bytes per object"},
                            {"value", report.master_rss_bytes_per_object},
                            {"goal", 256},
                            {"met", report.master_rss_bytes_per_object <= 256}});
  }
  out["warnings"] = report.warnings;
  return out;
}

std::string run_line(const KvRunResult& r, const StoreBenchReport* report) {
  if (!r.error.empty()) {
    return fmt::format("  {:<13} {:<4} {:>8} {:>3} {:>5}  error: {}", r.spec.system, r.spec.op,
                       format_size(r.spec.value_bytes), r.spec.threads, r.spec.batch, r.error);
  }
  std::string ratio;
  if (report != nullptr && r.spec.system != "redis") {
    if (const KvRunResult* redis = redis_twin(*report, r); redis != nullptr && redis->gbps > 0) {
      ratio = fmt::format("{:.2f}x", r.gbps / redis->gbps);
    }
  }
  return fmt::format("  {:<13} {:<4} {:>8} {:>3} {:>5} {:>8.2f} {:>11.0f} {:>9.0f} {:>9.0f} {:>9}",
                     r.spec.system, r.spec.op, format_size(r.spec.value_bytes), r.spec.threads, r.spec.batch,
                     r.gbps, r.ops_per_s, r.p50_us, r.p99_us, ratio);
}

void print_store_report(const StoreBenchReport& report) {
  fmt::print(
      "crescent bench store: client threads in this process; master, node and redis-server in their own\n");
  fmt::print("  {:<13} {:<4} {:>8} {:>3} {:>5} {:>8} {:>11} {:>9} {:>9} {:>9}\n", "system", "op", "value",
             "thr", "batch", "GB/s", "ops/s", "p50 us", "p99 us", "vs redis");
  for (const KvRunResult& r : report.runs) fmt::print("{}\n", run_line(r, &report));
  fmt::print("\nmetadata: batch_exists of 1 key per RPC\n");
  for (const auto& m : report.metadata_runs) {
    fmt::print("  {:>2} threads: {:>9.0f} ops/s  p50 {:.0f} us  p99 {:.0f} us\n", m.threads, m.ops_per_s,
               m.p50_us, m.p99_us);
  }
  if (report.master_objects > 0) {
    fmt::print(
        "master with {} objects: {:.0f} bytes of RSS per object; get_replica_list (1 key, 1 thread) p50 "
        "{:.0f} us, "
        "p99 {:.0f} us\n",
        report.master_objects, report.master_rss_bytes_per_object, report.get_replica_list_p50_us,
        report.get_replica_list_p99_us);
  }
  fmt::print("\ngoals (issue 9 section 6):\n");
  for (const Goal& g : goals(report)) {
    fmt::print("  {:<55} {:>6} (goal {:.1f}x) {}\n", g.what,
               g.measured ? fmt::format("{:.2f}x", g.ratio) : "n/a", g.goal,
               g.measured && g.ratio >= g.goal ? "met" : "NOT met");
  }
  for (const std::string& w : report.warnings) fmt::print(stderr, "warning: {}\n", w);
}

}  // namespace

void register_bench_store(CLI::App& bench_cmd, int& exit_code) {
  auto args = std::make_shared<StoreBenchArgs>();
  CLI::App* cmd = bench_cmd.add_subcommand(
      "store", "KV cache pool put/get throughput and latency (tcp and shm) against Redis in the same run");
  cmd->add_option("--systems", args->systems, "crescent-tcp, crescent-shm, redis")->capture_default_str();
  cmd->add_option("--ops", args->ops, "put, get")->capture_default_str();
  cmd->add_option("--values", args->values, "value sizes")->capture_default_str();
  cmd->add_option("--threads", args->threads, "client threads")->capture_default_str();
  cmd->add_option("--batch", args->batch, "keys per call (Redis: pipelining depth)")->capture_default_str();
  cmd->add_option("--seconds", args->seconds, "timed seconds per run")->capture_default_str();
  cmd->add_option("--node-dram", args->node_dram, "the storage node's DRAM segment")->capture_default_str();
  cmd->add_option("--metadata-objects", args->metadata_objects, "objects for the master RSS figure (0: skip)")
      ->capture_default_str();
  cmd->add_flag("--json", args->json, "Print JSON instead of tables");
  cmd->callback([args, &exit_code] {
    run_guarded(exit_code, [&] {
      Result<StoreBenchOptions> options = store_bench_options(*args);
      if (!options.ok()) return fail(options.status());
      if (::isatty(STDERR_FILENO)) {
        options->progress = [](const KvRunResult& r) { fmt::print(stderr, "{}\n", run_line(r, nullptr)); };
      }
      auto report = bench::run_store_bench(*options);
      if (!report.ok()) {
        fmt::print(stderr, "error: {}\n", report.status().message());
        return 1;
      }
      if (args->json) {
        fmt::print("{}\n", dump_json(store_report_json(*report), 2));
      } else {
        print_store_report(*report);
      }
      const auto failed = std::count_if(report->runs.begin(), report->runs.end(),
                                        [](const KvRunResult& r) { return !r.error.empty(); });
      if (failed > 0) {
        fmt::print(stderr, "error: {} of {} runs failed (see their 'error')\n", failed, report->runs.size());
        return 1;
      }
      return 0;
    });
  });
}

}  // namespace crescent::cli
