// A store on loopback for tests, in this process: a master on a free port (its /metrics too), the transfer
// metadata in a private directory, and storage nodes, members of one cluster (a secret of their own, also in
// secret_file() for `crescent store` processes). Clients connect with client_options().
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "store/client.h"
#include "store/master_server.h"
#include "store/storage_node.h"
#include "test_support/temp_dir.h"

namespace crescent::store::test {

class StoreCluster {
 public:
  /// Starts a master with `options` (addresses and metadata replaced by private ones) and `nodes` nodes of
  /// `node_bytes` each. Check ok() afterwards.
  explicit StoreCluster(size_t nodes = 2, uint64_t node_bytes = 16 << 20)
      : StoreCluster(nodes, node_bytes, MasterServerOptions()) {}
  StoreCluster(size_t nodes, uint64_t node_bytes, const MasterServerOptions& given) {
    MasterServerOptions options = given;
    options.listen_address = "127.0.0.1:0";
    options.metrics_address = "127.0.0.1:0";
    options.transfer_metadata = "dir:" + dir_.file("metadata");
    if (!options.secret) options.secret = ClusterSecret::generate();
    if (Status written = options.secret->write_to(secret_file()); !written.ok()) {
      error_ = written.to_string();
      return;
    }
    options_ = options;
    auto master = MasterServer::start(options);
    if (!master.ok()) {
      error_ = master.status().to_string();
      return;
    }
    master_ = std::move(*master);
    for (size_t i = 0; i < nodes; ++i) {
      Status added = add_node(node_bytes);
      if (!added.ok()) {
        error_ = added.to_string();
        return;
      }
    }
  }

  /// Stops the master and starts a new one with the same options on the same address (an empty master: the
  /// nodes' re-mounts rebuild it).
  Status restart_master() {
    MasterServerOptions options = options_;
    options.listen_address = master_->address();
    master_.reset();
    auto master = MasterServer::start(options);
    if (!master.ok()) return master.status();
    master_ = std::move(*master);
    return Status();
  }

  bool ok() const { return error_.empty(); }
  const std::string& error() const { return error_; }
  MasterServer& master() { return *master_; }
  std::vector<std::unique_ptr<StorageNode>>& nodes() { return nodes_; }
  const std::string& dir() const { return dir_.path(); }
  /// The cluster's secret, as `--cluster-secret-file` takes it.
  std::string secret_file() const { return dir_.file("cluster-secret"); }
  const ClusterSecret& secret() const { return *options_.secret; }

  MasterClientOptions master_options() const {
    MasterClientOptions options;
    options.address = master_->address();
    options.secret = options_.secret;
    return options;
  }

  StorageNodeOptions node_options(uint64_t bytes) {
    StorageNodeOptions options;
    options.master = master_options();
    options.name = "node" + std::to_string(next_node_++) + "-" + std::to_string(::getpid());
    options.dram_bytes = bytes;
    options.metrics_address = "127.0.0.1:0";
    return options;
  }

  Status add_node(uint64_t bytes) {
    auto node = StorageNode::start(node_options(bytes));
    if (!node.ok()) return node.status();
    nodes_.push_back(std::move(*node));
    return Status();
  }

  ClientOptions client_options() const {
    ClientOptions options;
    options.master = master_options();
    return options;
  }

 private:
  crescent::test::TempDir dir_{"crescent-store"};
  MasterServerOptions options_;
  std::unique_ptr<MasterServer> master_;
  std::vector<std::unique_ptr<StorageNode>> nodes_;
  std::string error_;
  int next_node_ = 0;
};

/// `size` bytes of a pattern determined by `seed`.
inline std::vector<std::byte> pattern_bytes(uint64_t size, uint64_t seed) {
  std::vector<std::byte> out(size);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (uint64_t i = 0; i < size; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    out[i] = static_cast<std::byte>(x);
  }
  return out;
}

}  // namespace crescent::store::test
