// What a simulation run is asked to do: the serving system simulated on the config's nodes, the Conductor's
// policies, the block size, the time scale and what to sample. The config itself is cluster::ClusterConfig.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "conductor/conductor.h"

namespace crescent::sim {

/// The serving architecture being simulated, on the same nodes (prefill_instances + decode_instances of the
/// config).
enum class System {
  kDisaggregated,         // Mooncake: separate prefill and decode instances, placed by the Conductor
  kColocated,             // vLLM-style: every node prefills and decodes; a prefill iteration stalls the batch
  kColocatedPrefixCache,  // colocated, plus a prefix cache in each node's own HBM
  kColocatedChunkedPrefill,  // colocated, prefill split into chunks that share iterations with decode
};

/// Parses "disaggregated", "colocated", "colocated-prefix-cache", "colocated-chunked-prefill"; the error
/// (kNotFound) lists the valid names.
Result<System> parse_system(std::string_view name);
/// The name of `system`, as parse_system() reads it.
std::string_view to_string(System system);
/// Every system's name, in the order above.
std::vector<std::string> system_names();

/// How often, in arrivals, SimOptions::progress is called.
inline constexpr uint32_t kProgressEveryRequests = 256;

/// Where a run is, for progress displays.
struct SimProgress {
  int64_t requests_arrived = 0;  // arrivals processed so far
  int64_t requests_total = 0;
  double simulated_s = 0;  // virtual clock
};

struct SimOptions {
  System system = System::kDisaggregated;
  conductor::PrefillPolicy policy = conductor::PrefillPolicy::kGlobalCacheAware;  // disaggregated only
  conductor::Admission admission = conductor::Admission::kNone;
  int64_t block_size_tokens = 512;  // tokens per trace block (hash_id)
  /// Arrivals happen at timestamp / time_scale: 2 replays the trace twice as fast (load sweeps). > 0.
  double time_scale = 1.0;
  /// Tokens of prefill per iteration for System::kColocatedChunkedPrefill (vLLM's max_num_batched_tokens).
  int64_t chunked_prefill_tokens = 512;
  /// Virtual seconds between load samples in cluster::RunResult::load_series (0: none).
  double load_sample_interval_s = 0;
  /// Called every kProgressEveryRequests arrivals (may be empty).
  std::function<void(const SimProgress&)> progress = nullptr;
  /// Disaggregated: the Conductor's state (conductor::ClusterState) is told of a prompt's blocks only up to
  /// the last one a later request of the trace names (conductor::RequestInfo::reused_later_blocks). No
  /// decision looks up the others again, so the decisions and every output are the same, for less work (the
  /// 1M-request run: docs/benchmarks.md, "Blocks no later request names"), and the prefill engines' caches
  /// keep the others unkeyed (kv::BlockCache's top comment; "Unkeyed blocks" there). false: of every block,
  /// as a live Conductor and live instances.
  bool index_only_reused_blocks = true;
};

}  // namespace crescent::sim
