// The same-run baseline of `crescent bench store`: Redis. A redis-server child process started for the
// bench, and a hiredis worker for drive_kv_load (kv_load.h) that pipelines a batch of SET or GET commands.
#pragma once

#include <cstdint>
#include <memory>

#include "bench/kv_load.h"
#include "common/child_process.h"
#include "common/status.h"
#include "common/temp_dir.h"

namespace crescent::bench {

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

}  // namespace crescent::bench
