#include "conductor/conductor.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <limits>

namespace crescent::conductor {
namespace {

constexpr std::array<std::pair<std::string_view, PrefillPolicy>, 4> kPolicies{{
    {"random", PrefillPolicy::kRandom},
    {"least-loaded", PrefillPolicy::kLeastLoaded},
    {"cache-aware", PrefillPolicy::kCacheAware},
    {"global-cache-aware", PrefillPolicy::kGlobalCacheAware},
}};

constexpr std::array<std::pair<std::string_view, Admission>, 2> kAdmissions{{
    {"none", Admission::kNone},
    {"slo", Admission::kSlo},
}};

template <typename Table>
std::string joined_names(const Table& table) {
  std::string out;
  for (const auto& [name, value] : table) out += fmt::format("{}{}", out.empty() ? "" : ", ", name);
  return out;
}

}  // namespace

Result<PrefillPolicy> parse_prefill_policy(std::string_view name) {
  for (const auto& [n, p] : kPolicies) {
    if (n == name) return p;
  }
  return Status::not_found(
      fmt::format("unknown prefill policy '{}' (valid: {})", name, joined_names(kPolicies)));
}

std::string_view to_string(PrefillPolicy policy) {
  for (const auto& [n, p] : kPolicies) {
    if (p == policy) return n;
  }
  return "?";
}

std::vector<std::string> prefill_policy_names() {
  std::vector<std::string> names;
  for (const auto& [n, p] : kPolicies) names.emplace_back(n);
  return names;
}

Result<Admission> parse_admission(std::string_view name) {
  for (const auto& [n, a] : kAdmissions) {
    if (n == name) return a;
  }
  return Status::not_found(fmt::format("unknown admission policy '{}' (valid: {})", name, joined_names(kAdmissions)));
}

std::string_view to_string(Admission admission) {
  for (const auto& [n, a] : kAdmissions) {
    if (a == admission) return n;
  }
  return "?";
}

std::string_view to_string(RejectReason reason) {
  switch (reason) {
    case RejectReason::kNone: return "none";
    case RejectReason::kTtft: return "ttft";
    case RejectReason::kTbt: return "tbt";
  }
  return "?";
}

Conductor::Conductor(const perf::CostModel& cost_model, ConductorOptions options)
    : cost_(cost_model), options_(options), rng_state_(options.seed) {}

// splitmix64: a tiny, well-distributed generator whose output is the same on every platform (unlike
// std::uniform_int_distribution), which keeps simulations byte-identical for a seed.
uint64_t Conductor::next_random() {
  uint64_t z = (rng_state_ += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// TTFT of running `request` on `instance` with `prefix_blocks` of its prompt reused, `local_blocks` of them
// already there: T_transfer + T_queue + T_prefill (Algorithm 1 lines 6-13).
Conductor::PrefillChoice Conductor::evaluate(InstanceId instance, int64_t local_blocks, int64_t prefix_blocks,
                                             const RequestInfo& request, double queue_s) const {
  const int64_t n = request.input_tokens;
  const int64_t block = options_.block_size_tokens;
  const int64_t local_tokens = std::min(local_blocks * block, n);
  const int64_t prefix_tokens = std::min(prefix_blocks * block, n);
  // The last prompt token is always recomputed: its logits give the first output token.
  const int64_t new_tokens = std::max<int64_t>(1, n - prefix_tokens);
  PrefillChoice c;
  c.instance = instance;
  c.local_blocks = local_blocks;
  c.fetched_blocks = prefix_blocks - local_blocks;
  c.transfer_s = prefix_tokens > local_tokens ? cost_.kv_transfer_time_s(prefix_tokens - local_tokens) : 0.0;
  c.queue_s = queue_s;
  c.prefill_s = cost_.prefill_time_s(new_tokens, std::max<int64_t>(0, n - new_tokens));
  return c;
}

Conductor::PrefillChoice Conductor::choose_prefill(const ClusterView& cluster, const RequestInfo& request,
                                                   double now_s) {
  const auto busy_until = cluster.prefill_busy_until_s();
  const auto instances = static_cast<uint32_t>(busy_until.size());
  auto queue_s = [&](InstanceId i) { return std::max(0.0, busy_until[i] - now_s); };

  // Each instance's local prefix (Algorithm 1's instance.prefix_len), dense for the loop below.
  cluster.block_index().match_prefix(request.block_keys, match_);
  local_blocks_.assign(instances, 0);
  for (const auto& [inst, run] : match_.matches) {
    if (inst < instances) local_blocks_[inst] = run;
  }

  switch (options_.policy) {
    case PrefillPolicy::kRandom: {
      auto i = static_cast<InstanceId>(next_random() % instances);
      return evaluate(i, local_blocks_[i], local_blocks_[i], request, queue_s(i));
    }
    case PrefillPolicy::kLeastLoaded: {
      InstanceId best = 0;
      for (InstanceId i = 1; i < instances; ++i) {
        if (busy_until[i] < busy_until[best]) best = i;
      }
      return evaluate(best, local_blocks_[best], local_blocks_[best], request, queue_s(best));
    }
    case PrefillPolicy::kCacheAware:
    case PrefillPolicy::kGlobalCacheAware:
      break;
  }

  // Algorithm 1: for each instance, reuse its local prefix or (global policy) fetch the best prefix when
  // best_len / local_len > kvcache_balancing_threshold; TTFT = T_transfer + T_queue + T_prefill; keep the
  // smallest. T_transfer + T_prefill depends on the instance only through its local prefix length, and a request
  // sees few distinct lengths, so it is computed once per length (memo) and the loop is one add per instance.
  const bool global = options_.policy == PrefillPolicy::kGlobalCacheAware;
  const int64_t best_blocks = match_.best_blocks;
  auto prefix_for = [&](int64_t local) {
    bool fetch = global && best_blocks > local &&
                 (local == 0 || static_cast<double>(best_blocks) / static_cast<double>(local) >
                                    options_.kvcache_balancing_threshold);
    return fetch ? best_blocks : local;
  };
  cost_by_local_.assign(static_cast<size_t>(best_blocks) + 1, -1.0);
  auto cost_s = [&](int64_t local) {
    double& c = cost_by_local_[static_cast<size_t>(local)];
    if (c < 0) {
      PrefillChoice e = evaluate(0, local, prefix_for(local), request, 0.0);
      c = e.transfer_s + e.prefill_s;
    }
    return c;
  };

  InstanceId best = 0;
  double best_ttft_s = std::numeric_limits<double>::infinity();
  for (InstanceId i = 0; i < instances; ++i) {
    double ttft_s = queue_s(i) + cost_s(local_blocks_[i]);
    if (ttft_s < best_ttft_s) {
      best_ttft_s = ttft_s;
      best = i;
    }
  }
  return evaluate(best, local_blocks_[best], prefix_for(local_blocks_[best]), request, queue_s(best));
}

// Decode instance with the smallest predicted TBT once this request joins (Algorithm 1 line 17), preferring
// instances whose HBM can take the prompt's KV now. Incoming requests (still in prefill) count as joined.
InstanceId Conductor::choose_decode(const ClusterView& cluster, const RequestInfo& request,
                                    double& predicted_tbt_s) const {
  InstanceId best = 0;
  bool best_fits = false;
  predicted_tbt_s = std::numeric_limits<double>::infinity();
  for (InstanceId d = 0; d < cluster.decode_instance_count(); ++d) {
    DecodeLoad load = cluster.decode_load(d);
    bool fits = load.kv_reserved_tokens + load.incoming_tokens + request.input_tokens <= load.kv_capacity_tokens;
    double tbt_s = cost_.decode_step_time_s(load.running_requests + load.waiting_requests + load.incoming_requests + 1,
                                            load.context_tokens + load.incoming_tokens + request.input_tokens);
    if ((fits && !best_fits) || (fits == best_fits && tbt_s < predicted_tbt_s)) {
      best = d;
      best_fits = fits;
      predicted_tbt_s = tbt_s;
    }
  }
  return best;
}

Decision Conductor::schedule(const ClusterView& cluster, const RequestInfo& request, double now_s) {
  PrefillChoice p = choose_prefill(cluster, request, now_s);
  Decision d;
  const int64_t n = request.input_tokens;
  const int64_t block = options_.block_size_tokens;
  d.prefill_instance = p.instance;
  d.local_prefix_tokens = std::min(p.local_blocks * block, n);
  d.fetched_prefix_tokens = std::min((p.local_blocks + p.fetched_blocks) * block, n) - d.local_prefix_tokens;
  d.fetch_from = match_.best_instance;
  d.prefill_tokens = std::max<int64_t>(1, n - d.prefix_tokens());
  d.transfer_s = p.transfer_s;
  d.queue_s = p.queue_s;
  d.prefill_s = p.prefill_s;
  d.ttft_s = p.transfer_s + p.queue_s + p.prefill_s;
  d.decode_instance = choose_decode(cluster, request, d.predicted_tbt_s);
  if (options_.admission == Admission::kSlo) {
    if (d.ttft_s > options_.ttft_slo_s) {
      d.rejected = RejectReason::kTtft;
    } else if (d.predicted_tbt_s > options_.tbt_slo_s) {
      d.rejected = RejectReason::kTbt;
    }
  }
  return d;
}

}  // namespace crescent::conductor
