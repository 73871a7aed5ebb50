#include "sim/colocated.h"

namespace crescent::sim {

Result<SimResult> simulate_colocated(const ClusterConfig&, std::span<const trace::Request>, const SimOptions&) {
  return Status::internal("colocated systems are being written");
}

}  // namespace crescent::sim
