// The RPC client of the store's master, shared by storage nodes and the client library: the control protocol
// (store/control_rpc.h) over a pool of connections, a deadline on every call, bounded retries with
// exponential back-off while the master is unreachable.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/secret.h"
#include "common/status.h"
#include "store/leader_election.h"
#include "store/master.h"
#include "store/types.h"

namespace crescent::store {

/// $CRESCENT_STORE_MASTER when set, else "127.0.0.1:50051" (MasterServerOptions' default).
std::string default_master_address();

/// Settings of the connection to a master.
struct MasterClientOptions {
  std::string address = default_master_address();  // host:port; unused when etcd.endpoint is set
  /// With an etcd endpoint: the address is the leading master's, found in etcd, and found again whenever the
  /// master cannot be reached (a failover); unreachable calls are then retried for failover_budget.
  EtcdStoreOptions etcd = {};
  /// The members' secret, which a master started with one requires (kPermissionDenied without it). Nodes
  /// and clients also give it to their transfer engines (transfer::EngineOptions::secret).
  std::optional<ClusterSecret> secret = std::nullopt;
  std::chrono::milliseconds failover_budget{12000};
  std::chrono::milliseconds rpc_timeout{2000};    // deadline of each attempt
  int max_attempts = 4;                           // attempts while the master is unreachable, >= 1
  std::chrono::milliseconds initial_backoff{50};  // wait before the 2nd attempt; doubles after each
  /// Connections kept open between calls, 1..1024: a call takes an idle one or opens another, so as many
  /// are open as calls run at once, and at most this many stay open after them.
  int idle_connections = 16;
};

/// What the master tells its members at connect (Hello).
struct MasterInfo {
  std::string transfer_metadata;  // transfer::open_metadata spec
  std::chrono::milliseconds lease_ttl{0};
  std::chrono::milliseconds segment_ttl{0};
};

/// The master's stats and segments (`store stat`).
struct MasterSnapshot {
  MasterStats stats;
  std::vector<SegmentInfo> segments;
};

/// Every call returns kUnavailable ("store master at ADDR unreachable after N attempts: ...") when the master
/// cannot be reached (with etcd: when no leader answers within failover_budget), kDeadlineExceeded when it
/// does not answer in time, and otherwise the master's answer (Master's per-key results, in key order).
/// Thread-safe.
class MasterClient {
 public:
  /// Connects and says Hello. kInvalidArgument for bad options; kUnavailable as above.
  static Result<std::unique_ptr<MasterClient>> connect(MasterClientOptions options = {});
  ~MasterClient();
  MasterClient(const MasterClient&) = delete;
  MasterClient& operator=(const MasterClient&) = delete;

  const MasterInfo& info() const;
  /// The master's address now (with etcd: the leader's, as last found).
  std::string address() const;

  Status mount_segment(const SegmentMount& mount, std::span<const HeldObject> held = {});
  Status unmount_segment(std::string_view segment);
  Result<SegmentChanges> renew_segment(std::string_view segment, uint64_t since_version,
                                       const SegmentReport& report = {});
  Result<std::vector<Result<std::vector<ReplicaLocation>>>> put_start(std::span<const std::string_view> keys,
                                                                      std::span<const uint64_t> sizes_bytes,
                                                                      const ReplicateConfig& config,
                                                                      std::string_view writer_host_id);
  /// `unwritten_segments`: empty, or for each key the segments its writer could not write
  /// (Master::put_end).
  Result<std::vector<Status>> put_end(std::span<const std::string_view> keys,
                                      std::span<const std::vector<std::string>> unwritten_segments = {});
  Result<std::vector<Status>> put_revoke(std::span<const std::string_view> keys,
                                         std::span<const std::vector<std::string>> unwritten_segments = {});
  Result<std::vector<Result<ReadGrant>>> get_replica_list(std::span<const std::string_view> keys);
  Result<std::vector<bool>> exists(std::span<const std::string_view> keys);
  Result<std::vector<Status>> remove(std::span<const std::string_view> keys);
  Result<uint64_t> remove_all();
  Result<MasterSnapshot> stats();

  class Impl;

 private:
  explicit MasterClient(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::store
