// The load driver of the key-value benches (`crescent bench store`, and the Redis baseline beside it): a
// timed multi-thread loop over per-thread workers, one call = one batch of puts or gets, that reports
// throughput and the latency of each call.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>

#include "common/status.h"

namespace crescent::bench {

/// One measured configuration of a key-value store.
struct KvRunSpec {
  std::string system;  // label of the store under test ("crescent-tcp", "redis")
  std::string op;      // "put" or "get" (the driver does not read it; workers do)
  uint64_t value_bytes = 0;
  int threads = 1;                           // client threads, one worker each
  size_t batch = 1;                          // ops per worker call
  std::chrono::milliseconds duration{1000};  // timed window (after the warm-up)
};

/// What one run measured. Counts cover the timed window only.
struct KvRunResult {
  KvRunSpec spec;
  std::string error;     // empty when the run succeeded; else the first setup or worker error
  double seconds = 0;    // timed window, first call started -> last call returned
  uint64_t ops = 0;      // ops completed (calls x batch)
  uint64_t bytes = 0;    // ops x value_bytes
  double gbps = 0;       // bytes / seconds / 1e9
  double ops_per_s = 0;  // ops / seconds
  double p50_us = 0;     // latency of one worker call (batch ops), microseconds
  double p99_us = 0;
};

/// One batch of `spec.batch` ops of `spec.value_bytes` each; non-ok when an op failed or returned wrong data.
using KvWorker = std::function<Status()>;

/// Runs `spec`: calls `make_worker(i)` for i in [0, threads) on the calling thread (a failure ends the run
/// with its message in `error`), then runs every worker on its own thread, all starting together: a warm-up
/// (10% of duration, at least 3 calls per thread), then calls until `duration` has passed. The first non-ok
/// Status of any worker stops all threads and becomes `error`. Workers are destroyed before returning.
/// SIGPIPE is ignored meanwhile (a write to a dead server fails with EPIPE instead of killing the process).
KvRunResult drive_kv_load(const KvRunSpec& spec,
                          const std::function<Result<KvWorker>(int thread_index)>& make_worker);

}  // namespace crescent::bench
