#include "serve/local_cluster.h"

#include <xxhash.h>

#include <chrono>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "conductor/cluster_state.h"
#include "engine/engine_core.h"
#include "perf/cost_model.h"
#include "serve/serve_metrics.h"
#include "sim/simulator.h"

namespace crescent::serve {

std::vector<BlockKey> prompt_block_keys(std::span<const int64_t> token_ids, int64_t block_size_tokens) {
  std::vector<BlockKey> keys;
  const auto block = static_cast<size_t>(block_size_tokens);
  BlockKey parent = 0;
  for (size_t start = 0; start + block <= token_ids.size(); start += block) {
    parent = XXH3_64bits_withSeed(token_ids.data() + start, block * sizeof(int64_t), parent);
    keys.push_back(parent);
  }
  return keys;
}

int64_t mock_token(uint64_t seed, int64_t index) {
  const uint64_t pair[2] = {seed, static_cast<uint64_t>(index)};
  const uint64_t h = XXH3_64bits(pair, sizeof(pair));
  const uint64_t letter = h % 32;
  return letter < 26 ? 'a' + static_cast<int64_t>(letter) : ' ';
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

using Clock = std::chrono::steady_clock;

}  // namespace

class LocalCluster::Impl {
 public:
  explicit Impl(const LocalClusterOptions& options)
      : options_(options),
        cost_(options.config.model, options.config.hardware),
        conductor_(cost_, sim::conductor_options(options.config, options.policy, options.admission,
                                                 options.block_size_tokens)),
        kv_capacity_tokens_(cost_.decode_kv_capacity_tokens(options.config.decode_hbm_reserved_share)),
        state_(options.config.prefill_instances, options.config.decode_instances, options.block_size_tokens,
               kv_capacity_tokens_),
        executor_(cost_),
        metrics_(options.model_name),
        start_(Clock::now()) {
    const engine::EngineOptions prefill_options{
        .kv_capacity_tokens = options.config.prefill_cache_capacity_tokens,
        .prefix_cache = true,
        .block_size_tokens = options.block_size_tokens,
        .prefix_in_dram = true};
    for (InstanceId i = 0; i < options.config.prefill_instances; ++i) {
      prefill_listeners_.push_back(std::make_unique<PrefillListener>(*this, i));
      prefill_.push_back(
          std::make_unique<engine::EngineCore>(prefill_options, executor_, *prefill_listeners_[i]));
    }
    const engine::EngineOptions decode_options{.kv_capacity_tokens = kv_capacity_tokens_,
                                               .report_tokens = true};
    decode_listener_ = std::make_unique<DecodeListener>(*this);
    for (InstanceId d = 0; d < options.config.decode_instances; ++d) {
      decode_.push_back(std::make_unique<engine::EngineCore>(decode_options, executor_, *decode_listener_));
    }
    driver_ = std::thread([this] { drive(); });
  }

  ~Impl() {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    driver_.join();
  }

  int64_t max_context_tokens() const { return kv_capacity_tokens_; }
  size_t requests_in_flight() {
    std::lock_guard lock(mu_);
    return requests_.size();
  }

  std::string metrics_text() {
    LoadGauges gauges;
    {
      std::lock_guard lock(mu_);
      advance_all(now_s());
      int64_t reserved = 0, capacity = 0;
      for (const auto& d : decode_) {
        const conductor::DecodeLoad load = d->decode_load();
        gauges.requests_running += load.running.requests;
        gauges.requests_waiting += load.waiting.requests;
        reserved += load.running.kv_tokens + load.waiting.kv_tokens;
        capacity += load.kv_capacity_tokens;
      }
      for (const auto& p : prefill_) gauges.requests_waiting += p->outstanding();
      gauges.kv_cache_usage =
          capacity > 0 ? static_cast<double>(reserved) / static_cast<double>(capacity) : 0;
    }
    return metrics_.scrape(gauges);
  }

  conductor::Decision submit(ClusterRequest request, RequestCallbacks callbacks, uint64_t& id) {
    std::unique_lock lock(mu_);
    const double now = now_s();
    advance_all(now);
    for (InstanceId d = 0; d < decode_.size(); ++d) state_.on_decode_report(d, decode_[d]->decode_load());
    Live live;
    live.request = std::move(request);
    live.callbacks = std::move(callbacks);
    live.block_keys = prompt_block_keys(live.request.prompt_token_ids, options_.block_size_tokens);
    const auto input = static_cast<int64_t>(live.request.prompt_token_ids.size());
    const conductor::RequestInfo info{input, live.block_keys, live.request.max_tokens};
    const auto decide_start = Clock::now();
    const conductor::Decision decision = conductor_.schedule(state_, info, now);
    metrics_.observe_decision(std::chrono::duration<double>(Clock::now() - decide_start).count());
    if (decision.rejected != conductor::RejectReason::kNone) {
      metrics_.observe_rejection(conductor::to_string(decision.rejected));
      return decision;
    }
    metrics_.observe_prefix(input, decision.local_prefix_tokens, decision.fetched_prefix_tokens);
    metrics_.observe_kv_bytes(
        "prefix_fetch", static_cast<double>(decision.fetched_prefix_tokens) * cost_.kv_bytes_per_token());
    live.submitted_s = now;
    id = next_id_++;
    live.summary.prompt_tokens = input;
    live.summary.prefill_instance = decision.prefill_instance;
    live.summary.decode_instance = decision.decode_instance;
    const conductor::PrefillTimeline timeline = state_.on_request_placed(info, decision, now);
    if (live.request.max_tokens > 1) {
      decode_[decision.decode_instance]->expect(id, input, live.request.max_tokens, now);
    }
    auto& entry = requests_.emplace(id, std::move(live)).first->second;
    // The prefix the Conductor found, fetched from another instance when it chose to: copying it is how a
    // hot prefix gains replicas (in process there is one memory, so only its time is paid).
    prefill_[decision.prefill_instance]->submit_prompt(id, input, 1, entry.block_keys, now,
                                                       {.reused_tokens = decision.prefix_tokens(),
                                                        .fetched_tokens = decision.fetched_prefix_tokens,
                                                        .ready_s = timeline.prefix_ready_s});
    lock.unlock();
    cv_.notify_all();
    return decision;
  }

  void cancel(uint64_t id) {
    std::lock_guard lock(mu_);
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    prefill_[it->second.summary.prefill_instance]->cancel(id);
    decode_[it->second.summary.decode_instance]->cancel(id);
    std::erase_if(kv_arrivals_, [id](const auto& entry) { return entry.second == id; });
    metrics_.observe_finished({.generation_tokens = it->second.summary.completion_tokens}, /*aborted=*/true);
    requests_.erase(it);
  }

 private:
  // A request in flight.
  struct Live {
    ClusterRequest request;
    RequestCallbacks callbacks;
    std::vector<BlockKey> block_keys;
    RequestSummary summary;
    double submitted_s = 0, prefill_start_s = 0, first_token_s = 0, last_token_s = 0;  // cluster clock
  };

  class PrefillListener final : public engine::EngineListener {
   public:
    PrefillListener(Impl& cluster, InstanceId instance) : cluster_(cluster), instance_(instance) {}
    void on_prefill_start(engine::RequestId id, double now_s, const engine::PrefillStart& start) override {
      if (auto it = cluster_.requests_.find(id); it != cluster_.requests_.end()) {
        it->second.summary.cached_tokens = start.hit_tokens;
        it->second.prefill_start_s = now_s;
      }
    }
    void on_first_token(engine::RequestId id, double now_s) override {
      cluster_.prefill_done(instance_, id, now_s);
    }
    void on_finished(engine::RequestId, double, const std::optional<engine::StepLog::Gaps>&) override {}
    void on_kv_event(std::span<const BlockKey> stored, std::span<const BlockKey> removed,
                     double now_s) override {
      cluster_.state_.on_kv_event(instance_, stored, removed, now_s);
    }

   private:
    Impl& cluster_;
    const InstanceId instance_;
  };

  class DecodeListener final : public engine::EngineListener {
   public:
    explicit DecodeListener(Impl& cluster) : cluster_(cluster) {}
    void on_prefill_start(engine::RequestId, double, const engine::PrefillStart&) override {}
    void on_first_token(engine::RequestId, double) override {}
    void on_tokens(std::span<const engine::RequestId> ids, double now_s) override {
      for (engine::RequestId id : ids) cluster_.emit_token(id, now_s);
    }
    void on_finished(engine::RequestId id, double now_s,
                     const std::optional<engine::StepLog::Gaps>&) override {
      cluster_.finish(id, now_s);
    }

   private:
    Impl& cluster_;
  };

  double now_s() const { return std::chrono::duration<double>(Clock::now() - start_).count(); }

  // Every engine runs the iterations that ended by `now`; KV hand-offs due by then reach their decode
  // instance, in time order with the iterations.
  void advance_all(double now) {
    for (;;) {
      const double next_arrival = kv_arrivals_.empty() ? kInf : kv_arrivals_.begin()->first;
      const double until = std::min(now, next_arrival);
      for (auto& p : prefill_) p->advance_until(until);
      for (auto& d : decode_) d->advance_until(until);
      if (next_arrival > now) return;
      const auto [at_s, id] = *kv_arrivals_.begin();
      kv_arrivals_.erase(kv_arrivals_.begin());
      auto it = requests_.find(id);
      if (it == requests_.end()) continue;
      decode_[it->second.summary.decode_instance]->submit_decode(id, at_s, at_s);
    }
  }

  void prefill_done(InstanceId instance, engine::RequestId id, double now) {
    state_.on_prefill_done(instance, now);
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    emit_token(id, now);  // the first token comes from the prefill
    it = requests_.find(id);
    if (it == requests_.end()) return;
    const auto input = static_cast<int64_t>(it->second.request.prompt_token_ids.size());
    if (it->second.request.max_tokens <= 1) {
      finish(id, now);
      return;
    }
    metrics_.observe_kv_bytes("prefill_to_decode", static_cast<double>(input) * cost_.kv_bytes_per_token());
    // KV streams to decode chunk by chunk while prefill runs: after the last chunk only its KV is left.
    const int64_t chunk = options_.config.prefill_chunk_tokens;
    const int64_t last_chunk_tokens = input % chunk == 0 ? chunk : input % chunk;
    kv_arrivals_.emplace(now + cost_.kv_transfer_time_s(last_chunk_tokens), id);
  }

  void emit_token(engine::RequestId id, double now) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    Live& live = it->second;
    if (live.summary.completion_tokens == 0) {
      live.first_token_s = now;
    } else {
      metrics_.observe_token_gap(now - live.last_token_s);
    }
    live.last_token_s = now;
    const int64_t token = mock_token(live.request.seed, live.summary.completion_tokens);
    ++live.summary.completion_tokens;
    if (live.callbacks.on_tokens) live.callbacks.on_tokens(std::span<const int64_t>(&token, 1));
  }

  void finish(engine::RequestId id, double now) {
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    const Live& live = it->second;
    conductor_.observe_output(live.summary.completion_tokens);
    metrics_.observe_finished({.prompt_tokens = live.summary.prompt_tokens,
                               .generation_tokens = live.summary.completion_tokens,
                               .ttft_s = live.first_token_s - live.submitted_s,
                               .e2e_s = now - live.submitted_s,
                               .queue_s = live.prefill_start_s - live.submitted_s,
                               .prefill_s = live.first_token_s - live.prefill_start_s,
                               .decode_s = now - live.first_token_s},
                              /*aborted=*/false);
    RequestCallbacks callbacks = std::move(it->second.callbacks);
    const RequestSummary summary = it->second.summary;
    requests_.erase(it);
    if (callbacks.on_done) callbacks.on_done(summary);
  }

  double next_event_s() const {
    double next = kv_arrivals_.empty() ? kInf : kv_arrivals_.begin()->first;
    for (const auto& p : prefill_) next = std::min(next, p->next_event_s());
    for (const auto& d : decode_) next = std::min(next, d->next_event_s());
    return next;
  }

  void drive() {
    std::unique_lock lock(mu_);
    while (!stopping_) {
      advance_all(now_s());
      const double next = next_event_s();
      if (next == kInf) {
        cv_.wait(lock);
      } else {
        cv_.wait_until(
            lock, start_ + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(next)));
      }
    }
  }

  const LocalClusterOptions options_;
  const perf::CostModel cost_;
  conductor::Conductor conductor_;
  const int64_t kv_capacity_tokens_;
  conductor::ClusterState state_;
  engine::MockExecutor executor_;
  ServeMetrics metrics_;  // thread-safe
  const Clock::time_point start_;

  std::mutex mu_;  // everything below, and the engines
  std::condition_variable cv_;
  bool stopping_ = false;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Live> requests_;
  std::multimap<double, uint64_t> kv_arrivals_;  // (when its KV reaches decode, request)
  std::vector<std::unique_ptr<PrefillListener>> prefill_listeners_;
  std::unique_ptr<DecodeListener> decode_listener_;
  std::vector<std::unique_ptr<engine::EngineCore>> prefill_;
  std::vector<std::unique_ptr<engine::EngineCore>> decode_;
  std::thread driver_;
};

Result<std::unique_ptr<LocalCluster>> LocalCluster::start(const LocalClusterOptions& options) {
  sim::SimOptions sim_options;
  sim_options.block_size_tokens = options.block_size_tokens;
  CRESCENT_RETURN_IF_ERROR(sim::validate(options.config, sim_options));
  return std::unique_ptr<LocalCluster>(new LocalCluster(std::make_unique<Impl>(options)));
}

LocalCluster::LocalCluster(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
LocalCluster::~LocalCluster() = default;

conductor::Decision LocalCluster::submit(ClusterRequest request, RequestCallbacks callbacks, uint64_t& id) {
  return impl_->submit(std::move(request), std::move(callbacks), id);
}
void LocalCluster::cancel(uint64_t id) {
  impl_->cancel(id);
}
int64_t LocalCluster::max_context_tokens() const {
  return impl_->max_context_tokens();
}
size_t LocalCluster::requests_in_flight() const {
  return impl_->requests_in_flight();
}
std::string LocalCluster::metrics_text() const {
  return impl_->metrics_text();
}

}  // namespace crescent::serve
