// A disaggregated cluster in one process, on the steady clock: the ConductorCore (the real Conductor over a
// ClusterState) with prefill and decode instances that are engine::EngineCore with the mock executor, and KV
// hand-off delayed by the cost model's transfer time. It is the simulator's system run in real time; the
// multi-process cluster (remote_cluster.h) runs the same core and engines in separate processes.
#pragma once

#include <memory>
#include <string>

#include "cluster/cluster.h"
#include "cluster/conductor_core.h"
#include "common/status.h"

namespace crescent::cluster {

/// The cluster. Thread-safe: submit() and cancel() from any thread; callbacks come from its driver thread.
class LocalCluster final : public Cluster {
 public:
  /// Validates the config (as the simulator does) and starts the driver thread.
  static Result<std::unique_ptr<LocalCluster>> start(const ClusterOptions& options);
  ~LocalCluster() override;

  conductor::Decision submit(ClusterRequest request, RequestCallbacks callbacks, uint64_t& id) override;
  void cancel(uint64_t id) override;
  int64_t max_context_tokens() const override;
  size_t requests_in_flight() const override;
  std::string metrics_text() const override;
  /// Every instance: in process, nothing goes down.
  std::pair<uint32_t, uint32_t> instances_up() const override;

  class Impl;

 private:
  explicit LocalCluster(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::cluster
