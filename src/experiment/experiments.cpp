#include "experiment/experiments.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>

#include "cluster/cluster_config.h"
#include "cluster/report.h"
#include "common/atomic_file.h"
#include "common/bundled_files.h"
#include "common/json_util.h"
#include "common/text_format.h"
#include "conductor/conductor.h"
#include "experiment/plot.h"
#include "experiment/progress.h"
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
  // How results record each trace: the path given, or a bundled trace's name relative to the bundle
  // ("data/traces/conversation_trace.jsonl.gz"), so results do not depend on where crescent is installed.
  std::vector<std::string> trace_records;
  std::vector<std::vector<trace::Request>> traces;  // one per path
  cluster::ClusterConfig config;
  double time_scale = 1;
  int64_t block_size_tokens = 512;
};

// What an experiment produces: its JSON fields (after the common ones), its figure, a short table of its
// main numbers and warnings (runs in which no request completed).
struct Output {
  Json fields;
  Figure figure;
  std::string table;
  std::vector<std::string> warnings;
};

// "conversation_trace" for ".../conversation_trace.jsonl.gz": a trace's name in legends and results.
std::string trace_name(const std::string& path) {
  std::string name = std::filesystem::path(path).filename().string();
  for (std::string_view ext : {".gz", ".jsonl"}) {
    if (name.size() > ext.size() && name.ends_with(ext)) name.resize(name.size() - ext.size());
  }
  return name;
}

// "paper-fig5: 8P+8D of 8xA800, llama3-70b", for titles: the hardware and model as used (an overridden
// preset says so, e.g. "8xA800 with gpus=4").
std::string cluster_name(const cluster::ClusterConfig& config) {
  return fmt::format("{}: {}P+{}D of {}, {}", config.name, config.prefill_instances, config.decode_instances,
                     config.hardware.name, config.model.name);
}

// "conversation_trace x2 on paper-fig5: 8P+8D of 8xA800, llama3-70b": what a run replayed, for titles.
std::string run_name(const Inputs& in, const cluster::ClusterConfig& config) {
  return fmt::format("{} x{:g} on {}", trace_name(in.trace_paths[0]), in.time_scale, cluster_name(config));
}

// A text table for the terminal: the first column left-aligned, the others right-aligned.
std::string text_table(const std::vector<std::string>& header,
                       const std::vector<std::vector<std::string>>& rows) {
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size() && c < width.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (size_t c = 0; c < cells.size(); ++c) {
      text +=
          c == 0 ? fmt::format("{:<{}}", cells[c], width[c]) : fmt::format("  {:>{}}", cells[c], width[c]);
    }
    return text + "\n";
  };
  std::string out = line(header);
  for (const auto& row : rows) out += line(row);
  return out;
}

// Table cells: a ratio as a percentage, seconds, milliseconds; "n/a" for a statistic of nothing.
std::string percent_cell(std::optional<double> ratio) {
  return format_or_na(ratio, 100, 1, "%");
}
std::string seconds_cell(std::optional<double> s) {
  return format_or_na(s, 1, 2, " s");
}
std::string ms_cell(std::optional<double> s) {
  return format_or_na(s, 1000, 1, " ms");
}

// `ms` as JSON: an integer when it is whole (100), else a number (12.5).
Json ms_json(double ms) {
  return ms == std::round(ms) ? Json(static_cast<int64_t>(std::llround(ms))) : Json(ms);
}

// Summarises one run, keeping its no-completion warning (labelled with the run) for the user.
cluster::PolicyReport summarize(Output& out, std::string_view experiment, const std::string& label,
                                const cluster::RunResult& result, const cluster::SloConfig& slo) {
  cluster::PolicyReport report = cluster::summarize(label, result, slo);
  if (std::string warning = cluster::no_completion_warning(report); !warning.empty()) {
    out.warnings.push_back(fmt::format("{} run {}", experiment, warning));
  }
  return report;
}

// Simulates `trace` on `config` at the experiment's time scale and block size, reported on `progress` as
// the next run, `label`. `options` sets the rest (system, policy, admission, load sampling).
Result<cluster::RunResult> simulate(const Inputs& in, const cluster::ClusterConfig& config,
                                    std::span<const trace::Request> trace, sim::SimOptions options,
                                    ProgressLine& progress, std::string label) {
  options.time_scale = in.time_scale;
  options.block_size_tokens = in.block_size_tokens;
  options.progress = progress.start_run(std::move(label));
  return sim::simulate(config, trace, options);
}

// Paper Figure 5: TTFT of the four prefill policies on one trace.
Result<Output> run_scheduling(const Inputs& in) {
  const std::vector<std::string> policies = {"random", "least-loaded", "cache-aware", "global-cache-aware"};
  ProgressLine progress("scheduling", static_cast<int>(policies.size()));
  Output out;
  out.fields["requests"] = in.traces[0].size();
  out.fields["policies"] = Json::array();
  PlotSeries mean{.name = "mean TTFT"}, p90{.name = "p90 TTFT"};
  std::vector<cluster::PolicyReport> reports;
  for (const std::string& policy : policies) {
    auto result = simulate(in, in.config, in.traces[0], {.policy = *conductor::parse_prefill_policy(policy)},
                           progress, policy);
    if (!result.ok()) return result.status();
    reports.push_back(summarize(out, "scheduling", policy, *result, in.config.slo));
    out.fields["policies"].push_back(Json(cluster::to_json(reports.back())));
    mean.y.push_back(cluster::or_nan(reports.back().ttft_mean_s));
    p90.y.push_back(cluster::or_nan(reports.back().ttft_p90_s));
  }
  out.table = cluster::format_table(reports, in.config.slo);
  out.figure = {.panels = {{.title = fmt::format("TTFT by prefill policy: {}", run_name(in, in.config)),
                            .x_label = "prefill scheduling policy",
                            .y_label = "time to first token (s)",
                            .kind = PlotKind::kBars,
                            .categories = policies,
                            .series = {mean, p90}}}};
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
  Plot plot{
      .title = fmt::format("Prefix hit ratio: one global pool vs {} per-instance caches (cache-aware, {})",
                           instances, cluster_name(in.config)),
      .x_label = "total cache capacity (tokens)",
      .y_label = "prefix hit ratio (% of input tokens)",
      .log_x = true};
  std::vector<std::vector<std::string>> rows;
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
      cluster::ClusterConfig config = in.config;
      config.prefill_cache_capacity_tokens = kCapacitiesTokens[i] / instances;
      const std::string label = fmt::format("{} {:g}M tokens", name, kCapacitiesTokens[i] / 1e6);
      auto result = simulate(in, config, in.traces[t], {.policy = conductor::PrefillPolicy::kCacheAware},
                             progress, label);
      if (!result.ok()) return result.status();
      const std::optional<double> local_hit_ratio =
          summarize(out, "cache-capacity", label, *result, config.slo).hit_ratio;
      const std::optional<double> global_hit_ratio = stats.hit_ratio_by_capacity[i].hit_ratio;
      points.push_back({{"capacity_tokens", kCapacitiesTokens[i]},
                        {"local_hit_ratio", json_or_null(local_hit_ratio)},
                        {"global_hit_ratio", json_or_null(global_hit_ratio)}});
      global.x.push_back(static_cast<double>(kCapacitiesTokens[i]));
      local.x.push_back(static_cast<double>(kCapacitiesTokens[i]));
      global.y.push_back(cluster::or_nan(global_hit_ratio) * 100);
      local.y.push_back(cluster::or_nan(local_hit_ratio) * 100);
      rows.push_back({name, fmt::format("{:g}M", kCapacitiesTokens[i] / 1e6), percent_cell(global_hit_ratio),
                      percent_cell(local_hit_ratio), percent_cell(stats.reuse_ceiling)});
    }
    const double ceiling = cluster::or_nan(stats.reuse_ceiling) * 100;
    plot.series.push_back(std::move(global));
    plot.series.push_back(std::move(local));
    plot.series.push_back(
        {.name = name + ": reuse ceiling",
         .x = {static_cast<double>(kCapacitiesTokens.front()), static_cast<double>(kCapacitiesTokens.back())},
         .y = {ceiling, ceiling},
         .style = LineStyle::kReference,
         .color = color});
    out.fields["traces"].push_back({{"name", name},
                                    {"path", in.trace_records[t]},
                                    {"ceiling", json_or_null(stats.reuse_ceiling)},
                                    {"points", std::move(points)}});
  }
  out.table = text_table({"trace", "capacity (tokens)", "global pool hit",
                          fmt::format("{} local caches hit", instances), "ceiling"},
                         rows);
  out.figure = {.panels = {std::move(plot)}};
  return out;
}

// The TBT thresholds (seconds) of the capacity experiment: its own grid, 100 to 1,000 ms by 100, and the
// config's thresholds, ascending, each once.
std::vector<double> capacity_thresholds_s(const cluster::SloConfig& slo) {
  std::set<int64_t> micros;  // whole microseconds, so 0.1 from the grid and from a config are one point
  for (int ms = 100; ms <= 1000; ms += 100) micros.insert(ms * 1000);
  for (double s : slo.tbt_s) micros.insert(std::llround(s * 1e6));
  std::vector<double> out;
  for (int64_t us : micros) out.push_back(static_cast<double>(us) / 1e6);
  return out;
}

// Paper Figures 1, 6, 7: effective request capacity versus TBT threshold for Mooncake's disaggregated
// architecture and the colocated (vLLM-style) baselines, on the same nodes.
Result<Output> run_capacity(const Inputs& in) {
  const std::vector<std::string> systems = sim::system_names();
  ProgressLine progress("capacity", static_cast<int>(systems.size()));
  const uint32_t nodes = in.config.prefill_instances + in.config.decode_instances;
  Output out;
  out.fields["requests"] = in.traces[0].size();
  out.fields["nodes"] = nodes;
  out.fields["ttft_slo_s"] = in.config.slo.ttft_s;
  Json config_thresholds = Json::array();
  for (double s : in.config.slo.tbt_s) config_thresholds.push_back(ms_json(s * 1000));
  out.fields["config_tbt_slo_ms"] = std::move(config_thresholds);
  out.fields["systems"] = Json::array();
  Plot plot{
      .title = fmt::format("Effective request capacity: {}", run_name(in, in.config)),
      .x_label = "TBT threshold (ms)",
      .y_label = fmt::format("requests with TTFT <= {:g} s and TBT <= threshold (%)", in.config.slo.ttft_s),
      .y_from_zero = false};  // the systems differ by a few points: zoom to the data
  // Effective capacity at each threshold = SLO attainment over all requests (rejected ones miss).
  const cluster::SloConfig thresholds{.ttft_s = in.config.slo.ttft_s,
                                      .tbt_s = capacity_thresholds_s(in.config.slo)};
  std::vector<std::string> header{"system"};
  std::set<int64_t> config_us;  // the config's thresholds, whole microseconds: the table's columns
  for (double s : in.config.slo.tbt_s) {
    if (config_us.insert(std::llround(s * 1e6)).second)
      header.push_back(fmt::format("TBT <= {:g} ms", s * 1000));
  }
  header.insert(header.end(), {"mean TTFT", "mean TBT"});
  std::vector<std::vector<std::string>> rows;
  for (const std::string& name : systems) {
    const sim::System system = *sim::parse_system(name);
    auto result = simulate(in, in.config, in.traces[0], {.system = system}, progress, name);
    if (!result.ok()) return result.status();
    const cluster::PolicyReport report = summarize(out, "capacity", name, *result, thresholds);
    Json points = Json::array();
    PlotSeries series{.name = name};
    std::vector<std::string> row{name};
    for (const cluster::SloAttainment& a : report.slo_attainment_by_tbt) {
      const double tbt_ms = a.tbt_slo_s * 1000;
      points.push_back({{"tbt_slo_ms", ms_json(tbt_ms)}, {"effective_capacity", a.attainment}});
      series.x.push_back(tbt_ms);
      series.y.push_back(a.attainment * 100);
      if (config_us.count(std::llround(a.tbt_slo_s * 1e6))) row.push_back(percent_cell(a.attainment));
    }
    row.insert(row.end(), {seconds_cell(report.ttft_mean_s), ms_cell(report.tbt_mean_s)});
    rows.push_back(std::move(row));
    out.fields["systems"].push_back({{"name", name},
                                     {"ttft_mean_s", json_or_null(report.ttft_mean_s)},
                                     {"tbt_mean_s", json_or_null(report.tbt_mean_s)},
                                     {"tbt_p99_s", json_or_null(report.tbt_p99_s)},
                                     {"hit_ratio", json_or_null(report.hit_ratio)},
                                     {"points", std::move(points)}});
    plot.series.push_back(std::move(series));
  }
  out.table = text_table(header, rows);
  out.figure = {.panels = {std::move(plot)}};
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
// The figure, for every policy ("none" included): the prefill queue over time (log scale: "none"'s dwarfs
// the others); the decode pool's load over time with its 100% line and a vertical line where each policy's
// load first passes it; the rejected requests and goodput.
Result<Output> run_overload(const Inputs& in) {
  constexpr double kSampleIntervalS = 10;
  const std::vector<std::string> admissions = conductor::admission_names();
  ProgressLine progress("overload", static_cast<int>(admissions.size()));
  Output out;
  out.fields["requests"] = in.traces[0].size();
  out.fields["policy"] = "global-cache-aware";
  out.fields["load_sample_interval_s"] = kSampleIntervalS;
  out.fields["policies"] = Json::array();
  Plot prefill_panel{.title = "Prefill pool",
                     .x_label = "virtual time (s)",
                     .y_label = "queued prefill work, mean per instance (s, log scale)",
                     .log_y = true};
  Plot decode_panel{.title = "Decode pool",
                    .x_label = "virtual time (s)",
                    .y_label = "HBM KV reserved by running and waiting requests (%)"};
  PlotSeries rejected{.name = "rejected requests"};
  PlotSeries goodput{.name = "goodput (req/s)", .right_axis = true};
  std::vector<PlotSeries> crossings;  // where a policy's decode load first passes 100%
  std::vector<std::vector<std::string>> rows;
  double last_time_s = 0, highest_decode = 100;
  for (size_t a = 0; a < admissions.size(); ++a) {
    const std::string& name = admissions[a];
    auto result =
        simulate(in, in.config, in.traces[0],
                 {.admission = *conductor::parse_admission(name), .load_sample_interval_s = kSampleIntervalS},
                 progress, name);
    if (!result.ok()) return result.status();
    const cluster::PolicyReport r = summarize(out, "overload", name, *result, in.config.slo);
    Json series = Json::array();
    PlotSeries prefill{.name = name, .color = static_cast<int>(a)};
    PlotSeries decode{.name = name, .color = static_cast<int>(a)};
    std::optional<double> decode_full_s;  // first sample above 100%
    for (const cluster::LoadSample& s : result->load_series) {
      series.push_back({{"time_s", s.time_s},
                        {"prefill_queue_s", s.prefill_queue_s},
                        {"decode_kv_share", s.decode_kv_share},
                        {"decode_running", s.decode_running},
                        {"decode_waiting", s.decode_waiting}});
      prefill.x.push_back(s.time_s);
      prefill.y.push_back(s.prefill_queue_s);
      decode.x.push_back(s.time_s);
      decode.y.push_back(s.decode_kv_share * 100);
      if (!decode_full_s && s.decode_kv_share > 1) decode_full_s = s.time_s;
      last_time_s = std::max(last_time_s, s.time_s);
      highest_decode = std::max(highest_decode, s.decode_kv_share * 100);
    }
    Json p = cluster::to_json(r);
    p["load_correlation"] = correlation(prefill.y, decode.y);
    p["decode_over_capacity_from_s"] = json_or_null(decode_full_s);
    p["load_series"] = std::move(series);
    out.fields["policies"].push_back(std::move(p));
    prefill_panel.series.push_back(std::move(prefill));
    decode_panel.series.push_back(std::move(decode));
    if (decode_full_s) {
      crossings.push_back({.name = fmt::format("{}: over 100% from {:g} s", name, *decode_full_s),
                           .x = {*decode_full_s, *decode_full_s},
                           .style = LineStyle::kReference,
                           .color = static_cast<int>(a)});
    }
    rejected.y.push_back(static_cast<double>(r.rejected));
    goodput.y.push_back(r.goodput_rps);
    rows.push_back({name, std::to_string(r.rejected),
                    fmt::format("{}/{}/{}/{}", r.rejected_ttft, r.rejected_tbt, r.rejected_decode_capacity,
                                r.rejected_context_length),
                    std::to_string(r.completed), fmt::format("{:.2f}", r.goodput_rps),
                    percent_cell(r.slo_attainment_accepted), seconds_cell(r.ttft_mean_s),
                    ms_cell(r.tbt_p99_s), decode_full_s ? fmt::format("{:g} s", *decode_full_s) : "never"});
  }
  decode_panel.series.push_back({.name = "HBM KV capacity (100%)",
                                 .x = {0, last_time_s},
                                 .y = {100, 100},
                                 .style = LineStyle::kReference,
                                 .color = 6});
  for (PlotSeries& crossing : crossings) {
    crossing.y = {0, highest_decode};
    decode_panel.series.push_back(std::move(crossing));
  }
  Plot outcomes{.title = fmt::format("Outcomes (SLO: TTFT <= {:g} s, TBT <= {:g} ms)", in.config.slo.ttft_s,
                                     in.config.slo.tbt_s.front() * 1000),
                .x_label = "admission policy",
                .y_label = "rejected requests",
                .y2_label = "goodput (requests/s meeting both SLOs)",
                .integer_y = true,
                .kind = PlotKind::kBars,
                .categories = admissions,
                .series = {rejected, goodput}};
  out.table = text_table({"admission", "rejected", "ttft/tbt/decode/context", "completed", "goodput (req/s)",
                          "SLO of accepted", "mean TTFT", "TBT p99", "decode > 100% from"},
                         rows);
  out.figure = {.title = fmt::format("Overload control: {}", run_name(in, in.config)),
                .panels = {std::move(prefill_panel), std::move(decode_panel), std::move(outcomes)},
                .columns = 3,
                .width_px = 1800,
                .height_px = 600};
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
  std::vector<std::vector<std::string>> rows;
  for (uint32_t prefill = 1; prefill < nodes; ++prefill) {
    cluster::ClusterConfig config = in.config;
    config.prefill_instances = prefill;
    config.decode_instances = nodes - prefill;
    const std::string label = fmt::format("{}P/{}D", prefill, nodes - prefill);
    auto result = simulate(in, config, in.traces[0], {}, progress, label);
    if (!result.ok()) return result.status();
    const cluster::PolicyReport r = summarize(out, "pd-ratio", label, *result, config.slo);
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
    ttft.y.push_back(cluster::or_nan(r.ttft_mean_s));
    tbt.x.push_back(prefill);
    tbt.y.push_back(cluster::or_nan(r.tbt_mean_s));
    rows.push_back({label, percent_cell(effective), seconds_cell(r.ttft_mean_s), ms_cell(r.tbt_mean_s)});
  }
  out.table = text_table({"split", "effective capacity", "mean TTFT", "mean TBT"}, rows);
  out.figure = {
      .panels = {{.title = fmt::format("Prefill/decode splits of {} nodes of {}, {}: {} x{:g} ({})", nodes,
                                       in.config.hardware.name, in.config.model.name,
                                       trace_name(in.trace_paths[0]), in.time_scale, in.config.name),
                  .x_label = fmt::format("prefill instances (decode = {} - prefill)", nodes),
                  .y_label = "effective request capacity (%)",
                  .y2_label = "mean TTFT and mean TBT (s, log scale)",
                  .log_y2 = true,
                  .integer_x = true,
                  .series = {capacity, ttft, tbt}}}};
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

Result<Inputs> load_inputs(const Experiment& experiment, const ExperimentOptions& options) {
  Inputs in;
  in.time_scale = options.time_scale.value_or(experiment.default_time_scale);
  in.block_size_tokens = options.block_size_tokens;
  in.trace_paths = options.traces;
  in.trace_records = options.traces;
  if (in.trace_paths.empty()) {
    std::vector<std::string_view> defaults{kConversationTrace};
    if (experiment.several_traces) defaults.push_back(kSyntheticTrace);
    for (std::string_view relative : defaults) {
      auto path = bundled_file(relative);
      if (!path.ok()) return path.status();
      in.trace_paths.push_back(*path);
      in.trace_records.emplace_back(relative);
    }
  } else if (in.trace_paths.size() > 1 && !experiment.several_traces) {
    return Status::invalid_argument(
        fmt::format("experiment '{}' takes one --trace, got {}", experiment.name, in.trace_paths.size()));
  }
  std::string config_path = options.config_path;
  if (config_path.empty()) {
    auto bundled = bundled_file(kDefaultConfig);
    if (!bundled.ok()) return bundled.status();
    config_path = *bundled;
  }
  auto config = cluster::load_cluster_config(config_path, in.block_size_tokens);
  if (!config.ok()) return config.status();
  in.config = std::move(*config);
  if (!options.profile_path.empty()) {
    auto profile = perf::load_profile(options.profile_path);
    if (!profile.ok()) return profile.status();
    in.config.profile = *profile;
  }
  CRESCENT_RETURN_IF_ERROR(
      sim::validate(in.config, {.block_size_tokens = in.block_size_tokens, .time_scale = in.time_scale}));
  for (const auto& path : in.trace_paths) {
    auto requests = trace::read_trace(path, {.block_size_tokens = in.block_size_tokens});
    if (!requests.ok()) return requests.status();
    if (requests->empty()) return trace::empty_trace_error(path, {});
    in.traces.push_back(std::move(*requests));
  }
  return in;
}

// How a result was made: the experiment, its inputs and options.
Json provenance(const Experiment& experiment, const Inputs& in) {
  Json j;
  j["experiment"] = experiment.name;
  if (!experiment.several_traces) j["trace"] = in.trace_records.front();  // else in the experiment's "traces"
  j["config"] = cluster::to_json(in.config);
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

Result<ExperimentSummary> run_experiment(std::string_view name, const ExperimentOptions& options) {
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
  auto fail = [&](Status status) -> Result<ExperimentSummary> {
    if (created_dir) std::filesystem::remove(options.out_dir, ignored);  // only removes it while empty
    return status;
  };

  auto output = experiment->run(*in);
  if (!output.ok()) return fail(output.status());
  auto svg = render_svg(output->figure);
  if (!svg.ok()) return fail(svg.status());
  Json j = provenance(*experiment, *in);
  j.update(output->fields);

  // Both files written in full before either replaces an older one; the JSON is renamed last.
  const std::filesystem::path base = std::filesystem::path(options.out_dir) / name;
  const std::string svg_path = base.string() + ".svg";
  const std::string json_text = j.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
  const FileContent files[] = {{svg_path, *svg}, {base.string() + ".json", json_text}};
  if (Status written = write_files_atomically(files); !written.ok()) return fail(written);
  return ExperimentSummary{.table = std::move(output->table),
                           .warnings = std::move(output->warnings),
                           .json_path = base.string() + ".json",
                           .svg_path = svg_path};
}

}  // namespace crescent::experiment
