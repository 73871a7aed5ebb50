// The store bench (`crescent bench store`, docs/benchmarks.md): the KV cache pool's put and get throughput
// and latency against Redis in the same run, and the master's metadata figures. A master and a storage node
// run as child processes (`crescent store master|node`), the clients in this process (drive_kv_load,
// kv_load.h); Redis is a redis-server child driven through hiredis with pipelining depth = batch
// (redis_baseline.h). Prints nothing.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "bench/kv_load.h"
#include "common/status.h"

namespace crescent::bench {

/// What `bench store` runs: every value size x threads x batch x op x system, in that nesting order.
struct StoreBenchOptions {
  std::string crescent_binary;  // the crescent executable (for the master and node processes); required
  /// "crescent-tcp" and "crescent-shm" (the store's client over that transport), "redis".
  std::vector<std::string> systems = {"crescent-tcp", "crescent-shm", "redis"};
  std::vector<std::string> ops = {"put", "get"};
  std::vector<uint64_t> value_bytes = {4 << 10, 512 << 10, 4 << 20};
  std::vector<int> threads = {1, 4};
  std::vector<size_t> batches = {1, 16};
  std::chrono::milliseconds duration{1000};  // timed window of each run
  uint64_t node_dram_bytes = 1ull << 30;     // the storage node's segment
  uint64_t metadata_objects = 1000000;  // objects the master holds for the RSS and latency figures; 0 = skip
  std::vector<int> metadata_threads = {1, 4, 16};  // threads for the batch_exists(1 key) rate
  /// Called after each put/get run with its result (progress display); may be empty.
  std::function<void(const KvRunResult&)> progress;
};

/// The master's batch_exists rate at one thread count (1 absent key per RPC).
struct StoreMetadataRun {
  int threads = 0;
  double ops_per_s = 0;
  double p50_us = 0;  // one RPC, microseconds
  double p99_us = 0;
};

/// Everything one store bench measured.
struct StoreBenchReport {
  std::vector<KvRunResult> runs;                // in the order of StoreBenchOptions; redis skipped if absent
  std::vector<StoreMetadataRun> metadata_runs;  // one per metadata_threads entry
  uint64_t master_objects = 0;                  // objects in the master when its RSS was read
  double master_rss_bytes_per_object = 0;       // (RSS with the objects - RSS before) / objects
  double get_replica_list_p50_us = 0;           // one key per RPC, 1 thread, random keys of master_objects
  double get_replica_list_p99_us = 0;
  std::vector<std::string> warnings;  // what was not measured and why (no redis-server, metadata errors)
};

/// Runs the bench. Errors: kInvalidArgument for an unknown system or op or no crescent_binary; the errors of
/// starting the master or node. A run that fails carries its error in KvRunResult::error and the bench goes
/// on; Redis missing or failing metadata figures become warnings.
Result<StoreBenchReport> run_store_bench(const StoreBenchOptions& options);

}  // namespace crescent::bench
