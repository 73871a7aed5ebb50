// The Conductor of the multi-process cluster: the cluster::ConductorCore (the same placement, state and
// request bookkeeping as the in-process cluster) whose instances are separate processes (instance_server.h).
// They connect to its control socket (ZeroMQ ROUTER, instance_wire.h), report their load every 50 ms, and are
// down when their connection closes (the process died) or when silent for the config's heartbeat_timeout_s
// (it hangs, or the network between is cut): their requests then fail (SSE error event, or 503)
// and nothing more is placed there until they say hello again. An instance that reports but does not answer
// is not down: its requests fail at their stage deadlines (cluster::RequestStage, checked every 20 ms).
// Prefill instances' KV events (vLLM format) feed the ClusterState from a subscriber per instance.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "cluster/cluster.h"
#include "cluster/conductor_core.h"
#include "common/secret.h"
#include "common/status.h"

namespace crescent::serve {

struct RemoteClusterOptions {
  cluster::ClusterOptions cluster;
  std::string control_endpoint = "tcp://127.0.0.1:0";  // where instances connect (port 0: any free one)
  /// The host instances reach the control socket on, when it is bound to every address (tcp://0.0.0.0:P):
  /// empty = the address of the interface that reaches etcd. Unused when it is bound to one address.
  std::string advertise_host;
  bool log_instances = true;  // print "prefill-0 up" / "decode-1 down" lines to stderr
  /// With an etcd endpoint ("http://HOST:PORT"): campaign for etcd_prefix/conductor
  /// (common/leader_election.h) with the control endpoint as its value, so that of several Conductors one
  /// leads and the others stand by (docs/serving.md, "Conductor failover"), and take as up only instances
  /// registered under etcd_prefix/instances/ (etcd_registry.h). Empty: the control socket is the registry.
  std::string etcd_endpoint;
  std::string etcd_prefix = "/crescent-serve";
  /// With etcd: the leader's lease. A standby leads within this (+ its retry period, leader_ttl / 10) of the
  /// leader's death.
  std::chrono::seconds leader_ttl{5};
  /// With etcd: called (on the election's thread) when this Conductor, leading, may have lost its lease: it
  /// must stop serving at once (`crescent serve conductor` exits 1). Empty: nothing is done.
  std::function<void()> on_leadership_lost;
  /// With etcd: the URL clients reach this Conductor's HTTP at ("http://HOST:PORT"); while it leads it is
  /// published under etcd_prefix/conductor-http for standbys to forward to. Empty: not published.
  std::string http_url;
  /// The cluster's secret (required): the control socket admits members only and the KV-event subscribers
  /// connect as members (members_only.h).
  std::optional<ClusterSecret> secret;
};

class RemoteCluster final : public cluster::Cluster {
 public:
  /// Validates the config, binds the control socket, campaigns in etcd (when set) and starts the
  /// Conductor's threads. kInvalidArgument without a secret; kUnavailable when the endpoint cannot be bound
  /// or etcd cannot be reached.
  static Result<std::unique_ptr<RemoteCluster>> start(const RemoteClusterOptions& options);
  ~RemoteCluster() override;

  /// The control endpoint as instances reach it, "tcp://HOST:PORT" (what --conductor takes, and what etcd
  /// holds): the bound one, its host replaced by the advertised one when bound to every address.
  const std::string& control_endpoint() const;
  /// Waits until every instance the config names is up; false when `timeout` passes first.
  bool wait_until_all_up(std::chrono::milliseconds timeout) const;
  std::pair<uint32_t, uint32_t> instances_up() const override;
  /// With etcd, standing by: the leading Conductor's HTTP URL (RemoteClusterOptions::http_url), as read from
  /// etcd every 200 ms. Empty while this Conductor leads, or when no leader published one.
  std::string leader_http_url() const;

  conductor::Decision submit(cluster::ClusterRequest request, cluster::RequestCallbacks callbacks,
                             uint64_t& id) override;
  void cancel(uint64_t id) override;
  int64_t max_context_tokens() const override;
  size_t requests_in_flight() const override;
  std::string metrics_text() const override;

  class Impl;

 private:
  explicit RemoteCluster(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::serve
