// Summaries of runs, simulated or replayed against a live server (run_result.h): per-policy latency
// percentiles, prefix hits, SLO attainment; as a text table or JSON (the shapes documented in the README).
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cluster/cluster_config.h"
#include "cluster/run_result.h"

namespace crescent::cluster {

/// Share of requests meeting TTFT <= ttft_slo_s and TBT <= tbt_slo_s; rejected requests count as missing.
struct SloAttainment {
  double tbt_slo_s = 0;
  double attainment = 0;
};

/// One run, summarised. Latency statistics are over completed (not rejected) requests; TBT statistics over
/// those with at least two output tokens. A statistic over an empty set (TTFT when no request completed, TBT
/// when none produced a second token) is std::nullopt: `null` in JSON, "n/a" in tables, never 0.
struct PolicyReport {
  std::string name;
  int64_t completed = 0;
  int64_t rejected = 0;
  int64_t rejected_ttft = 0;  // by reason (conductor::RejectReason)
  int64_t rejected_tbt = 0;
  int64_t rejected_decode_capacity = 0;
  int64_t rejected_context_length = 0;
  int64_t failed = 0;  // a live run's failures (RequestOutcome::failed): neither completed nor rejected
  std::optional<double> ttft_mean_s, ttft_p50_s, ttft_p90_s, ttft_p99_s;
  std::optional<double> tbt_mean_s, tbt_p99_s;
  std::optional<double> hit_ratio;      // prefix hit tokens / input tokens, over completed requests
  std::optional<double> fetched_ratio;  // tokens fetched from another instance / input tokens
  std::optional<double> prefill_compute_s_per_request;  // mean GPU time of prefill
  double slo_attainment = 0;                            // at the primary (first) TBT SLO, over all requests
  std::optional<double> slo_attainment_accepted;        // the same over accepted (completed) requests only
  double goodput_rps = 0;  // requests meeting both SLOs (primary TBT) per second of trace span
  std::vector<SloAttainment> slo_attainment_by_tbt;
  double makespan_s = 0;
};

/// Summarises `result` under `slo`. Percentiles are nearest-rank.
PolicyReport summarize(const std::string& name, const RunResult& result, const SloConfig& slo);

/// When no request of `report`'s run completed: one line saying so and why (rejections by reason), for
/// stderr; empty when some did. E.g. "cache-aware: no request completed: all 5 were rejected (5
/// context-length: prompt + output larger than a decode instance's HBM KV capacity); ...".
std::string no_completion_warning(const PolicyReport& report);

/// The per-request results of `result` as JSON Lines, one object per request in trace order (what `crescent
/// simulate --requests-out` writes): {"request" (0-based index among the trace's valid requests), "line" (its
/// line in the trace file; null for a trace not read from a file), "policy",
/// "arrival_s", "outcome" ("completed" | "rejected" | "failed": a live run's), "reject_reason" (null | "ttft"
/// | "tbt" | "decode-capacity" | "context-length"), "prefill_instance", "decode_instance" (colocated systems:
/// the node, twice), "prompt_tokens", "output_tokens", "hit_tokens" = "local_hit_tokens" +
/// "fetched_hit_tokens", "queue_wait_s", "prefix_load_s", "prefill_s" (GPU time), "ttft_s" (disaggregated:
/// the sum of the three before), "tbt_s" (mean of the longest 10% of its token gaps), "max_token_gap_s",
/// "e2e_s" (arrival → last token)}. Seconds of virtual time from the first arrival. What does not apply is
/// null: every instance, hit and time field but arrival_s of a rejected request; tbt_s and max_token_gap_s of
/// a request with one output token.
std::string requests_jsonl(const RunResult& result, std::string_view policy);
/// requests_jsonl's lines passed to `line` one at a time, in order, each with its '\n', until it returns
/// false (a failed write): for an output too large to hold whole (a million requests are ~400 MB of lines).
void for_each_request_line(const RunResult& result, std::string_view policy,
                           const std::function<bool(std::string_view)>& line_out);

/// `value`, or NaN for a statistic of nothing (plots leave NaN points out).
inline double or_nan(std::optional<double> value) {
  return value.value_or(std::numeric_limits<double>::quiet_NaN());
}

/// A fixed-width table, one row per report, for terminals; a "failed" column when a report has failures.
std::string format_table(const std::vector<PolicyReport>& reports, const SloConfig& slo);

/// `{"name", "ttft_mean_s", ..., "slo_attainment", "completed", "rejected", ...}`.
nlohmann::json to_json(const PolicyReport& report);

}  // namespace crescent::cluster
