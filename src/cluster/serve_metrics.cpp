#include "cluster/serve_metrics.h"

#include <prometheus/text_serializer.h>

#include <algorithm>

namespace crescent::cluster {
namespace {

using prometheus::Histogram;

// Latency buckets (seconds) as vLLM's: milliseconds to minutes.
const Histogram::BucketBoundaries kLatencyBuckets = {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,
                                                     0.25,  0.5,   0.75, 1.0,  2.5,  5.0,  7.5,  10,
                                                     20,    40,    80,   160,  640,  2560};
const Histogram::BucketBoundaries kDecisionBuckets = {1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5,
                                                      1e-4, 2e-4, 5e-4, 1e-3, 1e-2};

Histogram& histogram(prometheus::Registry& registry, const std::string& name, const std::string& help,
                     const prometheus::Labels& labels, const Histogram::BucketBoundaries& buckets) {
  return prometheus::BuildHistogram().Name(name).Help(help).Register(registry).Add(labels, buckets);
}
prometheus::Counter& counter(prometheus::Registry& registry, const std::string& name, const std::string& help,
                             const prometheus::Labels& labels) {
  return prometheus::BuildCounter().Name(name).Help(help).Register(registry).Add(labels);
}
prometheus::Gauge& gauge(prometheus::Registry& registry, const std::string& name, const std::string& help,
                         const prometheus::Labels& labels) {
  return prometheus::BuildGauge().Name(name).Help(help).Register(registry).Add(labels);
}

}  // namespace

ServeMetrics::ServeMetrics(const std::string& model_name)
    : registry_(std::make_shared<prometheus::Registry>()),
      model_name_(model_name),
      received_(counter(*registry_, "crescent_requests_received_total",
                        "Requests given to the Conductor to place; with none in flight, = rejected + "
                        "vllm:request_success_total (every finished_reason)",
                        {})),
      rejected_(
          prometheus::BuildCounter()
              .Name("crescent_requests_rejected_total")
              .Help("Requests refused before prefill, by reason (ttft, tbt, decode-capacity, context-length)")
              .Register(*registry_)),
      failed_(prometheus::BuildCounter()
                  .Name("crescent_requests_failed_total")
                  .Help("Requests that failed after they were accepted, by the error code their client got "
                        "(instance_down, kv_transfer_failed, prefill_failed, queue_timeout, "
                        "prefill_timeout, kv_handoff_timeout, decode_timeout)")
                  .Register(*registry_)),
      replaced_(prometheus::BuildCounter()
                    .Name("crescent_requests_replaced_total")
                    .Help("Accepted requests placed again because their instance went down, by reason "
                          "(prefill_down, decode_down: a stream with tokens out moved and went on)")
                    .Register(*registry_)),
      placed_on_(prometheus::BuildCounter()
                     .Name("crescent_instance_requests_total")
                     .Help("Requests placed on each instance (prefill and decode), by its name; a request "
                           "placed again counts on each instance it went to")
                     .Register(*registry_)),
      prefix_tokens_(
          prometheus::BuildCounter()
              .Name("crescent_prefix_tokens_total")
              .Help("Prompt tokens of accepted requests by where their KV came from: local (the prefill "
                    "instance's cache), pool (fetched from elsewhere), none (computed)")
              .Register(*registry_)),
      kv_bytes_(prometheus::BuildCounter()
                    .Name("crescent_kv_transfer_bytes_total")
                    .Help("KV cache bytes the modelled cluster moves between instances, at the model's size "
                          "(prefill_to_decode, prefix_fetch)")
                    .Register(*registry_)),
      kv_bytes_moved_(prometheus::BuildCounter()
                          .Name("crescent_kv_bytes_moved_total")
                          .Help("KV bytes the instance processes really moved, scaled down by kv_bytes_scale "
                                "(prefill_to_decode, pool_read, pool_write)")
                          .Register(*registry_)),
      kv_transport_bytes_(prometheus::BuildCounter()
                              .Name("crescent_kv_prefill_to_decode_bytes_total")
                              .Help("KV bytes written prefill -> decode, by the transport that carried them")
                              .Register(*registry_)),
      pool_prefix_(
          prometheus::BuildCounter()
              .Name("crescent_pool_prefix_tokens_total")
              .Help("Prefix tokens the Conductor arranged to fetch, found in the pool (hit) or not (miss)")
              .Register(*registry_)),
      prefill_computed_(counter(*registry_, "crescent_prefill_computed_tokens_total",
                                "Prompt tokens the prefill instances' executors computed (not reused)", {})),
      control_dropped_(
          prometheus::BuildCounter()
              .Name("crescent_control_messages_dropped_total")
              .Help("Control messages the Conductor dropped: undecodable, or from no instance of "
                    "its config")
              .Register(*registry_)),
      clients_refused_(counter(*registry_, "crescent_control_clients_refused_total",
                               "Connections to the Conductor's members-only sockets refused (no cluster key)",
                               {})),
      kv_blocks_verified_(counter(
          *registry_, "crescent_kv_blocks_verified_total",
          "KV blocks checked on arrival: at decode (from prefill) and at prefill (from the pool)", {})),
      kv_checksum_failures_(counter(*registry_, "crescent_kv_checksum_failures_total",
                                    "KV blocks that failed their check on arrival (corrupted, or not the "
                                    "block of their key): never used",
                                    {})),
      kv_writes_(counter(
          *registry_, "crescent_kv_transfer_writes_total",
          "Transfers that carried prompts' KV prefill -> decode (chunks, or a chunk's layers, streamed "
          "during prefill, then the rest)",
          {})),
      success_(prometheus::BuildCounter()
                   .Name("vllm:request_success_total")
                   .Help("Finished requests by finish reason")
                   .Register(*registry_)),
      prefix_queries_(counter(*registry_, "vllm:prefix_cache_queries_total",
                              "Prompt tokens looked up in the prefix cache", {{"model_name", model_name}})),
      prefix_hits_(counter(*registry_, "vllm:prefix_cache_hits_total",
                           "Prompt tokens found in the prefix cache", {{"model_name", model_name}})),
      prompt_tokens_(counter(*registry_, "vllm:prompt_tokens_total", "Prompt tokens of finished requests",
                             {{"model_name", model_name}})),
      generation_tokens_(counter(*registry_, "vllm:generation_tokens_total", "Generated tokens",
                                 {{"model_name", model_name}})),
      decision_(histogram(*registry_, "crescent_conductor_decision_seconds",
                          "Time the Conductor took to place a request", {}, kDecisionBuckets)),
      routing_(
          histogram(*registry_, "crescent_router_overhead_seconds",
                    "Router mode: from a request all received to its first engine request sent (parsing, "
                    "tokenizing, placing)",
                    {}, kDecisionBuckets)),
      ttft_(histogram(*registry_, "vllm:time_to_first_token_seconds", "Arrival to first token",
                      {{"model_name", model_name}}, kLatencyBuckets)),
      itl_(histogram(*registry_, "vllm:inter_token_latency_seconds", "Gap between two output tokens",
                     {{"model_name", model_name}}, kLatencyBuckets)),
      e2e_(histogram(*registry_, "vllm:e2e_request_latency_seconds", "Arrival to last token",
                     {{"model_name", model_name}}, kLatencyBuckets)),
      queue_(histogram(*registry_, "vllm:request_queue_time_seconds", "Arrival to the start of prefill",
                       {{"model_name", model_name}}, kLatencyBuckets)),
      prefill_(histogram(*registry_, "vllm:request_prefill_time_seconds", "Start of prefill to first token",
                         {{"model_name", model_name}}, kLatencyBuckets)),
      decode_(histogram(*registry_, "vllm:request_decode_time_seconds", "First token to last token",
                        {{"model_name", model_name}}, kLatencyBuckets)),
      kv_exposed_transfer_(
          histogram(*registry_, "crescent_kv_exposed_transfer_seconds",
                    "Prefill end (first token) to the prompt's KV all written to decode: the "
                    "transfer not hidden behind compute",
                    {}, kLatencyBuckets)),
      running_(gauge(*registry_, "vllm:num_requests_running", "Requests in decode batches",
                     {{"model_name", model_name}})),
      waiting_(gauge(*registry_, "vllm:num_requests_waiting",
                     "Requests queued for prefill or waiting for decode KV room",
                     {{"model_name", model_name}})),
      kv_usage_(gauge(*registry_, "vllm:kv_cache_usage_perc", "Decode KV cache reserved / capacity (0-1)",
                      {{"model_name", model_name}})),
      instances_up_(prometheus::BuildGauge()
                        .Name("crescent_instances_up")
                        .Help("Instances the Conductor may place requests on, by role")
                        .Register(*registry_)),
      kv_reserved_(gauge(*registry_, "crescent_decode_kv_reserved_tokens",
                         "KV tokens reserved on decode instances: running, waiting and incoming requests",
                         {})),
      caches_synced_(gauge(*registry_, "crescent_prefill_caches_synced",
                           "Prefill instances up whose whole cache the Conductor has learned since they came "
                           "up (their full KV report after its reset)",
                           {})) {}

void ServeMetrics::observe_decision(double seconds) {
  decision_.Observe(seconds);
}
void ServeMetrics::observe_routing_overhead(double seconds) {
  routing_.Observe(seconds);
}
void ServeMetrics::observe_received() {
  received_.Increment();
}
void ServeMetrics::observe_rejection(std::string_view reason) {
  rejected_.Add({{"reason", std::string(reason)}}).Increment();
}
void ServeMetrics::observe_failure(std::string_view code) {
  failed_.Add({{"reason", std::string(code)}}).Increment();
}
void ServeMetrics::observe_replaced(std::string_view reason) {
  replaced_.Add({{"reason", std::string(reason)}}).Increment();
}
void ServeMetrics::observe_placed_on(const std::string& instance) {
  placed_on_.Add({{"instance", instance}}).Increment();
}
void ServeMetrics::observe_prefix(int64_t prompt_tokens, int64_t local_tokens, int64_t fetched_tokens) {
  prefix_tokens_.Add({{"source", "local"}}).Increment(static_cast<double>(local_tokens));
  prefix_tokens_.Add({{"source", "pool"}}).Increment(static_cast<double>(fetched_tokens));
  prefix_tokens_.Add({{"source", "none"}})
      .Increment(static_cast<double>(prompt_tokens - local_tokens - fetched_tokens));
  prefix_queries_.Increment(static_cast<double>(prompt_tokens));
  prefix_hits_.Increment(static_cast<double>(local_tokens + fetched_tokens));
}
void ServeMetrics::observe_kv_bytes_moved(std::string_view path, uint64_t bytes) {
  kv_bytes_moved_.Add({{"path", std::string(path)}}).Increment(static_cast<double>(bytes));
}

void ServeMetrics::observe_kv_transport(std::string_view transport, uint64_t bytes) {
  kv_transport_bytes_.Add({{"transport", std::string(transport)}}).Increment(static_cast<double>(bytes));
}

void ServeMetrics::observe_kv_writes(uint64_t writes) {
  kv_writes_.Increment(static_cast<double>(writes));
}

void ServeMetrics::observe_pool_prefix(int64_t hit_tokens, int64_t miss_tokens) {
  pool_prefix_.Add({{"result", "hit"}}).Increment(static_cast<double>(hit_tokens));
  pool_prefix_.Add({{"result", "miss"}}).Increment(static_cast<double>(miss_tokens));
}

void ServeMetrics::observe_kv_exposed_transfer(double seconds) {
  kv_exposed_transfer_.Observe(std::max(0.0, seconds));
}

void ServeMetrics::observe_prefill_computed(int64_t tokens) {
  prefill_computed_.Increment(static_cast<double>(tokens));
}

uint64_t ServeMetrics::observe_control_dropped(std::string_view reason) {
  prometheus::Counter& c = control_dropped_.Add({{"reason", std::string(reason)}});
  c.Increment();
  return static_cast<uint64_t>(c.Value());
}

void ServeMetrics::observe_clients_refused(uint64_t total) {
  const double now = static_cast<double>(total);
  if (now > clients_refused_.Value()) clients_refused_.Increment(now - clients_refused_.Value());
}

void ServeMetrics::observe_kv_checks(uint64_t verified_blocks, uint64_t failed_blocks) {
  kv_blocks_verified_.Increment(static_cast<double>(verified_blocks));
  kv_checksum_failures_.Increment(static_cast<double>(failed_blocks));
}

void ServeMetrics::observe_kv_bytes(std::string_view kind, double bytes) {
  kv_bytes_.Add({{"kind", std::string(kind)}}).Increment(bytes);
}
void ServeMetrics::observe_token_gap(double seconds) {
  itl_.Observe(seconds);
}
void ServeMetrics::observe_finished(const FinishedRequest& r, std::string_view finished_reason) {
  success_.Add({{"model_name", model_name_}, {"finished_reason", std::string(finished_reason)}}).Increment();
  generation_tokens_.Increment(static_cast<double>(r.generation_tokens));
  if (finished_reason == "abort") return;
  prompt_tokens_.Increment(static_cast<double>(r.prompt_tokens));
  ttft_.Observe(r.ttft_s);
  e2e_.Observe(r.e2e_s);
  queue_.Observe(r.queue_s);
  prefill_.Observe(r.prefill_s);
  decode_.Observe(r.decode_s);
}

std::string ServeMetrics::scrape(const LoadGauges& gauges) {
  running_.Set(static_cast<double>(gauges.requests_running));
  waiting_.Set(static_cast<double>(gauges.requests_waiting));
  kv_usage_.Set(gauges.kv_cache_usage);
  kv_reserved_.Set(static_cast<double>(gauges.decode_kv_reserved_tokens));
  instances_up_.Add({{"role", "prefill"}}).Set(static_cast<double>(gauges.prefill_instances_up));
  instances_up_.Add({{"role", "decode"}}).Set(static_cast<double>(gauges.decode_instances_up));
  caches_synced_.Set(static_cast<double>(gauges.prefill_caches_synced));
  return prometheus::TextSerializer().Serialize(registry_->Collect());
}

}  // namespace crescent::cluster
