// What happened in a run of a cluster, simulated (sim::simulate) or live (serve::replay measuring a server):
// one outcome per request, in trace order, in seconds from the first arrival. The report (report.h) is built
// from it, so a simulation and a replay are summarised by the same code.
#pragma once

#include <cstdint>
#include <vector>

#include "common/instance_id.h"
#include "conductor/conductor.h"

namespace crescent::cluster {

/// What happened to one request. Times in seconds since the first arrival (virtual time when simulated).
/// Fields that do not apply are 0: every time but arrival_s and finish_s for a rejected request, tbt_s and
/// max_token_gap_s with fewer than 2 output tokens (requests_jsonl() writes them as null).
struct RequestOutcome {
  double arrival_s = 0;
  double ttft_s = 0;  // arrival → first token (end of prefill) = queue_wait_s + prefix_load_s + prefill
  double tbt_s = 0;   // mean of the longest 10% of its token gaps (paper §5.1)
  double max_token_gap_s = 0;  // its longest token gap (the first includes KV transfer and waiting for HBM)
  double finish_s = 0;         // last token (the arrival when rejected)
  double queue_wait_s = 0;     // arrival → its prefill could start (queue; remote prefix not yet computed)
  double prefix_load_s = 0;    // fetching the remote part of its prefix and loading the prefix into HBM
  int64_t trace_line = 0;      // the request's line in its trace file (trace::Request::line)
  int64_t input_tokens = 0;
  int64_t output_tokens = 0;
  int64_t prefix_hit_tokens = 0;  // prompt tokens reused: local cache + fetched
  int64_t fetched_tokens = 0;     // of which fetched from another prefill instance
  double prefill_compute_s = 0;   // GPU time of its prefill (what reuse saves)
  InstanceId prefill_instance = 0;
  InstanceId decode_instance = 0;
  conductor::RejectReason rejected = conductor::RejectReason::kNone;
  /// A live run's request that neither completed nor was refused (no answer in time, a 5xx, a broken
  /// stream): counted apart from completed and rejected, and as a miss in SLO attainment.
  bool failed = false;
};

/// Work done by a simulated run, for speed reports (a live run leaves it 0).
struct RunCounters {
  int64_t events = 0;        // disaggregated: arrivals + prefill completions + KV arrivals + decode steps;
                             // colocated: arrivals + iterations
  int64_t decode_steps = 0;  // continuous-batching iterations over all decode instances
  int64_t decisions = 0;     // Conductor::schedule calls
};

/// Load of the two pools at one moment (simulated disaggregated runs).
struct LoadSample {
  double time_s = 0;
  double prefill_queue_s = 0;  // mean over prefill instances of the queued work, seconds
  double decode_kv_share = 0;  // KV of running and waiting requests / HBM KV capacity, over the decode pool
                               // (above 1: a backlog waiting for room)
  int64_t decode_running = 0;  // requests in decode batches
  int64_t decode_waiting = 0;  // requests whose KV arrived, waiting for HBM room
};

struct RunResult {
  std::vector<RequestOutcome> requests;  // in trace order
  RunCounters counters;
  double makespan_s = 0;  // virtual time when the last request finished
  std::vector<LoadSample>
      load_series;  // every sim::SimOptions::load_sample_interval_s, until the cluster drains
};

}  // namespace crescent::cluster
