// `crescent plan TRACE`: the cheapest cluster that meets the SLOs on a trace (paper §7's lesson: plan for
// overload). Candidates are cluster configs (prefill:decode split, prefill cache capacity, admission policy,
// and the colocated baselines at the same node count), each simulated on the trace; a necessary-condition
// bound (docs/plan.md "The bound") skips candidates that cannot meet the target, without changing the
// answer. Two questions: the fewest nodes meeting the target at a given load, or the highest load a given
// number of nodes sustains.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cluster/cluster_config.h"
#include "cluster/report.h"
#include "common/status.h"
#include "conductor/conductor.h"
#include "experiment/plot.h"
#include "sim/sim_options.h"
#include "trace/request.h"

namespace crescent::experiment {

/// The most nodes a plan considers (PlanOptions::node_budget and max_nodes).
inline constexpr uint32_t kMaxPlanNodes = 512;

/// What a plan searches for. The SLO thresholds are the config's (slo.ttft_s and the first slo.tbt_s).
/// Every member has an initializer, so designated initializers may leave any out.
struct PlanOptions {
  /// Share of all requests (rejected ones count as misses) that must meet both SLOs, in (0, 1].
  double attainment_target = 0.99;
  /// The load: arrivals `rate_scale` times faster than the trace's (sim::SimOptions::time_scale). > 0. With
  /// node_budget, where the search for the highest load starts.
  double rate_scale = 1;
  /// 0: find the fewest nodes meeting the target at rate_scale. N in 2..kMaxPlanNodes: find the highest rate
  /// scale at which some candidate of N nodes meets it (the trace's requests must not all arrive at once).
  uint32_t node_budget = 0;
  /// The fewest-nodes search gives up past this many nodes (2..kMaxPlanNodes).
  uint32_t max_nodes = 64;
  /// Host DRAM of a prefill node that its prefix cache may use, bytes: the largest cache searched is this
  /// over the model's KV bytes per token (the paper's 8xA800 nodes hold 3M tokens of LLaMA3-70B, ~0.98 TB).
  double cache_dram_bytes = 1e12;
  /// Admission policies searched (each disaggregated candidate is tried with each).
  std::vector<conductor::Admission> admissions = {conductor::Admission::kNone, conductor::Admission::kSlo,
                                                  conductor::Admission::kEarly,
                                                  conductor::Admission::kPredictive};
  /// Colocated baselines simulated at each node count, to say what disaggregation gains.
  std::vector<sim::System> colocated_systems = {sim::System::kColocated, sim::System::kColocatedPrefixCache,
                                                sim::System::kColocatedChunkedPrefill};
  /// false: simulate every candidate, even those the bound rules out (still marked bound_rules_out), to check
  /// the bound against the full search.
  bool prune = true;
  unsigned threads = 0;             // candidates simulated at once (0: one per core this process may use)
  int64_t block_size_tokens = 512;  // tokens per trace block (hash_id)
  int64_t chunked_prefill_tokens = 512;  // colocated-chunked-prefill's tokens per iteration
  bool progress = true;                  // a progress bar on stderr when it is a terminal
};

/// One configuration the search considered, and what its simulation gave.
struct PlanCandidate {
  uint32_t nodes = 0;
  sim::System system = sim::System::kDisaggregated;
  uint32_t prefill_instances = 0;  // disaggregated: the split; colocated: 0 (every node does both)
  uint32_t decode_instances = 0;
  int64_t prefill_cache_capacity_tokens = 0;  // per prefill node; colocated: the config's (unused there)
  conductor::Admission admission = conductor::Admission::kNone;
  double rate_scale = 1;
  bool bound_rules_out = false;  // the bound proves it cannot meet the target (docs/plan.md)
  bool simulated =
      false;  // false: ruled out by the bound, or a node-budget probe that another one already met
  std::optional<cluster::PolicyReport> report{};  // when simulated
  bool meets = false;                             // simulated, and report->slo_attainment >= the target
};

/// "4P+1D 1.5M-token cache, admission early" or "colocated-prefix-cache": a candidate's short name.
std::string candidate_name(const PlanCandidate& candidate);

/// `base` turned into `candidate`'s cluster: its instance counts and cache (a colocated candidate of N nodes
/// keeps base's split of N as prefill_instances + decode_instances, which is all the simulator reads of it).
cluster::ClusterConfig candidate_config(const cluster::ClusterConfig& base, const PlanCandidate& candidate);

/// The search and its answer.
struct PlanResult {
  std::vector<PlanCandidate> candidates;         // in the order considered
  std::vector<int64_t> cache_capacities_tokens;  // the prefill cache capacities searched, ascending
  /// Indices into candidates. recommended: the best candidate meeting the target (fewest nodes, then highest
  /// attainment, then goodput, then smallest cache); runner_up: the next by the same order that is another
  /// cluster (node count, system or split; not only another cache or admission); next_smaller: the
  /// simulated candidate of one node fewer with the highest attainment (none of which meets the target).
  std::optional<size_t> recommended, runner_up, next_smaller;
  /// The colocated baseline with the highest attainment at the recommendation's node count, and the first
  /// colocated candidate meeting the target (fewest nodes) when the search found one.
  std::optional<size_t> best_colocated_same_nodes, colocated_fewest_nodes;
  /// Node-count search: the colocated baselines were searched up to this many nodes (0: not at all).
  uint32_t colocated_searched_to_nodes = 0;
  /// Node-budget search: the rate scales probed, in order, and whether some candidate met the target there.
  std::vector<double> probed_rate_scales;
  std::vector<bool> probe_met;
  /// Node-budget search: every probe up to the search's limit (2^20 times rate_scale) met the target, so the
  /// highest load is at least the recommendation's, not known to be the most.
  bool highest_load_is_search_limit = false;
  /// Requests that cannot meet the SLOs on any cluster (their prefill alone, with every reusable prefix hit,
  /// is longer than the TTFT SLO, or a decode step of them alone longer than the TBT SLO).
  int64_t impossible_requests = 0;
  /// Too many such requests for the target: nothing was searched, no cluster can reach it.
  bool hopeless = false;
  int64_t requests = 0;     // in the trace
  int64_t simulations = 0;  // candidates simulated
  int64_t pruned = 0;       // candidates the bound ruled out and were not simulated
  int64_t skipped = 0;      // node-budget probes' candidates not simulated: one of the probe already met
  double wall_s = 0;        // time the search took
};

/// Searches for `options`' answer on `trace` (sorted by arrival) with `base`'s model, hardware, SLOs and
/// scheduler settings. Deterministic: the same inputs give the same result, whatever the thread count.
/// Errors: kInvalidArgument for options out of range (named), an empty trace, or a base config the simulator
/// refuses; a simulation's error.
Result<PlanResult> plan(const cluster::ClusterConfig& base, std::span<const trace::Request> trace,
                        const PlanOptions& options);

/// The plan as JSON: options, the search space, every candidate (with its report when simulated) and the
/// answer's indices resolved into candidates (docs/plan.md lists the fields).
nlohmann::json to_json(const PlanResult& result, const PlanOptions& options);

/// The plan for a terminal: the answer in a few sentences, then a table of the best candidate of each node
/// count and system.
std::string format_plan(const PlanResult& result, const PlanOptions& options, const cluster::SloConfig& slo);

/// The plot: node-count search, the best attainment at each node count for disaggregated and each colocated
/// system, the best disaggregated candidate's goodput on the right axis, the target as a line and the
/// recommendation marked; node-budget search, the same at each probed load.
Plot plan_plot(const PlanResult& result, const PlanOptions& options, const std::string& title);

}  // namespace crescent::experiment
