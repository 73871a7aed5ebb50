// `crescent bench router`: router mode's routing overhead under open-loop load, stand-in engines, router and
// front end in one process on loopback (docs/benchmarks.md, "Router mode: routing overhead"). This file
// parses the flags and prints; the measurement code is bench/router_bench.h.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/router_bench.h"
#include "cli/commands.h"
#include "cluster/serve_options.h"
#include "common/bundled_files.h"
#include "conductor/conductor.h"
#include "router/router.h"

namespace crescent::cli {
namespace {

constexpr double kGoalP99Us = 1000;  // issue §4: p99 under 1 ms for 32 KB prompts

struct BenchRouterArgs {
  bench::RouterBenchOptions options;  // the flags' defaults are the options'
  std::string arrivals = "poisson";
  std::string tokenizer_file;
  std::vector<std::string> corpus_files;
  std::string config_path;
  std::string profile_path;
  std::string policy;
  std::string admission;
  bool json = false;
};

Result<std::string> read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::invalid_argument(fmt::format("--corpus {}: cannot be read", path));
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// The corpus: --corpus files, or every docs/*.md of the source tree but benchmarks.md (which this bench's
// results go into), in name order.
Result<std::string> load_corpus(const std::vector<std::string>& files, std::string& source) {
  std::vector<std::string> paths = files;
  if (paths.empty()) {
    namespace fs = std::filesystem;
    for (const std::string& dir : bundled_file_dirs()) {
      std::error_code ec;
      const fs::path docs = fs::path(dir) / "docs";
      if (!fs::is_directory(docs, ec)) continue;
      for (const auto& entry : fs::directory_iterator(docs, ec)) {
        if (entry.path().extension() == ".md" && entry.path().filename() != "benchmarks.md")
          paths.push_back(entry.path().string());
      }
      if (!paths.empty()) {
        source = docs.string() + "/*.md but benchmarks.md";
        break;
      }
    }
    if (paths.empty()) {
      return Status::invalid_argument(
          "no docs/*.md found beside the binary or in its source tree: give --corpus FILE");
    }
    std::sort(paths.begin(), paths.end());
  } else {
    source = fmt::format("{}", fmt::join(paths, ", "));
  }
  std::string corpus;
  for (const std::string& path : paths) {
    auto text = read_text(path);
    if (!text.ok()) return text.status();
    corpus += *text;
    corpus += "\n\n";
  }
  return corpus;
}

nlohmann::json percentiles_json(const bench::Percentiles& p) {
  return {{"count", p.count}, {"p50", p.p50}, {"p90", p.p90}, {"p99", p.p99}, {"max", p.max}};
}

int run_bench_router(BenchRouterArgs& args) {
  bench::RouterBenchOptions& o = args.options;
  if (args.arrivals != "poisson" && args.arrivals != "uniform") {
    return fail(
        Status::invalid_argument(fmt::format("--arrivals: '{}' is not poisson or uniform", args.arrivals)));
  }
  o.spacing = args.arrivals == "poisson" ? bench::ArrivalSpacing::kPoisson : bench::ArrivalSpacing::kUniform;
  // The config as `serve conductor --engines` resolves it (blocks of the engines' 16 tokens).
  auto path = config_path_or_default(args.config_path, kServeClusterConfig);
  if (!path.ok()) return fail(path.status());
  auto config = load_cluster_config_or_default(*path, 16, kServeClusterConfig, args.profile_path);
  if (!config.ok()) return fail(config.status());
  auto setup = cluster::resolve_serve_options(
      std::move(*config), *path,
      {.policy = args.policy, .admission = args.admission, .block_size_tokens = 16});
  if (!setup.ok()) return fail(setup.status());
  o.config = setup->cluster.config;
  // The policy the router places by (router::placement_policy): the bench's stand-ins share no KV pool.
  router::RouterOptions router_options;
  router_options.config = o.config;
  o.config.serve.policy = router::placement_policy(router_options);
  std::string tokenizer_source = "the prompt's bytes";
  if (!args.tokenizer_file.empty()) {
    auto loaded = model::load_huggingface_tokenizer(args.tokenizer_file, 0);  // checked once here
    if (!loaded.ok()) return fail(loaded.status());
    o.make_tokenizer = [file = args.tokenizer_file](size_t prefix_cache_bytes) {
      auto t = model::load_huggingface_tokenizer(file, prefix_cache_bytes);
      return t.ok() ? std::shared_ptr<const model::Tokenizer>(std::move(*t)) : nullptr;
    };
    tokenizer_source = args.tokenizer_file;
  }
  std::string corpus_source;
  auto corpus = load_corpus(args.corpus_files, corpus_source);
  if (!corpus.ok()) return fail(corpus.status());
  o.corpus_text = std::move(*corpus);

  Result<bench::RouterBenchReport> result = bench::run_router_bench(o);
  if (!result.ok()) return fail(result.status());
  const bench::RouterBenchReport& r = *result;
  const unsigned cores = std::thread::hardware_concurrency();
  const std::string policy(conductor::to_string(o.config.serve.policy));
  const bool goal_met = r.overhead_us.count > 0 && r.overhead_us.p99 < kGoalP99Us;

  if (args.json) {
    nlohmann::json stages = nlohmann::json::array();
    for (const bench::StageTiming& s : r.stages)
      stages.push_back({{"name", s.name}, {"what", s.what}, {"us", percentiles_json(s.us)}});
    const nlohmann::json out = {
        {"options",
         {{"prompt_bytes", o.prompt_bytes},
          {"rate_per_s", o.rate_per_s},
          {"seconds", o.seconds},
          {"warmup_s", o.warmup_s},
          {"arrivals", args.arrivals},
          {"engines", o.engines},
          {"shared_prefixes", o.shared_prefixes},
          {"shared_prefix_share", o.shared_prefix_share},
          {"max_tokens", o.max_tokens},
          {"seed", o.seed},
          {"tokenizer", tokenizer_source},
          {"token_prefix_cache_bytes", o.token_prefix_cache_bytes},
          {"corpus", corpus_source},
          {"config", *path},
          {"policy", policy}}},
        {"cores", cores},
        {"tokenizer_kind", r.tokenizer_kind},
        {"prompt_tokens_mean", r.prompt_tokens_mean},
        {"requests_sent", r.requests_sent},
        {"answered", r.answered},
        {"failed", r.failed},
        {"offered_per_s", r.offered_per_s},
        {"achieved_per_s", r.achieved_per_s},
        {"overhead_us", percentiles_json(r.overhead_us)},
        {"end_to_end_us", percentiles_json(r.end_to_end_us)},
        {"send_lag_us", percentiles_json(r.send_lag_us)},
        {"cpu_us_per_request", r.cpu_us_per_request},
        {"router_cpu_us_per_request", r.router_cpu_us_per_request},
        {"front_end_thread_cpu_us_per_request", r.front_end_thread_cpu_us_per_request},
        {"page_faults_per_request", r.page_faults_per_request},
        {"token_prefix_cache",
         {{"whole_hits", r.token_prefix_cache.whole_hits},
          {"prefix_hits", r.token_prefix_cache.prefix_hits},
          {"misses", r.token_prefix_cache.misses},
          {"entries", r.token_prefix_cache.entries},
          {"bytes", r.token_prefix_cache.bytes}}},
        {"placement_us_mean", r.placement_us_mean},
        {"stages", stages},
        {"goal_p99_us", kGoalP99Us},
        {"goal_met", goal_met}};
    fmt::print("{}\n", dump_json(out, 2));
  } else {
    fmt::print(
        "crescent bench router: {} stand-in engines, the router ({} policy) and its front end in one process "
        "on loopback, {} cores\n",
        o.engines, policy, cores);
    fmt::print(
        "prompts: {} bytes of {} ({:.0f} tokens on average, tokenized by {}), {} shared prefixes of "
        "{:.0f}%\n",
        o.prompt_bytes, corpus_source, r.prompt_tokens_mean, tokenizer_source, o.shared_prefixes,
        100 * o.shared_prefix_share);
    fmt::print(
        "load: {} arrivals at {:g}/s for {:g} s after {:g} s of warm-up: {} sent ({:.1f}/s), {} answered "
        "({:.1f}/s), {} failed\n\n",
        args.arrivals == "poisson" ? "Poisson" : "evenly spaced", o.rate_per_s, o.seconds, o.warmup_s,
        r.requests_sent, r.offered_per_s, r.answered, r.achieved_per_s, r.failed);
    fmt::print("{:<44} {:>9} {:>9} {:>9} {:>9}\n", "microseconds per request", "p50", "p90", "p99", "max");
    const auto row = [](const std::string& name, const bench::Percentiles& p) {
      fmt::print("{:<44} {:>9.1f} {:>9.1f} {:>9.1f} {:>9.1f}\n", name, p.p50, p.p90, p.p99, p.max);
    };
    row("routing overhead (router's samples)", r.overhead_us);
    row("end to end (client: sent -> [DONE])", r.end_to_end_us);
    for (const bench::StageTiming& s : r.stages) row("  alone: " + s.name, s.us);
    fmt::print("{:<44} {:>9.1f}   (mean in the run: crescent_conductor_decision_seconds)\n",
               "  Conductor placement", r.placement_us_mean);
    row("load generator's lag behind schedule", r.send_lag_us);
    fmt::print(
        "\nCPU per request: {:.0f} us in the process; {:.0f} us outside the stand-in engines and the load "
        "generator (router and front end), of which {:.0f} us on the front end's HTTP thread; {:.1f} minor "
        "page faults (the process)\n",
        r.cpu_us_per_request, r.router_cpu_us_per_request, r.front_end_thread_cpu_us_per_request,
        r.page_faults_per_request);
    const model::TokenPrefixCache::Stats& c = r.token_prefix_cache;
    fmt::print("tokenizer's prefix cache: {} whole hits, {} prefix hits, {} misses; {} texts kept ({:.1f} MiB)\n",
               c.whole_hits, c.prefix_hits, c.misses, c.entries, static_cast<double>(c.bytes) / (1 << 20));
    fmt::print("goal: routing overhead p99 < {:g} us: {}\n", kGoalP99Us, goal_met ? "met" : "NOT met");
  }
  return r.failed == 0 ? 0 : 1;
}

}  // namespace

void register_bench_router(CLI::App& bench_cmd, int& exit_code) {
  auto args = std::make_shared<BenchRouterArgs>();
  bench::RouterBenchOptions& o = args->options;
  CLI::App* cmd = bench_cmd.add_subcommand("router",
                                           "Router mode's routing overhead (HTTP in -> engine request sent, "
                                           "tokenizing included) under open-loop load");
  cmd->add_option("--prompt-bytes", o.prompt_bytes, "Bytes of text per prompt")->capture_default_str();
  cmd->add_option("--rate", o.rate_per_s, "Requests per second (open loop)")->capture_default_str();
  cmd->add_option("--seconds", o.seconds, "Length of the measured part")->capture_default_str();
  cmd->add_option("--warmup-s", o.warmup_s, "Seconds sent first at the same rate, not measured")
      ->capture_default_str();
  cmd->add_option("--arrivals", args->arrivals, "poisson (exponential gaps) or uniform (evenly spaced)")
      ->capture_default_str();
  cmd->add_option("--engines", o.engines, "Stand-in engines")->capture_default_str();
  cmd->add_option("--shared-prefixes", o.shared_prefixes, "Distinct shared prefixes the prompts start with")
      ->capture_default_str();
  cmd->add_option("--shared-prefix-share", o.shared_prefix_share,
                  "The share of a prompt its shared prefix is")
      ->capture_default_str();
  cmd->add_option("--max-tokens", o.max_tokens, "Tokens per request (SSE events a stand-in answers with)")
      ->capture_default_str();
  cmd->add_option("--seed", o.seed, "Seeds the prompts and the arrivals")->capture_default_str();
  cmd->add_option("--tokenizer", args->tokenizer_file,
                  "The front end's tokenizer (a tokenizer.json); default: the prompt's bytes");
  cmd->add_option("--token-prefix-cache-bytes", o.token_prefix_cache_bytes,
                  "The tokenizer's prefix cache (model/hf_tokenizer.h); 0: none")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--corpus", args->corpus_files,
                  "Text files the prompts are cut from (repeatable; default: the source tree's docs/*.md but "
                  "benchmarks.md)");
  cmd->add_option("--config", args->config_path,
                  fmt::format("Cluster config of the router (default: the bundled {})", kServeClusterConfig));
  add_profile_flag(cmd, args->profile_path);
  cmd->add_option("--policy", args->policy,
                  "Prefill policy (default: the config's; global-cache-aware is cache-aware)");
  cmd->add_option("--admission", args->admission, "Admission (default: the config's)");
  cmd->add_flag("--json", args->json, "Print JSON instead of a table");
  cmd->callback([args, &exit_code] { run_guarded(exit_code, [&] { return run_bench_router(*args); }); });
}

}  // namespace crescent::cli
