// Test fixtures shared by the sim tests.
#pragma once

#include <cstdint>

#include "cluster/cluster_config.h"
#include "perf/hardware_spec.h"
#include "perf/model_spec.h"

namespace crescent::sim {

/// llama3-70b on 8xA800 nodes, `prefill` + `decode` instances, every other field at its default.
inline cluster::ClusterConfig small_cluster(uint32_t prefill, uint32_t decode) {
  cluster::ClusterConfig c;
  c.name = "test";
  c.model = *perf::model_preset("llama3-70b");
  c.hardware = *perf::hardware_preset("8xA800");
  c.prefill_instances = prefill;
  c.decode_instances = decode;
  return c;
}

}  // namespace crescent::sim
