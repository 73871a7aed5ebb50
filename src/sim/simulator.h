// Trace-driven discrete-event simulation of a cluster on a virtual clock: the disaggregated cluster
// (disaggregated.h: the cluster model of src/cluster driven by virtual time, placed by the real Conductor)
// or a colocated vLLM-style baseline (colocated.h), on the same nodes. All times come from perf::CostModel.
#pragma once

#include <span>

#include "cluster/cluster_config.h"
#include "cluster/run_result.h"
#include "common/status.h"
#include "sim/sim_options.h"
#include "trace/request.h"

namespace crescent::sim {

/// Checks that `config` can run with `options`: time scale > 0, block size >= 1, at least one instance per
/// pool, a prefill cache of at least one block, model weights that leave HBM room for KV in a decode
/// instance. Errors (kInvalidArgument) say which.
Status validate(const cluster::ClusterConfig& config, const SimOptions& options);

/// Replays `trace` (sorted by timestamp, as the reader guarantees) through `config`, virtual time starting
/// at the first arrival (arrival_time_s). Deterministic: the same inputs give the same result. Errors: those
/// of validate(), and arrivals later than 1e9 s of virtual time (a trace spanning decades or a tiny time
/// scale).
Result<cluster::RunResult> simulate(const cluster::ClusterConfig& config,
                                    std::span<const trace::Request> trace, const SimOptions& options);

}  // namespace crescent::sim
