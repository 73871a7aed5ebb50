#include "cluster/report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <string_view>

#include "common/json_util.h"
#include "common/percentile.h"
#include "common/text_format.h"

namespace crescent::cluster {
namespace {

std::optional<double> mean(const std::vector<double>& v) {
  if (v.empty()) return std::nullopt;
  double sum = 0;
  for (double x : v) sum += x;
  return sum / static_cast<double>(v.size());
}

// Nearest-rank percentile of a sorted sample; none of an empty one.
std::optional<double> percentile(const std::vector<double>& sorted, int percent) {
  if (sorted.empty()) return std::nullopt;
  return nearest_rank(sorted, percent);
}

// `numerator / denominator`, none when the denominator is 0 (a ratio over nothing).
std::optional<double> ratio(double numerator, double denominator) {
  if (denominator <= 0) return std::nullopt;
  return numerator / denominator;
}

// A table cell: `value` * scale with `decimals` and `unit`, right-aligned in `width`; "n/a" for nothing.
std::string cell(std::optional<double> value, int width, double scale, int decimals, std::string_view unit) {
  return fmt::format("{:>{}}", format_or_na(value, scale, decimals, unit), width);
}

}  // namespace

PolicyReport summarize(const std::string& name, const RunResult& result, const SloConfig& slo) {
  PolicyReport r;
  r.name = name;
  r.makespan_s = result.makespan_s;
  std::vector<double> ttft, tbt;
  double input_tokens = 0, hit_tokens = 0, fetched_tokens = 0, prefill_s = 0;
  r.slo_attainment_by_tbt.resize(slo.tbt_s.size());
  for (const auto& o : result.requests) {
    if (o.failed) {
      ++r.failed;
      continue;
    }
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
        case conductor::RejectReason::kContextLength:
          ++r.rejected_context_length;
          break;
        case conductor::RejectReason::kNoInstance:  // a live cluster's 503 no-instance: no reason of its own
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
  r.slo_attainment_accepted = ratio(r.slo_attainment * total, static_cast<double>(r.completed));
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
  r.ttft_p50_s = percentile(ttft, 50);
  r.ttft_p90_s = percentile(ttft, 90);
  r.ttft_p99_s = percentile(ttft, 99);
  r.tbt_p99_s = percentile(tbt, 99);
  r.hit_ratio = ratio(hit_tokens, input_tokens);
  r.fetched_ratio = ratio(fetched_tokens, input_tokens);
  r.prefill_compute_s_per_request = ratio(prefill_s, static_cast<double>(r.completed));
  return r;
}

std::string no_completion_warning(const PolicyReport& r) {
  if (r.completed > 0) return "";
  const std::string who = r.name.empty() ? "" : fmt::format("{}: ", r.name);
  if (r.rejected == 0) return who + "no request completed: the trace is empty";
  std::vector<std::string> reasons;
  if (r.rejected_context_length > 0) {
    reasons.push_back(
        fmt::format("{} context-length: prompt + output larger than a decode instance's whole HBM KV "
                    "capacity (more GPUs or "
                    "HBM per instance, or a smaller decode_hbm_reserved_share, make room)",
                    r.rejected_context_length));
  }
  if (r.rejected_decode_capacity > 0) {
    reasons.push_back(
        fmt::format("{} decode-capacity: admission judged the decode pool full", r.rejected_decode_capacity));
  }
  if (r.rejected_ttft > 0) {
    reasons.push_back(fmt::format("{} ttft: predicted TTFT above the TTFT SLO", r.rejected_ttft));
  }
  if (r.rejected_tbt > 0) {
    reasons.push_back(fmt::format("{} tbt: predicted TBT above the TBT SLO", r.rejected_tbt));
  }
  return fmt::format("{}no request completed: all {} were rejected ({}); TTFT and TBT statistics are n/a",
                     who, r.rejected, fmt::join(reasons, "; "));
}

std::string requests_jsonl(const RunResult& result, std::string_view policy) {
  std::string out;
  for_each_request_line(result, policy, [&](std::string_view line) {
    out += line;
    return true;
  });
  return out;
}

void for_each_request_line(const RunResult& result, std::string_view policy,
                           const std::function<bool(std::string_view)>& line_out) {
  const nlohmann::json null;
  std::string text;
  for (size_t i = 0; i < result.requests.size(); ++i) {
    const RequestOutcome& o = result.requests[i];
    const bool done = o.rejected == conductor::RejectReason::kNone && !o.failed;
    const bool gaps = done && o.output_tokens > 1;
    auto when_done = [&](auto value) { return done ? nlohmann::json(value) : null; };
    const char* outcome = done ? "completed" : o.failed ? "failed" : "rejected";
    const bool rejected = !done && !o.failed;
    const nlohmann::ordered_json line = {
        {"request", i},
        {"line", o.trace_line > 0 ? nlohmann::json(o.trace_line) : null},
        {"policy", policy},
        {"arrival_s", o.arrival_s},
        {"outcome", outcome},
        {"reject_reason", rejected ? nlohmann::json(conductor::to_string(o.rejected)) : null},
        {"prefill_instance", when_done(o.prefill_instance)},
        {"decode_instance", when_done(o.decode_instance)},
        {"prompt_tokens", o.input_tokens},
        {"output_tokens", o.output_tokens},
        {"hit_tokens", when_done(o.prefix_hit_tokens)},
        {"local_hit_tokens", when_done(o.prefix_hit_tokens - o.fetched_tokens)},
        {"fetched_hit_tokens", when_done(o.fetched_tokens)},
        {"queue_wait_s", when_done(o.queue_wait_s)},
        {"prefix_load_s", when_done(o.prefix_load_s)},
        {"prefill_s", when_done(o.prefill_compute_s)},
        {"ttft_s", when_done(o.ttft_s)},
        {"tbt_s", gaps ? nlohmann::json(o.tbt_s) : null},
        {"max_token_gap_s", gaps ? nlohmann::json(o.max_token_gap_s) : null},
        {"e2e_s", when_done(o.finish_s - o.arrival_s)},
    };
    text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    text += '\n';
    if (!line_out(text)) return;
  }
}

std::string format_table(const std::vector<PolicyReport>& reports, const SloConfig& slo) {
  size_t name_width = 20;  // the longest name, at least 20
  for (const auto& r : reports) name_width = std::max(name_width, r.name.size());
  std::string out =
      fmt::format("{:<{}} {:>9} {:>9} {:>9} {:>9} {:>9} {:>9} {:>6} {:>9}", "policy", name_width, "TTFT mean",
                  "p50", "p90", "p99", "TBT mean", "TBT p99", "hit", "prefill");
  for (double t : slo.tbt_s) out += fmt::format(" {:>10}", fmt::format("SLO@{:g}ms", t * 1000));
  const bool failures = std::ranges::any_of(reports, [](const PolicyReport& r) { return r.failed > 0; });
  out += fmt::format(" {:>9} {:>8}{}\n", "completed", "rejected",
                     failures ? fmt::format(" {:>7}", "failed") : "");
  for (const auto& r : reports) {
    out += fmt::format(
        "{:<{}} {} {} {} {} {} {} {} {}", r.name, name_width, cell(r.ttft_mean_s, 9, 1, 2, "s"),
        cell(r.ttft_p50_s, 9, 1, 2, "s"), cell(r.ttft_p90_s, 9, 1, 2, "s"), cell(r.ttft_p99_s, 9, 1, 2, "s"),
        cell(r.tbt_mean_s, 9, 1000, 1, "ms"), cell(r.tbt_p99_s, 9, 1000, 1, "ms"),
        cell(r.hit_ratio, 6, 100, 1, "%"), cell(r.prefill_compute_s_per_request, 9, 1, 3, "s"));
    for (const auto& a : r.slo_attainment_by_tbt) out += fmt::format(" {:>9.1f}%", a.attainment * 100);
    out += fmt::format(" {:>9} {:>8}{}\n", r.completed, r.rejected,
                       failures ? fmt::format(" {:>7}", r.failed) : "");
  }
  out += fmt::format(
      "(TTFT over completed requests, TBT over those with 2+ output tokens, n/a when there are none; SLO = "
      "share of all requests with TTFT <= {:g} s and TBT <= the threshold; prefill = mean prefill GPU time "
      "per "
      "request)\n",
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
      {"ttft_mean_s", json_or_null(r.ttft_mean_s)},
      {"ttft_p50_s", json_or_null(r.ttft_p50_s)},
      {"ttft_p90_s", json_or_null(r.ttft_p90_s)},
      {"ttft_p99_s", json_or_null(r.ttft_p99_s)},
      {"tbt_mean_s", json_or_null(r.tbt_mean_s)},
      {"tbt_p99_s", json_or_null(r.tbt_p99_s)},
      {"hit_ratio", json_or_null(r.hit_ratio)},
      {"fetched_ratio", json_or_null(r.fetched_ratio)},
      {"prefill_compute_s_per_request", json_or_null(r.prefill_compute_s_per_request)},
      {"slo_attainment", r.slo_attainment},
      {"slo_attainment_by_tbt", by_tbt},
      {"slo_attainment_accepted", json_or_null(r.slo_attainment_accepted)},
      {"goodput_rps", r.goodput_rps},
      {"completed", r.completed},
      {"rejected", r.rejected},
      {"rejected_by_reason",
       {{"ttft", r.rejected_ttft},
        {"tbt", r.rejected_tbt},
        {"decode-capacity", r.rejected_decode_capacity},
        {"context-length", r.rejected_context_length}}},
      {"makespan_s", r.makespan_s},
  };
}

}  // namespace crescent::cluster
