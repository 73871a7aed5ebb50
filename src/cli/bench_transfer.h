// Measurement code of `crescent bench transfer` (cli/bench.cpp): the target process that serves a segment,
// the same-run baselines (single-thread memcpy, raw loopback TCP) and the timed transfer runs between two
// engines in two processes.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "cli/flags.h"  // format_size
#include "common/status.h"
#include "transfer/transfer_engine.h"

namespace crescent::cli::bench {

/// "read" or "write".
std::string_view op_name(transfer::TransferOp op);

/// The data path of one run: a transport and, for ucx, the UCX transports it may use (UCX_TLS syntax).
struct PathSpec {
  transfer::TransportKind kind = transfer::TransportKind::kShm;
  std::string ucx_tls;  // only for kUcx

  /// "tcp", "shm", "ucx (tls tcp)".
  std::string label() const;
  /// Whether the path's baseline is raw loopback TCP (tcp, ucx over tcp only) rather than memcpy.
  bool compares_to_tcp() const;
};

/// One measured configuration.
struct RunSpec {
  PathSpec path;
  uint64_t block_bytes = 0;  // bytes per request
  size_t batch = 1;          // requests per batch (submitted at once, then waited for)
  int threads = 1;           // initiator threads, each with its own batches in flight
  transfer::TransferOp op = transfer::TransferOp::kRead;
};

/// What one run measured. Throughput comes from batches completed with wait(); latencies from further
/// batches whose requests are polled with status() (per-request submit -> completion time).
struct RunResult {
  RunSpec spec;
  std::string error;          // empty when the run succeeded
  double seconds = 0;         // length of the throughput phase
  uint64_t bytes = 0;         // payload bytes moved in the throughput phase
  uint64_t requests = 0;      // requests completed in the throughput phase
  double gbps = 0;            // bytes / seconds / 1e9
  double requests_per_s = 0;  // requests / seconds
  double p50_us = 0;          // per-request latency (submit -> completion seen by polling), microseconds
  double p99_us = 0;
  size_t latency_samples = 0;  // requests behind p50/p99
  double batch_p50_us = 0;  // batch latency (submit -> wait() returns) in the throughput phase, microseconds
  double batch_p99_us = 0;
  uint64_t verified_bytes =
      0;  // bytes compared end to end (checksums at both engines) after the timed phases
  uint64_t working_set_bytes = 0;  // bytes of local and of remote memory the run rotated over
};

/// Same-run baselines for one block size.
struct BlockBaseline {
  uint64_t block_bytes = 0;
  size_t batch = 0;                      // blocks per round (the largest batch of this block size's runs)
  double memcpy_gbps = 0;                // single-thread memcpy, 1e9 bytes/s
  double tcp_loopback_gbps = 0;          // one blocking socket over 127.0.0.1, sender and receiver threads
  double tcp_loopback_streams_gbps = 0;  // BenchOptions::loopback_streams such sockets at once (0: not run)
  std::string tcp_loopback_error;        // set when the socket baseline could not run
};

/// Settings of a whole bench.
struct BenchOptions {
  std::vector<RunSpec> runs;
  double seconds = 1.0;                    // per run and per baseline measurement
  uint64_t working_set_bytes = 256 << 20;  // minimum bytes each side of a run (and memcpy) rotates over
  /// Parallel sockets of the extra loopback baseline (the tcp transport's lanes per peer); <= 1: none.
  int loopback_streams = transfer::TcpOptions{}.lanes_per_peer;
  /// Called before each step with a one-line description (progress display); may be empty.
  std::function<void(const std::string&)> progress;
};

/// Everything a bench measured.
struct BenchReport {
  std::vector<BlockBaseline> baselines;  // sorted by block size; always includes 1 MiB
  std::vector<RunResult> runs;           // in BenchOptions::runs order
  pid_t target_pid = 0;
  uint64_t segment_bytes = 0;                             // size of the target's segment
  std::vector<std::string> target_transports;             // what the target serves its segment on
  std::map<std::string, std::string> target_unavailable;  // transport -> why the target cannot serve it
  double wall_seconds = 0;                                // whole bench, target start to exit
};

/// Bytes each side of `spec` rotates over: at least `working_set_bytes`, at least threads x batch x block,
/// a multiple of threads x block.
uint64_t run_working_set_bytes(const RunSpec& spec, uint64_t working_set_bytes);

/// Runs the baselines, then every run, against a target process started for the bench (re-executing
/// /proc/self/exe as `crescent bench transfer-target`) and always stopped and reaped before returning.
/// Per-run failures (a transport that cannot start or reach the target, a failed or mis-copied transfer) are
/// reported in RunResult::error; an error Status only when the bench as a whole cannot run (no target).
Result<BenchReport> run_bench(const BenchOptions& options);

/// Settings of the target process (`crescent bench transfer-target`).
struct TargetOptions {
  std::string metadata_dir;  // make_directory_metadata directory shared with the initiator
  std::string engine_name;
  std::string segment;  // name of the exposed segment
  std::vector<transfer::TransportKind> transports;
  std::string ucx_tls;  // the target engine's UCX transports (empty: UCX's default, all of them)
  uint64_t bytes = 0;   // segment size
};

/// Body of the target process: serves one segment (from allocate_memory, filled with a pattern) on every
/// transport of `options` that can start, prints one JSON "ready" line on stdout, then answers "sum OFFSET
/// LENGTH" lines on stdin with "sum HEX" (XXH3-64 of those segment bytes) until "exit" or end of input.
/// Returns the process exit code (1 when it cannot serve the segment on any transport).
int run_target(const TargetOptions& options);

}  // namespace crescent::cli::bench
