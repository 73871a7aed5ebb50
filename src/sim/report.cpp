#include "sim/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "common/percentile.h"

namespace crescent::sim {
namespace {

double mean(const std::vector<double>& v) {
  double sum = 0;
  for (double x : v) sum += x;
  return v.empty() ? 0 : sum / static_cast<double>(v.size());
}

}  // namespace

PolicyReport summarize(const std::string& name, const SimResult& result, const SloConfig& slo) {
  PolicyReport r;
  r.name = name;
  r.makespan_s = result.makespan_s;
  std::vector<double> ttft, tbt;
  double input_tokens = 0, hit_tokens = 0, fetched_tokens = 0, prefill_s = 0;
  r.slo_attainment_by_tbt.resize(slo.tbt_s.size());
  for (const auto& o : result.requests) {
    if (o.rejected != conductor::RejectReason::kNone) {
      ++r.rejected;
      switch (o.rejected) {
        case conductor::RejectReason::kTtft:
          ++r.rejected_ttft;
          break;
        case conductor::RejectReason::kTbt:
          ++r.rejected_tbt;
          break;
        case conductor::RejectReason::kDecodeCapacity:
          ++r.rejected_decode_capacity;
          break;
        case conductor::RejectReason::kNone:
          break;
      }
      continue;
    }
    ++r.completed;
    ttft.push_back(o.ttft_s);
    if (o.output_tokens > 1) tbt.push_back(o.tbt_s);  // one token has no gaps: no TBT
    input_tokens += static_cast<double>(o.input_tokens);
    hit_tokens += static_cast<double>(o.prefix_hit_tokens);
    fetched_tokens += static_cast<double>(o.fetched_tokens);
    prefill_s += o.prefill_compute_s;
    for (size_t i = 0; i < slo.tbt_s.size(); ++i) {
      if (o.ttft_s <= slo.ttft_s && o.tbt_s <= slo.tbt_s[i]) r.slo_attainment_by_tbt[i].attainment += 1;
    }
  }
  const double total = static_cast<double>(result.requests.size());
  for (size_t i = 0; i < slo.tbt_s.size(); ++i) {
    r.slo_attainment_by_tbt[i].tbt_slo_s = slo.tbt_s[i];
    r.slo_attainment_by_tbt[i].attainment = total > 0 ? r.slo_attainment_by_tbt[i].attainment / total : 0;
  }
  r.slo_attainment = r.slo_attainment_by_tbt.empty() ? 0 : r.slo_attainment_by_tbt.front().attainment;
  r.slo_attainment_accepted =
      r.completed > 0 ? r.slo_attainment * total / static_cast<double>(r.completed) : 0;
  // Goodput over the arrival span (first to last arrival); a single-instant trace counts as one second.
  double first_s = 0, last_s = 0;
  if (!result.requests.empty()) {
    first_s = result.requests.front().arrival_s;
    last_s = result.requests.back().arrival_s;
  }
  r.goodput_rps = r.slo_attainment * total / std::max(1.0, last_s - first_s);
  r.ttft_mean_s = mean(ttft);
  r.tbt_mean_s = mean(tbt);
  std::sort(ttft.begin(), ttft.end());
  std::sort(tbt.begin(), tbt.end());
  r.ttft_p50_s = nearest_rank(ttft, 50);
  r.ttft_p90_s = nearest_rank(ttft, 90);
  r.ttft_p99_s = nearest_rank(ttft, 99);
  r.tbt_p99_s = nearest_rank(tbt, 99);
  r.hit_ratio = input_tokens > 0 ? hit_tokens / input_tokens : 0;
  r.fetched_ratio = input_tokens > 0 ? fetched_tokens / input_tokens : 0;
  r.prefill_compute_s_per_request = r.completed > 0 ? prefill_s / static_cast<double>(r.completed) : 0;
  return r;
}

std::string format_table(const std::vector<PolicyReport>& reports, const SloConfig& slo) {
  std::string out = fmt::format("{:<20} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>9}", "policy",
                                "TTFT mean", "p50", "p90", "p99", "TBT mean", "TBT p99", "hit", "prefill");
  for (double t : slo.tbt_s) out += fmt::format(" {:>10}", fmt::format("SLO@{:g}ms", t * 1000));
  out += fmt::format(" {:>9} {:>8}\n", "completed", "rejected");
  for (const auto& r : reports) {
    out += fmt::format(
        "{:<20} {:>8.2f}s {:>8.2f}s {:>8.2f}s {:>8.2f}s {:>7.1f}ms {:>7.1f}ms {:>5.1f}% {:>8.3f}s", r.name,
        r.ttft_mean_s, r.ttft_p50_s, r.ttft_p90_s, r.ttft_p99_s, r.tbt_mean_s * 1000, r.tbt_p99_s * 1000,
        r.hit_ratio * 100, r.prefill_compute_s_per_request);
    for (const auto& a : r.slo_attainment_by_tbt) out += fmt::format(" {:>9.1f}%", a.attainment * 100);
    out += fmt::format(" {:>9} {:>8}\n", r.completed, r.rejected);
  }
  out += fmt::format(
      "(TTFT over completed requests; SLO = share of all requests with TTFT <= {:g} s and TBT <= the "
      "threshold; prefill = mean prefill GPU time per request)\n",
      slo.ttft_s);
  return out;
}

nlohmann::json to_json(const PolicyReport& r) {
  nlohmann::json by_tbt = nlohmann::json::array();
  for (const auto& a : r.slo_attainment_by_tbt) {
    by_tbt.push_back({{"tbt_slo_s", a.tbt_slo_s}, {"attainment", a.attainment}});
  }
  return {
      {"name", r.name},
      {"ttft_mean_s", r.ttft_mean_s},
      {"ttft_p50_s", r.ttft_p50_s},
      {"ttft_p90_s", r.ttft_p90_s},
      {"ttft_p99_s", r.ttft_p99_s},
      {"tbt_mean_s", r.tbt_mean_s},
      {"tbt_p99_s", r.tbt_p99_s},
      {"hit_ratio", r.hit_ratio},
      {"fetched_ratio", r.fetched_ratio},
      {"prefill_compute_s_per_request", r.prefill_compute_s_per_request},
      {"slo_attainment", r.slo_attainment},
      {"slo_attainment_by_tbt", by_tbt},
      {"slo_attainment_accepted", r.slo_attainment_accepted},
      {"goodput_rps", r.goodput_rps},
      {"completed", r.completed},
      {"rejected", r.rejected},
      {"rejected_by_reason",
       {{"ttft", r.rejected_ttft}, {"tbt", r.rejected_tbt}, {"decode-capacity", r.rejected_decode_capacity}}},
      {"makespan_s", r.makespan_s},
  };
}

}  // namespace crescent::sim
