#include "sim/simulator.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <limits>
#include <queue>

#include "common/name_table.h"
#include "conductor/cluster_state.h"
#include "engine/engine_core.h"
#include "kv/block_cache.h"
#include "perf/cost_model.h"
#include "sim/colocated.h"

namespace crescent::sim {
namespace {

constexpr NameTable<System, 4> kSystems{"system",
                                        {{
                                            {"disaggregated", System::kDisaggregated},
                                            {"colocated", System::kColocated},
                                            {"colocated-prefix-cache", System::kColocatedPrefixCache},
                                            {"colocated-chunked-prefill", System::kColocatedChunkedPrefill},
                                        }}};

// How often (in arrivals) SimOptions::progress is called.
constexpr uint32_t kProgressEveryRequests = 256;

constexpr double kInf = std::numeric_limits<double>::infinity();
// Virtual time beyond which doubles lose sub-millisecond precision; arrivals later than this are refused.
constexpr double kMaxArrivalS = 1e9;

// Per-request state while it is in flight.
struct InFlight {
  std::vector<BlockKey> pinned_at_prefill;  // blocks pinned in the chosen prefill instance's cache
  std::vector<BlockKey> pinned_at_source;   // blocks pinned in the fetch source's cache
  InstanceId fetch_source = 0;
  double compute_start_s = 0;  // after fetching and loading the prefix
  int64_t prefill_tokens = 0;
  int64_t decode_steps = 0;  // output tokens after the first (which prefill produces)
};

// A prefill instance's DRAM prefix cache; its queue is the Conductor's prediction (ClusterState), which the
// simulator carries out exactly.
struct PrefillInstance {
  explicit PrefillInstance(int64_t capacity_blocks) : cache(capacity_blocks) {}
  kv::BlockCache cache;
};

enum class EventKind : uint8_t { kPrefillDone, kDecodeArrive };

struct Event {
  double time_s;
  uint64_t seq;  // insertion order: ties resolve deterministically
  EventKind kind;
  uint32_t req;
  bool operator>(const Event& o) const { return time_s != o.time_s ? time_s > o.time_s : seq > o.seq; }
};

// The disaggregated cluster. Decode instances are engine::EngineCore (continuous batching, HBM-bounded
// admission) on the virtual clock; prefill instances run exactly as the Conductor's queue model predicts.
class Simulation final : private engine::EngineListener {
 public:
  Simulation(const ClusterConfig& config, std::span<const trace::Request> trace, const SimOptions& options)
      : config_(config),
        trace_(trace),
        options_(options),
        cost_(config.model, config.hardware),
        conductor_(cost_,
                   conductor_options(config, options.policy, options.admission, options.block_size_tokens)),
        state_(config.prefill_instances, config.decode_instances, options.block_size_tokens,
               cost_.decode_kv_capacity_tokens(config.decode_hbm_reserved_share)),
        executor_(cost_) {
    result_.requests.resize(trace.size());
    inflight_.resize(trace.size());
    const int64_t capacity_blocks = config.prefill_cache_capacity_tokens / options.block_size_tokens;
    prefill_.reserve(config.prefill_instances);
    for (uint32_t i = 0; i < config.prefill_instances; ++i) prefill_.emplace_back(capacity_blocks);
    const engine::EngineOptions decode_options{
        .kv_capacity_tokens = cost_.decode_kv_capacity_tokens(config.decode_hbm_reserved_share)};
    for (uint32_t d = 0; d < config.decode_instances; ++d) {
      engine::EngineListener& listener = *this;
      decode_.push_back(std::make_unique<engine::EngineCore>(decode_options, executor_, listener));
    }
  }

  SimResult run() {
    double next_sample_s = 0;
    for (uint32_t req = 0; req < trace_.size(); ++req) {
      const double arrival_s = arrival_time_s(trace_, req, options_.time_scale);
      while (options_.load_sample_interval_s > 0 && next_sample_s <= arrival_s) {
        drain_events_until(next_sample_s);
        sample_load(next_sample_s);
        next_sample_s += options_.load_sample_interval_s;
      }
      drain_events_until(arrival_s);
      on_arrival(req, arrival_s);
      if (options_.progress && (req + 1) % kProgressEveryRequests == 0) {
        options_.progress({req + 1, static_cast<int64_t>(trace_.size()), arrival_s});
      }
    }
    // Keep sampling the loads until the cluster has drained, so short traces and overloaded runs show it.
    if (options_.load_sample_interval_s > 0) {
      while (!events_.empty() || std::ranges::any_of(decode_, [](const auto& d) { return d->busy(); })) {
        drain_events_until(next_sample_s);
        sample_load(next_sample_s);
        next_sample_s += options_.load_sample_interval_s;
      }
    }
    drain_events_until(kInf);
    for (auto& d : decode_) {
      d->advance_until(kInf);
      result_.counters.events += d->iterations();
      result_.counters.decode_steps += d->decode_steps();
    }
    for (const auto& o : result_.requests) result_.makespan_s = std::max(result_.makespan_s, o.finish_s);
    return std::move(result_);
  }

 private:
  void sample_load(double now_s) {
    LoadSample sample{.time_s = now_s};
    const std::span<const double> busy_until = state_.prefill_busy_until_s();
    for (double busy_until_s : busy_until) sample.prefill_queue_s += std::max(0.0, busy_until_s - now_s);
    sample.prefill_queue_s /= static_cast<double>(busy_until.size());
    int64_t reserved = 0, capacity = 0;
    for (auto& d : decode_) {
      d->advance_until(now_s);
      const conductor::DecodeLoad load = d->decode_load();
      reserved += load.running.kv_tokens + load.waiting.kv_tokens;
      capacity += load.kv_capacity_tokens;
      sample.decode_running += load.running.requests;
      sample.decode_waiting += load.waiting.requests;
    }
    sample.decode_kv_share = static_cast<double>(reserved) / static_cast<double>(capacity);
    result_.load_series.push_back(sample);
  }

  void push(double time_s, EventKind kind, uint32_t req) {
    events_.push(Event{time_s, next_seq_++, kind, req});
  }

  void drain_events_until(double t_s) {
    while (!events_.empty() && events_.top().time_s <= t_s) {
      Event e = events_.top();
      events_.pop();
      ++result_.counters.events;
      if (e.kind == EventKind::kPrefillDone) {
        on_prefill_done(e.req, e.time_s);
      } else {
        const RequestOutcome& o = result_.requests[e.req];
        engine::EngineCore& d = *decode_[o.decode_instance];
        d.advance_until(e.time_s);
        d.submit_decode(e.req, o.arrival_s + o.ttft_s, e.time_s);
      }
    }
  }

  // Touches `keys` in prefill instance `i`'s cache (pinned); what it stored and evicted reaches the
  // Conductor's state as a KV event, the stored blocks readable from `ready_s`.
  std::vector<BlockKey> touch_and_pin(InstanceId i, std::span<const BlockKey> keys, double ready_s) {
    events_scratch_.clear();
    prefill_[i].cache.touch(keys, /*pin=*/true, &events_scratch_);
    state_.on_kv_event(i, events_scratch_.stored, events_scratch_.evicted, ready_s);
    return events_scratch_.pinned;
  }

  void on_arrival(uint32_t req, double now_s) {
    const trace::Request& r = trace_[req];
    RequestOutcome& o = result_.requests[req];
    o.arrival_s = now_s;
    o.trace_line = r.line;
    o.input_tokens = r.input_tokens;
    o.output_tokens = r.output_tokens;
    ++result_.counters.events;
    ++result_.counters.decisions;
    // Every decode instance reports its current load (a live instance reports periodically; here the
    // report is exact).
    for (InstanceId d = 0; d < decode_.size(); ++d) {
      decode_[d]->advance_until(now_s);
      state_.on_decode_report(d, decode_[d]->decode_load());
    }

    const conductor::RequestInfo info{r.input_tokens, r.block_keys, r.output_tokens};
    const conductor::Decision dec = conductor_.schedule(state_, info, now_s);
    o.prefill_instance = dec.prefill_instance;
    o.decode_instance = dec.decode_instance;
    if (dec.rejected != conductor::RejectReason::kNone) {
      o.rejected = dec.rejected;
      o.finish_s = now_s;
      return;
    }
    InFlight& f = inflight_[req];
    const int64_t block = options_.block_size_tokens;

    // The prefill runs exactly as the Conductor's queue model predicts.
    const conductor::PrefillTimeline timeline = state_.on_request_placed(info, dec, now_s);
    f.compute_start_s = timeline.compute_start_s;
    const double done_s = timeline.done_s;

    // A remote prefix stays pinned at its holder until the prefill is done. The holder's whole matching
    // prefix is touched (and pinned), not only the fetched blocks, so its cache keeps the prefix's head at
    // least as recent as its tail (kv/block_cache.h).
    if (dec.fetched_prefix_tokens > 0) {
      const auto end = static_cast<size_t>((dec.prefix_tokens() + block - 1) / block);
      f.fetch_source = dec.fetch_from;
      f.pinned_at_source =
          touch_and_pin(dec.fetch_from, std::span<const BlockKey>(r.block_keys).first(end), now_s);
    }
    f.prefill_tokens = dec.prefill_tokens;
    f.decode_steps = std::max<int64_t>(0, r.output_tokens - 1);

    // Algorithm 1's "update the cache": the prompt's blocks (fetched and new) are cached and pinned on the
    // chosen instance, computed (ready) when its prefill ends.
    f.pinned_at_prefill = touch_and_pin(dec.prefill_instance, r.block_keys, done_s);

    o.queue_wait_s = timeline.start_s - now_s;
    o.prefix_load_s = dec.transfer_s;
    o.prefix_hit_tokens = dec.prefix_tokens();
    o.fetched_tokens = dec.fetched_prefix_tokens;
    o.prefill_compute_s = dec.prefill_s;
    if (f.decode_steps > 0) decode_[dec.decode_instance]->expect(req, r.input_tokens, r.output_tokens);
    push(done_s, EventKind::kPrefillDone, req);
  }

  void on_prefill_done(uint32_t req, double now_s) {
    RequestOutcome& o = result_.requests[req];
    InFlight& f = inflight_[req];
    o.ttft_s = now_s - o.arrival_s;
    state_.on_prefill_done(o.prefill_instance, now_s);
    prefill_[o.prefill_instance].cache.unpin(f.pinned_at_prefill);
    prefill_[f.fetch_source].cache.unpin(f.pinned_at_source);
    std::vector<BlockKey>().swap(f.pinned_at_prefill);
    std::vector<BlockKey>().swap(f.pinned_at_source);
    if (f.decode_steps == 0) {
      o.finish_s = now_s;
      conductor_.observe_output(o.output_tokens);
      return;
    }
    // KV streams to decode chunk by chunk while prefill runs (§3.1 step 3): after the last chunk only its own
    // KV is left to send, but the whole prompt's KV can never arrive faster than the link allows.
    const int64_t chunk = config_.prefill_chunk_tokens;
    const int64_t last_chunk_tokens = f.prefill_tokens % chunk == 0 ? chunk : f.prefill_tokens % chunk;
    const double arrive_s =
        std::max(now_s + cost_.kv_transfer_time_s(std::min(last_chunk_tokens, f.prefill_tokens)),
                 f.compute_start_s + cost_.kv_transfer_time_s(o.input_tokens));
    push(arrive_s, EventKind::kDecodeArrive, req);
  }

  // engine::EngineListener, for the decode instances (which never prefill).
  void on_prefill_start(engine::RequestId, double, const engine::PrefillStart&) override {}
  void on_first_token(engine::RequestId, double) override {}
  void on_finished(engine::RequestId id, double now_s,
                   const std::optional<engine::StepLog::Gaps>& gaps) override {
    RequestOutcome& o = result_.requests[id];
    o.finish_s = now_s;
    if (gaps) {
      o.tbt_s = gaps->tbt_s;
      o.max_token_gap_s = gaps->max_gap_s;
    }
    conductor_.observe_output(o.output_tokens);
  }

  const ClusterConfig& config_;
  std::span<const trace::Request> trace_;
  SimOptions options_;
  perf::CostModel cost_;
  conductor::Conductor conductor_;
  conductor::ClusterState state_;  // what the Conductor knows, fed by the instances' events
  std::vector<PrefillInstance> prefill_;
  engine::MockExecutor executor_;
  std::vector<std::unique_ptr<engine::EngineCore>> decode_;
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  uint64_t next_seq_ = 0;
  std::vector<InFlight> inflight_;
  SimResult result_;
  kv::TouchEvents events_scratch_;
};

}  // namespace

Result<System> parse_system(std::string_view name) {
  return kSystems.parse(name);
}
std::string_view to_string(System system) {
  return kSystems.name(system);
}
std::vector<std::string> system_names() {
  return kSystems.names();
}

Status validate(const ClusterConfig& config, const SimOptions& options) {
  if (!(options.time_scale > 0) || !std::isfinite(options.time_scale)) {
    return Status::invalid_argument(fmt::format("--time-scale must be > 0, got {}", options.time_scale));
  }
  if (options.block_size_tokens < 1) {
    return Status::invalid_argument(
        fmt::format("--block-size must be >= 1, got {}", options.block_size_tokens));
  }
  if (config.prefill_instances < 1 || config.decode_instances < 1) {
    return Status::invalid_argument("a cluster needs at least one prefill and one decode instance");
  }
  if (config.prefill_cache_capacity_tokens < options.block_size_tokens) {
    return Status::invalid_argument(
        fmt::format("prefill_cache_capacity_tokens ({}) is below one block ({} tokens)",
                    config.prefill_cache_capacity_tokens, options.block_size_tokens));
  }
  CRESCENT_RETURN_IF_ERROR(perf::validate_model_spec(config.model, "model"));
  CRESCENT_RETURN_IF_ERROR(perf::validate_hardware_spec(config.hardware, "hardware"));
  const perf::CostModel cost(config.model, config.hardware);
  if (cost.decode_kv_capacity_tokens(config.decode_hbm_reserved_share) < options.block_size_tokens) {
    return Status::invalid_argument(
        fmt::format("{} weights ({:.1f} GB) leave no room for KV cache in a decode instance's HBM ({} x "
                    "{:.1f} GB, {:.0f}% "
                    "reserved)",
                    config.model.name, cost.weight_bytes() / 1e9, config.hardware.gpus,
                    config.hardware.hbm_bytes_per_gpu / 1e9, config.decode_hbm_reserved_share * 100));
  }
  return Status();
}

Result<SimResult> simulate(const ClusterConfig& config, std::span<const trace::Request> trace,
                           const SimOptions& options) {
  CRESCENT_RETURN_IF_ERROR(validate(config, options));
  if (trace.size() > std::numeric_limits<uint32_t>::max()) {
    return Status::invalid_argument("trace has more than 2^32 requests");
  }
  if (!trace.empty()) {
    const double last_arrival_s = arrival_time_s(trace, trace.size() - 1, options.time_scale);
    if (!(last_arrival_s <= kMaxArrivalS)) {
      return Status::invalid_argument(
          fmt::format("the last arrival would be at {:g} s of virtual time (timestamp {} ms, time scale "
                      "{:g}); at most {:g} s "
                      "is supported",
                      last_arrival_s, trace.back().timestamp_ms, options.time_scale, kMaxArrivalS));
    }
  }
  if (options.system != System::kDisaggregated) return simulate_colocated(config, trace, options);
  Simulation sim(config, trace, options);
  return sim.run();
}

}  // namespace crescent::sim
