// Summaries of simulation runs: per-policy latency percentiles, prefix hits, SLO attainment; as a text table
// or JSON (the shapes documented in the README).
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sim/cluster_config.h"
#include "sim/simulator.h"

namespace crescent::sim {

/// Share of requests meeting TTFT <= ttft_slo_s and TBT <= tbt_slo_s; rejected requests count as missing.
struct SloAttainment {
  double tbt_slo_s = 0;
  double attainment = 0;
};

/// One run, summarised. Latency statistics are over completed (not rejected) requests; TBT statistics over
/// those with at least two output tokens.
struct PolicyReport {
  std::string name;
  int64_t completed = 0;
  int64_t rejected = 0;
  int64_t rejected_ttft = 0;  // by reason (conductor::RejectReason)
  int64_t rejected_tbt = 0;
  int64_t rejected_decode_capacity = 0;
  double ttft_mean_s = 0, ttft_p50_s = 0, ttft_p90_s = 0, ttft_p99_s = 0;
  double tbt_mean_s = 0, tbt_p99_s = 0;
  double hit_ratio = 0;                      // prefix hit tokens / input tokens, over completed requests
  double fetched_ratio = 0;                  // tokens fetched from another instance / input tokens
  double prefill_compute_s_per_request = 0;  // mean GPU time of prefill
  double slo_attainment = 0;                 // at the primary (first) TBT SLO, over all requests
  double slo_attainment_accepted = 0;        // the same over accepted (completed) requests only
  double goodput_rps = 0;  // requests meeting both SLOs (primary TBT) per second of trace span
  std::vector<SloAttainment> slo_attainment_by_tbt;
  double makespan_s = 0;
};

/// Summarises `result` under `slo`. Percentiles are nearest-rank.
PolicyReport summarize(const std::string& name, const SimResult& result, const SloConfig& slo);

/// A fixed-width table, one row per report, for terminals.
std::string format_table(const std::vector<PolicyReport>& reports, const SloConfig& slo);

/// `{"name", "ttft_mean_s", ..., "slo_attainment", "completed", "rejected", ...}`.
nlohmann::json to_json(const PolicyReport& report);

}  // namespace crescent::sim
