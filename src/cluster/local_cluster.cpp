#include "cluster/local_cluster.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <unordered_map>

#include "cluster/cluster_config.h"
#include "common/clock.h"
#include "engine/engine_core.h"

namespace crescent::cluster {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

}  // namespace

class LocalCluster::Impl final : public InstanceLinks {
 public:
  explicit Impl(const ClusterOptions& options)
      : options_(options), core_(options, *this), executor_(core_.cost()) {
    const engine::EngineOptions prefill_options =
        prefill_engine_options(options.config, options.block_size_tokens);
    for (InstanceId i = 0; i < options.config.prefill_instances; ++i) {
      prefill_listeners_.push_back(std::make_unique<PrefillListener>(*this, i));
      prefill_.push_back(
          std::make_unique<engine::EngineCore>(prefill_options, executor_, *prefill_listeners_[i]));
    }
    engine::EngineOptions decode_options = decode_engine_options(options.config);
    decode_options.kv_transfer_timeout_s = 0;  // in process, KV always arrives
    decode_listener_ = std::make_unique<DecodeListener>(*this);
    for (InstanceId d = 0; d < options.config.decode_instances; ++d) {
      decode_.push_back(std::make_unique<engine::EngineCore>(decode_options, executor_, *decode_listener_));
    }
    driver_ = std::thread([this] { drive(); });
  }

  ~Impl() override {
    {
      std::lock_guard lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
    driver_.join();
  }

  int64_t max_context_tokens() const { return core_.max_context_tokens(); }
  std::pair<uint32_t, uint32_t> instances_up() const {
    return {options_.config.prefill_instances, options_.config.decode_instances};
  }
  size_t requests_in_flight() {
    std::lock_guard lock(mu_);
    return core_.requests_in_flight();
  }

  std::string metrics_text() {
    LoadGauges gauges;
    {
      std::lock_guard lock(mu_);
      advance_all(now_s());
      kv::DecodePoolLoad pool;
      for (const auto& d : decode_) pool.add(d->decode_load());
      gauges.add_decode_pool(pool);
      for (const auto& p : prefill_) gauges.requests_waiting += p->outstanding();
      gauges.prefill_instances_up = std::ssize(prefill_);  // in process, nothing goes down
      gauges.decode_instances_up = std::ssize(decode_);
      // In process the Conductor reads every prefill instance's cache events as they happen, from the start.
      gauges.prefill_caches_synced = gauges.prefill_instances_up;
    }
    return core_.metrics().scrape(gauges);
  }

  conductor::Decision submit(ClusterRequest request, RequestCallbacks callbacks, uint64_t& id) {
    std::unique_lock lock(mu_);
    const double now = now_s();
    advance_all(now);
    const conductor::Decision decision = core_.place(std::move(request), std::move(callbacks), id, now);
    lock.unlock();
    cv_.notify_all();
    return decision;
  }

  void cancel(uint64_t id) {
    std::lock_guard lock(mu_);
    core_.cancel(id, now_s());
  }

  // InstanceLinks: the engines are here, so orders are calls.
  void report_decode_loads(conductor::ClusterState& state, double) override {
    // Exact: the engines were advanced to now before placing.
    for (InstanceId d = 0; d < decode_.size(); ++d) state.on_decode_report(d, decode_[d]->decode_load());
  }
  void send_prefill(InstanceId p, uint64_t id, const ClusterRequest& request,
                    std::span<const BlockKey> block_keys, const engine::EngineCore::ArrangedPrefix& prefix,
                    InstanceId, double now_s) override {
    // In process there is one memory: a fetched prefix costs only its transfer time.
    prefill_[p]->submit_prompt(id, static_cast<int64_t>(request.prompt_token_ids.size()), 1, block_keys,
                               now_s, prefix);
  }
  void send_expect(InstanceId d, uint64_t id, const ClusterRequest& request, double now_s) override {
    decode_[d]->expect(id, std::ssize(request.prompt_token_ids), request.max_tokens, now_s);
  }
  void send_kv_coming(InstanceId, uint64_t, int64_t, double) override {}  // in process, KV always arrives
  void send_kv_handoff(InstanceId d, uint64_t id, int64_t input_tokens, int64_t, double now_s) override {
    // When the simulator's KV arrives: streamed chunk by chunk from the prefill's start.
    const auto started = prefill_started_.extract(id);
    const double start_s = started ? started.mapped().first : now_s;
    const int64_t prefill_tokens = started ? started.mapped().second : input_tokens;
    kv_arrivals_.emplace(core_.cost().kv_handoff_done_s(input_tokens, prefill_tokens,
                                                        options_.config.prefill_chunk_tokens, start_s, now_s),
                         Arrival{id, d});
  }
  void send_cancel(InstanceId p, InstanceId d, uint64_t id) override {
    // A stop decided in an engine's own callback (a token that ends its request) waits until the engine's
    // call returns: cancelling there would erase the request under the iteration handling it.
    if (advancing_) {
      deferred_cancels_.push_back({p, d, id});
      return;
    }
    prefill_[p]->cancel(id);
    decode_[d]->cancel(id);
    prefill_started_.erase(id);
    std::erase_if(kv_arrivals_, [id](const auto& entry) { return entry.second.id == id; });
  }

 private:
  struct Arrival {
    uint64_t id;
    InstanceId decode;
  };
  struct Cancel {
    InstanceId prefill, decode;
    uint64_t id;
  };

  // `engine` runs the iterations that ended by `until`; the cancels its callbacks asked for follow.
  void advance(engine::EngineCore& engine, double until) {
    advancing_ = true;
    engine.advance_until(until);
    advancing_ = false;
    for (const Cancel& c : deferred_cancels_) send_cancel(c.prefill, c.decode, c.id);
    deferred_cancels_.clear();
  }

  class PrefillListener final : public engine::EngineListener {
   public:
    PrefillListener(Impl& cluster, InstanceId instance) : cluster_(cluster), instance_(instance) {}
    void on_prefill_start(engine::RequestId id, double now_s, const engine::PrefillStart& start) override {
      cluster_.prefill_started_[id] = {now_s, start.prefill_tokens};
      cluster_.core_.on_prefill_start(id, start.hit_tokens, now_s);
      cluster_.core_.metrics().observe_prefill_computed(start.prefill_tokens);
    }
    void on_first_token(engine::RequestId id, double now_s) override {
      // Hands its KV off (send_kv_handoff).
      cluster_.core_.on_first_token(instance_, id, cluster_.core_.next_mock_token(id), now_s);
      cluster_.core_.on_kv_shipped(id, now_s);
      cluster_.prefill_started_.erase(id);  // a one-token request hands nothing off
    }
    void on_finished(engine::RequestId, double, const std::optional<engine::StepLog::Gaps>&) override {}
    void on_kv_event(std::span<const BlockKey> stored, std::span<const BlockKey> removed,
                     double now_s) override {
      cluster_.core_.state().on_kv_event(instance_, stored, removed, now_s);
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
      tokens_.clear();
      for (engine::RequestId id : ids) tokens_.push_back(cluster_.core_.next_mock_token(id));
      cluster_.core_.on_tokens(ids, tokens_, now_s);
    }
    void on_finished(engine::RequestId, double, const std::optional<engine::StepLog::Gaps>&) override {}

   private:
    Impl& cluster_;
    std::vector<int64_t> tokens_;  // scratch
  };

  double now_s() const { return clock_.now_s(); }

  // Every engine runs the iterations that ended by `now`; KV hand-offs due by then reach their decode
  // instance, in time order with the iterations.
  void advance_all(double now) {
    for (;;) {
      const double next_arrival = kv_arrivals_.empty() ? kInf : kv_arrivals_.begin()->first;
      const double until = std::min(now, next_arrival);
      for (auto& p : prefill_) advance(*p, until);
      for (auto& d : decode_) advance(*d, until);
      if (next_arrival > now) return;
      const auto [at_s, arrival] = *kv_arrivals_.begin();
      kv_arrivals_.erase(kv_arrivals_.begin());
      if (core_.has_request(arrival.id)) decode_[arrival.decode]->submit_decode(arrival.id, at_s, at_s);
    }
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
      core_.expire_deadlines(now_s());
      const double next = std::min(next_event_s(), core_.next_deadline_s());
      if (next == kInf) {
        cv_.wait(lock);
      } else {
        cv_.wait_until(lock, clock_.at(next));
      }
    }
  }

  const ClusterOptions options_;
  std::mutex mu_;  // the core, the engines and everything below
  ConductorCore core_;
  engine::MockExecutor executor_;
  const SteadyClock clock_;
  std::condition_variable cv_;
  bool stopping_ = false;
  std::multimap<double, Arrival> kv_arrivals_;  // (when its KV reaches decode, request)
  bool advancing_ = false;                      // inside an engine's advance_until (its callbacks)
  std::vector<Cancel> deferred_cancels_;        // asked for meanwhile
  // Prompts being prefilled: (when their prefill started, tokens computed), for their KV hand-off.
  std::unordered_map<uint64_t, std::pair<double, int64_t>> prefill_started_;
  std::vector<std::unique_ptr<PrefillListener>> prefill_listeners_;
  std::unique_ptr<DecodeListener> decode_listener_;
  std::vector<std::unique_ptr<engine::EngineCore>> prefill_;
  std::vector<std::unique_ptr<engine::EngineCore>> decode_;
  std::thread driver_;
};

Result<std::unique_ptr<LocalCluster>> LocalCluster::start(const ClusterOptions& options) {
  CRESCENT_RETURN_IF_ERROR(validate(options));
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
std::pair<uint32_t, uint32_t> LocalCluster::instances_up() const {
  return impl_->instances_up();
}

}  // namespace crescent::cluster
