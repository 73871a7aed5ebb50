// The front end's Prometheus metrics (docs/serving.md): vLLM's names, so existing dashboards read them, plus
// crescent_ ones for what vLLM lacks (refusals by reason, Conductor decision time, prefix hits by source, KV
// bytes moved). Observations are thread-safe; scrape() renders the text exposition format.
#pragma once

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "kv/decode_load.h"

namespace crescent::cluster {

/// Gauges read at scrape time from the cluster.
struct LoadGauges {
  int64_t requests_running = 0;           // in decode batches
  int64_t requests_waiting = 0;           // queued for prefill, or waiting for decode HBM room
  double kv_cache_usage = 0;              // decode KV reserved / HBM KV capacity, 0..1
  int64_t decode_kv_reserved_tokens = 0;  // HBM KV reserved on decode instances, incoming requests included
  int64_t prefill_instances_up = 0;  // instances the Conductor may place on (crescent_instances_up{role})
  int64_t decode_instances_up = 0;
  /// Prefill instances up whose whole cache the Conductor has learned since they came up (their full KV
  /// report: crescent_prefill_caches_synced; in process, all of them); -1: not known (router mode: an
  /// engine's events tell what it stores from the router's subscription on, not what it held before), and
  /// the gauge says so.
  int64_t prefill_caches_synced = -1;

  /// Adds the decode pool's sums: its running and waiting requests, its usage (committed KV / capacity) and
  /// its reserved KV.
  void add_decode_pool(const kv::DecodePoolLoad& pool) {
    requests_running += pool.requests_running;
    requests_waiting += pool.requests_waiting;
    kv_cache_usage = pool.usage();
    decode_kv_reserved_tokens += pool.reserved_kv_tokens;
  }
};

/// What one finished request contributes. Times in seconds.
struct FinishedRequest {
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  double ttft_s = 0, e2e_s = 0, queue_s = 0, prefill_s = 0, decode_s = 0;
};

class ServeMetrics {
 public:
  /// Metrics labelled with model_name = `model_name`.
  explicit ServeMetrics(const std::string& model_name);

  /// Placing a request (cluster::place: the Conductor's decision, recording it and queueing its orders)
  /// took `seconds` (crescent_conductor_decision_seconds).
  void observe_decision(double seconds);
  /// Router mode (docs/router.md): from a request all received to its first engine request sent, parsing,
  /// tokenizing and placing it (crescent_router_overhead_seconds).
  void observe_routing_overhead(double seconds);
  /// A request given to the Conductor to place (crescent_requests_received_total). Each ends once: refused
  /// (crescent_requests_rejected_total) or finished (vllm:request_success_total, any finished_reason;
  /// "abort" for the failed and the cancelled), so with nothing in flight received = rejected + finished.
  void observe_received();
  /// A request refused for `reason` (crescent_requests_rejected_total{reason}).
  void observe_rejection(std::string_view reason);
  /// An accepted prompt's tokens by where their KV came from (crescent_prefix_tokens_total{source}: local
  /// cache, pool (fetched from elsewhere), none (computed)) and the prefix cache counters vLLM has.
  void observe_prefix(int64_t prompt_tokens, int64_t local_tokens, int64_t fetched_tokens);
  /// KV bytes moved between instances (crescent_kv_transfer_bytes_total{kind}: "prefill_to_decode",
  /// "prefix_fetch").
  void observe_kv_bytes(std::string_view kind, double bytes);
  /// KV bytes the instance processes really moved (crescent_kv_bytes_moved_total{path}: "prefill_to_decode"
  /// through the transfer engine, "pool_read" and "pool_write" to and from the store), scaled down by the
  /// config's kv_bytes_scale from what the model would move.
  void observe_kv_bytes_moved(std::string_view path, uint64_t bytes);
  /// KV bytes written prefill -> decode by the transport that carried them ("tcp", "shm", "ucx":
  /// crescent_kv_prefill_to_decode_bytes_total{transport}): shm only between processes of one host.
  void observe_kv_transport(std::string_view transport, uint64_t bytes);
  /// A prompt's KV reached its decode instance in `writes` transfers (crescent_kv_transfer_writes_total):
  /// chunks streamed while its prefill ran, then the rest at prefill done.
  void observe_kv_writes(uint64_t writes);
  /// Prefix tokens the Conductor arranged to fetch, by whether the prefill instance found them in the pool
  /// (crescent_pool_prefix_tokens_total{result="hit"|"miss"}).
  void observe_pool_prefix(int64_t hit_tokens, int64_t miss_tokens);
  /// Prompt tokens a prefill instance's executor computed for a request, not reused
  /// (crescent_prefill_computed_tokens_total): against crescent_prefix_tokens_total, what the instances
  /// did beside what their caches reported.
  void observe_prefill_computed(int64_t tokens);
  /// From a prompt's prefill end (its first token) to all its KV written to decode (prefill done): the KV
  /// transfer not hidden behind compute (paper §3.1), crescent_kv_exposed_transfer_seconds.
  void observe_kv_exposed_transfer(double seconds);
  /// KV blocks decode instances checked on arrival, and those that failed the check
  /// (crescent_kv_blocks_verified_total, crescent_kv_checksum_failures_total).
  void observe_kv_checks(uint64_t verified_blocks, uint64_t failed_blocks);
  /// A control message the Conductor could not decode, or took from no instance of its config
  /// (crescent_control_messages_dropped_total{reason="malformed"|"unknown_sender"}). Returns how many of that
  /// reason so far, so the caller can log the first and a few more rather than one line per message.
  uint64_t observe_control_dropped(std::string_view reason);
  /// Clients the members-only sockets have refused so far in all (crescent_control_clients_refused_total:
  /// connections without the cluster's keys); the counter is brought up to `total`.
  void observe_clients_refused(uint64_t total);
  /// A request failed after it was accepted, with `code` (RequestCallbacks::on_error's: "instance_down",
  /// "kv_transfer_failed", "prefill_failed", "queue_timeout", "prefill_timeout", "kv_handoff_timeout",
  /// "decode_timeout"):
  /// crescent_requests_failed_total{reason=code}.
  void observe_failure(std::string_view code);
  /// An accepted request was placed again because its instance went down (`reason`: "prefill_down",
  /// "decode_down"):
  /// crescent_requests_replaced_total{reason}.
  void observe_replaced(std::string_view reason);
  /// A request placed on the instance named `instance` ("prefill-0", "decode-1"):
  /// crescent_instance_requests_total{instance}.
  void observe_placed_on(const std::string& instance);
  /// One gap between two output tokens of a request (vllm:inter_token_latency_seconds).
  void observe_token_gap(double seconds);
  /// A request that ended: vllm:request_success_total{finished_reason} counts it; "length" (all its
  /// max_tokens) and "stop" (EOS or a stop string) add its latencies, "abort" (cancelled or failed) not.
  void observe_finished(const FinishedRequest& request, std::string_view finished_reason);

  /// Everything, in the Prometheus text format, with `gauges`.
  std::string scrape(const LoadGauges& gauges);

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  const std::string model_name_;
  prometheus::Counter& received_;
  prometheus::Family<prometheus::Counter>& rejected_;
  prometheus::Family<prometheus::Counter>& failed_;
  prometheus::Family<prometheus::Counter>& replaced_;
  prometheus::Family<prometheus::Counter>& placed_on_;
  prometheus::Family<prometheus::Counter>& prefix_tokens_;
  prometheus::Family<prometheus::Counter>& kv_bytes_;
  prometheus::Family<prometheus::Counter>& kv_bytes_moved_;
  prometheus::Family<prometheus::Counter>& kv_transport_bytes_;
  prometheus::Family<prometheus::Counter>& pool_prefix_;
  prometheus::Counter& prefill_computed_;
  prometheus::Family<prometheus::Counter>& control_dropped_;
  prometheus::Counter& clients_refused_;
  prometheus::Counter& kv_blocks_verified_;
  prometheus::Counter& kv_checksum_failures_;
  prometheus::Counter& kv_writes_;
  prometheus::Family<prometheus::Counter>& success_;
  prometheus::Counter& prefix_queries_;
  prometheus::Counter& prefix_hits_;
  prometheus::Counter& prompt_tokens_;
  prometheus::Counter& generation_tokens_;
  prometheus::Histogram& decision_;
  prometheus::Histogram& routing_;
  prometheus::Histogram& ttft_;
  prometheus::Histogram& itl_;
  prometheus::Histogram& e2e_;
  prometheus::Histogram& queue_;
  prometheus::Histogram& prefill_;
  prometheus::Histogram& decode_;
  prometheus::Histogram& kv_exposed_transfer_;
  prometheus::Gauge& running_;
  prometheus::Gauge& waiting_;
  prometheus::Gauge& kv_usage_;
  prometheus::Family<prometheus::Gauge>& instances_up_;
  prometheus::Gauge& kv_reserved_;
  prometheus::Gauge& caches_synced_;
};

}  // namespace crescent::cluster
