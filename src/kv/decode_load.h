// A decode instance's KV load, as it reports it (its engine, engine::EngineCore::decode_load) and as the
// Conductor judges it (conductor::ClusterView::decode_load): requests and the HBM KV tokens reserved for
// them, by state. Below both the engine and the Conductor, so neither includes the other. The sums over a
// decode pool (what metrics and load samples show) are computed here only: DecodePoolLoad.
#pragma once

#include <cstdint>
#include <span>

namespace crescent::kv {

/// Requests in one state on a decode instance, and what they hold.
struct DecodeGroup {
  int64_t requests = 0;
  /// KV tokens they hold (or will hold on joining): prompt + tokens generated so far.
  int64_t context_tokens = 0;
  int64_t kv_tokens = 0;  // HBM KV tokens reserved for them: prompt + max output each (no preemption)

  bool operator==(const DecodeGroup&) const = default;
};

/// Load of one decode instance.
struct DecodeLoad {
  DecodeGroup running;             // in the continuous batch
  DecodeGroup waiting;             // KV arrived, waiting for HBM room to join the batch
  DecodeGroup incoming;            // assigned by the Conductor, still in prefill or KV transfer
  int64_t kv_capacity_tokens = 0;  // HBM KV tokens the instance can hold

  /// KV tokens of the requests whose KV is here (running and waiting): the instance's usage.
  int64_t committed_kv_tokens() const { return running.kv_tokens + waiting.kv_tokens; }
  /// KV tokens promised to requests: committed plus incoming. A request fits when its prompt + max output
  /// is at most kv_capacity_tokens - reserved_kv_tokens().
  int64_t reserved_kv_tokens() const { return committed_kv_tokens() + incoming.kv_tokens; }

  bool operator==(const DecodeLoad&) const = default;
};

/// The sums over a decode pool.
struct DecodePoolLoad {
  int64_t instances = 0;
  int64_t requests_running = 0;
  int64_t requests_waiting = 0;     // KV arrived, waiting for HBM room
  int64_t committed_kv_tokens = 0;  // DecodeLoad::committed_kv_tokens, summed
  int64_t reserved_kv_tokens = 0;   // DecodeLoad::reserved_kv_tokens, summed
  int64_t kv_capacity_tokens = 0;

  /// Adds one instance's load.
  void add(const DecodeLoad& load) {
    ++instances;
    requests_running += load.running.requests;
    requests_waiting += load.waiting.requests;
    committed_kv_tokens += load.committed_kv_tokens();
    reserved_kv_tokens += load.reserved_kv_tokens();
    kv_capacity_tokens += load.kv_capacity_tokens;
  }
  /// committed / capacity (vLLM's kv_cache_usage_perc as a share; above 1 when a backlog waits for room);
  /// 0 for a pool of no capacity.
  double usage() const {
    return kv_capacity_tokens > 0
               ? static_cast<double>(committed_kv_tokens) / static_cast<double>(kv_capacity_tokens)
               : 0;
  }
};

/// The sums of `loads`.
inline DecodePoolLoad sum_decode_loads(std::span<const DecodeLoad> loads) {
  DecodePoolLoad pool;
  for (const DecodeLoad& load : loads) pool.add(load);
  return pool;
}

}  // namespace crescent::kv
