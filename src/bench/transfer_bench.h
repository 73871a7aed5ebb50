// The transfer bench (`crescent bench transfer`, docs/benchmarks.md): throughput and latency of the transfer
// engine between two engines in two processes over loopback, beside same-run baselines (single-thread memcpy,
// raw loopback TCP). run_transfer_bench starts the target process that serves the remote segment (the
// crescent binary as `crescent bench transfer-target`, whose body is run_transfer_target), measures the
// baselines, then the timed runs, and returns plain numbers; it prints nothing on stdout.
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

#include "common/status.h"
#include "transfer/transfer_engine.h"

namespace crescent::bench {

/// "read" or "write".
std::string_view op_name(transfer::TransferOp op);

/// The data path of one run: a transport and, for ucx, the UCX transports it may use (UCX_TLS syntax).
struct TransferPath {
  transfer::TransportKind kind = transfer::TransportKind::kShm;
  std::string ucx_tls;  // only for kUcx

  /// "tcp", "shm", "ucx (tls tcp)".
  std::string label() const;
  /// Whether the path's baseline is raw loopback TCP (tcp, ucx over tcp only) rather than memcpy.
  bool compares_to_tcp() const;
};

/// One measured configuration.
struct TransferRunSpec {
  TransferPath path;
  uint64_t block_bytes = 0;  // bytes per request
  size_t batch = 1;          // requests per batch (submitted at once, then waited for)
  int threads = 1;           // initiator threads, each with its own batches in flight
  transfer::TransferOp op = transfer::TransferOp::kRead;
};

/// What one run measured. Throughput comes from batches completed with wait(); latencies from further
/// batches whose requests are polled with status() (per-request submit -> completion time).
struct TransferRunResult {
  TransferRunSpec spec;
  std::string error;          // empty when the run succeeded
  double seconds = 0;         // length of the throughput phase
  uint64_t bytes = 0;         // payload bytes moved in the throughput phase (requests x block_bytes)
  uint64_t requests = 0;      // requests completed in the throughput phase (whole batches)
  double gbps = 0;            // bytes / seconds / 1e9
  double requests_per_s = 0;  // requests / seconds
  double p50_us = 0;          // per-request latency (submit -> completion seen by polling), microseconds
  double p99_us = 0;
  size_t latency_samples = 0;  // requests behind p50/p99
  double batch_p50_us = 0;  // batch latency (submit -> wait() returns) in the throughput phase, microseconds
  double batch_p99_us = 0;
  /// Bytes compared end to end after the timed phases: a verification batch whose first, middle and last
  /// blocks get fresh content (reads: zeroed here; writes: a new pattern), then XXH3-64 checksums of those
  /// blocks here and in the target must match.
  uint64_t verified_bytes = 0;
  uint64_t working_set_bytes = 0;  // bytes of local and of remote memory the run rotated over
};

/// Same-run baselines for one block size.
struct TransferBaseline {
  uint64_t block_bytes = 0;
  size_t batch = 0;                      // blocks per round (the largest batch of this block size's runs)
  double memcpy_gbps = 0;                // single-thread memcpy, 1e9 bytes/s
  double tcp_loopback_gbps = 0;          // one blocking socket over 127.0.0.1, sender and receiver threads
  double tcp_loopback_streams_gbps = 0;  // loopback_streams such sockets at once (0: not run)
  std::string tcp_loopback_error;        // set when the socket baseline could not run
};

/// Settings of a whole transfer bench.
struct TransferBenchOptions {
  std::vector<TransferRunSpec> runs;
  double seconds = 1.0;                    // per run and per baseline measurement
  uint64_t working_set_bytes = 256 << 20;  // minimum bytes each side of a run (and memcpy) rotates over
  /// Parallel sockets of the extra loopback baseline (the tcp transport's lanes per peer); <= 1: none.
  int loopback_streams = transfer::TcpOptions{}.lanes_per_peer;
  /// The crescent executable started as the target process (`BINARY bench transfer-target ...`). The
  /// default, /proc/self/exe, is right when the caller is crescent itself; a test names the built binary.
  std::string crescent_binary = "/proc/self/exe";
  /// Called before each step with a one-line description (progress display); may be empty.
  std::function<void(const std::string&)> progress;
};

/// Everything a transfer bench measured.
struct TransferBenchReport {
  std::vector<TransferBaseline> baselines;  // sorted by block size; always includes 1 MiB
  std::vector<TransferRunResult> runs;      // in TransferBenchOptions::runs order
  pid_t target_pid = 0;
  uint64_t segment_bytes = 0;                             // size of the target's segment
  std::vector<std::string> target_transports;             // what the target serves its segment on
  std::map<std::string, std::string> target_unavailable;  // transport -> why the target cannot serve it
  double wall_seconds = 0;                                // whole bench, target start to exit
};

/// Bytes each side of `spec` rotates over: at least `working_set_bytes`, at least threads x batch x block,
/// a multiple of threads x block.
uint64_t run_working_set_bytes(const TransferRunSpec& spec, uint64_t working_set_bytes);

/// Runs the baselines, then every run, against a target process started for the bench (options.
/// crescent_binary as `bench transfer-target`) and always stopped and reaped before returning. Per-run
/// failures (a transport that cannot start or reach the target, a failed or mis-copied transfer) are
/// reported in TransferRunResult::error; an error Status only when the bench as a whole cannot run (the
/// target does not start or serves nothing, memory cannot be had). While it runs, file descriptor 1 points at
/// stderr (what libraries such as UCX print stays out of the caller's report) and SIGPIPE is ignored.
Result<TransferBenchReport> run_transfer_bench(const TransferBenchOptions& options);

/// Settings of the target process (`crescent bench transfer-target`).
struct TransferTargetOptions {
  std::string metadata_dir;  // make_directory_metadata directory shared with the initiator
  std::string engine_name;
  std::string segment;  // name of the exposed segment
  std::vector<transfer::TransportKind> transports;
  std::string ucx_tls;         // the target engine's UCX transports (empty: UCX's default, all of them)
  uint64_t segment_bytes = 0;  // segment size
};

/// Body of the target process: serves one segment (from allocate_memory, filled with a pattern) on every
/// transport of `options` that can start, writes one JSON "ready" line on its control channel (the
/// process's original stdout), then answers "sum OFFSET LENGTH" lines on stdin with "sum HEX" (XXH3-64 of
/// those segment bytes) until "exit" or end of input. The process dies with its parent (PR_SET_PDEATHSIG).
/// REQUIRES: runs as the main work of a process of its own, started by run_transfer_bench. Returns the
/// error it also sent the initiator ({"ready": false, "error": ...}) when it cannot serve the segment on
/// any transport.
Status run_transfer_target(const TransferTargetOptions& options);

}  // namespace crescent::bench
