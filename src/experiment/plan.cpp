#include "experiment/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>
#include <nlohmann/json.hpp>
#include <numeric>
#include <tuple>
#include <unordered_set>

#include "common/json_util.h"
#include "common/parallel.h"
#include "common/status_line.h"
#include "common/text_format.h"
#include "perf/cost_model.h"
#include "perf/model_spec.h"
#include "sim/simulator.h"

namespace crescent::experiment {
namespace {

constexpr double kInfinity = std::numeric_limits<double>::infinity();

// The necessary condition of docs/plan.md "The bound": a disaggregated cluster of P prefill and D decode
// instances can only meet the target when its prefill instances have the GPU time, and its decode instances
// the KV-token-seconds, that the cheapest `needed` requests take at the least, within the window in which
// requests meeting their SLOs must be served.
class PlanBound {
 public:
  PlanBound(const cluster::ClusterConfig& base, std::span<const trace::Request> trace, double target,
            int64_t block_size_tokens) {
    const perf::CostModel cost = cluster::cost_model(base);
    const double ttft_slo_s = base.slo.ttft_s;
    const double tbt_slo_s = base.slo.tbt_s.front();
    // The fewest requests meeting the SLOs that reach the target, as cluster::summarize computes attainment
    // (met / all, in doubles).
    const auto n = static_cast<double>(trace.size());
    needed_ = static_cast<size_t>(std::ceil(target * n));
    while (needed_ > 0 && static_cast<double>(needed_ - 1) / n >= target) --needed_;
    while (needed_ < trace.size() && static_cast<double>(needed_) / n < target) ++needed_;
    std::unordered_set<BlockKey> seen;
    prefill_s_.reserve(trace.size());
    decode_kv_token_s_.reserve(trace.size());
    int64_t longest_decode_tokens = 0;
    for (const trace::Request& r : trace) {
      // The longest prefix any cache could hold: leading blocks some earlier request had (an unbounded
      // cache).
      size_t reusable_blocks = 0;
      while (reusable_blocks < r.block_keys.size() && seen.count(r.block_keys[reusable_blocks])) {
        ++reusable_blocks;
      }
      for (BlockKey key : r.block_keys) seen.insert(key);
      const int64_t hit = std::min(r.input_tokens, static_cast<int64_t>(reusable_blocks) * block_size_tokens);
      // Prefill GPU time with that hit: Eq. 1's FLOPs of the rest, without iteration overheads, weight reads
      // or prefix loading (each only adds).
      const double prefill_s = std::max(0.0, cost.prefill_time_s(r.input_tokens - hit, hit));
      // Every decode step holding the request takes at least a batch of it alone; each of its gaps is one
      // such step, and its TBT (the mean of its longest gaps) is at least that.
      const double step_s = std::max(0.0, cost.decode_step_time_s(1, r.input_tokens));
      // (With a relative slack, so that a rounding in the simulator's clock cannot make one meet them.)
      const bool possible = prefill_s <= ttft_slo_s * (1 + kSlack) &&
                            (r.output_tokens < 2 || step_s <= tbt_slo_s * (1 + kSlack));
      if (!possible) ++impossible_;
      prefill_s_.push_back(possible ? prefill_s : kInfinity);
      // A decode instance reserves prompt + output tokens of KV when the request joins its batch and keeps
      // them through its output - 1 steps (engine::EngineCore).
      const double held_s = static_cast<double>(std::max<int64_t>(0, r.output_tokens - 1)) * step_s;
      decode_kv_token_s_.push_back(possible ? static_cast<double>(r.input_tokens + r.output_tokens) * held_s
                                            : kInfinity);
      longest_decode_tokens = std::max(longest_decode_tokens, r.output_tokens - 1);
    }
    std::sort(prefill_s_.begin(), prefill_s_.end());
    std::sort(decode_kv_token_s_.begin(), decode_kv_token_s_.end());
    prefill_need_s_ = sum_of_first(prefill_s_, needed_);
    decode_need_kv_token_s_ = sum_of_first(decode_kv_token_s_, needed_);
    span_s_ =
        trace.empty() ? 0 : static_cast<double>(trace.back().timestamp_ms - trace.front().timestamp_ms) / 1e3;
    ttft_slo_s_ = ttft_slo_s;
    longest_decode_s_ = static_cast<double>(longest_decode_tokens) * tbt_slo_s;
    decode_kv_capacity_tokens_ = static_cast<double>(cluster::decode_kv_capacity_tokens(base));
  }

  // Whether P prefill and D decode instances cannot meet the target at `rate_scale`.
  bool rules_out(uint32_t prefill, uint32_t decode, double rate_scale) const {
    if (!std::isfinite(prefill_need_s_) || !std::isfinite(decode_need_kv_token_s_)) return true;
    // Requests meeting their SLOs arrive after the first arrival, and finish prefill by the last arrival plus
    // the TTFT SLO, decode by then plus the longest output at the TBT SLO.
    const double prefill_window_s = span_s_ / rate_scale + ttft_slo_s_;
    const double decode_window_s = prefill_window_s + longest_decode_s_;
    return prefill_need_s_ > static_cast<double>(prefill) * prefill_window_s * (1 + kSlack) ||
           decode_need_kv_token_s_ >
               static_cast<double>(decode) * decode_kv_capacity_tokens_ * decode_window_s * (1 + kSlack);
  }

  // Requests that cannot meet the SLOs on any cluster, disaggregated or colocated: their prefill alone
  // (with every reusable prefix hit) takes longer than the TTFT SLO, or a decode step of them alone longer
  // than the TBT SLO (a colocated iteration is no shorter than either).
  size_t impossible_requests() const { return impossible_; }
  // Whether too few requests can meet the SLOs for the target: then no cluster reaches it.
  bool hopeless() const { return prefill_s_.size() - impossible_ < needed_; }

  // How much room a split has: the smaller of its pools' capacity over need (> 1: both pools have room).
  double headroom(uint32_t prefill, uint32_t decode, double rate_scale) const {
    const double prefill_window_s = span_s_ / rate_scale + ttft_slo_s_;
    const double p = static_cast<double>(prefill) * prefill_window_s / std::max(prefill_need_s_, 1e-12);
    const double d = static_cast<double>(decode) * decode_kv_capacity_tokens_ *
                     (prefill_window_s + longest_decode_s_) / std::max(decode_need_kv_token_s_, 1e-12);
    return std::min(p, d);
  }

 private:
  static double sum_of_first(const std::vector<double>& sorted, size_t count) {
    if (count > sorted.size()) return kInfinity;
    double sum = 0;
    for (size_t i = 0; i < count; ++i) sum += sorted[i];
    return sum;
  }

  static constexpr double kSlack = 1e-9;
  size_t needed_ = 0;
  size_t impossible_ = 0;
  std::vector<double> prefill_s_, decode_kv_token_s_;
  double prefill_need_s_ = 0, decode_need_kv_token_s_ = 0;
  double span_s_ = 0, ttft_slo_s_ = 0, longest_decode_s_ = 0, decode_kv_capacity_tokens_ = 0;
};

// The progress bar: candidates simulated of those in the current batch, and the whole search's count.
class PlanProgress {
 public:
  explicit PlanProgress(bool enabled) : enabled_(enabled) {}

  void start_batch(std::string label, size_t to_simulate) {
    const std::lock_guard lock(mutex_);
    label_ = std::move(label);
    batch_total_ = to_simulate;
    batch_done_ = 0;
    draw_locked();
  }
  void done_one() {
    const std::lock_guard lock(mutex_);
    ++batch_done_;
    ++total_done_;
    draw_locked();
  }

 private:
  void draw_locked() {
    if (!enabled_ || !line_.due()) return;
    const double elapsed_s = std::chrono::duration<double>(Clock::now() - started_).count();
    line_.draw(fmt::format("[plan] {}: {}/{} simulated ({} in all, {:.0f} s)", label_, batch_done_,
                           batch_total_, total_done_, elapsed_s));
  }

  using Clock = std::chrono::steady_clock;
  bool enabled_;
  std::mutex mutex_;
  StatusLine line_;
  std::string label_;
  size_t batch_total_ = 0, batch_done_ = 0, total_done_ = 0;
  Clock::time_point started_ = Clock::now();
};

class Planner {
 public:
  Planner(const cluster::ClusterConfig& base, std::span<const trace::Request> trace,
          const PlanOptions& options)
      : base_(base),
        trace_(trace),
        options_(options),
        bound_(base, trace, options.attainment_target, options.block_size_tokens),
        progress_(options.progress) {}

  Result<PlanResult> run() {
    const auto started = std::chrono::steady_clock::now();
    result_.cache_capacities_tokens = cache_capacities();
    result_.requests = static_cast<int64_t>(trace_.size());
    result_.impossible_requests = static_cast<int64_t>(bound_.impossible_requests());
    if (bound_.hopeless()) {
      // No cluster of any size or split reaches the target: nothing to search.
      result_.hopeless = true;
      result_.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      return std::move(result_);
    }
    Status status = options_.node_budget > 0 ? search_load() : search_nodes();
    if (!status.ok()) return status;
    choose_answer();
    result_.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return std::move(result_);
  }

 private:
  // Prefill cache capacities searched: the most the DRAM holds, its half and its quarter, in whole blocks.
  std::vector<int64_t> cache_capacities() const {
    const int64_t block = options_.block_size_tokens;
    const double kv_bytes = static_cast<double>(std::max<int64_t>(1, perf::kv_bytes_per_token(base_.model)));
    const double most_tokens = std::min(options_.cache_dram_bytes / kv_bytes, 1e15);
    std::vector<int64_t> out;
    for (double share : {0.25, 0.5, 1.0}) {
      const int64_t tokens = std::max<int64_t>(1, static_cast<int64_t>(most_tokens * share) / block) * block;
      if (out.empty() || out.back() != tokens) out.push_back(tokens);
    }
    return out;
  }

  // The disaggregated candidates of `nodes` nodes at `rate_scale`, then the colocated ones when asked.
  std::vector<PlanCandidate> candidates_at(uint32_t nodes, double rate_scale, bool disaggregated,
                                           bool colocated) const {
    std::vector<PlanCandidate> out;
    if (disaggregated) {
      for (uint32_t prefill = 1; prefill < nodes; ++prefill) {
        const bool ruled_out = bound_.rules_out(prefill, nodes - prefill, rate_scale);
        for (int64_t cache : result_.cache_capacities_tokens) {
          for (conductor::Admission admission : options_.admissions) {
            out.push_back({.nodes = nodes,
                           .prefill_instances = prefill,
                           .decode_instances = nodes - prefill,
                           .prefill_cache_capacity_tokens = cache,
                           .admission = admission,
                           .rate_scale = rate_scale,
                           .bound_rules_out = ruled_out});
          }
        }
      }
    }
    if (colocated) {
      for (sim::System system : options_.colocated_systems) {
        out.push_back({.nodes = nodes,
                       .system = system,
                       .prefill_cache_capacity_tokens = base_.prefill_cache_capacity_tokens,
                       .rate_scale = rate_scale});
      }
    }
    return out;
  }

  // Simulates candidates [first, end) of result_.candidates that are not yet simulated and not ruled out,
  // `chunk` at a time in order (0: all at once), stopping after the first chunk in which one meets the target
  // when `until_one_meets`. Returns whether one of [first, end) meets it.
  Result<bool> evaluate(size_t first, size_t end, std::string label, bool until_one_meets = false,
                        size_t chunk = 0) {
    std::vector<size_t> to_run;
    for (size_t i = first; i < end; ++i) {
      PlanCandidate& c = result_.candidates[i];
      if (c.simulated) continue;
      if (c.bound_rules_out && options_.prune) continue;
      to_run.push_back(i);
    }
    progress_.start_batch(std::move(label), to_run.size());
    if (chunk == 0) chunk = std::max<size_t>(1, to_run.size());
    bool met = std::any_of(result_.candidates.begin() + static_cast<std::ptrdiff_t>(first),
                           result_.candidates.begin() + static_cast<std::ptrdiff_t>(end),
                           [](const PlanCandidate& c) { return c.meets; });
    size_t start = 0;
    for (; start < to_run.size() && !(until_one_meets && met); start += chunk) {
      const size_t count = std::min(chunk, to_run.size() - start);
      std::vector<std::optional<Result<cluster::RunResult>>> runs(count);
      parallel_for(count, options_.threads, [&](size_t k) {
        const PlanCandidate& c = result_.candidates[to_run[start + k]];
        runs[k].emplace(sim::simulate(candidate_config(base_, c), trace_,
                                      {.system = c.system,
                                       .policy = conductor::PrefillPolicy::kGlobalCacheAware,
                                       .admission = c.admission,
                                       .block_size_tokens = options_.block_size_tokens,
                                       .time_scale = c.rate_scale,
                                       .chunked_prefill_tokens = options_.chunked_prefill_tokens}));
        progress_.done_one();
      });
      for (size_t k = 0; k < count; ++k) {
        if (!runs[k]->ok()) return runs[k]->status();
        PlanCandidate& c = result_.candidates[to_run[start + k]];
        c.simulated = true;
        c.report = cluster::summarize(candidate_name(c), **runs[k], base_.slo);
        c.meets = c.report->slo_attainment >= options_.attainment_target;
        met = met || c.meets;
        ++result_.simulations;
      }
    }
    result_.skipped += static_cast<int64_t>(to_run.size() - std::min(start, to_run.size()));
    return met;
  }

  void add(std::vector<PlanCandidate> batch) {
    for (PlanCandidate& c : batch) result_.candidates.push_back(std::move(c));
  }

  // Fewest nodes at options_.rate_scale. Node counts are tried from 2 up, every split, cache and admission
  // of each (less those the bound rules out), and the colocated baselines, until the first node count with a
  // candidate meeting the target, one more for disaggregated candidates (the runner-up), and until the
  // colocated baselines meet it too, at most twice the first node count that met it.
  Status search_nodes() {
    std::optional<uint32_t> disaggregated_met, colocated_met;
    for (uint32_t nodes = 2; nodes <= options_.max_nodes; ++nodes) {
      const std::optional<uint32_t> first_met = disaggregated_met && colocated_met
                                                    ? std::min(*disaggregated_met, *colocated_met)
                                                    : (disaggregated_met ? disaggregated_met : colocated_met);
      const uint32_t limit = first_met ? std::min(options_.max_nodes, 2 * *first_met) : options_.max_nodes;
      if (nodes > limit) break;
      const bool disaggregated = !disaggregated_met || nodes == *disaggregated_met + 1;
      const bool colocated = !colocated_met && !options_.colocated_systems.empty();
      if (!disaggregated && !colocated) break;
      const size_t first = result_.candidates.size();
      add(candidates_at(nodes, options_.rate_scale, disaggregated, colocated));
      result_.pruned += count_pruned(first);
      if (colocated) result_.colocated_searched_to_nodes = nodes;
      auto met = evaluate(first, result_.candidates.size(), fmt::format("{} nodes", nodes));
      if (!met.ok()) return met.status();
      for (size_t i = first; i < result_.candidates.size(); ++i) {
        const PlanCandidate& c = result_.candidates[i];
        if (!c.meets) continue;
        auto& found = c.system == sim::System::kDisaggregated ? disaggregated_met : colocated_met;
        if (!found) found = nodes;
      }
    }
    return Status();
  }

  // Highest load for options_.node_budget nodes: from options_.rate_scale, doubled (or halved) until a probe
  // meets the target and one does not (at most 8 times), then 5 bisections of the ratio between them. A probe
  // simulates the load's candidates in order of the bound's headroom, 8 at a time, until one meets the
  // target; at the highest load that met, every candidate is simulated to choose among them.
  Status search_load() {
    const uint32_t nodes = options_.node_budget;
    std::optional<double> met_scale, missed_scale;
    std::optional<size_t> met_first;
    const double span_s =
        trace_.empty() ? 0
                       : static_cast<double>(trace_.back().timestamp_ms - trace_.front().timestamp_ms) / 1e3;
    auto probe = [&](double scale) -> Result<bool> {
      const size_t first = result_.candidates.size();
      std::vector<PlanCandidate> batch = candidates_at(nodes, scale, true, true);
      std::stable_sort(batch.begin(), batch.end(), [&](const PlanCandidate& a, const PlanCandidate& b) {
        return headroom(a) > headroom(b);
      });
      add(std::move(batch));
      result_.pruned += count_pruned(first);
      auto met = evaluate(first, result_.candidates.size(), fmt::format("{} nodes at x{:.3g}", nodes, scale),
                          true, 8);
      if (!met.ok()) return met.status();
      result_.probed_rate_scales.push_back(scale);
      result_.probe_met.push_back(*met);
      if (*met) {
        met_scale = scale;
        met_first = first;
      } else {
        missed_scale = scale;
      }
      return *met;
    };
    double scale = options_.rate_scale;
    auto met = probe(scale);
    if (!met.ok()) return met.status();
    // Doubled up to 2^20 times; halved while the slowed trace stays within the simulator's clock (1e9 s).
    for (int step = 0; step < 20 && (!met_scale || !missed_scale); ++step) {
      if (!*met && span_s / (scale / 2) > 1e8) break;
      scale = *met ? scale * 2 : scale / 2;
      met = probe(scale);
      if (!met.ok()) return met.status();
    }
    result_.highest_load_is_search_limit = met_scale && !missed_scale;
    if (met_scale && missed_scale) {
      for (int step = 0; step < 5; ++step) {
        auto m = probe(std::sqrt(*met_scale * *missed_scale));
        if (!m.ok()) return m.status();
      }
    }
    if (met_first) {
      size_t end = *met_first;
      while (end < result_.candidates.size() && result_.candidates[end].rate_scale == *met_scale) ++end;
      // Every candidate of the highest load that met, simulated: the probe stopped at its first.
      auto all = evaluate(*met_first, end, fmt::format("{} nodes at x{:.3g}, all", nodes, *met_scale));
      if (!all.ok()) return all.status();
    }
    return Status();
  }

  double headroom(const PlanCandidate& c) const {
    if (c.system != sim::System::kDisaggregated) return 0;  // colocated baselines after the splits
    return bound_.headroom(c.prefill_instances, c.decode_instances, c.rate_scale);
  }

  int64_t count_pruned(size_t first) const {
    if (!options_.prune) return 0;
    return std::count_if(result_.candidates.begin() + static_cast<std::ptrdiff_t>(first),
                         result_.candidates.end(), [](const PlanCandidate& c) { return c.bound_rules_out; });
  }

  // recommended and runner-up: fewest nodes (node budget: highest load), then highest attainment, goodput,
  // smallest cache, then the order considered.
  void choose_answer() {
    std::vector<size_t> met;
    for (size_t i = 0; i < result_.candidates.size(); ++i) {
      if (result_.candidates[i].meets) met.push_back(i);
    }
    const bool budget = options_.node_budget > 0;
    std::stable_sort(met.begin(), met.end(), [&](size_t a, size_t b) {
      const PlanCandidate& x = result_.candidates[a];
      const PlanCandidate& y = result_.candidates[b];
      if (budget && x.rate_scale != y.rate_scale) return x.rate_scale > y.rate_scale;
      if (x.nodes != y.nodes) return x.nodes < y.nodes;
      if (x.report->slo_attainment != y.report->slo_attainment)
        return x.report->slo_attainment > y.report->slo_attainment;
      if (x.report->goodput_rps != y.report->goodput_rps)
        return x.report->goodput_rps > y.report->goodput_rps;
      return x.prefill_cache_capacity_tokens < y.prefill_cache_capacity_tokens;
    });
    if (met.empty()) return;
    result_.recommended = met[0];
    const PlanCandidate& rec = result_.candidates[*result_.recommended];
    // The runner-up is another cluster: not the recommended one with only its cache or admission changed.
    for (size_t i : met) {
      const PlanCandidate& c = result_.candidates[i];
      const bool other_cluster =
          c.nodes != rec.nodes || c.system != rec.system || c.prefill_instances != rec.prefill_instances;
      if (other_cluster && (!budget || c.rate_scale == rec.rate_scale)) {
        result_.runner_up = i;
        break;
      }
    }
    auto best_where = [&](auto&& keep) {
      std::optional<size_t> best;
      for (size_t i = 0; i < result_.candidates.size(); ++i) {
        const PlanCandidate& c = result_.candidates[i];
        if (!c.simulated || !keep(c)) continue;
        if (!best || c.report->slo_attainment > result_.candidates[*best].report->slo_attainment) best = i;
      }
      return best;
    };
    if (!budget) {
      result_.next_smaller = best_where([&](const PlanCandidate& c) { return c.nodes + 1 == rec.nodes; });
    }
    result_.best_colocated_same_nodes = best_where([&](const PlanCandidate& c) {
      return c.system != sim::System::kDisaggregated && c.nodes == rec.nodes &&
             c.rate_scale == rec.rate_scale;
    });
    if (!budget) {
      // The colocated candidate meeting the target with the fewest nodes, the highest attainment of those.
      for (size_t i = 0; i < result_.candidates.size(); ++i) {
        const PlanCandidate& c = result_.candidates[i];
        if (!c.meets || c.system == sim::System::kDisaggregated) continue;
        const auto& best = result_.colocated_fewest_nodes;
        if (!best || c.nodes < result_.candidates[*best].nodes ||
            (c.nodes == result_.candidates[*best].nodes &&
             c.report->slo_attainment > result_.candidates[*best].report->slo_attainment)) {
          result_.colocated_fewest_nodes = i;
        }
      }
    }
  }

  const cluster::ClusterConfig& base_;
  std::span<const trace::Request> trace_;
  const PlanOptions& options_;
  PlanBound bound_;
  PlanProgress progress_;
  PlanResult result_;
};

// "763k", "3.05M", "1.2T" tokens.
std::string cache_name(int64_t tokens) {
  const auto t = static_cast<double>(tokens);
  for (auto [scale, unit] : {std::pair{1e12, "T"}, {1e9, "G"}, {1e6, "M"}, {1e3, "k"}}) {
    if (t >= scale) return fmt::format("{:.3g}{}", t / scale, unit);
  }
  return std::to_string(tokens);
}

nlohmann::json candidate_json(const PlanCandidate& c) {
  nlohmann::json j = {{"name", candidate_name(c)},
                      {"nodes", c.nodes},
                      {"system", std::string(sim::to_string(c.system))},
                      {"rate_scale", c.rate_scale},
                      {"bound_rules_out", c.bound_rules_out},
                      {"simulated", c.simulated},
                      {"meets", c.meets}};
  if (c.system == sim::System::kDisaggregated) {
    j["prefill_instances"] = c.prefill_instances;
    j["decode_instances"] = c.decode_instances;
    j["prefill_cache_capacity_tokens"] = c.prefill_cache_capacity_tokens;
    j["admission"] = std::string(conductor::to_string(c.admission));
  }
  j["report"] = c.report ? cluster::to_json(*c.report) : nlohmann::json(nullptr);
  return j;
}

}  // namespace

std::string candidate_name(const PlanCandidate& c) {
  if (c.system != sim::System::kDisaggregated) return std::string(sim::to_string(c.system));
  return fmt::format("{}P+{}D {} cache, {}", c.prefill_instances, c.decode_instances,
                     cache_name(c.prefill_cache_capacity_tokens), conductor::to_string(c.admission));
}

cluster::ClusterConfig candidate_config(const cluster::ClusterConfig& base, const PlanCandidate& c) {
  cluster::ClusterConfig config = base;
  if (c.system == sim::System::kDisaggregated) {
    config.prefill_instances = c.prefill_instances;
    config.decode_instances = c.decode_instances;
    config.prefill_cache_capacity_tokens = c.prefill_cache_capacity_tokens;
  } else {
    config.prefill_instances = (c.nodes + 1) / 2;
    config.decode_instances = c.nodes - config.prefill_instances;
  }
  return config;
}

Result<PlanResult> plan(const cluster::ClusterConfig& base, std::span<const trace::Request> trace,
                        const PlanOptions& options) {
  if (!(options.attainment_target > 0 && options.attainment_target <= 1)) {
    return Status::invalid_argument(fmt::format(
        "attainment target {}: must be in (0, 1] (0.99: 99% of requests)", options.attainment_target));
  }
  if (!(options.rate_scale > 0) || !std::isfinite(options.rate_scale)) {
    return Status::invalid_argument(fmt::format("rate scale {}: must be > 0", options.rate_scale));
  }
  if (options.node_budget == 1) {
    return Status::invalid_argument("node budget 1: a disaggregated cluster needs at least 2 nodes");
  }
  if (options.max_nodes < 2) {
    return Status::invalid_argument(fmt::format("max nodes {}: must be >= 2", options.max_nodes));
  }
  if (!(options.cache_dram_bytes > 0) || !std::isfinite(options.cache_dram_bytes)) {
    return Status::invalid_argument(
        fmt::format("cache DRAM {} bytes: must be > 0", options.cache_dram_bytes));
  }
  if (options.node_budget > kMaxPlanNodes) {
    return Status::invalid_argument(
        fmt::format("node budget {}: at most {} nodes are planned", options.node_budget, kMaxPlanNodes));
  }
  if (options.max_nodes > kMaxPlanNodes) {
    return Status::invalid_argument(
        fmt::format("max nodes {}: at most {} nodes are planned", options.max_nodes, kMaxPlanNodes));
  }
  if (options.admissions.empty()) return Status::invalid_argument("no admission policy to search");
  for (size_t i = 0; i < options.admissions.size(); ++i) {
    if (std::count(options.admissions.begin(), options.admissions.end(), options.admissions[i]) > 1) {
      return Status::invalid_argument(
          fmt::format("admission policy '{}' is named twice", conductor::to_string(options.admissions[i])));
    }
  }
  if (options.node_budget > 0 && trace.size() > 1 &&
      trace.back().timestamp_ms == trace.front().timestamp_ms) {
    return Status::invalid_argument(
        "every request of the trace arrives at the same instant: there is no rate to scale (a node budget "
        "asks for the highest load; plan for the fewest nodes instead)");
  }
  if (trace.empty()) return Status::invalid_argument("the trace has no requests to plan for");
  if (base.slo.tbt_s.empty()) return Status::invalid_argument("the config's slo.tbt_s is empty");
  CRESCENT_RETURN_IF_ERROR(sim::validate(
      base, {.block_size_tokens = options.block_size_tokens, .time_scale = options.rate_scale}));
  return Planner(base, trace, options).run();
}

nlohmann::json to_json(const PlanResult& result, const PlanOptions& options) {
  nlohmann::json j;
  j["question"] = options.node_budget > 0 ? "highest-load" : "fewest-nodes";
  j["attainment_target"] = options.attainment_target;
  j["rate_scale"] = options.rate_scale;
  if (options.node_budget > 0) j["node_budget"] = options.node_budget;
  nlohmann::json search;
  search["max_nodes"] = options.max_nodes;
  search["cache_dram_bytes"] = options.cache_dram_bytes;
  search["cache_capacities_tokens"] = result.cache_capacities_tokens;
  search["admissions"] = nlohmann::json::array();
  for (auto a : options.admissions) search["admissions"].push_back(std::string(conductor::to_string(a)));
  search["colocated_systems"] = nlohmann::json::array();
  for (auto s : options.colocated_systems)
    search["colocated_systems"].push_back(std::string(sim::to_string(s)));
  search["prefill_policy"] = "global-cache-aware";
  search["prune"] = options.prune;
  search["candidates"] = result.candidates.size();
  search["simulated"] = result.simulations;
  search["pruned"] = result.pruned;
  search["skipped"] = result.skipped;
  search["colocated_searched_to_nodes"] = result.colocated_searched_to_nodes;
  search["wall_s"] = result.wall_s;
  j["search"] = std::move(search);
  auto at = [&](const std::optional<size_t>& i) {
    return i ? candidate_json(result.candidates[*i]) : nlohmann::json(nullptr);
  };
  j["impossible_requests"] = result.impossible_requests;
  j["hopeless"] = result.hopeless;
  if (options.node_budget > 0) j["highest_load_is_search_limit"] = result.highest_load_is_search_limit;
  j["recommended"] = at(result.recommended);
  j["runner_up"] = at(result.runner_up);
  j["next_smaller"] = at(result.next_smaller);
  j["best_colocated_same_nodes"] = at(result.best_colocated_same_nodes);
  j["colocated_fewest_nodes"] = at(result.colocated_fewest_nodes);
  if (options.node_budget > 0) {
    j["probes"] = nlohmann::json::array();
    for (size_t i = 0; i < result.probed_rate_scales.size(); ++i) {
      j["probes"].push_back(
          {{"rate_scale", result.probed_rate_scales[i]}, {"met", bool(result.probe_met[i])}});
    }
  }
  j["candidates"] = nlohmann::json::array();
  for (const PlanCandidate& c : result.candidates) j["candidates"].push_back(candidate_json(c));
  return j;
}

namespace {

// Two decimals, so that a near miss (98.96%) does not read as the target (99.0%).
std::string percent(double ratio) {
  return fmt::format("{:.2f}%", ratio * 100);
}

// "5 nodes, 4P+1D 763k cache, none: 99.62% meet the SLOs, goodput 3.31 req/s, mean TTFT 2.1 s" (with
// `load`, "at x3.91" after the node count).
std::string describe(const PlanCandidate& c, bool load = false) {
  const cluster::PolicyReport& r = *c.report;
  return fmt::format("{} nodes{}, {}: {} meet the SLOs, goodput {:.2f} req/s, mean TTFT {}", c.nodes,
                     load ? fmt::format(" at x{:.3g}", c.rate_scale) : "", candidate_name(c),
                     percent(r.slo_attainment), r.goodput_rps, format_or_na(r.ttft_mean_s, 1, 2, " s"));
}

}  // namespace

std::string format_plan(const PlanResult& result, const PlanOptions& options, const cluster::SloConfig& slo) {
  std::string out;
  const auto& cs = result.candidates;
  const bool budget = options.node_budget > 0;
  if (result.hopeless) {
    return fmt::format(
        "No cluster can meet the target: {} of the trace's requests cannot meet TTFT <= {:g} s and TBT <= "
        "{:g} "
        "ms on any node (their prefill alone, with every reusable prefix cached, takes longer than the TTFT "
        "SLO, or a decode step of them alone longer than the TBT SLO), so at most {} of requests can meet "
        "them, below the target {}. Loosen the SLOs (--ttft-slo, --tbt-slo) or the target (--attainment).\n",
        result.impossible_requests, slo.ttft_s, slo.tbt_s.front() * 1000,
        percent(1.0 - static_cast<double>(result.impossible_requests) /
                          static_cast<double>(std::max<int64_t>(1, result.requests))),
        percent(options.attainment_target));
  }
  if (result.recommended) {
    const PlanCandidate& rec = cs[*result.recommended];
    if (budget) {
      out += fmt::format(
          "Highest load {} for {} nodes: x{:.3g} the trace's rate, with {}\n",
          result.highest_load_is_search_limit ? "searched (the search's limit; it may take more)" : "found",
          options.node_budget, rec.rate_scale, describe(rec));
    } else {
      out += fmt::format("Recommended: {}\n", describe(rec));
    }
    if (result.runner_up) out += fmt::format("Runner-up:   {}\n", describe(cs[*result.runner_up], budget));
    if (!budget) {
      const bool split_ruled_out = std::any_of(cs.begin(), cs.end(), [&](const PlanCandidate& c) {
        return c.nodes + 1 == rec.nodes && c.system == sim::System::kDisaggregated && c.bound_rules_out;
      });
      const bool split_simulated = std::any_of(cs.begin(), cs.end(), [&](const PlanCandidate& c) {
        return c.nodes + 1 == rec.nodes && c.system == sim::System::kDisaggregated && c.simulated;
      });
      if (rec.nodes > 2 && split_ruled_out && !split_simulated) {
        out += fmt::format(
            "One node fewer ({}): every prefill/decode split is ruled out by the bound{}\n", rec.nodes - 1,
            result.next_smaller
                ? fmt::format("; the best colocated there, {}", describe(cs[*result.next_smaller]))
                : "");
      } else if (result.next_smaller) {
        out += fmt::format("One node fewer misses: the best there, {}\n", describe(cs[*result.next_smaller]));
      }
    }
    if (result.best_colocated_same_nodes) {
      const PlanCandidate& co = cs[*result.best_colocated_same_nodes];
      out += fmt::format("Colocated at {} nodes: the best, {}, reaches {}", co.nodes, candidate_name(co),
                         percent(co.report->slo_attainment));
      if (rec.system == sim::System::kDisaggregated) {
        out +=
            fmt::format(" (disaggregated: {}; goodput {:.2f} vs {:.2f} req/s)",
                        percent(rec.report->slo_attainment), rec.report->goodput_rps, co.report->goodput_rps);
      }
      out += "\n";
    }
    if (!budget) {
      if (result.colocated_fewest_nodes) {
        const PlanCandidate& co = cs[*result.colocated_fewest_nodes];
        if (rec.system == sim::System::kDisaggregated) {
          out += fmt::format("Colocated needs {} nodes ({}): disaggregation saves {} nodes ({:.0f}%)\n",
                             co.nodes, candidate_name(co), co.nodes - rec.nodes,
                             100.0 * (co.nodes - rec.nodes) / co.nodes);
        } else {
          out +=
              "A colocated baseline is the cheapest: disaggregation gains nothing on this traffic at this "
              "load\n";
        }
      } else if (result.colocated_searched_to_nodes > 0) {
        out += fmt::format("No colocated baseline meets the target up to {} nodes (searched that far)\n",
                           result.colocated_searched_to_nodes);
      }
    }
  } else if (budget) {
    out += fmt::format(
        "No candidate of {} nodes meets the target at any load probed (down to x{:.3g})\n",
        options.node_budget,
        result.probed_rate_scales.empty() ? options.rate_scale : result.probed_rate_scales.back());
  } else {
    out += fmt::format("No candidate up to {} nodes meets the target (--max-nodes raises the limit)\n",
                       options.max_nodes);
  }
  out += fmt::format(
      "Searched {} candidates: {} simulated, {} ruled out by the bound{}, in {:.1f} s\n\n", cs.size(),
      result.simulations, result.pruned,
      result.skipped > 0
          ? fmt::format(", {} not needed (their load's probe had already met the target)", result.skipped)
          : "",
      result.wall_s);

  // The table: per node count (or load), the best disaggregated and the best colocated candidate.
  std::vector<std::vector<std::string>> rows;
  auto row_of = [&](const PlanCandidate& c) {
    const cluster::PolicyReport& r = *c.report;
    return std::vector<std::string>{std::to_string(c.nodes),
                                    budget ? fmt::format("x{:.3g}", c.rate_scale) : "",
                                    candidate_name(c),
                                    percent(r.slo_attainment),
                                    fmt::format("{:.2f}", r.goodput_rps),
                                    format_or_na(r.ttft_mean_s, 1, 2, " s"),
                                    format_or_na(r.ttft_p99_s, 1, 2, " s"),
                                    format_or_na(r.tbt_p99_s, 1000, 1, " ms"),
                                    format_or_na(r.hit_ratio, 100, 1, "%"),
                                    std::to_string(r.rejected),
                                    c.meets ? "yes" : "no"};
  };
  // Groups of one node count and load, in the order considered (node budget: by load).
  std::vector<std::pair<size_t, size_t>> groups;
  for (size_t i = 0; i < cs.size();) {
    size_t end = i;
    while (end < cs.size() && cs[end].nodes == cs[i].nodes && cs[end].rate_scale == cs[i].rate_scale) ++end;
    groups.emplace_back(i, end);
    i = end;
  }
  std::stable_sort(groups.begin(), groups.end(), [&](const auto& a, const auto& b) {
    return cs[a.first].rate_scale < cs[b.first].rate_scale;
  });
  for (const auto& [i, end] : groups) {
    std::optional<size_t> best_d, best_c;
    for (size_t k = i; k < end; ++k) {
      if (!cs[k].simulated) continue;
      auto& best = cs[k].system == sim::System::kDisaggregated ? best_d : best_c;
      if (!best || cs[k].report->slo_attainment > cs[*best].report->slo_attainment) best = k;
    }
    size_t ruled_out = 0;
    for (size_t k = i; k < end; ++k) ruled_out += cs[k].bound_rules_out ? 1 : 0;
    if (best_d)
      rows.push_back(row_of(cs[*best_d]));
    else if (ruled_out > 0)
      rows.push_back({std::to_string(cs[i].nodes), budget ? fmt::format("x{:.3g}", cs[i].rate_scale) : "",
                      "disaggregated: every split ruled out by the bound", "", "", "", "", "", "", "", "no"});
    if (best_c) rows.push_back(row_of(cs[*best_c]));
  }
  std::vector<std::string> header{"nodes",   budget ? "load" : "", "best candidate", "SLO met",
                                  "goodput", "TTFT mean",          "TTFT p99",       "TBT p99",
                                  "hit",     "rejected",           "meets"};
  std::vector<size_t> width(header.size());
  for (size_t c = 0; c < header.size(); ++c) width[c] = header[c].size();
  for (const auto& row : rows)
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  auto line = [&](const std::vector<std::string>& cells) {
    std::string text;
    for (size_t c = 0; c < cells.size(); ++c) {
      if (width[c] == 0) continue;  // the load column of a fewest-nodes plan
      text +=
          c == 2 ? fmt::format("  {:<{}}", cells[c], width[c]) : fmt::format("  {:>{}}", cells[c], width[c]);
    }
    return text.substr(2) + "\n";
  };
  out += line(header);
  for (const auto& row : rows) out += line(row);
  out += fmt::format(
      "(SLO met = share of all requests with TTFT <= {:g} s and TBT <= {:g} ms; target {}; "
      "prefill policy global-cache-aware)\n",
      slo.ttft_s, slo.tbt_s.front() * 1000, percent(options.attainment_target));
  return out;
}

Plot plan_plot(const PlanResult& result, const PlanOptions& options, const std::string& title) {
  const bool budget = options.node_budget > 0;
  Plot plot{.title = title,
            .x_label = budget ? "load (x the trace's arrival rate)" : "nodes",
            .y_label = "requests meeting both SLOs (%)",
            .y_from_zero = true,
            .log_x = budget,
            .integer_x = !budget};
  plot.y2_label = "goodput of the best disaggregated candidate (requests/s)";
  // The best attainment of each family at each x.
  std::vector<std::pair<std::string, std::function<bool(const PlanCandidate&)>>> families;
  families.emplace_back("disaggregated (best split, cache, admission)",
                        [](const PlanCandidate& c) { return c.system == sim::System::kDisaggregated; });
  for (sim::System s : options.colocated_systems) {
    families.emplace_back(std::string(sim::to_string(s)),
                          [s](const PlanCandidate& c) { return c.system == s; });
  }
  double lo_x = kInfinity, hi_x = -kInfinity;
  for (size_t f = 0; f < families.size(); ++f) {
    // (x, best attainment %, that candidate's goodput)
    std::vector<std::tuple<double, double, double>> points;
    for (const PlanCandidate& c : result.candidates) {
      if (!c.simulated || !families[f].second(c)) continue;
      const double x = budget ? c.rate_scale : static_cast<double>(c.nodes);
      auto it =
          std::find_if(points.begin(), points.end(), [&](const auto& p) { return std::get<0>(p) == x; });
      const double y = c.report->slo_attainment * 100;
      if (it == points.end()) {
        points.emplace_back(x, y, c.report->goodput_rps);
      } else if (y > std::get<1>(*it)) {
        *it = {x, y, c.report->goodput_rps};
      }
    }
    if (points.empty()) continue;
    std::sort(points.begin(), points.end());
    if (f == 0) {
      PlotSeries goodput{.name = "goodput of the best disaggregated (right axis)",
                         .style = LineStyle::kDashed,
                         .color = 5,
                         .right_axis = true};
      for (const auto& [x, y, g] : points) {
        goodput.x.push_back(x);
        goodput.y.push_back(g);
      }
      plot.series.push_back(std::move(goodput));
    }
    PlotSeries series{.name = families[f].first,
                      .style = f == 0 ? LineStyle::kSolid : LineStyle::kDashed,
                      .color = static_cast<int>(f)};
    for (const auto& [x, y, g] : points) {
      series.x.push_back(x);
      series.y.push_back(y);
      lo_x = std::min(lo_x, x);
      hi_x = std::max(hi_x, x);
    }
    plot.series.push_back(std::move(series));
  }
  if (plot.series.empty()) {
    // Nothing simulated (every candidate ruled out): the target line alone, over the node counts considered.
    lo_x = 2;
    hi_x = std::max<double>(3, budget ? 1 : options.max_nodes);
  }
  plot.series.push_back({.name = fmt::format("target: {:g}%", options.attainment_target * 100),
                         .x = {lo_x, hi_x},
                         .y = {options.attainment_target * 100, options.attainment_target * 100},
                         .style = LineStyle::kReference,
                         .color = 6});
  if (result.recommended) {
    const PlanCandidate& rec = result.candidates[*result.recommended];
    plot.notes.push_back({.x = budget ? rec.rate_scale : static_cast<double>(rec.nodes),
                          .y = rec.report->slo_attainment * 100,
                          .text = fmt::format("recommended: {}", candidate_name(rec))});
  }
  return plot;
}

}  // namespace crescent::experiment
