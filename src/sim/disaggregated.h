// The disaggregated cluster simulated (Mooncake's; paper §3): the cluster model of src/cluster on a virtual
// clock. The real Conductor places each request through the placement protocol (cluster::place) over a
// ClusterState fed by the instances' events; prefill and decode instances are engine::EngineCore with the
// options live instances use and the mock executor. Prefill instances: FIFO queue, chunked prefill with KV
// streamed to decode chunk by chunk, DRAM prefix cache with LRU that never evicts blocks in use. Decode
// instances: continuous batching, admission bounded by HBM KV capacity. Internal to sim; callers use
// sim::simulate().
#pragma once

#include <span>

#include "cluster/cluster_config.h"
#include "cluster/run_result.h"
#include "sim/sim_options.h"
#include "trace/request.h"

namespace crescent::sim {

/// Simulates `config` as a disaggregated cluster. REQUIRES: validate(config, options) is ok and the arrivals
/// are in range (simulate() checks both).
cluster::RunResult simulate_disaggregated(const cluster::ClusterConfig& config,
                                          std::span<const trace::Request> trace, const SimOptions& options);

}  // namespace crescent::sim
