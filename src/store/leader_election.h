// Master failover through etcd (docs/store.md, "Design"): several `crescent store master` processes
// campaign for one key; the holder leads and its address is what clients and nodes connect to. A leader that
// dies stops renewing its etcd lease, the key vanishes within leader_ttl, and a standby takes it. The new
// leader starts empty; nodes find it in etcd, re-mount their segments with their indexes (mounted_segment.h),
// and every object whose bytes survived is readable again.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"

namespace crescent::store {

/// Where the store's masters meet in etcd.
struct EtcdStoreOptions {
  std::string endpoint;                             // etcd's client URL, http://HOST:PORT ("" = no etcd)
  std::string prefix = "/crescent-store";           // the leader key is PREFIX/master/leader
  std::chrono::seconds leader_ttl{5};               // the leader's etcd lease (whole seconds, >= 1)
  std::chrono::milliseconds request_timeout{1000};  // per etcd request
};

/// PREFIX/master/leader.
std::string leader_key(const EtcdStoreOptions& options);

/// The address ("host:port") of the leading master. kUnavailable when no master leads or etcd cannot be
/// reached.
Result<std::string> find_leader(const EtcdStoreOptions& options);

/// One master's campaign.
class LeaderElection {
 public:
  /// Starts campaigning for `address` in a thread: it tries to create the leader key under a lease of
  /// leader_ttl every leader_ttl / 10 while another master holds it; once elected it calls `on_elected` and
  /// keeps the lease alive every leader_ttl / 3. When the lease may be lost (etcd says it expired, or no
  /// keepalive succeeded for 3/4 of leader_ttl, so before etcd can expire it) it calls `on_lost` once and
  /// stops: a deposed leader must stop serving. kInvalidArgument for bad options (naming them).
  static Result<std::unique_ptr<LeaderElection>> start(const EtcdStoreOptions& options, std::string address,
                                                       std::function<void()> on_elected,
                                                       std::function<void()> on_lost);
  /// Stops campaigning and resigns (revokes the lease, so a standby takes over at once).
  ~LeaderElection();
  LeaderElection(const LeaderElection&) = delete;
  LeaderElection& operator=(const LeaderElection&) = delete;

  bool is_leader() const;

  class Impl;

 private:
  explicit LeaderElection(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::store
