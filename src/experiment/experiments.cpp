#include "experiment/experiments.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <span>

#include "common/json_util.h"
#include "conductor/conductor.h"
#include "common/atomic_file.h"
#include "experiment/plot.h"
#include "experiment/progress.h"
#include "sim/cluster_config.h"
#include "sim/report.h"
#include "sim/simulator.h"
#include "trace/reader.h"
#include "trace/stats.h"

namespace crescent::experiment {
namespace {

using Json = nlohmann::ordered_json;  // keys in insertion order: provenance first, then results

constexpr std::string_view kConversationTrace = "data/traces/conversation_trace.jsonl.gz";
constexpr std::string_view kSyntheticTrace = "data/traces/synthetic_trace.jsonl.gz";
constexpr std::string_view kDefaultConfig = "configs/paper-fig5.json";

// What an experiment runs on: options resolved, files loaded and checked.
struct Inputs {
  std::vector<std::string> trace_paths;
  std::vector<std::vector<trace::Request>> traces;  // one per path
  sim::ClusterConfig config;
  double time_scale = 1;
  int64_t block_size_tokens = 512;
};

// What an experiment produces: its JSON fields (after the common ones) and its plot.
struct Output {
  Json fields;
  Plot plot;
};

// "conversation_trace" for ".../conversation_trace.jsonl.gz": a trace's name in legends and results.
std::string trace_name(const std::string& path) {
  std::string name = std::filesystem::path(path).filename().string();
  for (std::string_view ext : {".gz", ".jsonl"}) {
    if (name.size() > ext.size() && name.ends_with(ext)) name.resize(name.size() - ext.size());
  }
  return name;
}

// "paper-fig5 (8 prefill + 8 decode)", for titles.
std::string cluster_name(const sim::ClusterConfig& config) {
  return fmt::format("{} ({} prefill + {} decode)", config.name, config.prefill_instances,
                     config.decode_instances);
}

// Simulates `trace` on `config` at the experiment's time scale and block size, reported on `progress` as
// the next run, `label`. `options` sets the rest (system, policy, admission, load sampling).
Result<sim::SimResult> simulate(const Inputs& in, const sim::ClusterConfig& config,
                                std::span<const trace::Request> trace, sim::SimOptions options,
                                ProgressLine& progress, std::string label) {
  options.time_scale = in.time_scale;
  options.block_size_tokens = in.block_size_tokens;
  options.progress = progress.start_run(std::move(label));
  return sim::simulate(config, trace, options);
}

// Paper Figure 5: TTFT of the four prefill policies on one trace.
Result<Output> run_scheduling(const Inputs& in) {
  const std::vector<std::string> policies = conductor::prefill_policy_names();
  ProgressLine progress("scheduling", static_cast<int>(policies.size()));
  Output out;
  out.fields["requests"] = in.traces[0].size();
  out.fields["policies"] = Json::array();
  PlotSeries mean{.name = "mean TTFT"}, p90{.name = "p90 TTFT"};
  for (const std::string& policy : policies) {
    auto result = simulate(in, in.config, in.traces[0], {.policy = *conductor::parse_prefill_policy(policy)},
                           progress, policy);
    if (!result.ok()) return result.status();
    const sim::PolicyReport report = sim::summarize(policy, *result, in.config.slo);
    out.fields["policies"].push_back(Json(sim::to_json(report)));
    mean.y.push_back(sim::or_nan(report.ttft_mean_s));
    p90.y.push_back(sim::or_nan(report.ttft_p90_s));
  }
  out.plot = {.title = fmt::format("TTFT by prefill scheduling policy: {} on {}",
                                   trace_name(in.trace_paths[0]), cluster_name(in.config)),
              .x_label = "prefill scheduling policy",
              .y_label = "time to first token (s)",
              .kind = PlotKind::kBars,
              .categories = policies,
              .series = {mean, p90}};
  return out;
}

// Paper Figure 9: prefix hit ratio versus total cache capacity, for one LRU pool shared by all prefill
// instances (the trace analyzer) and for the same capacity split into per-instance caches with requests
// placed by the cache-aware Conductor (the simulator).
Result<Output> run_cache_capacity(const Inputs& in) {
  constexpr std::array<int64_t, 6> kCapacitiesTokens{1'000'000,  3'000'000,  10'000'000,
                                                     30'000'000, 50'000'000, 100'000'000};
  const uint32_t instances = in.config.prefill_instances;
  ProgressLine progress("cache-capacity", static_cast<int>(in.traces.size() * kCapacitiesTokens.size()));
  Output out;
  out.fields["local_policy"] = "cache-aware";
  out.fields["local_instances"] = instances;
  out.fields["traces"] = Json::array();
  out.plot = {.title = fmt::format(
                  "Prefix hit ratio: one global cache pool vs {} per-instance caches (cache-aware placement)",
                  instances),
              .x_label = "total cache capacity (tokens)",
              .y_label = "prefix hit ratio (% of input tokens)",
              .log_x = true};
  for (size_t t = 0; t < in.traces.size(); ++t) {
    const std::string name = trace_name(in.trace_paths[t]);
    trace::TraceAnalyzer analyzer({.block_size_tokens = in.block_size_tokens,
                                   .capacities_tokens = {kCapacitiesTokens.begin(), kCapacitiesTokens.end()},
                                   .hottest_blocks = 0});
    for (const trace::Request& r : in.traces[t]) analyzer.add(r);
    const trace::TraceStats stats = analyzer.finish();
    const int color = static_cast<int>(t);
    PlotSeries global{.name = name + ": global pool", .color = color};
    PlotSeries local{.name = fmt::format("{}: {} local caches", name, instances),
                     .style = LineStyle::kDashed,
                     .color = color};
    Json points = Json::array();
    for (size_t i = 0; i < kCapacitiesTokens.size(); ++i) {
      sim::ClusterConfig config = in.config;
      config.prefill_cache_capacity_tokens = kCapacitiesTokens[i] / instances;
      auto result = simulate(in, config, in.traces[t], {.policy = conductor::PrefillPolicy::kCacheAware},
                             progress, fmt::format("{} {:g}M tokens", name, kCapacitiesTokens[i] / 1e6));
      if (!result.ok()) return result.status();
      const double local_hit_ratio = sim::or_nan(sim::summarize(name, *result, config.slo).hit_ratio);
      const double global_hit_ratio = sim::or_nan(stats.hit_ratio_by_capacity[i].hit_ratio);
      points.push_back({{"capacity_tokens", kCapacitiesTokens[i]},
                        {"local_hit_ratio", local_hit_ratio},
                        {"global_hit_ratio", global_hit_ratio}});
      global.x.push_back(static_cast<double>(kCapacitiesTokens[i]));
      local.x.push_back(static_cast<double>(kCapacitiesTokens[i]));
      global.y.push_back(global_hit_ratio * 100);
      local.y.push_back(local_hit_ratio * 100);
    }
    const double ceiling = sim::or_nan(stats.reuse_ceiling) * 100;
    out.plot.series.push_back(std::move(global));
    out.plot.series.push_back(std::move(local));
    out.plot.series.push_back(
        {.name = name + ": reuse ceiling",
         .x = {static_cast<double>(kCapacitiesTokens.front()), static_cast<double>(kCapacitiesTokens.back())},
         .y = {ceiling, ceiling},
         .style = LineStyle::kReference,
         .color = color});
    out.fields["traces"].push_back({{"name", name},
                                    {"path", in.trace_paths[t]},
                                    {"ceiling", json_or_null(stats.reuse_ceiling)},
                                    {"points", std::move(points)}});
  }
  return out;
}

// Paper Figures 1, 6, 7: effective request capacity versus TBT threshold for Mooncake's disaggregated
// architecture and the colocated (vLLM-style) baselines, on the same nodes.
Result<Output> run_capacity(const Inputs& in) {
  const std::vector<std::string> systems = sim::system_names();
  ProgressLine progress("capacity", static_cast<int>(systems.size()));
  Output out;
  out.fields["requests"] = in.traces[0].size();
  out.fields["nodes"] = in.config.prefill_instances + in.config.decode_instances;
  out.fields["ttft_slo_s"] = in.config.slo.ttft_s;
  out.fields["systems"] = Json::array();
  out.plot = {
      .title = fmt::format("Effective request capacity: {} on {} nodes, time scale {:g}",
                           trace_name(in.trace_paths[0]),
                           in.config.prefill_instances + in.config.decode_instances, in.time_scale),
      .x_label = "TBT threshold (ms)",
      .y_label = fmt::format("requests with TTFT <= {:g} s and TBT <= threshold (%)", in.config.slo.ttft_s)};
  for (const std::string& name : systems) {
    const sim::System system = *sim::parse_system(name);
    auto result = simulate(in, in.config, in.traces[0], {.system = system}, progress, name);
    if (!result.ok()) return result.status();
    // Effective capacity at each threshold = SLO attainment over all requests (rejected ones miss).
    sim::SloConfig thresholds{.ttft_s = in.config.slo.ttft_s, .tbt_s = {}};
    for (int tbt_ms = 100; tbt_ms <= 1000; tbt_ms += 100) thresholds.tbt_s.push_back(tbt_ms / 1000.0);
    const sim::PolicyReport report = sim::summarize(name, *result, thresholds);
    Json points = Json::array();
    PlotSeries series{.name = name};
    for (const sim::SloAttainment& a : report.slo_attainment_by_tbt) {
      const int tbt_ms = static_cast<int>(std::lround(a.tbt_slo_s * 1000));
      points.push_back({{"tbt_slo_ms", tbt_ms}, {"effective_capacity", a.attainment}});
      series.x.push_back(tbt_ms);
      series.y.push_back(a.attainment * 100);
    }
    out.fields["systems"].push_back({{"name", name},
                                     {"ttft_mean_s", json_or_null(report.ttft_mean_s)},
                                     {"tbt_mean_s", json_or_null(report.tbt_mean_s)},
                                     {"tbt_p99_s", json_or_null(report.tbt_p99_s)},
                                     {"hit_ratio", json_or_null(report.hit_ratio)},
                                     {"points", std::move(points)}});
    out.plot.series.push_back(std::move(series));
  }
  return out;
}

// Pearson correlation of two equally long series; 0 when either is constant. Negative: anti-phase.
double correlation(const std::vector<double>& a, const std::vector<double>& b) {
  const auto n = static_cast<double>(a.size());
  if (a.size() < 2) return 0;
  double ma = 0, mb = 0;
  for (size_t i = 0; i < a.size(); ++i) ma += a[i] / n, mb += b[i] / n;
  double cov = 0, va = 0, vb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    cov += (a[i] - ma) * (b[i] - mb);
    va += (a[i] - ma) * (a[i] - ma);
    vb += (b[i] - mb) * (b[i] - mb);
  }
  return va > 0 && vb > 0 ? cov / std::sqrt(va * vb) : 0;
}

// arXiv report §7: the trace sped up until the cluster is overloaded, under each admission policy.
// Rejections, goodput, SLO attainment of accepted requests, and the prefill- and decode-pool loads over time.
Result<Output> run_overload(const Inputs& in) {
  constexpr double kSampleIntervalS = 10;
  const std::vector<std::string> admissions = conductor::admission_names();
  ProgressLine progress("overload", static_cast<int>(admissions.size()));
  Output out;
  out.fields["requests"] = in.traces[0].size();
  out.fields["policy"] = "global-cache-aware";
  out.fields["load_sample_interval_s"] = kSampleIntervalS;
  out.fields["policies"] = Json::array();
  out.plot = {.title = fmt::format("Pool loads under overload: {} at time scale {:g} on {}",
                                   trace_name(in.trace_paths[0]), in.time_scale, cluster_name(in.config)),
              .x_label = "virtual time (s)",
              .y_label = "prefill queue, mean per instance (s)",
              .y2_label = "decode HBM KV reserved (%)"};
  for (size_t a = 0; a < admissions.size(); ++a) {
    const std::string& name = admissions[a];
    auto result =
        simulate(in, in.config, in.traces[0],
                 {.admission = *conductor::parse_admission(name), .load_sample_interval_s = kSampleIntervalS},
                 progress, name);
    if (!result.ok()) return result.status();
    const sim::PolicyReport r = sim::summarize(name, *result, in.config.slo);
    Json series = Json::array();
    PlotSeries prefill{.name = name + ": prefill queue", .color = static_cast<int>(a)};
    PlotSeries decode{.name = name + ": decode KV",
                      .style = LineStyle::kDashed,
                      .color = static_cast<int>(a),
                      .right_axis = true};
    for (const sim::LoadSample& s : result->load_series) {
      series.push_back({{"time_s", s.time_s},
                        {"prefill_queue_s", s.prefill_queue_s},
                        {"decode_kv_share", s.decode_kv_share},
                        {"decode_running", s.decode_running},
                        {"decode_waiting", s.decode_waiting}});
      prefill.x.push_back(s.time_s);
      prefill.y.push_back(s.prefill_queue_s);
      decode.x.push_back(s.time_s);
      decode.y.push_back(s.decode_kv_share * 100);
    }
    Json p = sim::to_json(r);
    p["load_correlation"] = correlation(prefill.y, decode.y);
    p["load_series"] = std::move(series);
    out.fields["policies"].push_back(std::move(p));
    if (name != "none") {  // "none" never refuses: its queue dwarfs the others on a shared axis
      out.plot.series.push_back(std::move(prefill));
      out.plot.series.push_back(std::move(decode));
    }
  }
  return out;
}

// Paper Figure 15: every split of the config's nodes into prefill and decode instances.
Result<Output> run_pd_ratio(const Inputs& in) {
  const uint32_t nodes = in.config.prefill_instances + in.config.decode_instances;
  if (nodes < 2) return Status::invalid_argument("pd-ratio needs a config with at least 2 nodes");
  ProgressLine progress("pd-ratio", static_cast<int>(nodes - 1));
  const double tbt_slo_s = in.config.slo.tbt_s.front();
  Output out;
  out.fields["requests"] = in.traces[0].size();
  out.fields["nodes"] = nodes;
  out.fields["tbt_slo_s"] = tbt_slo_s;
  out.fields["points"] = Json::array();
  PlotSeries capacity{.name = fmt::format("effective capacity (TTFT <= {:g} s, TBT <= {:g} ms)",
                                          in.config.slo.ttft_s, tbt_slo_s * 1000)};
  PlotSeries ttft{.name = "mean TTFT", .style = LineStyle::kDashed, .right_axis = true};
  PlotSeries tbt{.name = "mean TBT", .style = LineStyle::kDashed, .right_axis = true};
  for (uint32_t prefill = 1; prefill < nodes; ++prefill) {
    sim::ClusterConfig config = in.config;
    config.prefill_instances = prefill;
    config.decode_instances = nodes - prefill;
    auto result =
        simulate(in, config, in.traces[0], {}, progress, fmt::format("{}P/{}D", prefill, nodes - prefill));
    if (!result.ok()) return result.status();
    const sim::PolicyReport r = sim::summarize("", *result, config.slo);
    const double effective = r.slo_attainment;  // at the config's first TBT threshold, over all requests
    out.fields["points"].push_back({{"prefill", prefill},
                                    {"decode", nodes - prefill},
                                    {"effective_capacity", effective},
                                    {"ttft_mean_s", json_or_null(r.ttft_mean_s)},
                                    {"tbt_mean_s", json_or_null(r.tbt_mean_s)},
                                    {"hit_ratio", json_or_null(r.hit_ratio)}});
    capacity.x.push_back(prefill);
    capacity.y.push_back(effective * 100);
    ttft.x.push_back(prefill);
    ttft.y.push_back(sim::or_nan(r.ttft_mean_s));
    tbt.x.push_back(prefill);
    tbt.y.push_back(sim::or_nan(r.tbt_mean_s));
  }
  out.plot = {.title = fmt::format("Prefill/decode split of {} nodes: {} at time scale {:g}", nodes,
                                   trace_name(in.trace_paths[0]), in.time_scale),
              .x_label = fmt::format("prefill instances (decode = {} - prefill)", nodes),
              .y_label = "effective request capacity (%)",
              .y2_label = "mean TTFT and mean TBT (s, log scale)",
              .log_y2 = true,
              .series = {capacity, ttft, tbt}};
  return out;
}

// A registered experiment. To add one: write `Result<Output> run_x(const Inputs&)` above and add a line.
struct Experiment {
  std::string_view name;
  Result<Output> (*run)(const Inputs&);
  bool several_traces = false;  // takes any number of traces; default: both bundled traces
  double default_time_scale = 1;
};

constexpr std::array kExperiments{
    Experiment{.name = "scheduling", .run = run_scheduling},
    Experiment{.name = "cache-capacity", .run = run_cache_capacity, .several_traces = true},
    Experiment{.name = "capacity", .run = run_capacity},
    // Twice the trace's rate overloads paper-fig5's 8 prefill instances (docs/experiments.md).
    Experiment{.name = "overload", .run = run_overload, .default_time_scale = 2},
    Experiment{.name = "pd-ratio", .run = run_pd_ratio},
};

// A missing default file most likely means crescent was started outside the repository.
Status check_default(std::string_view what, std::string_view path, std::string_view flag) {
  if (std::filesystem::exists(path)) return Status();
  return Status::not_found(
      fmt::format("default {} '{}' not found: run from the repository root or pass {}", what, path, flag));
}

Result<Inputs> load_inputs(const Experiment& experiment, const ExperimentOptions& options) {
  Inputs in;
  in.time_scale = options.time_scale.value_or(experiment.default_time_scale);
  in.block_size_tokens = options.block_size_tokens;
  in.trace_paths = options.traces;
  if (in.trace_paths.empty()) {
    in.trace_paths.emplace_back(kConversationTrace);
    if (experiment.several_traces) in.trace_paths.emplace_back(kSyntheticTrace);
    for (const auto& path : in.trace_paths) CRESCENT_RETURN_IF_ERROR(check_default("trace", path, "--trace"));
  } else if (in.trace_paths.size() > 1 && !experiment.several_traces) {
    return Status::invalid_argument(
        fmt::format("experiment '{}' takes one --trace, got {}", experiment.name, in.trace_paths.size()));
  }
  std::string config_path = options.config_path;
  if (config_path.empty()) {
    config_path = kDefaultConfig;
    CRESCENT_RETURN_IF_ERROR(check_default("config", config_path, "--config"));
  }
  auto config = sim::load_cluster_config(config_path, in.block_size_tokens);
  if (!config.ok()) return config.status();
  in.config = std::move(*config);
  CRESCENT_RETURN_IF_ERROR(
      sim::validate(in.config, {.block_size_tokens = in.block_size_tokens, .time_scale = in.time_scale}));
  for (const auto& path : in.trace_paths) {
    auto requests = trace::read_trace(path, {.block_size_tokens = in.block_size_tokens});
    if (!requests.ok()) return requests.status();
    if (requests->empty())
      return Status::invalid_argument(fmt::format("{}: the trace has no requests", path));
    in.traces.push_back(std::move(*requests));
  }
  return in;
}

// How a result was made: the experiment, its inputs and options.
Json provenance(const Experiment& experiment, const Inputs& in) {
  Json j;
  j["experiment"] = experiment.name;
  if (!experiment.several_traces) j["trace"] = in.trace_paths.front();  // else in the experiment's "traces"
  j["config"] = sim::to_json(in.config);
  j["time_scale"] = in.time_scale;
  j["block_size_tokens"] = in.block_size_tokens;
  return j;
}

}  // namespace

std::vector<std::string> experiment_names() {
  std::vector<std::string> names;
  for (const Experiment& e : kExperiments) names.emplace_back(e.name);
  return names;
}

Status run_experiment(std::string_view name, const ExperimentOptions& options) {
  const auto experiment = std::ranges::find(kExperiments, name, &Experiment::name);
  if (experiment == kExperiments.end()) {
    return Status::not_found(
        fmt::format("unknown experiment '{}' (valid: {})", name, fmt::join(experiment_names(), ", ")));
  }
  if (options.out_dir.empty()) return Status::invalid_argument("--out: an output directory is needed");
  auto in = load_inputs(*experiment, options);
  if (!in.ok()) return in.status();
  std::error_code ignored;
  const bool created_dir = !std::filesystem::exists(options.out_dir, ignored);
  CRESCENT_RETURN_IF_ERROR(ensure_writable_directory(options.out_dir));
  // A failed run leaves no trace: not even the directory it created.
  auto fail = [&](Status status) {
    if (created_dir) std::filesystem::remove(options.out_dir, ignored);  // only removes it while empty
    return status;
  };

  auto output = experiment->run(*in);
  if (!output.ok()) return fail(output.status());
  auto svg = render_svg(output->plot);
  if (!svg.ok()) return fail(svg.status());
  Json j = provenance(*experiment, *in);
  j.update(output->fields);

  // Both files written in full before either replaces an older one; the JSON is renamed last.
  const std::filesystem::path base = std::filesystem::path(options.out_dir) / name;
  const std::string svg_path = base.string() + ".svg";
  const std::string json_text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const FileContent files[] = {{svg_path, *svg}, {base.string() + ".json", json_text}};
  if (Status written = write_files_atomically(files); !written.ok()) return fail(written);
  return Status();
}

}  // namespace crescent::experiment
