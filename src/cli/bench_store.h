// Measurement code of `crescent bench store` (cli/bench.cpp registers the command): the store's put and get
// throughput and latency against Redis in the same run (docs/benchmarks.md). A master and a storage node run
// as child processes (`crescent store master|node`), the clients in this process; Redis is a redis-server
// child driven through hiredis with pipelining depth = batch.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "cli/bench_kv.h"
#include "common/status.h"

namespace crescent::cli::bench {

/// What `bench store` runs.
struct StoreBenchOptions {
  std::string crescent_binary;  // the crescent executable (for the master and node processes)
  std::vector<std::string> systems = {"crescent-tcp", "crescent-shm", "redis"};
  std::vector<std::string> ops = {"put", "get"};
  std::vector<uint64_t> value_bytes = {4 << 10, 512 << 10, 4 << 20};
  std::vector<int> threads = {1, 4};
  std::vector<size_t> batches = {1, 16};
  std::chrono::milliseconds duration{1000};  // timed window of each run
  uint64_t node_dram_bytes = 1ull << 30;     // the storage node's segment
  uint64_t metadata_objects = 1000000;  // objects the master holds for the RSS and latency figures; 0 = skip
  std::vector<int> metadata_threads = {1, 4, 16};  // threads for the batch_exists(1 key) rate
};

/// Metadata-only figures.
struct MetadataRun {
  int threads = 0;
  double ops_per_s = 0;
  double p50_us = 0;
  double p99_us = 0;
};

/// Everything one bench measured.
struct StoreBenchReport {
  std::vector<KvRunResult> runs;
  std::vector<MetadataRun> metadata_runs;  // batch_exists of 1 key
  uint64_t master_objects = 0;             // objects in the master when its RSS was read
  double master_rss_bytes_per_object = 0;  // (RSS with the objects - RSS before) / objects
  double get_replica_list_p50_us = 0;      // one key per RPC, 1 thread, random keys of master_objects
  double get_replica_list_p99_us = 0;
  std::vector<std::string> warnings;
};

/// Runs the bench; `progress` is called after each run. kInvalidArgument for bad options; errors of starting
/// the master or node. A run that fails carries its error and the bench goes on.
Result<StoreBenchReport> run_store_bench(const StoreBenchOptions& options,
                                         const std::function<void(const KvRunResult&)>& progress);

}  // namespace crescent::cli::bench
