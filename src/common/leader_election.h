// Leadership through etcd, for roles that run as several processes of which one leads (the store master,
// docs/store.md "Design"; the Conductor, docs/serving.md "Conductor failover"): each campaigns for one key,
// the holder leads and the key's value (its address) is what others connect to. A leader that dies stops
// renewing its etcd lease, the key vanishes within leader_ttl, and a standby takes it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "common/status.h"

namespace crescent {

/// Where and how a role's processes campaign.
struct ElectionOptions {
  std::string endpoint;                             // etcd's client URL, http://HOST:PORT
  std::string key;                                  // the leader key: whoever holds it leads
  std::chrono::seconds leader_ttl{5};               // the leader's etcd lease (whole seconds, >= 1)
  std::chrono::milliseconds request_timeout{1000};  // per etcd request
};

/// One process's campaign.
class LeaderElection {
 public:
  /// Starts campaigning for `value` (what the key holds while this process leads: its address) in a thread:
  /// it tries to create the key under a lease of leader_ttl every leader_ttl / 10 while another process holds
  /// it; once elected it calls `on_elected` with the lease the key is held under (other keys put under it go
  /// with the leadership) and keeps the lease alive every leader_ttl / 3. When the lease may
  /// be lost (etcd says it expired, or no keepalive succeeded for 3/4 of leader_ttl, so before etcd can
  /// expire it) it calls `on_lost` once and stops: a deposed leader must stop leading. Both run on the
  /// election's thread. kInvalidArgument for bad options or an empty value (naming them).
  static Result<std::unique_ptr<LeaderElection>> start(const ElectionOptions& options, std::string value,
                                                       std::function<void(int64_t lease)> on_elected,
                                                       std::function<void()> on_lost);
  /// Stops campaigning and resigns (revokes the lease, so a standby takes over at once).
  ~LeaderElection();
  LeaderElection(const LeaderElection&) = delete;
  LeaderElection& operator=(const LeaderElection&) = delete;

  bool is_leader() const;
  /// The lease the key is held under while leading (0 otherwise): other keys put under it go with the
  /// leadership.
  int64_t lease() const;

  class Impl;

 private:
  explicit LeaderElection(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent
