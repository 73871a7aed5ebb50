// `crescent bench serve`: the front end under load, in one process on loopback (docs/benchmarks.md). This
// file parses the flags and prints; the measurement code is bench/serve_bench.h.
#include <fmt/format.h>

#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "bench/serve_bench.h"
#include "cli/commands.h"

namespace crescent::cli {
namespace {

struct BenchServeArgs {
  std::string config_path;
  double rate = 1000;
  double seconds = 3;
  int64_t streams = 2000;
  int64_t tokens = 64;
  uint32_t prefill_instances = 12;  // 16 instances in all: enough prefill for 1,000 short prompts a second
  uint32_t decode_instances = 4;
  bool json = false;
};

int run_bench_serve(const BenchServeArgs& args) {
  auto config = load_cluster_config_or_default(args.config_path, 512);
  if (!config.ok()) return fail(config.status());
  config->prefill_instances = args.prefill_instances;
  config->decode_instances = args.decode_instances;
  const bench::ServeBenchOptions options{.config = *config,
                                         .rate_per_s = args.rate,
                                         .seconds = args.seconds,
                                         .streams = args.streams,
                                         .tokens_per_stream = args.tokens};
  Result<bench::ServeBenchReport> report = bench::run_serve_bench(options);
  if (!report.ok()) return fail(report.status());
  const bench::ServeAdmission& a = report->admission;
  const bench::ServeStreams& s = report->streams;

  nlohmann::json out = {{"admission",
                         {{"rate_per_s", args.rate},
                          {"requests", a.requests},
                          {"answered", a.answered},
                          {"dropped_client_side", a.dropped_client_side},
                          {"achieved_per_s", a.achieved_per_s},
                          {"handler_p50_us", a.handler_p50_us},
                          {"handler_p99_us", a.handler_p99_us},
                          {"response_p50_ms", a.response_p50_ms},
                          {"response_p99_ms", a.response_p99_ms}}},
                        {"streams",
                         {{"opened", args.streams},
                          {"completed", s.completed},
                          {"held_at_once", s.held_at_once},
                          {"tokens_per_stream", args.tokens},
                          {"tokens_delivered", s.tokens_delivered},
                          {"seconds", s.seconds},
                          {"tokens_per_s", s.tokens_per_s},
                          {"cpu_s", s.cpu_seconds},
                          {"tokens_per_cpu_s", s.tokens_per_cpu_s},
                          {"admissions_timed", s.admissions_timed}}},
                        {"peak_rss_mib", report->peak_rss_mib},
                        {"cluster", fmt::format("{} prefill + {} decode mock instances",
                                                config->prefill_instances, config->decode_instances)}};
  if (args.json) {
    fmt::print("{}\n", dump_json(out, 2));
  } else {
    fmt::print(
        "crescent bench serve: front end and in-process cluster ({}, mock timing of the config's model), "
        "one process, loopback\n\n",
        out["cluster"].get<std::string>());
    fmt::print("admission at {:g} requests/s for {:g} s: {} answered ({:.0f}/s), {} dropped by the client\n",
               args.rate, args.seconds, a.answered, a.achieved_per_s, a.dropped_client_side);
    fmt::print("  handler (HTTP in -> placement) p50 {:.1f} us  p99 {:.1f} us   goal p99 < 1000 us: {}\n",
               a.handler_p50_us, a.handler_p99_us, a.handler_p99_us < 1000 ? "met" : "NOT met");
    fmt::print("  whole response (1 token)        p50 {:.2f} ms  p99 {:.2f} ms\n", a.response_p50_ms,
               a.response_p99_ms);
    fmt::print(
        "streams: {} opened at once, {} completed, {} held open at once; {} tokens in {:.1f} s = {:.0f} "
        "tokens/s   goal >= 2000 held: {}\n",
        args.streams, s.completed, s.held_at_once, s.tokens_delivered, s.seconds, s.tokens_per_s,
        s.held_at_once >= 2000 && s.completed == static_cast<size_t>(args.streams) ? "met" : "NOT met");
    fmt::print("  {:.1f} CPU seconds (server and load driver together): {:.0f} tokens per CPU second\n",
               s.cpu_seconds, s.tokens_per_cpu_s);
    fmt::print("peak RSS {:.0f} MiB\n", report->peak_rss_mib);
  }
  return s.completed == static_cast<size_t>(args.streams) ? 0 : 1;
}

}  // namespace

void register_bench_serve(CLI::App& bench_cmd, int& exit_code) {
  auto args = std::make_shared<BenchServeArgs>();
  CLI::App* cmd = bench_cmd.add_subcommand(
      "serve", "The HTTP front end and Conductor under load: admission overhead and concurrent SSE streams");
  cmd->add_option("--config", args->config_path,
                  "Cluster config (default: the bundled configs/paper-fig5.json)");
  cmd->add_option("--rate", args->rate, "Open-loop arrivals per second for the admission test")
      ->capture_default_str();
  cmd->add_option("--seconds", args->seconds, "Length of the admission test")->capture_default_str();
  cmd->add_option("--streams", args->streams, "Streams opened at once")->capture_default_str();
  cmd->add_option("--tokens", args->tokens, "Tokens per stream")->capture_default_str();
  cmd->add_option("--prefill", args->prefill_instances, "Prefill instances")->capture_default_str();
  cmd->add_option("--decode", args->decode_instances, "Decode instances")->capture_default_str();
  cmd->add_flag("--json", args->json, "Print JSON instead of text");
  cmd->callback([args, &exit_code] { run_guarded(exit_code, [&] { return run_bench_serve(*args); }); });
}

}  // namespace crescent::cli
