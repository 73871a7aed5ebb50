#include "sim/simulator.h"

#include <fmt/format.h>

#include <cmath>
#include <limits>

#include "common/name_table.h"
#include "sim/colocated.h"
#include "sim/disaggregated.h"

namespace crescent::sim {
namespace {

constexpr NameTable<System, 4> kSystems{"system",
                                        {{
                                            {"disaggregated", System::kDisaggregated},
                                            {"colocated", System::kColocated},
                                            {"colocated-prefix-cache", System::kColocatedPrefixCache},
                                            {"colocated-chunked-prefill", System::kColocatedChunkedPrefill},
                                        }}};

// Virtual time beyond which doubles lose sub-millisecond precision; arrivals later than this are refused.
constexpr double kMaxArrivalS = 1e9;

}  // namespace

Result<System> parse_system(std::string_view name) {
  return kSystems.parse(name);
}
std::string_view to_string(System system) {
  return kSystems.name(system);
}
std::vector<std::string> system_names() {
  return kSystems.names();
}

Status validate(const cluster::ClusterConfig& config, const SimOptions& options) {
  if (!(options.time_scale > 0) || !std::isfinite(options.time_scale)) {
    return Status::invalid_argument(fmt::format("--time-scale must be > 0, got {}", options.time_scale));
  }
  return cluster::validate(config, options.block_size_tokens);
}

Result<cluster::RunResult> simulate(const cluster::ClusterConfig& config,
                                    std::span<const trace::Request> trace, const SimOptions& options) {
  CRESCENT_RETURN_IF_ERROR(validate(config, options));
  if (trace.size() > std::numeric_limits<uint32_t>::max()) {
    return Status::invalid_argument("trace has more than 2^32 requests");
  }
  if (!trace.empty()) {
    const double last_arrival_s = trace::arrival_time_s(trace, trace.size() - 1, options.time_scale);
    if (!(last_arrival_s <= kMaxArrivalS)) {
      return Status::invalid_argument(
          fmt::format("the last arrival would be at {:g} s of virtual time (timestamp {} ms, time scale "
                      "{:g}); at most {:g} s "
                      "is supported",
                      last_arrival_s, trace.back().timestamp_ms, options.time_scale, kMaxArrivalS));
    }
  }
  if (options.system != System::kDisaggregated) return simulate_colocated(config, trace, options);
  return simulate_disaggregated(config, trace, options);
}

}  // namespace crescent::sim
