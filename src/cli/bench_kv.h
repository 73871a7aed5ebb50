// Load driver of `crescent bench store` and its same-run baseline, Redis: a timed multi-thread loop over
// per-thread workers (one call = one batch of puts or gets), a redis-server started for the run, and a
// hiredis worker that pipelines a batch of SET or GET commands.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "common/child_process.h"
#include "common/status.h"
#include "common/temp_dir.h"

namespace crescent::cli::bench {

/// One measured configuration of a key-value store.
struct KvRunSpec {
  std::string system;  // label of the store under test ("crescent", "redis")
  std::string op;      // "put" or "get"
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

/// A redis-server child process for one bench: 127.0.0.1 on a free port, no persistence (`--save ""
/// --appendonly no`), a fresh temp dir as its `--dir` (removed with the server). The child gets SIGKILL if
/// the thread that started it exits (PR_SET_PDEATHSIG), so start it from a thread that outlives it.
class RedisServer {
 public:
  /// Path of the binary started (Debian package redis-server).
  static constexpr const char* kBinary = "/usr/bin/redis-server";

  /// Starts the server and waits (at most 5 s) until it answers (INFO names its pid,
  /// so a server that took the port first is not mistaken for it); retries on a port collision. Errors:
  /// not_found when kBinary is missing; unavailable when it exits or does not answer (the message holds the
  /// end of its log).
  static Result<std::unique_ptr<RedisServer>> start();
  /// Stops the server: SIGTERM, SIGKILL after 2 s, then reaps it; removes its temp dir.
  ~RedisServer();
  RedisServer(const RedisServer&) = delete;
  RedisServer& operator=(const RedisServer&) = delete;

  /// TCP port on 127.0.0.1 the server listens on.
  uint16_t port() const { return port_; }

 private:
  RedisServer(std::unique_ptr<ChildProcess> process, uint16_t port, TempDir dir)
      : dir_(std::move(dir)), process_(std::move(process)), port_(port) {}
  TempDir dir_;  // declared first: removed after the server has stopped
  std::unique_ptr<ChildProcess> process_;
  uint16_t port_;
};

/// A worker for drive_kv_load against the Redis server on 127.0.0.1:`port`: its own connection (hiredis),
/// and a key set of its own ("crescent:t<thread_index>:k<n>", up to 64 keys, fewer when 64 values would
/// exceed 256 MiB) rotated over. Each call pipelines `spec.batch` SET or GET commands, then reads and checks
/// every reply (SET: OK; GET: length value_bytes and the key's known first bytes). For "get" the keys are
/// stored first. Errors: invalid_argument for a bad op, batch or value_bytes; unavailable when the server
/// cannot be reached or refuses a preload SET.
Result<KvWorker> make_redis_worker(uint16_t port, const KvRunSpec& spec, int thread_index);

}  // namespace crescent::cli::bench
