// One prefill or decode instance of the multi-process cluster (`crescent serve prefill|decode`): an
// engine::EngineCore with the mock executor (or the cpu executor, computing a real model on a thread of its
// own) on the steady clock, taking orders from the Conductor over
// instance_wire.h and moving real (scaled) KV bytes:
//   prefill: reads the arranged prefix from the pool (store::Client batch_get, checksums verified), computes
//            the rest (as long as the cost model says), writes its new full blocks to the pool (put_blocks),
//            writes the prompt's KV into the memory its decode instance reserved (transfer engine), then says
//            prefill done; publishes its prefix cache's KV events in vLLM's format (kv_events.h).
//   decode:    reserves room in a registered segment when the Conductor places a request, checks every
//            block's checksum when the KV has arrived, runs the continuous batch, reports each step's tokens;
//            frees a reservation on cancel, on finish, or after kv_transfer_timeout_s without KV.
// Both send a load report every 50 ms (the Conductor's heartbeat) and after each change.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "cluster/conductor_core.h"
#include "common/secret.h"
#include "common/status.h"
#include "serve/instance_wire.h"

namespace crescent::serve {

class LeasedKey;

struct InstanceOptions {
  InstanceRole role = InstanceRole::kPrefill;
  /// Its number within its role: its name is "prefill-INDEX" / "decode-INDEX", unique in the cluster. The
  /// config's instances are 0 .. count-1; another index joins the cluster as it starts.
  uint32_t index = 0;
  std::string conductor_endpoint;  // the Conductor's control socket, "tcp://HOST:PORT" ("": from etcd)
  /// Prefill: the store master's host:port (the KV cache pool; its Hello names the transfer metadata). Empty
  /// with etcd: the leading master found in etcd under store_etcd_prefix, and found again after a master
  /// failover. Decode needs no store: it only exposes the memory its requests' KV is written into.
  std::string store_master;
  std::string store_etcd_prefix =
      "/crescent-store";  // the store masters' prefix in etcd (store_master empty)
  /// Prefill: keep the prefix cache in this file too (kv/persistent_block_file.h; a path in /dev/shm), and
  /// adopt what a previous run left in it, so a restarted instance keeps its cache. "": none.
  std::string cache_file;
  cluster::ClusterOptions cluster;  // model, hardware, capacities, "serve" section, block size
  /// The address peers reach this instance on: a prefill instance's KV event sockets (the Conductor
  /// subscribes) and the transfer engine's tcp endpoint (a decode instance's KV segment). Empty: the address
  /// of the interface that reaches the Conductor (or etcd), so never loopback when they are elsewhere.
  std::string advertise_host;
  /// Decode: where its KV segment is published (transfer::open_metadata spec; prefill instances look it up
  /// there through the store's). Empty: "etcd:" + etcd_endpoint with etcd, else the store's default.
  std::string transfer_metadata;
  /// With an etcd endpoint: register under etcd_prefix/instances/NAME with a lease while running, and find
  /// the Conductor's control socket there when conductor_endpoint is empty (etcd_registry.h).
  std::string etcd_endpoint;
  std::string etcd_prefix = "/crescent-serve";
  /// The cluster's secret (required): the instance connects to the Conductor as a member, and its KV event
  /// sockets admit members only (members_only.h).
  std::optional<ClusterSecret> secret;
};

class InstanceServer {
 public:
  /// Connects to the store (prefill) or starts a transfer engine (decode), allocates and registers KV
  /// memory, binds the KV event sockets, starts the instance's thread (it says hello to the Conductor,
  /// reconnecting while the Conductor is away) and, with etcd, registers. kInvalidArgument for a prefill
  /// instance without a store; the store's, the transfer engine's, ZeroMQ's or etcd's
  /// error otherwise (kUnavailable: no Conductor in etcd within 20 s, or no route to it).
  static Result<std::unique_ptr<InstanceServer>> start(const InstanceOptions& options);
  /// Starts draining (SIGTERM, docs/serving.md "Instances up and down"): the instance tells the Conductor,
  /// which places nothing new here and acknowledges; what it has goes on. Returns at once.
  void begin_drain();
  /// Whether the drain is done: the Conductor acknowledged (or did not within 5 s: it may be gone) and
  /// nothing is left (no prompt queued or computing, no reservation, nothing decoding). Then destroying the
  /// instance loses nothing.
  bool drained() const;
  /// Leaves: deregisters (with etcd), stops the thread and releases everything. Requests still here are
  /// placed again by the Conductor when it sees the instance gone.
  ~InstanceServer();

  class Impl;

 private:
  InstanceServer(std::unique_ptr<Impl> impl, std::unique_ptr<LeasedKey> registration);
  std::unique_ptr<Impl> impl_;
  std::unique_ptr<LeasedKey> registration_;  // with etcd; destroyed first: the instance leaves the view first
};

}  // namespace crescent::serve
