// The in-process cluster the serve tests run against: the bundled paper-fig5 config with `instances` prefill
// and `instances` decode mock instances, global cache-aware placement, the given admission and TTFT SLO, and
// what `adjust` changes.
#pragma once

#include <functional>
#include <memory>

#include "cluster/cluster_config.h"
#include "cluster/local_cluster.h"

namespace crescent::serve {

inline Result<std::unique_ptr<cluster::LocalCluster>> start_test_cluster(
    uint32_t instances, const char* admission = "none", double ttft_slo_s = 30,
    const std::function<void(cluster::ClusterConfig&)>& adjust = {}) {
  auto config = cluster::load_cluster_config(CRESCENT_SOURCE_DIR "/configs/paper-fig5.json", 512);
  if (!config.ok()) return config.status();
  auto parsed_admission = conductor::parse_admission(admission);
  if (!parsed_admission.ok()) return parsed_admission.status();
  config->prefill_instances = instances;
  config->decode_instances = instances;
  config->slo.ttft_s = ttft_slo_s;
  config->serve.policy = conductor::PrefillPolicy::kGlobalCacheAware;
  config->serve.admission = *parsed_admission;
  if (adjust) adjust(*config);
  return cluster::LocalCluster::start({.config = *config, .block_size_tokens = 512});
}

}  // namespace crescent::serve
