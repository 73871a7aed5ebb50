// The master as a control-protocol server (store/control_rpc.h: a thread per connection; handlers call
// Master, whose lock they share), its background ticks, and its /metrics endpoint (Prometheus text,
// crescent_store_ prefix, docs/store.md lists the metrics).
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "common/secret.h"
#include "common/status.h"
#include "store/leader_election.h"
#include "store/master.h"

namespace crescent::store {

/// Settings of a master process.
struct MasterServerOptions {
  std::string listen_address = "127.0.0.1:50051";  // host:port of the control protocol; port 0: a free one
  /// With listen_address on every address (0.0.0.0:P): the host published in etcd and reported by address()
  /// for nodes and clients to reach. Empty: the interface that reaches etcd (loopback without etcd).
  std::string advertise_host;
  std::string metrics_address = "127.0.0.1:9151";  // host:port serving /metrics; port 0 picks one; "" = none
  /// Where nodes and clients publish and find transfer-engine segments, handed to them by Hello:
  /// "dir:PATH" (one machine, no service; transfer/metadata.h) or "etcd:URL". "" = the default dir.
  std::string transfer_metadata = "";
  MasterOptions master = {};
  std::chrono::milliseconds tick_interval{100};  // how often Master::tick runs
  /// With an etcd endpoint: campaign for leadership (leader_election.h) and answer every call with
  /// UNAVAILABLE
  /// ("standby") until elected; the transfer metadata then defaults to the same etcd. Without: lead at once.
  EtcdStoreOptions etcd = {};
  /// Called (from the election thread) when this master loses its leadership; it stops serving at once.
  std::function<void()> on_leadership_lost = nullptr;
  /// The members' secret: only nodes and clients holding it are served (store/control_rpc.h, "Members
  /// only"). Unset: everyone is, which only tests and benchmarks in one process should do.
  std::optional<ClusterSecret> secret = std::nullopt;
};

class MasterServer {
 public:
  /// Validates the options and starts serving. kInvalidArgument for bad options (naming the field);
  /// kUnavailable when an address cannot be bound (naming it).
  static Result<std::unique_ptr<MasterServer>> start(MasterServerOptions options);
  /// Stops serving (in-flight calls finish or are cancelled) and the tick thread.
  ~MasterServer();
  MasterServer(const MasterServer&) = delete;
  MasterServer& operator=(const MasterServer&) = delete;

  /// "127.0.0.1:PORT" as bound (the chosen port when 0 was asked).
  const std::string& address() const;
  /// "127.0.0.1:PORT" of /metrics, or "" when disabled.
  const std::string& metrics_address() const;
  /// The transfer metadata spec handed to nodes and clients.
  const std::string& transfer_metadata() const;
  /// Whether this master leads (always, without etcd).
  bool is_leader() const;
  Master& master();

  class Impl;

 private:
  explicit MasterServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::store
