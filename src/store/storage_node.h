// A storage node (`crescent store node`): contributes a DRAM segment to the pool and keeps it mounted. Value
// bytes reach the segment straight from clients through the transfer engine (tcp; shm from the same host;
// ucx); the node itself moves none of them.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/status.h"
#include "store/master_client.h"
#include "store/ssd_tier.h"
#include "transfer/transfer_engine.h"

namespace crescent::store {

/// Settings of a storage node.
struct StorageNodeOptions {
  MasterClientOptions master = {};
  std::string name = "";             // engine name, unique in the cluster; "" = store-node-HOST-PID
  uint64_t dram_bytes = 1ull << 30;  // size of the DRAM segment
  std::vector<transfer::TransportKind> transports = {transfer::TransportKind::kShm,
                                                     transfer::TransportKind::kTcp};
  /// Address clients connect to; empty: this machine's address on the interface that reaches the master.
  std::string tcp_host;
  std::string metrics_address = "127.0.0.1:0";  // /metrics; port 0 picks one; "" = none
  std::string ssd_dir = "";         // "" = no SSD tier; else objects evicted from DRAM are spilled here
  uint64_t ssd_capacity_bytes = 0;  // the SSD tier's size (least recently used files go beyond it)
  /// Renewals (index updates). Spill and load orders run on an SSD thread of their own, and their outcome is
  /// reported at once.
  std::chrono::milliseconds sync_interval{100};
  std::chrono::milliseconds ssd_delay_for_testing{0};  // MountedSegment::Options
};

class StorageNode {
 public:
  /// Connects to the master, starts the engine on the transfer metadata the master names, and mounts a DRAM
  /// segment NAME/dram. Errors from each step, naming it.
  static Result<std::unique_ptr<StorageNode>> start(StorageNodeOptions options);
  /// Unmounts the segment (its objects leave the pool) and stops.
  ~StorageNode();
  StorageNode(const StorageNode&) = delete;
  StorageNode& operator=(const StorageNode&) = delete;

  /// The DRAM segment's name.
  const std::string& segment() const;
  /// "host:PORT" of /metrics, or "".
  const std::string& metrics_address() const;
  /// Complete objects in the node's own index (what a re-mount would restore).
  uint64_t indexed_objects() const;
  /// Spills its SSD tier could not write (crescent_store_node_ssd_spill_failures_total).
  uint64_t ssd_spill_failures() const;
  /// What its SSD tier adopted from a previous run's files at start (MountedSegment::ssd_adopted).
  const SsdTier::Adopted& ssd_adopted() const;

  class Impl;

 private:
  explicit StorageNode(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::store
