#include "sim/disaggregated.h"

#include <algorithm>
#include <bit>
#include <cassert>
#include <cmath>
#include <limits>
#include <memory>
#include <queue>

#include "cluster/placement.h"
#include "common/clock.h"
#include "conductor/cluster_state.h"
#include "engine/engine_core.h"
#include "kv/block_map.h"
#include "kv/decode_load.h"
#include "perf/cost_model.h"

namespace crescent::sim {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// Per-request state while its prefill runs.
struct InFlight {
  double prefill_start_s = 0;
  int64_t prefill_tokens = 0;  // prompt tokens its prefill computes
};

// The earliest of n event times, ties to the lowest index (what a scan with `<` finds), kept in a tournament
// tree: an update costs O(log n), where a scan of every instance per event cost O(n). For the prefill
// engines, whose events run one at a time in time order.
class EarliestEvent {
 public:
  explicit EarliestEvent(size_t n) : leaves_(std::bit_ceil(std::max<size_t>(n, 1))), time_s_(leaves_, kInf) {
    winner_.resize(2 * leaves_);
    for (size_t i = 0; i < leaves_; ++i) winner_[leaves_ + i] = static_cast<uint32_t>(i);
    for (size_t node = leaves_ - 1; node >= 1; --node) winner_[node] = better(2 * node, 2 * node + 1);
  }
  /// Event `i` (< n) is now at `time_s` (infinity: none). Not NaN: it would hide the events it is compared
  /// with (cluster::validate keeps the cost model's times finite).
  void set(size_t i, double time_s) {
    assert(!std::isnan(time_s));
    time_s_[i] = time_s;
    for (size_t node = (leaves_ + i) / 2; node >= 1; node /= 2)
      winner_[node] = better(2 * node, 2 * node + 1);
  }
  size_t earliest() const { return winner_[1]; }
  double earliest_s() const { return time_s_[winner_[1]]; }

 private:
  uint32_t better(size_t left, size_t right) const {  // the left subtree's indices are the lower
    return time_s_[winner_[left]] <= time_s_[winner_[right]] ? winner_[left] : winner_[right];
  }
  size_t leaves_;
  std::vector<double> time_s_;    // per event
  std::vector<uint32_t> winner_;  // per tree node (1 is the root; leaves from leaves_): its earliest event
};

// Per request of `trace`, in arrival order: one past the last of its blocks that a later request names
// (0: none). The trace is walked last request first, with the keys seen so far in a set (~10 bytes a
// reference, for as long as this takes).
std::vector<uint32_t> reused_later_blocks_of(std::span<const trace::Request> trace) {
  std::vector<uint32_t> out(trace.size(), 0);
  // Sized for every reference up front, so no table grows: each is then its own mapping, given back to the
  // system when the set goes (a table freed after growing may stay in the heap and add to the run's peak).
  size_t references = 0;
  for (const trace::Request& r : trace) references += r.block_keys.size();
  struct Seen {};  // a set: 8 bytes a slot (kv::BlockMap stores no room for an empty value)
  kv::BlockMap<Seen> seen;
  seen.reserve(references);
  for (size_t r = trace.size(); r-- > 0;) {
    const std::span<const BlockKey> keys = trace[r].block_keys;
    uint32_t later = 0;
    size_t j = 0;
    kv::for_each_prefetched(
        keys,
        [&](BlockKey k) {
          ++j;
          if (!seen.try_emplace(k, Seen{}).second) later = static_cast<uint32_t>(j);
        },
        seen);
    out[r] = later;
  }
  return out;
}

// A prompt's KV reaching its decode instance.
struct KvArrival {
  double time_s;
  uint64_t seq;  // insertion order: ties resolve deterministically
  uint32_t req;
  bool operator>(const KvArrival& o) const { return time_s != o.time_s ? time_s > o.time_s : seq > o.seq; }
};

// The disaggregated cluster, as the live one runs it (cluster::LocalCluster) but on a virtual clock: the same
// Conductor over the same ClusterState, prefill and decode instances that are engine::EngineCore with the
// options live instances use (cluster::prefill_engine_options, cluster::decode_engine_options) and the mock
// executor. Events run in time order: the prefill engines' iterations, KV arriving at decode, arrivals.
// Decode engines are brought up to date lazily (at each arrival, and before KV reaches them): nothing else
// depends on them in between. At an arrival only the decode engines with an iteration due run, and only
// those whose load changed since the last report report it again (the rest would report what the
// Conductor's state already holds): a decision costs the decode engines that did something, not all of them.
class Simulation final : private engine::EngineListener, private cluster::PlacementDriver {
 public:
  Simulation(const cluster::ClusterConfig& config, std::span<const trace::Request> trace,
             const SimOptions& options)
      : config_(config),
        trace_(trace),
        options_(options),
        cost_(cluster::cost_model(config)),
        conductor_(cost_, cluster::conductor_options(config, options.policy, options.admission,
                                                     options.block_size_tokens)),
        state_(config.prefill_instances, config.decode_instances, options.block_size_tokens,
               cluster::decode_kv_capacity_tokens(config)),
        executor_(cost_),
        next_prefill_event_(config.prefill_instances),
        next_decode_event_s_(config.decode_instances, kInf),
        decode_load_changed_(config.decode_instances, 0) {
    result_.requests.resize(trace.size());
    inflight_.resize(trace.size());
    if (options.index_only_reused_blocks) {
      reused_later_blocks_ = reused_later_blocks_of(trace);
    } else {
      reused_later_blocks_.assign(trace.size(), std::numeric_limits<uint32_t>::max());
    }
    const engine::EngineOptions prefill_options =
        cluster::prefill_engine_options(config, options.block_size_tokens);
    for (InstanceId i = 0; i < config.prefill_instances; ++i) {
      prefill_listeners_.push_back(std::make_unique<PrefillListener>(*this, i));
      prefill_.push_back(
          std::make_unique<engine::EngineCore>(prefill_options, executor_, *prefill_listeners_[i]));
    }
    engine::EngineOptions decode_options = cluster::decode_engine_options(config);
    decode_options.report_tokens = false;      // outcomes need only each request's gaps (StepLog)
    decode_options.kv_transfer_timeout_s = 0;  // simulated KV always arrives
    for (uint32_t d = 0; d < config.decode_instances; ++d) {
      engine::EngineListener& listener = *this;
      decode_.push_back(std::make_unique<engine::EngineCore>(decode_options, executor_, listener));
      decode_changed(d);  // the first decision hears every engine
    }
  }

  cluster::RunResult run() {
    double next_sample_s = 0;
    for (uint32_t req = 0; req < trace_.size(); ++req) {
      const double arrival_s = trace::arrival_time_s(trace_, req, options_.time_scale);
      while (options_.load_sample_interval_s > 0 && next_sample_s <= arrival_s) {
        advance_to(next_sample_s);
        sample_load();
        next_sample_s += options_.load_sample_interval_s;
      }
      advance_to(arrival_s);
      on_arrival(req);
      if (options_.progress && (req + 1) % kProgressEveryRequests == 0) {
        options_.progress({req + 1, static_cast<int64_t>(trace_.size()), arrival_s});
      }
    }
    // Keep sampling the loads until the cluster has drained, so short traces and overloaded runs show it.
    if (options_.load_sample_interval_s > 0) {
      const auto busy = [](const auto& e) { return e->busy(); };
      while (!kv_arrivals_.empty() || std::ranges::any_of(prefill_, busy) ||
             std::ranges::any_of(decode_, busy)) {
        advance_to(next_sample_s);
        sample_load();
        next_sample_s += options_.load_sample_interval_s;
      }
    }
    advance_to(kInf);
    for (auto& p : prefill_) result_.counters.events += p->iterations();
    for (auto& d : decode_) {
      d->advance_until(kInf);
      result_.counters.events += d->iterations();
      result_.counters.decode_steps += d->decode_steps();
    }
    for (const auto& o : result_.requests) result_.makespan_s = std::max(result_.makespan_s, o.finish_s);
    return std::move(result_);
  }

 private:
  // Tells the simulation what prefill instance `instance`'s engine does.
  class PrefillListener final : public engine::EngineListener {
   public:
    PrefillListener(Simulation& sim, InstanceId instance) : sim_(sim), instance_(instance) {}
    void on_prefill_start(engine::RequestId id, double now_s, const engine::PrefillStart& start) override {
      sim_.on_prefill_start(static_cast<uint32_t>(id), now_s, start);
    }
    void on_first_token(engine::RequestId id, double now_s) override {
      sim_.on_prefill_done(instance_, static_cast<uint32_t>(id), now_s);
    }
    void on_finished(engine::RequestId, double, const std::optional<engine::StepLog::Gaps>&) override {}
    // What its DRAM cache stored and evicted reaches the Conductor's state, as live KV events do.
    void on_kv_event(std::span<const BlockKey> stored, std::span<const BlockKey> removed,
                     double now_s) override {
      sim_.state_.on_kv_event(instance_, sim_.reused_later(stored), removed, now_s);
    }

   private:
    Simulation& sim_;
    const InstanceId instance_;
  };

  void sample_load() {
    const double now_s = clock_.now_s();
    cluster::LoadSample sample{.time_s = now_s};
    const std::span<const double> busy_until = state_.prefill_busy_until_s();
    for (double busy_until_s : busy_until) sample.prefill_queue_s += std::max(0.0, busy_until_s - now_s);
    sample.prefill_queue_s /= static_cast<double>(busy_until.size());
    kv::DecodePoolLoad pool;
    advance_decode_until(now_s);
    for (auto& d : decode_) pool.add(d->decode_load());
    sample.decode_kv_share = pool.usage();
    sample.decode_running = pool.requests_running;
    sample.decode_waiting = pool.requests_waiting;
    result_.load_series.push_back(sample);
  }

  // Runs, in time order, every prefill iteration and KV arrival at or before `t_s`, then moves the clock to
  // `t_s` (when finite).
  void advance_to(double t_s) {
    for (;;) {
      const auto next_prefill = static_cast<InstanceId>(next_prefill_event_.earliest());
      const double prefill_s = next_prefill_event_.earliest_s();
      const double kv_s = kv_arrivals_.empty() ? kInf : kv_arrivals_.top().time_s;
      const double next_s = std::min(prefill_s, kv_s);
      if (next_s > t_s || next_s == kInf) break;
      clock_.advance_to(next_s);
      if (prefill_s <= kv_s) {
        prefill_[next_prefill]->advance_until(prefill_s);
        next_prefill_event_.set(next_prefill, prefill_[next_prefill]->next_event_s());
        continue;
      }
      const KvArrival a = kv_arrivals_.top();
      kv_arrivals_.pop();
      ++result_.counters.events;
      const cluster::RequestOutcome& o = result_.requests[a.req];
      engine::EngineCore& d = *decode_[o.decode_instance];
      d.advance_until(a.time_s);
      d.submit_decode(a.req, o.arrival_s + o.ttft_s, a.time_s);
      decode_changed(o.decode_instance);
    }
    if (t_s != kInf) clock_.advance_to(t_s);
  }

  void on_arrival(uint32_t req) {
    const double now_s = clock_.now_s();
    const trace::Request& r = trace_[req];
    cluster::RequestOutcome& o = result_.requests[req];
    o.arrival_s = now_s;
    o.trace_line = r.line;
    o.input_tokens = r.input_tokens;
    o.output_tokens = r.output_tokens;
    ++result_.counters.events;
    ++result_.counters.decisions;
    const conductor::RequestInfo info{.input_tokens = r.input_tokens,
                                      .block_keys = r.block_keys,
                                      .max_output_tokens = r.output_tokens,
                                      .reused_later_blocks = reused_later_blocks_[req]};
    const conductor::Decision dec = cluster::place(conductor_, state_, info, req, now_s, *this);
    o.prefill_instance = dec.prefill_instance;
    o.decode_instance = dec.decode_instance;
    if (dec.rejected != conductor::RejectReason::kNone) {
      o.rejected = dec.rejected;
      o.finish_s = now_s;
      return;
    }
    o.fetched_tokens = dec.fetched_prefix_tokens;
  }

  // cluster::PlacementDriver: the engines are here.
  void report_decode_loads(conductor::ClusterState& state, double now_s) override {
    // Every decode instance's current load reaches the state (a live instance reports periodically; here the
    // report is exact). An engine whose load did not change since its last report would repeat it.
    advance_decode_until(now_s);
    for (InstanceId d : decode_loads_changed_) {
      state.on_decode_report(d, decode_[d]->decode_load());
      decode_load_changed_[d] = 0;
    }
    decode_loads_changed_.clear();
#ifndef NDEBUG
    // The engines not reported again hold the load the state has (the sim tests run this in debug builds).
    for (InstanceId d = 0; d < decode_.size(); ++d)
      assert(state.decode_loads()[d] == decode_[d]->decode_load());
#endif
  }
  void expect(InstanceId d, uint64_t id, const conductor::RequestInfo& request, double now_s) override {
    decode_[d]->expect(id, request.input_tokens, request.max_output_tokens, now_s);
    decode_changed(d);
  }

  // Runs the iterations of every decode engine that ends one at or before `t_s`. An engine with none due
  // is left as it is: advancing it would change nothing (decode engines keep no cache, and simulated KV
  // never times out), and its load is what it last reported. Those due run in index order, each to `t_s`:
  // they do not interact, and the order of their finishes changes nothing (the Conductor sums output
  // lengths as integers: conductor::OutputLengthEstimator). So a scan of their next times finds them, where
  // a tree picked the earliest engine at an update per engine advanced; and as they are cold (thousands of
  // events ran since their last step), their lines are loaded together before any runs.
  void advance_decode_until(double t_s) {
    due_decode_.clear();
    for (InstanceId d = 0; d < next_decode_event_s_.size(); ++d) {
      const double next_s = next_decode_event_s_[d];
      if (next_s <= t_s && next_s != kInf) {
        due_decode_.push_back(d);
        decode_[d]->prefetch_step();
      }
    }
    for (InstanceId d : due_decode_) decode_[d]->prefetch_step_log();
    for (InstanceId d : due_decode_) {
      decode_[d]->advance_until(t_s);
      decode_changed(d);
    }
  }
  // Decode engine `d` ran or took a request: its next iteration may have moved, and its load changed.
  void decode_changed(InstanceId d) {
    next_decode_event_s_[d] = decode_[d]->next_event_s();
    if (!decode_load_changed_[d]) {
      decode_load_changed_[d] = 1;
      decode_loads_changed_.push_back(d);
    }
  }
  void submit_prefill(InstanceId p, uint64_t id, const conductor::RequestInfo& request,
                      const engine::EngineCore::ArrangedPrefix& prefix, InstanceId, double now_s) override {
    // A DRAM cache takes the prompt's blocks now, and says which it stores (reused_later). Those no later
    // request names that it does not hold already it keeps unkeyed (kv::BlockCache's top comment): they
    // evict and are evicted as keyed blocks would be, and no KV event names them, as none needs to.
    submitting_ = &request;
    prefill_[p]->submit_prompt(id, request.input_tokens, 1, request.block_keys, now_s, prefix,
                               request.reused_later_blocks);
    submitting_ = nullptr;
    next_prefill_event_.set(p, prefill_[p]->next_event_s());
  }

  void on_prefill_start(uint32_t req, double now_s, const engine::PrefillStart& start) {
    cluster::RequestOutcome& o = result_.requests[req];
    o.queue_wait_s = now_s - o.arrival_s;
    o.prefix_hit_tokens = start.hit_tokens;
    o.prefill_compute_s = cost_.prefill_iterations_time_s(start.prefill_tokens, start.reused_tokens,
                                                          config_.prefill_chunk_tokens);
    inflight_[req] = {now_s, start.prefill_tokens};
  }

  void on_prefill_done(InstanceId instance, uint32_t req, double now_s) {
    cluster::RequestOutcome& o = result_.requests[req];
    o.ttft_s = now_s - o.arrival_s;
    // The rest of its prefill brought the prefix into HBM (in its first iteration).
    o.prefix_load_s = std::max(0.0, o.ttft_s - o.queue_wait_s - o.prefill_compute_s);
    const std::span<const BlockKey> keys = trace_[req].block_keys;
    state_.on_prefill_done(instance, keys.first(std::min<size_t>(keys.size(), reused_later_blocks_[req])),
                           now_s);
    if (o.output_tokens <= 1) {
      o.finish_s = now_s;
      conductor_.observe_output(o.output_tokens);
      return;
    }
    const InFlight& f = inflight_[req];
    const double arrive_s = cost_.kv_handoff_done_s(o.input_tokens, f.prefill_tokens,
                                                    config_.prefill_chunk_tokens, f.prefill_start_s, now_s);
    kv_arrivals_.push(KvArrival{arrive_s, next_seq_++, req});
  }

  // engine::EngineListener, for the decode instances (which never prefill).
  void on_prefill_start(engine::RequestId, double, const engine::PrefillStart&) override {}
  void on_first_token(engine::RequestId, double) override {}
  void on_finished(engine::RequestId id, double now_s,
                   const std::optional<engine::StepLog::Gaps>& gaps) override {
    cluster::RequestOutcome& o = result_.requests[id];
    o.finish_s = now_s;
    if (gaps) {
      o.tbt_s = gaps->tbt_s;
      o.max_token_gap_s = gaps->max_gap_s;
    }
    conductor_.observe_output(o.output_tokens);
  }

  const cluster::ClusterConfig& config_;
  std::span<const trace::Request> trace_;
  SimOptions options_;
  VirtualClock clock_;  // the simulation's now: an event's time while it is handled
  perf::CostModel cost_;
  conductor::Conductor conductor_;
  conductor::ClusterState state_;  // what the Conductor knows, fed by the instances' events
  engine::MockExecutor executor_;
  std::vector<std::unique_ptr<PrefillListener>> prefill_listeners_;
  std::vector<std::unique_ptr<engine::EngineCore>> prefill_;
  std::vector<std::unique_ptr<engine::EngineCore>> decode_;
  // Each prefill engine's next_event_s(), set whenever the simulation has one run or take a prompt.
  EarliestEvent next_prefill_event_;
  // Each decode engine's next_event_s(), set whenever one runs or takes a request (decode_changed).
  std::vector<double> next_decode_event_s_;
  std::vector<InstanceId> due_decode_;  // scratch for advance_decode_until
  // Decode engines whose load changed since they last reported it: a flag per engine, and their ids.
  std::vector<uint8_t> decode_load_changed_;
  std::vector<InstanceId> decode_loads_changed_;
  std::priority_queue<KvArrival, std::vector<KvArrival>, std::greater<>> kv_arrivals_;
  uint64_t next_seq_ = 0;
  std::vector<InFlight> inflight_;
  cluster::RunResult result_;
  // Per request: how many of its leading blocks a later request names (reused_later_blocks_of).
  std::vector<uint32_t> reused_later_blocks_;
  // The request whose prompt a prefill engine is taking (submit_prefill), while it does.
  const conductor::RequestInfo* submitting_ = nullptr;

  // Of the blocks a prefill engine says it stores, those the Conductor's state needs: while it takes a
  // prompt, the ones among the prompt's first reused_later_blocks (a cache lists them in the prompt's order).
  // The others no later request names, so no decision will look them up.
  std::span<const BlockKey> reused_later(std::span<const BlockKey> stored) const {
    if (submitting_ == nullptr) return stored;
    const std::span<const BlockKey> keys = submitting_->block_keys;
    const size_t later = std::min(keys.size(), submitting_->reused_later_blocks);
    size_t i = 0, kept = 0;
    for (BlockKey k : stored) {
      while (i < keys.size() && keys[i] != k) ++i;
      if (i == keys.size()) return stored;  // not the prompt's order: keep them all
      if (i >= later) break;
      ++kept;
      ++i;
    }
    return stored.first(kept);
  }
};

}  // namespace

cluster::RunResult simulate_disaggregated(const cluster::ClusterConfig& config,
                                          std::span<const trace::Request> trace, const SimOptions& options) {
  Simulation sim(config, trace, options);
  return sim.run();
}

}  // namespace crescent::sim
