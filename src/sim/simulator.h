// Trace-driven discrete-event simulation of a disaggregated (prefill/decode) cluster on a virtual clock,
// placed by the real Conductor (conductor/conductor.h). Prefill instances: FIFO queue, chunked prefill with
// KV streamed to decode chunk by chunk, DRAM prefix cache with LRU that never evicts blocks in use. Decode
// instances: continuous batching, admission bounded by HBM KV capacity. KV transfers and remote prefix
// fetches take bytes / network bandwidth. All times come from perf::CostModel.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "conductor/conductor.h"
#include "sim/cluster_config.h"
#include "trace/request.h"

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
  /// Virtual seconds between load samples in SimResult::load_series (0: none).
  double load_sample_interval_s = 0;
  /// Called every few hundred arrivals (may be empty).
  std::function<void(const SimProgress&)> progress = nullptr;
};

/// What happened to one request. Times in seconds of virtual time since the first arrival. Fields that do not
/// apply are 0: every time but arrival_s and finish_s for a rejected request, tbt_s and max_token_gap_s with
/// fewer than 2 output tokens (requests_jsonl() writes them as null).
struct RequestOutcome {
  double arrival_s = 0;
  double ttft_s = 0;  // arrival → first token (end of prefill) = queue_wait_s + prefix_load_s + prefill
  double tbt_s = 0;   // mean of the longest 10% of its token gaps (paper §5.1)
  double max_token_gap_s = 0;  // its longest token gap (the first includes KV transfer and waiting for HBM)
  double finish_s = 0;         // last token (the arrival when rejected)
  double queue_wait_s = 0;     // arrival → its prefill could start (queue; remote prefix not yet computed)
  double prefix_load_s = 0;    // fetching the remote part of its prefix and loading the prefix into HBM
  int64_t trace_line = 0;      // the request's line in its trace file (trace::Request::line)
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  int64_t prefix_hit_tokens = 0;  // prompt tokens reused: local cache + fetched
  int64_t fetched_tokens = 0;     // of which fetched from another prefill instance
  double prefill_compute_s = 0;   // GPU time of its prefill (what reuse saves)
  InstanceId prefill_instance = 0;
  InstanceId decode_instance = 0;
  conductor::RejectReason rejected = conductor::RejectReason::kNone;
};

/// Work done by a run, for speed reports.
struct SimCounters {
  int64_t events = 0;        // disaggregated: arrivals + prefill completions + KV arrivals + decode steps;
                             // colocated: arrivals + iterations
  int64_t decode_steps = 0;  // continuous-batching iterations over all decode instances
  int64_t decisions = 0;     // Conductor::schedule calls
};

/// Load of the two pools at one moment (disaggregated runs).
struct LoadSample {
  double time_s = 0;
  double prefill_queue_s = 0;  // mean over prefill instances of the queued work, seconds
  double decode_kv_share = 0;  // KV of running and waiting requests / HBM KV capacity, over the decode pool
                               // (above 1: a backlog waiting for room)
  int64_t decode_running = 0;  // requests in decode batches
  int64_t decode_waiting = 0;  // requests whose KV arrived, waiting for HBM room
};

struct SimResult {
  std::vector<RequestOutcome> requests;  // in trace order
  SimCounters counters;
  double makespan_s = 0;                // virtual time when the last request finished
  std::vector<LoadSample> load_series;  // every SimOptions::load_sample_interval_s, until the cluster drains
};

/// When `trace`[i] arrives, in seconds of virtual time: time is measured from the first request's arrival
/// (so traces with Unix-epoch timestamps run as if shifted to start at 0) and divided by `time_scale`.
/// REQUIRES: i < trace.size().
inline double arrival_time_s(std::span<const trace::Request> trace, size_t i, double time_scale) {
  return static_cast<double>(trace[i].timestamp_ms - trace.front().timestamp_ms) / 1000.0 / time_scale;
}

/// Checks that `config` can run with `options`: time scale > 0, block size >= 1, at least one instance per
/// pool, a prefill cache of at least one block, model weights that leave HBM room for KV in a decode
/// instance. Errors (kInvalidArgument) say which.
Status validate(const ClusterConfig& config, const SimOptions& options);

/// Replays `trace` (sorted by timestamp, as the reader guarantees) through `config`, virtual time starting
/// at the first arrival (arrival_time_s). Deterministic: the same inputs give the same result. Errors: those
/// of validate(), and arrivals later than 1e9 s of virtual time (a trace spanning decades or a tiny time
/// scale).
Result<SimResult> simulate(const ClusterConfig& config, std::span<const trace::Request> trace,
                           const SimOptions& options);

}  // namespace crescent::sim
