// The serve bench (`crescent bench serve`, docs/benchmarks.md): the HTTP front end and the Conductor under
// load, in one process on loopback, over an in-process cluster of mock instances (cluster::LocalCluster).
//   1. Admission overhead: completions sent open-loop at rate_per_s for `seconds`; the time from the HTTP
//      handler's entry to the Conductor's placement returned (parse, tokenize, schedule), p50/p99.
//   2. Concurrent streams: `streams` streamed completions of tokens_per_stream tokens opened at once and held
//      to the end; how many completed, tokens delivered per second, the process's peak RSS.
// The load driver is one epoll thread with non-blocking sockets, so the client is not the bottleneck. Prints
// nothing.
#pragma once

#include <cstddef>
#include <cstdint>

#include "cluster/cluster_config.h"
#include "common/status.h"

namespace crescent::bench {

/// What `bench serve` runs.
struct ServeBenchOptions {
  cluster::ClusterConfig config;   // the cluster started in process, instance counts included
  double rate_per_s = 1000;        // open-loop arrivals of the admission test, > 0
  double seconds = 3;              // length of the admission test, > 0
  int64_t streams = 2000;          // streams opened at once, >= 1
  int64_t tokens_per_stream = 64;  // max_tokens of each stream, >= 2
};

/// The admission test: requests of 1 token ("Say hello.") at a fixed arrival rate, each on an idle
/// connection of a pool of min(requests, 2048).
struct ServeAdmission {
  size_t requests = 0;             // rate_per_s x seconds
  size_t answered = 0;             // whole responses received
  size_t dropped_client_side = 0;  // not sent: every connection was still busy (the server is behind)
  double achieved_per_s = 0;       // answered / the test's wall time
  double handler_p50_us = 0;       // HTTP handler entry -> placement returned, microseconds
  double handler_p99_us = 0;
  double response_p50_ms = 0;  // request sent -> whole response received, milliseconds
  double response_p99_ms = 0;
};

/// The concurrent streams test.
struct ServeStreams {
  size_t completed = 0;          // streams that ended with [DONE] within 120 s
  int64_t held_at_once = 0;      // the most connections the server held open at once
  int64_t tokens_delivered = 0;  // SSE data events of token chunks (the finish chunk and [DONE] not counted)
  double seconds = 0;            // first request sent -> last stream done (or the 120 s limit)
  double tokens_per_s = 0;       // tokens_delivered / seconds
  double cpu_seconds = 0;        // this process's user + system CPU meanwhile (server and driver together)
  double tokens_per_cpu_s = 0;   // tokens_delivered / cpu_seconds
  size_t admissions_timed = 0;   // handler calls timed during this test
};

/// Everything one serve bench measured.
struct ServeBenchReport {
  ServeAdmission admission;
  ServeStreams streams;
  double peak_rss_mib = 0;  // this process's peak resident memory (getrusage), MiB
};

/// Starts the cluster and the front end on a free loopback port, runs both tests, stops them. Errors:
/// kInvalidArgument for options out of range; the cluster's and the HTTP server's start errors;
/// kUnavailable when the driver cannot open its connections (ulimit -n). Streams that do not complete are
/// counted, not an error.
Result<ServeBenchReport> run_serve_bench(const ServeBenchOptions& options);

}  // namespace crescent::bench
