// What the router reads from an engine's Prometheus /metrics (docs/router.md, "Load"): vLLM's names
// (serving-notes: vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc, the prefix
// cache counters, and vllm:cache_config_info's block_size and num_gpu_blocks labels), and SGLang's for the
// same gauges (sglang:num_running_reqs, sglang:num_queue_reqs, sglang:token_usage).
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace crescent::router {

/// One scrape's figures; a figure the engine does not expose is absent. Samples of one name with several
/// label sets (e.g. one per model_name or engine) are summed.
struct EngineMetrics {
  std::optional<double> requests_running;  // in its batch
  std::optional<double> requests_waiting;  // queued
  std::optional<double> kv_cache_usage;    // 0..1
  std::optional<double> prefix_cache_queries_tokens;
  std::optional<double> prefix_cache_hits_tokens;
  std::optional<int64_t> block_size_tokens;  // vllm:cache_config_info{block_size}
  std::optional<int64_t> gpu_blocks;         // vllm:cache_config_info{num_gpu_blocks}
};

/// Reads the Prometheus text exposition format `text`. Lines it cannot read are skipped; never fails.
EngineMetrics parse_engine_metrics(std::string_view text);

}  // namespace crescent::router
