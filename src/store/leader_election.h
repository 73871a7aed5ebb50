// Master failover through etcd (docs/store.md, "Design"): several `crescent store master` processes
// campaign for one key (common/leader_election.h); the holder leads and its address is what clients and
// nodes connect to. A leader that
// dies stops renewing its etcd lease, the key vanishes within leader_ttl, and a standby takes it. The new
// leader starts empty; nodes find it in etcd, re-mount their segments with their indexes (mounted_segment.h),
// and every object whose bytes survived is readable again.
#pragma once

#include <chrono>
#include <string>

#include "common/leader_election.h"
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

/// The election options of the masters (leader_key(options) as the key).
ElectionOptions election_options(const EtcdStoreOptions& options);

}  // namespace crescent::store
