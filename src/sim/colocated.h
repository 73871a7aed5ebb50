// Colocated (vLLM-style) baselines: every node both prefills and decodes. Internal to sim; callers use
// sim::simulate() with SimOptions::system.
#pragma once

#include <span>

#include "cluster/cluster_config.h"
#include "cluster/run_result.h"
#include "common/status.h"
#include "sim/sim_options.h"
#include "trace/request.h"

namespace crescent::sim {

/// Simulates `config`'s prefill_instances + decode_instances nodes as colocated instances, for the colocated
/// systems of SimOptions::system. REQUIRES: validate(config, options) is ok and the arrivals are in range
/// (simulate() checks both).
Result<cluster::RunResult> simulate_colocated(const cluster::ClusterConfig& config,
                                              std::span<const trace::Request> trace,
                                              const SimOptions& options);

}  // namespace crescent::sim
