#include "router/router.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <deque>
#include <fstream>
#include <limits>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>
#include <unordered_map>

#include "cluster/placement.h"
#include "cluster/serve_metrics.h"
#include "common/clock.h"
#include "common/etcd_client.h"
#include "common/secret.h"
#include "conductor/cluster_state.h"
#include "conductor/conductor.h"
#include "kv/block_key.h"
#include "perf/cost_model.h"
#include "router/engine_body.h"
#include "router/engine_cache.h"
#include "router/engine_metrics.h"
#include "serve/http_client.h"
#include "serve/kv_events.h"

namespace crescent::router {
namespace {

using nlohmann::json;

constexpr size_t kMaxAnswerBytes = 64ull << 20;  // a whole (non-streamed) answer held before relaying
constexpr double kHealthTimeoutS = 2;
// How long a placement's blocks stay indexed on an engine that publishes KV events after its prefill is seen
// to end, waiting for the events that say it stores them: its answer and its events come on different
// sockets, and a request arriving in between should still find the prefix there (docs/router.md).
constexpr double kKvEventLagS = 1;
constexpr size_t kMaxOverheadSamples = 1 << 20;  // what take_overhead_samples_s() keeps between takes

// The key of an engine's entry file, trimmed: what an api_key_file holds.
Result<std::string> read_api_key(const std::string& path, const std::string& engine) {
  std::ifstream in(path);
  if (!in) return Status::not_found(fmt::format("engine '{}': cannot read api_key_file '{}'", engine, path));
  std::stringstream text;
  text << in.rdbuf();
  std::string key = text.str();
  while (!key.empty() && std::isspace(static_cast<unsigned char>(key.back()))) key.pop_back();
  if (key.empty()) return Status::invalid_argument(fmt::format("engine '{}': api_key_file '{}' is empty", engine, path));
  return key;
}

// The cost model of an engine timed as `profile` (none: the config's own), on the config's model and
// hardware.
perf::CostModel engine_cost_model(cluster::ClusterConfig config, const std::optional<perf::Profile>& profile) {
  if (profile) config.profile = profile;
  return cluster::cost_model(config);
}

std::string header_value(const std::vector<std::pair<std::string, std::string>>& headers,
                         std::string_view name) {
  for (const auto& [k, v] : headers)
    if (k == name) return v;
  return {};
}

}  // namespace

class Router::Impl final : private cluster::PlacementDriver {
 private:
  struct Engine {
    size_t index = 0;  // in engines_
    EngineEntry entry;
    const perf::CostModel* cost = nullptr;  // its profile's (entry.profile_path); null: the default
    bool from_etcd = false;      // registered in etcd: it leaves when its key goes
    bool deregistered = false;   // its key went: down until registered again
    int64_t etcd_revision = 0;   // the put of its key it was made from
    HostPort http;
    std::string api_key;
    std::optional<InstanceId> prefill, decode;  // its ids in the ClusterState's pools
    bool up = false;
    std::unique_ptr<EngineCache> cache;
    uint64_t kv_generation = 0;  // bumped when it comes up: its KV-event subscriber starts afresh
    int64_t kv_capacity_tokens = 0;
    int64_t cache_blocks = 0;  // its prefix cache's size in blocks, when known (entry or /metrics); 0: not
    int64_t max_model_len = 0;  // its /v1/models'; 0: unknown
    EngineMetrics scraped;      // its last /metrics
    int health_failures = 0;    // consecutive
    std::string refused_comeback;  // why it answered again but stayed down (logged once per reason)
    int64_t prefills_pending = 0;  // prompts sent here whose prefill has not been seen to end
    kv::DecodeGroup incoming, running;  // requests that will decode / decode here, as the router counts
    int64_t in_flight = 0;              // exchanges open with it
    uint64_t requests_sent = 0, failures = 0;
    uint64_t kv_batches = 0, kv_gaps_dropped = 0, kv_batches_replayed = 0;
  };

  struct Request {
    serve::RelayedRequest request;
    serve::RelayCallbacks callbacks;
    std::string request_id;  // X-Request-Id, the same at every engine it visits
    std::vector<BlockKey> keys;
    conductor::Decision decision;
    size_t prefill_engine = 0, decode_engine = 0;  // indices into engines_
    bool prefill_step = false;                     // the exchange open is a disaggregated prefill
    bool prefill_done = false;                     // its prefill was seen to end (first token, or answer)
    bool decoding = false;                         // counted in its decode engine's running group
    bool head_sent = false;                        // the client has the answer's head
    uint64_t exchange = 0;                         // the open exchange (0: none)
    size_t exchange_engine = 0;
    int attempts = 0;
    int status = 0;  // the open exchange's HTTP status
    std::string content_type;
    std::string buffer;  // a prefill answer, or an answer relayed whole
    std::unique_ptr<serve::SseParser> sse;  // a streamed answer's events, counted into Impl::fed_events_
    int64_t events = 0;                     // SSE events relayed (about one per token)
    double arrived_s = 0, placed_s = 0, first_token_s = 0, last_token_s = 0;
  };

 public:
  explicit Impl(RouterOptions options)
      : options_(std::move(options)),
        cost_(engine_cost_model(options_.config, options_.default_profile)),
        conductor_(cost_, conductor_options()),
        state_(count_role(true), count_role(false), block_size(), cluster::decode_kv_capacity_tokens(options_.config)),
        metrics_(options_.engines.front().model) {}

  ~Impl() {
    stopping_ = true;
    if (poll_thread_.joinable()) poll_thread_.join();
    if (kv_thread_.joinable()) kv_thread_.join();
    if (registry_thread_.joinable()) registry_thread_.join();
    {
      // Requests still open end here; the client's late callbacks then find nothing.
      std::lock_guard lock(mu_);
      while (!requests_.empty()) {
        auto it = requests_.begin();
        fail(it->first, it->second, 503, "shutting_down", "the router is stopping");
      }
    }
    client_.reset();
  }

  // Checks every engine and starts the threads.
  Status start() {
    CRESCENT_RETURN_IF_ERROR(cluster::check_cost_model_times(options_.config, cost_, "router: "));
    client_ = serve::HttpClient::start();
    InstanceId next_prefill = 0, next_decode = 0;
    for (const EngineEntry& entry : options_.engines) {
      auto made = make_engine(entry);
      if (!made.ok()) return made.status();
      Engine& e = engines_.emplace_back(std::move(*made));
      e.index = engines_.size() - 1;
      if (entry.role != EngineRole::kDecode) e.prefill = next_prefill++;
      if (entry.role != EngineRole::kPrefill) e.decode = next_decode++;
      // Every instance starts down; engine_up brings it up once checked.
      if (e.prefill) {
        state_.on_prefill_down(*e.prefill, 0);
        engine_of_prefill_.push_back(e.index);
      }
      if (e.decode) {
        state_.on_decode_down(*e.decode);
        engine_of_decode_.push_back(e.index);
      }
    }
    const double deadline_s = clock_.now_s() + options_.startup_timeout_s;
    for (Engine& e : engines_) CRESCENT_RETURN_IF_ERROR(check_engine(e, deadline_s));
    if (!options_.etcd_endpoint.empty()) {
      auto etcd = EtcdClient::create(options_.etcd_endpoint, std::chrono::milliseconds(2000));
      if (!etcd.ok()) return etcd.status();
      etcd_ = std::make_unique<EtcdClient>(std::move(*etcd));
      if (auto listed = etcd_->list_keys(engines_prefix()); !listed.ok()) {
        return Status::unavailable(fmt::format("etcd {}: {}", options_.etcd_endpoint, listed.status().message()));
      }
    }
    {
      std::lock_guard lock(mu_);
      apply_cost_models();
      for (Engine& e : engines_) engine_up(e);
    }
    poll_thread_ = std::thread([this] { poll_loop(); });
    kv_thread_ = std::thread([this] { kv_event_loop(); });
    if (etcd_) registry_thread_ = std::thread([this] { registry_loop(); });
    return Status::ok_status();
  }

  // The cost model of `entry`'s profile, loaded once per file (engines of one kind share it).
  Result<const perf::CostModel*> profile_cost(const EngineEntry& entry) {
    std::lock_guard lock(profiles_mu_);
    auto it = profile_costs_.find(entry.profile_path);
    if (it != profile_costs_.end()) return it->second.get();
    auto profile = perf::load_profile(entry.profile_path);
    if (!profile.ok()) {
      return Status::invalid_argument(
          fmt::format("engine '{}': profile: {}", entry.name, profile.status().message()));
    }
    auto cost = std::make_unique<perf::CostModel>(engine_cost_model(options_.config, *profile));
    // Checked up to the config's KV capacity: an engine that reports more may be given longer prompts.
    CRESCENT_RETURN_IF_ERROR(cluster::check_cost_model_times(
        options_.config, *cost, fmt::format("engine '{}': profile {}: ", entry.name, entry.profile_path)));
    return profile_costs_.emplace(entry.profile_path, std::move(cost)).first->second.get();
  }

  // Hands the Conductor each instance's cost model (its engine's profile) when the engines are not alike.
  void apply_cost_models() {
    bool any = false;
    for (const Engine& e : engines_) any |= e.cost != nullptr;
    if (!any) return;
    std::vector<const perf::CostModel*> prefill(engine_of_prefill_.size()), decode(engine_of_decode_.size());
    for (const Engine& e : engines_) {
      if (e.prefill) prefill[*e.prefill] = e.cost;
      if (e.decode) decode[*e.decode] = e.cost;
    }
    conductor_.set_instance_cost_models(std::move(prefill), std::move(decode));
  }

  // An engine of `entry`, not yet checked nor numbered.
  Result<Engine> make_engine(const EngineEntry& entry) {
    Engine e;
    e.entry = entry;
    if (!entry.profile_path.empty()) {
      auto cost = profile_cost(entry);
      if (!cost.ok()) return cost.status();
      e.cost = *cost;
    }
    auto hp = parse_host_port(entry.url, "http", fmt::format("engine '{}': url", entry.name));
    if (!hp.ok()) return hp.status();
    e.http = *hp;
    if (!entry.api_key_file.empty()) {
      auto key = read_api_key(entry.api_key_file, entry.name);
      if (!key.ok()) return key.status();
      e.api_key = *key;
    }
    return e;
  }

  conductor::Decision relay(serve::RelayedRequest request, serve::RelayCallbacks callbacks, uint64_t& id) {
    const int64_t block = block_size();
    std::vector<BlockKey> keys =
        kv::prompt_block_keys(request.prompt_token_ids, block, options_.block_key_seed);
    std::lock_guard lock(mu_);
    id = ids_.next();
    Request& r = requests_[id];
    r.request = std::move(request);
    r.callbacks = std::move(callbacks);
    r.keys = std::move(keys);
    r.request_id = fmt::format("crescent-{:016x}", id);
    r.arrived_s = clock_.now_s();
    metrics_.observe_received();
    const conductor::Decision decision = place(id, r);
    if (decision.rejected != conductor::RejectReason::kNone) requests_.erase(id);
    return decision;
  }

  void cancel(uint64_t id) {
    std::lock_guard lock(mu_);
    auto it = requests_.find(id);
    if (it == requests_.end()) return;
    close_exchange(it->second);
    unplace(it->second, clock_.now_s());
    metrics_.observe_finished({}, "abort");
    requests_.erase(it);
  }

  int64_t max_context_tokens() const {
    std::lock_guard lock(mu_);
    int64_t limit = std::numeric_limits<int64_t>::max();
    for (const Engine& e : engines_)
      if (e.max_model_len > 0) limit = std::min(limit, e.max_model_len);
    if (options_.config.serve.max_model_len_tokens > 0)
      limit = std::min(limit, options_.config.serve.max_model_len_tokens);
    return limit;
  }

  size_t requests_in_flight() const {
    std::lock_guard lock(mu_);
    return requests_.size();
  }

  std::pair<uint32_t, uint32_t> instances_up() const {
    std::lock_guard lock(mu_);
    return up_counts();
  }

  std::vector<double> take_overhead_samples_s() {
    std::lock_guard lock(mu_);
    return std::exchange(overhead_samples_, {});
  }

  std::string metrics_text() const {
    std::lock_guard lock(mu_);
    cluster::LoadGauges gauges;
    const auto [prefill_up, decode_up] = up_counts();
    gauges.prefill_instances_up = prefill_up;
    gauges.decode_instances_up = decode_up;
    kv::DecodePoolLoad pool;
    for (const Engine& e : engines_)
      if (e.decode && e.up) pool.add(decode_load(e));
    gauges.add_decode_pool(pool);
    std::string text = metrics_.scrape(gauges);
    text += engine_metrics_text();
    return text;
  }

 private:
  // ---- Placement -----------------------------------------------------------------------------------

  conductor::ConductorOptions conductor_options() const {
    conductor::ConductorOptions o = cluster::conductor_options(options_.config, placement_policy(options_),
                                                               options_.config.serve.admission, block_size());
    o.prefill_chunk_tokens = 0;  // an engine's chunking is its own: one prefill, as its profile timed it
    o.prefix_cache_in_hbm = true;  // an engine's prefix cache is in its GPUs' memory
    return o;
  }

  uint32_t count_role(bool prefill) const {
    uint32_t n = 0;
    for (const EngineEntry& e : options_.engines)
      n += prefill ? e.role != EngineRole::kDecode : e.role != EngineRole::kPrefill;
    return n;
  }
  int64_t block_size() const { return options_.engines.front().block_size_tokens; }
  bool colocated() const { return options_.engines.front().role == EngineRole::kBoth; }

  Engine* engine_of_prefill(InstanceId p) { return &engines_[engine_of_prefill_[p]]; }
  Engine* engine_of_decode(InstanceId d) { return &engines_[engine_of_decode_[d]]; }
  static size_t index_of(const Engine& e) { return e.index; }

  std::pair<uint32_t, uint32_t> up_counts() const {
    uint32_t p = 0, d = 0;
    for (const Engine& e : engines_) {
      if (!e.up) continue;
      p += e.prefill.has_value();
      d += e.decode.has_value();
    }
    return {p, d};
  }

  // A decode engine's load as the Conductor judges it: the requests the router has there (their prompts and
  // reservations), at least as many running as the engine itself reports, and at least the KV it says it
  // uses.
  kv::DecodeLoad decode_load(const Engine& e) const {
    kv::DecodeLoad load;
    load.kv_capacity_tokens = e.kv_capacity_tokens;
    load.running = e.running;
    load.incoming = e.incoming;
    if (e.scraped.requests_running) {
      load.running.requests = std::max<int64_t>(load.running.requests,
                                                static_cast<int64_t>(*e.scraped.requests_running));
    }
    if (e.scraped.kv_cache_usage) {
      load.running.kv_tokens = std::max<int64_t>(
          load.running.kv_tokens,
          static_cast<int64_t>(*e.scraped.kv_cache_usage * static_cast<double>(e.kv_capacity_tokens)));
    }
    return load;
  }

  // PlacementDriver: the router's engines report through its own counts and their /metrics.
  void report_decode_loads(conductor::ClusterState& state, double now_s) override {
    (void)now_s;
    for (const Engine& e : engines_)
      if (e.decode && e.up) state.on_decode_report(*e.decode, decode_load(e));
  }
  void expect(InstanceId, uint64_t, const conductor::RequestInfo&, double) override {}
  void submit_prefill(InstanceId, uint64_t, const conductor::RequestInfo&,
                      const engine::EngineCore::ArrangedPrefix&, InstanceId, double) override {}

  // Places request `id` and sends it to its first engine; refusals are returned (the caller answers them).
  conductor::Decision place(uint64_t id, Request& r) {
    const double now = clock_.now_s();
    conductor::RequestInfo info;
    info.input_tokens = static_cast<int64_t>(r.request.prompt_token_ids.size());
    info.block_keys = r.keys;
    info.max_output_tokens = r.request.max_tokens;
    const auto started = std::chrono::steady_clock::now();
    conductor::Decision decision = cluster::place(conductor_, state_, info, id, now, *this);
    metrics_.observe_decision(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    if (decision.rejected != conductor::RejectReason::kNone) {
      metrics_.observe_rejection(conductor::to_string(decision.rejected));
      return decision;
    }
    Engine* p = engine_of_prefill(decision.prefill_instance);
    // A colocated engine decodes what it prefilled.
    Engine* d = colocated() ? p : engine_of_decode(decision.decode_instance);
    if (colocated()) decision.decode_instance = *p->decode;
    r.decision = decision;
    r.prefill_engine = index_of(*p);
    r.decode_engine = index_of(*d);
    r.placed_s = now;
    r.prefill_done = false;
    r.decoding = false;
    ++r.attempts;
    ++p->prefills_pending;
    d->incoming.requests += 1;
    d->incoming.context_tokens += info.input_tokens;
    d->incoming.kv_tokens += info.input_tokens + info.max_output_tokens;
    send(id, r, /*prefill_step=*/!colocated(), nullptr);
    return decision;
  }

  // Undoes what placing `r` counted that has not run its course: its prefill (in the Conductor's queue and
  // the engine's pending count) and its place on its decode engine.
  void unplace(Request& r, double now) {
    Engine& p = engines_[r.prefill_engine];
    Engine& d = engines_[r.decode_engine];
    if (!r.prefill_done) {
      if (p.up && p.prefill) {
        state_.on_request_dropped(*p.prefill, r.keys, std::max(0.0, r.placed_s + r.decision.ttft_s - now), now);
      }
      prefill_ended(p, now);
    }
    kv::DecodeGroup& group = r.decoding ? d.running : d.incoming;
    group.requests -= 1;
    group.context_tokens -= static_cast<int64_t>(r.request.prompt_token_ids.size());
    group.kv_tokens -= static_cast<int64_t>(r.request.prompt_token_ids.size()) + r.request.max_tokens;
    r.decoding = false;
  }

  // One fewer prefill pending on `p`; with none left it is idle now.
  void prefill_ended(Engine& p, double now) {
    p.prefills_pending = std::max<int64_t>(0, p.prefills_pending - 1);
    if (p.prefills_pending == 0 && p.prefill && p.up) state_.on_prefill_idle(*p.prefill, now);
  }

  // `r`'s prefill ended at `now` (its first token, or its prefill answer): the engine's cache has its
  // blocks (tracked approximately: the router's LRU says so), the queue estimate is corrected, and it
  // decodes from now on.
  void prefill_finished(Request& r, double now) {
    if (r.prefill_done) return;
    r.prefill_done = true;
    // Counted once a prefill ran, as the engine counts it: a request placed again after its engine failed
    // counts once, with the prefix of where it ran.
    metrics_.observe_prefix(static_cast<int64_t>(r.request.prompt_token_ids.size()),
                            r.decision.local_prefix_tokens, r.decision.fetched_prefix_tokens);
    Engine& p = engines_[r.prefill_engine];
    if (p.up && p.prefill) {
      if (p.cache && p.cache->tracking() == CacheTracking::kApproximate) {
        changes_.clear();
        p.cache->on_prefill_done(r.keys, changes_);
        state_.on_kv_event(*p.prefill, changes_.stored, changes_.removed, now);
        state_.on_prefill_done(*p.prefill, r.keys, now);
      } else {
        state_.on_prefill_computed(*p.prefill, r.keys, now);
        unsettled_.push_back({now + kKvEventLagS, r.prefill_engine, p.kv_generation, r.keys});
      }
    }
    prefill_ended(p, now);
    Engine& d = engines_[r.decode_engine];
    const auto input = static_cast<int64_t>(r.request.prompt_token_ids.size());
    d.incoming.requests -= 1;
    d.incoming.context_tokens -= input;
    d.incoming.kv_tokens -= input + r.request.max_tokens;
    d.running.requests += 1;
    d.running.context_tokens += input;
    d.running.kv_tokens += input + r.request.max_tokens;
    r.decoding = true;
  }

  // ---- Exchanges with engines ------------------------------------------------------------------------

  // Opens `r`'s next exchange: the prefill step of a disaggregated request (at its prefill engine), or the
  // answer (at its decode engine, the prefill engine when colocated).
  void send(uint64_t id, Request& r, bool prefill_step, const json* kv_transfer_params) {
    Engine& e = engines_[prefill_step ? r.prefill_engine : r.decode_engine];
    serve::HttpClientRequest http;
    http.method = "POST";
    http.host = e.http.host;
    http.port = e.http.port;
    http.target = r.request.endpoint == serve::Endpoint::kCompletions ? "/v1/completions" : "/v1/chat/completions";
    http.headers.emplace_back("X-Request-Id", r.request_id);
    if (!e.api_key.empty()) http.headers.emplace_back("Authorization", "Bearer " + e.api_key);
    http.body = engine_body(r.request, e.entry.token_ids, prefill_step, kv_transfer_params);
    http.connect_timeout_s = options_.connect_timeout_s;
    http.response_timeout_s = options_.engine_idle_timeout_s;
    http.idle_timeout_s = options_.engine_idle_timeout_s;
    r.prefill_step = prefill_step;
    r.status = 0;
    r.content_type.clear();
    r.buffer.clear();
    r.exchange_engine = index_of(e);
    r.sse = std::make_unique<serve::SseParser>([this](std::string_view data) {
      if (data != "[DONE]") ++fed_events_;
    });
    ++e.requests_sent;
    ++e.in_flight;
    serve::HttpClientCallbacks cb;
    // The exchange's own number, known once send() returns: a callback of an exchange that is no longer
    // the request's (it was cancelled and the request moved on) finds it stale.
    auto exchange = std::make_shared<std::atomic<uint64_t>>(0);
    cb.on_head = [this, id, exchange](int status, const std::vector<std::pair<std::string, std::string>>& headers) {
      std::lock_guard lock(mu_);
      Request* r = current(id, *exchange);
      if (r == nullptr) return false;
      r->status = status;
      r->content_type = header_value(headers, "content-type");
      if (r->content_type.empty()) r->content_type = "application/json";
      return true;
    };
    cb.on_body = [this, id, exchange](std::string_view piece) {
      std::lock_guard lock(mu_);
      Request* r = current(id, *exchange);
      if (r == nullptr) return false;
      return on_body(*r, piece);
    };
    cb.on_end = [this, id, exchange](const Status& status) {
      std::lock_guard lock(mu_);
      Request* r = current(id, *exchange);
      if (r == nullptr) return;
      on_end(id, *r, status);
    };
    // The callbacks run on the client's thread, which waits for mu_ (held here) before any of them reads
    // `exchange`: it is set before they can look.
    r.exchange = client_->send(std::move(http), std::move(cb));
    exchange->store(r.exchange);
    if (r.attempts == 1 && (prefill_step || colocated())) {
      // The request's first engine request is on its way: what routing it cost.
      const double overhead_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - r.request.received).count();
      metrics_.observe_routing_overhead(overhead_s);
      if (overhead_samples_.size() < kMaxOverheadSamples) overhead_samples_.push_back(overhead_s);
    }
  }

  // Closes `r`'s open exchange, if any (its engine sees the connection close and aborts the request); its
  // callbacks then find it stale.
  void close_exchange(Request& r) {
    if (r.exchange == 0) return;
    client_->cancel(r.exchange);
    r.exchange = 0;
    --engines_[r.exchange_engine].in_flight;
  }

  // The request `id` whose open exchange is `exchange`, or nullptr (it ended, or moved on).
  Request* current(uint64_t id, uint64_t exchange) {
    auto it = requests_.find(id);
    if (it == requests_.end() || it->second.exchange != exchange || exchange == 0) return nullptr;
    return &it->second;
  }

  // A piece of an engine's answer. A streamed 200 answer goes to the client as it comes (its first event
  // is the first token); the rest is held whole. False aborts the exchange.
  bool on_body(Request& r, std::string_view piece) {
    const bool relay_now = !r.prefill_step && r.status == 200 && r.request.stream &&
                           r.content_type.starts_with("text/event-stream");
    if (!relay_now) {
      if (r.buffer.size() + piece.size() > kMaxAnswerBytes) return false;
      r.buffer.append(piece);
      return true;
    }
    const double now = clock_.now_s();
    if (!r.head_sent) {
      r.head_sent = true;
      r.callbacks.on_head(200, r.content_type);
    }
    r.callbacks.on_body(piece);
    fed_events_ = 0;
    const Status parsed = r.sse->feed(piece);
    for (int64_t i = 0; i < fed_events_; ++i) {
      if (r.events == 0) {
        r.first_token_s = now;
        prefill_finished(r, now);
      } else {
        metrics_.observe_token_gap(now - r.last_token_s);
      }
      r.last_token_s = now;
      ++r.events;
    }
    return parsed.ok();
  }

  // An exchange ended: the next step, the answer relayed, or the engine's failure handled.
  void on_end(uint64_t id, Request& r, const Status& status) {
    Engine& e = engines_[r.exchange_engine];
    --e.in_flight;
    r.exchange = 0;
    const double now = clock_.now_s();
    if (!status.ok()) {
      ++e.failures;
      if (status.code() == StatusCode::kUnavailable && r.status == 0) {
        engine_down(e, fmt::format("a request to it failed: {}", status.message()));
      }
      return engine_failed(id, r, fmt::format("engine '{}' failed the request: {}", e.entry.name, status.message()));
    }
    if (r.status != 200) {
      // The engine's own answer (a 400 for a field it refuses, a 5xx of its own): the client gets it as is.
      relay_whole(r);
      return finish(id, r, now, "abort");
    }
    if (r.prefill_step) {
      json answer = json::parse(r.buffer, nullptr, false);
      const json* params = nullptr;
      if (answer.is_object()) {
        auto it = answer.find("kv_transfer_params");
        if (it != answer.end() && it->is_object()) params = &*it;
      }
      if (params == nullptr) {
        ++e.failures;
        return fail(id, r, 502, "prefill_failed",
                    fmt::format("prefill engine '{}' answered without kv_transfer_params (is it started with a "
                                "KV connector, as kv_producer?)",
                                e.entry.name));
      }
      prefill_finished(r, now);
      if (!engines_[r.decode_engine].up) {
        return engine_failed(id, r, fmt::format("decode engine '{}' went down", engines_[r.decode_engine].entry.name));
      }
      const json kv_params = *params;
      send(id, r, /*prefill_step=*/false, &kv_params);
      return;
    }
    // A whole answer: its prefill ended some time before, when predicted at the latest (no later first
    // token was seen to correct the estimate).
    if (!r.prefill_done) prefill_finished(r, std::min(now, r.placed_s + r.decision.ttft_s));
    if (!r.head_sent) {
      relay_whole(r);
    } else {
      r.callbacks.on_end();
    }
    finish(id, r, now, "length");
  }

  // Relays a whole answer held in r.buffer.
  void relay_whole(Request& r) {
    r.head_sent = true;
    r.callbacks.on_head(r.status, r.content_type);
    r.callbacks.on_body(r.buffer);
    r.callbacks.on_end();
  }

  // `r`'s engine failed it (refused, reset, timed out, or went down): placed again elsewhere while the client
  // has nothing of the answer and attempts remain, else failed.
  void engine_failed(uint64_t id, Request& r, const std::string& why) {
    const double now = clock_.now_s();
    if (stopping_ || r.head_sent || r.attempts >= options_.max_attempts) {
      return fail(id, r, 502, "engine_failed", why);
    }
    unplace(r, now);
    const conductor::Decision decision = place(id, r);
    if (decision.rejected == conductor::RejectReason::kNone) return;
    const bool none = decision.rejected == conductor::RejectReason::kNoInstance;
    r.callbacks.on_error(none ? 503 : 429, std::string(conductor::to_string(decision.rejected)),
                         fmt::format("{}; no other engine could take it ({})", why,
                                     conductor::to_string(decision.rejected)),
                         false);
    metrics_.observe_failure("engine_failed");
    requests_.erase(id);
  }

  void fail(uint64_t id, Request& r, int http_status, const std::string& code, const std::string& message) {
    close_exchange(r);
    unplace(r, clock_.now_s());
    metrics_.observe_failure(code);
    metrics_.observe_finished({}, "abort");
    r.callbacks.on_error(http_status, code, message, r.head_sent);
    requests_.erase(id);
  }

  void finish(uint64_t id, Request& r, double now, std::string_view reason) {
    unplace(r, now);
    if (reason != "abort") {
      cluster::FinishedRequest f;
      f.prompt_tokens = static_cast<int64_t>(r.request.prompt_token_ids.size());
      f.generation_tokens = r.events > 0 ? r.events : r.request.max_tokens;
      f.ttft_s = (r.first_token_s > 0 ? r.first_token_s : now) - r.arrived_s;
      f.e2e_s = now - r.arrived_s;
      f.queue_s = r.placed_s - r.arrived_s;
      f.decode_s = r.first_token_s > 0 ? now - r.first_token_s : 0;
      metrics_.observe_finished(f, reason);
      conductor_.observe_output(f.generation_tokens);
    } else {
      metrics_.observe_finished({}, "abort");
    }
    requests_.erase(id);
  }

  // ---- Engines coming and going --------------------------------------------------------------------

  // Blocking GET of `target` at `e`, for checks and polls.
  Result<serve::HttpClientResponse> get(const Engine& e, const char* target, double timeout_s) {
    return get(EngineAddress{e.http, e.api_key}, target, timeout_s);
  }
  // Where an engine is asked, copied out of its Engine: the registry may replace the Engine (under mu_) while
  // the poll loop waits on an answer (without it).
  struct EngineAddress {
    HostPort http;
    std::string api_key;
  };
  static serve::HttpClientRequest get_request(const EngineAddress& e, const char* target, double timeout_s) {
    serve::HttpClientRequest http;
    http.method = "GET";
    http.host = e.http.host;
    http.port = e.http.port;
    http.target = target;
    if (!e.api_key.empty()) http.headers.emplace_back("Authorization", "Bearer " + e.api_key);
    http.connect_timeout_s = timeout_s;
    http.response_timeout_s = timeout_s;
    http.idle_timeout_s = timeout_s;
    return http;
  }
  Result<serve::HttpClientResponse> get(const EngineAddress& e, const char* target, double timeout_s) {
    std::vector<serve::HttpClientRequest> one;
    one.push_back(get_request(e, target, timeout_s));
    return std::move(fetch_all(std::move(one)).front());
  }
  // The GETs of `asks`, all at once: each answer, an answer other than 200 being kUnavailable naming it.
  std::vector<Result<serve::HttpClientResponse>> fetch_all(std::vector<serve::HttpClientRequest> asks) {
    std::vector<std::string> named;
    for (const auto& a : asks) named.push_back(fmt::format("GET http://{}:{}{}", a.host, a.port, a.target));
    auto answers = client_->fetch_all(std::move(asks));
    for (size_t i = 0; i < answers.size(); ++i) {
      if (answers[i].ok() && answers[i]->status != 200) {
        answers[i] = Status::unavailable(fmt::format("{} answered {}: {}", named[i], answers[i]->status,
                                                     answers[i]->body.substr(0, 200)));
      }
    }
    return answers;
  }

  // Whether the engine whose /v1/models answered `body` serves `entry`'s model: its max_model_len (0: not
  // said), or an error naming the entry and what it serves instead.
  static Result<int64_t> serves_model(const EngineEntry& entry, const std::string& body) {
    json list = json::parse(body, nullptr, false);
    std::vector<std::string> served;
    int64_t max_model_len = 0;
    if (list.is_object() && list.contains("data") && list["data"].is_array()) {
      for (const json& m : list["data"]) {
        if (!m.is_object() || !m.contains("id") || !m["id"].is_string()) continue;
        served.push_back(m["id"].get<std::string>());
        if (served.back() == entry.model && m.contains("max_model_len") && m["max_model_len"].is_number_integer())
          max_model_len = m["max_model_len"].get<int64_t>();
      }
    }
    if (std::find(served.begin(), served.end(), entry.model) == served.end()) {
      return Status::invalid_argument(fmt::format("engine '{}' ({}) serves {}, not the entry's model '{}'",
                                                  entry.name, entry.url,
                                                  served.empty() ? "no model it names"
                                                                 : fmt::format("'{}'", fmt::join(served, "', '")),
                                                  entry.model));
    }
    return max_model_len;
  }

  // Whether the engine whose /metrics say `scraped` keeps blocks of `entry`'s size (unknown: yes).
  static Status keeps_block_size(const EngineEntry& entry, const EngineMetrics& scraped) {
    if (scraped.block_size_tokens && *scraped.block_size_tokens != entry.block_size_tokens) {
      return Status::invalid_argument(fmt::format("engine '{}' ({}): block_size {} in its entry, but the engine's "
                                                  "/metrics says its blocks hold {} tokens",
                                                  entry.name, entry.url, entry.block_size_tokens,
                                                  *scraped.block_size_tokens));
    }
    return Status::ok_status();
  }

  // What an engine must be to serve: reachable (retried until `deadline_s`), serving the entry's model,
  // keeping blocks of the entry's size, with a known cache size when it publishes no events.
  Status check_engine(Engine& e, double deadline_s) {
    const std::string named = fmt::format("engine '{}' ({})", e.entry.name, e.entry.url);
    Result<serve::HttpClientResponse> models = Status::unavailable("not asked");
    for (;;) {
      models = get(e, "/v1/models", kHealthTimeoutS);
      if (models.ok() || clock_.now_s() >= deadline_s) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    if (!models.ok()) {
      return Status::unavailable(fmt::format("{} is unreachable: {}", named, models.status().message()));
    }
    auto max_model_len = serves_model(e.entry, models->body);
    if (!max_model_len.ok()) return max_model_len.status();
    e.max_model_len = *max_model_len;
    auto metrics = get(e, "/metrics", kHealthTimeoutS);
    if (metrics.ok()) e.scraped = parse_engine_metrics(metrics->body);
    CRESCENT_RETURN_IF_ERROR(keeps_block_size(e.entry, e.scraped));
    const int64_t reported_blocks = e.scraped.gpu_blocks.value_or(0);
    e.kv_capacity_tokens = e.entry.kv_capacity_tokens > 0 ? e.entry.kv_capacity_tokens
                           : reported_blocks > 0         ? reported_blocks * e.entry.block_size_tokens
                                                         : cluster::decode_kv_capacity_tokens(options_.config);
    if (e.entry.role != EngineRole::kDecode) {  // it prefills: its cache is tracked
      int64_t approximate_blocks = 0;
      if (e.entry.kv_events.empty()) {
        approximate_blocks = e.entry.cache_blocks > 0 ? e.entry.cache_blocks : reported_blocks;
        if (approximate_blocks <= 0) {
          return Status::invalid_argument(fmt::format(
              "{} publishes no KV events and its /metrics says no cache size (vllm:cache_config_info "
              "num_gpu_blocks): give its entry 'cache_blocks' or 'kv_events'",
              named));
        }
      }
      e.cache = std::make_unique<EngineCache>(options_.block_key_seed, e.entry.block_size_tokens, approximate_blocks);
      e.cache_blocks = e.entry.cache_blocks > 0 ? e.entry.cache_blocks : reported_blocks;
    }
    return Status::ok_status();
  }

  void engine_up(Engine& e) {
    if (e.up) return;
    e.up = true;
    e.health_failures = 0;
    ++e.kv_generation;
    if (e.prefill) {
      // Room made now, not while requests wait for placements: the index fills to the cache's size without
      // growing a table on the request path (docs/benchmarks.md "Router mode"). Once per instance: an engine
      // coming back (or registered again) asks for the room it has.
      state_.reserve_prefix_cache_blocks(*e.prefill, std::min(e.cache_blocks, kMaxReservedCacheBlocks));
    }
    if (e.prefill) state_.on_prefill_up(*e.prefill);
    if (e.decode) state_.on_decode_up(*e.decode);
    if (options_.log_engines) {
      fmt::print(stderr, "router: engine {} up ({}, {}, cache from {})\n", e.entry.name, to_string(e.entry.role),
                 e.entry.url, e.cache && e.cache->tracking() == CacheTracking::kApproximate ? "routing" : "KV events");
    }
  }

  // `e` leaves the view: nothing more is placed there and its cache is forgotten. Requests whose exchange is
  // open there go on (an engine taken out of service finishes what it has); one that fails later is failed
  // over as any other. False when it was not up.
  bool engine_drain(Engine& e, const std::string& why) {
    if (!e.up) return false;
    e.up = false;
    const double now = clock_.now_s();
    if (e.prefill) state_.on_prefill_down(*e.prefill, now);
    if (e.decode) state_.on_decode_down(*e.decode);
    if (e.cache) e.cache->clear();
    if (options_.log_engines) fmt::print(stderr, "router: engine {} down: {}\n", e.entry.name, why);
    return true;
  }

  // `e` leaves the view as engine_drain, and requests whose exchange is open there are failed over (placed
  // elsewhere when the client has nothing yet): it failed.
  void engine_down(Engine& e, const std::string& why) {
    if (!engine_drain(e, why)) return;
    const size_t index = index_of(e);
    std::vector<uint64_t> open;
    for (auto& [id, r] : requests_)
      if (r.exchange != 0 && r.exchange_engine == index) open.push_back(id);
    for (uint64_t id : open) {
      Request& r = requests_.at(id);
      close_exchange(r);
      engine_failed(id, r, fmt::format("engine '{}' went down: {}", e.entry.name, why));
    }
  }

  // Settles the placements whose wait for their engine's KV events is over.
  void settle_placements() {
    std::lock_guard lock(mu_);
    const double now = clock_.now_s();
    while (!unsettled_.empty() && unsettled_.front().due_s <= now) {
      const Unsettled& u = unsettled_.front();
      const Engine& e = engines_[u.engine];
      if (e.up && e.prefill && e.kv_generation == u.kv_generation) state_.on_placement_settled(*e.prefill, u.keys);
      unsettled_.pop_front();
    }
  }

  // Every poll_interval_s, every engine at once (one that hangs delays no other's checks): its /health, then
  // its /metrics. Two failed checks in a row (or one refused connection) take it down; a check that passes
  // brings it back.
  void poll_loop() {
    struct Probe {
      Engine* engine = nullptr;
      EngineAddress address;
      EngineEntry entry;
      bool was_up = false;
      Result<serve::HttpClientResponse> health = Status::unavailable("not asked");
      Result<serve::HttpClientResponse> metrics = Status::unavailable("unhealthy");
      Status same_engine;
    };
    std::vector<Probe> probes;
    while (!stopping_) {
      probes.clear();
      {
        std::lock_guard lock(mu_);
        for (Engine& e : engines_) {
          if (e.deregistered) continue;
          Probe& p = probes.emplace_back();
          p.engine = &e;
          p.address = {e.http, e.api_key};
          p.entry = e.entry;
          p.was_up = e.up;
        }
      }
      std::vector<serve::HttpClientRequest> asks;
      for (const Probe& p : probes) asks.push_back(get_request(p.address, "/health", kHealthTimeoutS));
      auto health = fetch_all(std::move(asks));
      // The healthy ones' /metrics; and an engine coming back may be another one at the same address
      // (restarted with another model or block size): its model is checked again before anything is placed
      // there.
      std::vector<size_t> asked_metrics, asked_models;
      for (size_t i = 0; i < probes.size(); ++i) {
        probes[i].health = std::move(health[i]);
        if (!probes[i].health.ok()) continue;
        asks.push_back(get_request(probes[i].address, "/metrics", kHealthTimeoutS));
        asked_metrics.push_back(i);
        if (probes[i].was_up) continue;
        asks.push_back(get_request(probes[i].address, "/v1/models", kHealthTimeoutS));
        asked_models.push_back(i);
      }
      auto answers = fetch_all(std::move(asks));
      size_t next = 0;
      for (size_t i = 0; i < probes.size(); ++i) {
        Probe& p = probes[i];
        if (!p.health.ok()) continue;
        p.metrics = std::move(answers[next++]);
        if (p.was_up) continue;
        Result<serve::HttpClientResponse>& models = answers[next++];
        p.same_engine = models.ok() ? serves_model(p.entry, models->body).status() : models.status();
        if (p.same_engine.ok() && p.metrics.ok()) {
          p.same_engine = keeps_block_size(p.entry, parse_engine_metrics(p.metrics->body));
        }
      }
      {
        std::lock_guard lock(mu_);
        for (Probe& p : probes) {
          Engine& e = *p.engine;
          if (e.deregistered || e.entry.name != p.entry.name || e.http.host != p.address.http.host ||
              e.http.port != p.address.http.port) {
            continue;  // replaced while it was asked: the next round asks the new one
          }
          if (p.health.ok() && !p.same_engine.ok()) {
            if (options_.log_engines && e.refused_comeback != p.same_engine.message()) {
              fmt::print(stderr, "router: engine {} answers again but stays down: {}\n", e.entry.name,
                         p.same_engine.message());
            }
            e.refused_comeback = p.same_engine.message();
          } else if (p.health.ok()) {
            if (p.metrics.ok()) e.scraped = parse_engine_metrics(p.metrics->body);
            e.health_failures = 0;
            e.refused_comeback.clear();
            engine_up(e);
          } else if (++e.health_failures >= 2 || p.health.status().code() == StatusCode::kUnavailable) {
            engine_down(e, fmt::format("/health: {}", p.health.status().message()));
          }
        }
      }
      const double until = clock_.now_s() + options_.poll_interval_s;
      while (!stopping_ && clock_.now_s() < until) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }


  // One subscriber per engine that publishes KV events and prefills, while it is up; a fresh one each time
  // it comes up (it replays from the start of what the engine still holds).
  void kv_event_loop() {
    struct Subscription {
      uint64_t generation = 0;
      std::unique_ptr<serve::KvEventSubscriber> subscriber;
      uint64_t replayed = 0;  // what it had replayed at the last look
    };
    std::vector<Subscription> subs;
    while (!stopping_) {
      bool any = false;
      subs.resize(engine_count());
      for (size_t i = 0; i < subs.size(); ++i) {
        std::string endpoint, replay;
        uint64_t generation = 0;
        bool listen = false;
        {
          std::lock_guard lock(mu_);
          const Engine& e = engines_[i];
          listen = e.up && e.prefill && !e.entry.kv_events.empty();
          generation = e.kv_generation;
          endpoint = e.entry.kv_events;
          replay = e.entry.kv_replay;
        }
        Subscription& s = subs[i];
        if (!listen) {
          s.subscriber.reset();
          continue;
        }
        if (!s.subscriber || s.generation != generation) {
          auto sub = serve::KvEventSubscriber::connect(endpoint, replay);
          if (!sub.ok()) continue;
          s = {generation, std::move(*sub), 0};
        }
        any = true;
        s.subscriber->poll(
            std::chrono::milliseconds(5),
            [&](uint64_t, const serve::KvEventBatch& batch) {
              std::lock_guard lock(mu_);
              Engine& e = engines_[i];
              if (!e.up || e.kv_generation != generation) return;
              ++e.kv_batches;
              const uint64_t wrong_size = e.cache->problems().wrong_block_size;
              changes_.clear();
              e.cache->apply(batch, changes_);
              if (e.cache->problems().wrong_block_size > wrong_size && wrong_size == 0 && options_.log_engines) {
                fmt::print(stderr, "router: engine {} publishes blocks of another size than its entry's {}: "
                                   "they are not indexed\n", e.entry.name, e.entry.block_size_tokens);
              }
              const double now = clock_.now_s();
              if (changes_.cleared) state_.on_kv_cleared(*e.prefill);
              state_.on_kv_event(*e.prefill, changes_.stored, changes_.removed, now);
            },
            [&](uint64_t first_missing, uint64_t next) {
              std::lock_guard lock(mu_);
              Engine& e = engines_[i];
              if (!e.up || e.kv_generation != generation) return;
              // The batches in between are lost: what the index says of this engine may be stale.
              ++e.kv_gaps_dropped;
              e.cache->clear();
              state_.on_kv_cleared(*e.prefill);
              if (options_.log_engines && first_missing > 0) {
                fmt::print(stderr, "router: engine {}: KV event batches {}..{} lost and not replayable; its "
                                   "index starts afresh\n", e.entry.name, first_missing, next - 1);
              }
            });
        if (const uint64_t replayed = s.subscriber->replayed(); replayed != s.replayed) {
          std::lock_guard lock(mu_);
          engines_[i].kv_batches_replayed += replayed - s.replayed;
          s.replayed = replayed;
        }
      }
      settle_placements();
      if (!any) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  size_t engine_count() const {
    std::lock_guard lock(mu_);
    return engines_.size();
  }

  std::string engines_prefix() const { return options_.etcd_prefix + "/engines/"; }

  // Every 0.5 s: the engines registered in etcd under PREFIX/engines/NAME (the value an entry as in an
  // engines file). A new key (or a new put of one) is read, checked as the engines at start are, and its
  // engine joins; a key that went takes its engine down for good (until put again). An entry that cannot
  // join is logged once per put, naming its key.
  void registry_loop() {
    const std::string prefix = engines_prefix();
    std::unordered_map<std::string, int64_t> refused;  // key -> the put that was refused
    while (!stopping_) {
      auto listed = etcd_->list(prefix);
      if (listed.ok()) {
        std::vector<std::pair<std::string, EtcdKeyValue>> fresh;
        {
          std::lock_guard lock(mu_);
          for (Engine& e : engines_) {
            if (!e.from_etcd || e.deregistered) continue;
            const std::string key = prefix + e.entry.name;
            const bool present = std::any_of(listed->begin(), listed->end(),
                                             [&](const auto& kv) { return kv.first == key; });
            if (!present) {
              e.deregistered = true;
              engine_drain(e, "its etcd key was deleted");
            }
          }
          for (const auto& [key, kv] : *listed) {
            const Engine* known = nullptr;
            for (const Engine& e : engines_)
              if (e.from_etcd && prefix + e.entry.name == key) known = &e;
            if (known != nullptr && !known->deregistered && known->etcd_revision == kv.mod_revision) continue;
            if (auto r = refused.find(key); r != refused.end() && r->second == kv.mod_revision) continue;
            fresh.emplace_back(key, kv);
          }
        }
        for (const auto& [key, kv] : fresh) {
          if (Status joined = join_from_etcd(key, kv.mod_revision); !joined.ok()) {
            refused[key] = kv.mod_revision;
            if (options_.log_engines) fmt::print(stderr, "router: {}\n", joined.message());
          } else {
            refused.erase(key);
          }
        }
      }
      for (int i = 0; i < 25 && !stopping_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // Reads etcd key `key` (at put `revision`), checks its entry as the engines at start are checked and against
  // them (one block size, one model, the same kind of cluster), and makes it an engine: a new one, or the one
  // of that name coming back.
  Status join_from_etcd(const std::string& key, int64_t revision) {
    const std::string where = fmt::format("etcd key {}", key);
    auto value = etcd_->get(key);
    if (!value.ok()) return value.status();
    if (!value->has_value()) return Status::ok_status();  // deleted since it was listed
    const nlohmann::json j = nlohmann::json::parse((*value)->value, nullptr, false);
    auto entry = engine_from_json(j, where);
    if (!entry.ok()) return entry.status();
    if (key != engines_prefix() + entry->name) {
      return Status::invalid_argument(
          fmt::format("{}: its entry is named '{}', not the key's last part", where, entry->name));
    }
    {
      std::lock_guard lock(mu_);
      std::vector<EngineEntry> all;
      for (const Engine& e : engines_)
        if (e.entry.name != entry->name) all.push_back(e.entry);
      all.push_back(*entry);
      for (const Engine& e : engines_) {
        if (e.entry.name != entry->name) continue;
        if (!e.from_etcd) {
          return Status::invalid_argument(
              fmt::format("{}: engine '{}' is named by the engines file already", where, entry->name));
        }
        if (e.entry.role != entry->role) {
          return Status::invalid_argument(fmt::format(
              "{}: engine '{}' was registered as {}, now as {}: register a new role under a new name", where,
              entry->name, to_string(e.entry.role), to_string(entry->role)));
        }
      }
      CRESCENT_RETURN_IF_ERROR(check_engines(all, where));
    }
    auto made = make_engine(*entry);
    if (!made.ok()) return made.status();
    CRESCENT_RETURN_IF_ERROR(check_engine(*made, clock_.now_s() + kHealthTimeoutS));
    std::lock_guard lock(mu_);
    Engine* slot = nullptr;
    for (Engine& e : engines_)
      if (e.from_etcd && e.entry.name == entry->name) slot = &e;
    if (slot != nullptr) {
      // The same name again (a restart, or a changed entry): its slot, its instance ids, a fresh start.
      engine_down(*slot, "its etcd entry was put again");
      made->index = slot->index;
      made->prefill = slot->prefill;
      made->decode = slot->decode;
      made->kv_generation = slot->kv_generation;
      made->requests_sent = slot->requests_sent;
      made->failures = slot->failures;
      *slot = std::move(*made);
    } else {
      slot = &engines_.emplace_back(std::move(*made));
      slot->index = engines_.size() - 1;
    }
    if (slot->entry.role != EngineRole::kDecode && !slot->prefill) {
      slot->prefill = state_.add_prefill_instance();
      engine_of_prefill_.push_back(slot->index);
    }
    if (slot->entry.role != EngineRole::kPrefill && !slot->decode) {
      slot->decode = state_.add_decode_instance(slot->kv_capacity_tokens);
      engine_of_decode_.push_back(slot->index);
    }
    slot->from_etcd = true;
    slot->deregistered = false;
    slot->etcd_revision = revision;
    apply_cost_models();
    engine_up(*slot);
    return Status::ok_status();
  }

  // Per-engine lines for /metrics (what vLLM's names cannot say): up, how its cache is known, its cached
  // blocks, its requests, its KV events.
  std::string engine_metrics_text() const {
    std::string out;
    const auto family = [&](const char* name, const char* type, const char* help) {
      out += fmt::format("# HELP {} {}\n# TYPE {} {}\n", name, help, name, type);
    };
    family("crescent_engine_up", "gauge", "1 while the router places requests on the engine");
    for (const Engine& e : engines_)
      out += fmt::format("crescent_engine_up{{engine=\"{}\",role=\"{}\"}} {}\n", e.entry.name, to_string(e.entry.role), e.up ? 1 : 0);
    family("crescent_engine_cache_tracking", "gauge",
           "How the router knows the engine's prefix cache: from its KV events, or approximately from what it routed there");
    for (const Engine& e : engines_) {
      if (!e.cache) continue;
      const bool events = e.cache->tracking() == CacheTracking::kEvents;
      out += fmt::format("crescent_engine_cache_tracking{{engine=\"{}\",mode=\"events\"}} {}\n", e.entry.name, events ? 1 : 0);
      out += fmt::format("crescent_engine_cache_tracking{{engine=\"{}\",mode=\"approximate\"}} {}\n", e.entry.name, events ? 0 : 1);
    }
    family("crescent_engine_cached_blocks", "gauge", "Blocks the router knows the engine caches");
    for (const Engine& e : engines_)
      if (e.cache) out += fmt::format("crescent_engine_cached_blocks{{engine=\"{}\"}} {}\n", e.entry.name, e.cache->blocks());
    family("crescent_engine_requests_in_flight", "gauge", "Exchanges open with the engine");
    for (const Engine& e : engines_)
      out += fmt::format("crescent_engine_requests_in_flight{{engine=\"{}\"}} {}\n", e.entry.name, e.in_flight);
    family("crescent_engine_requests_sent_total", "counter", "Exchanges opened with the engine");
    for (const Engine& e : engines_)
      out += fmt::format("crescent_engine_requests_sent_total{{engine=\"{}\"}} {}\n", e.entry.name, e.requests_sent);
    family("crescent_engine_failures_total", "counter", "Exchanges the engine failed (refused, reset, timed out, malformed)");
    for (const Engine& e : engines_)
      out += fmt::format("crescent_engine_failures_total{{engine=\"{}\"}} {}\n", e.entry.name, e.failures);
    family("crescent_engine_kv_event_batches_total", "counter", "KV event batches applied, by how they came");
    for (const Engine& e : engines_) {
      if (e.entry.kv_events.empty()) continue;
      out += fmt::format("crescent_engine_kv_event_batches_total{{engine=\"{}\",via=\"pub\"}} {}\n", e.entry.name,
                         e.kv_batches - std::min(e.kv_batches, e.kv_batches_replayed));
      out += fmt::format("crescent_engine_kv_event_batches_total{{engine=\"{}\",via=\"replay\"}} {}\n", e.entry.name,
                         e.kv_batches_replayed);
    }
    family("crescent_engine_index_dropped_total", "counter",
           "Times the engine's index was dropped: its KV events had a gap replay could not fill");
    for (const Engine& e : engines_)
      if (!e.entry.kv_events.empty())
        out += fmt::format("crescent_engine_index_dropped_total{{engine=\"{}\"}} {}\n", e.entry.name, e.kv_gaps_dropped);
    family("crescent_engine_kv_event_problems_total", "counter", "Stored blocks of the engine's events the router could not index, by why");
    for (const Engine& e : engines_) {
      if (!e.cache || e.entry.kv_events.empty()) continue;
      const EventProblems& p = e.cache->problems();
      out += fmt::format("crescent_engine_kv_event_problems_total{{engine=\"{}\",problem=\"unknown_parent\"}} {}\n", e.entry.name, p.unknown_parent_blocks);
      out += fmt::format("crescent_engine_kv_event_problems_total{{engine=\"{}\",problem=\"wrong_block_size\"}} {}\n", e.entry.name, p.wrong_block_size);
      out += fmt::format("crescent_engine_kv_event_problems_total{{engine=\"{}\",problem=\"wrong_token_count\"}} {}\n", e.entry.name, p.wrong_token_count);
    }
    return out;
  }

  const RouterOptions options_;
  const perf::CostModel cost_;
  std::unique_ptr<EtcdClient> etcd_;  // with options_.etcd_endpoint
  std::mutex profiles_mu_;            // profile_costs_ (loaded by the registry thread too)
  std::map<std::string, std::unique_ptr<perf::CostModel>> profile_costs_;  // by profile path
  mutable std::mutex mu_;  // everything below
  conductor::Conductor conductor_;
  conductor::ClusterState state_;
  mutable cluster::ServeMetrics metrics_;
  std::deque<Engine> engines_;  // only grows (engines registered in etcd): references stay valid
  std::vector<size_t> engine_of_prefill_, engine_of_decode_;  // by InstanceId: the engine's index
  std::unordered_map<uint64_t, Request> requests_;
  UnguessableIds ids_;
  std::vector<double> overhead_samples_;  // seconds, for take_overhead_samples_s()
  CacheChanges changes_;    // scratch
  // Placements on engines tracked from their events whose prefill ended, in the order they ended: each
  // settles (ClusterState::on_placement_settled) kKvEventLagS later, unless its engine went down since.
  struct Unsettled {
    double due_s = 0;
    size_t engine = 0;
    uint64_t kv_generation = 0;
    std::vector<BlockKey> keys;
  };
  std::deque<Unsettled> unsettled_;
  int64_t fed_events_ = 0;  // scratch: the events one SseParser::feed completed
  const SteadyClock clock_;
  std::unique_ptr<serve::HttpClient> client_;
  std::atomic<bool> stopping_{false};
  std::thread poll_thread_, kv_thread_, registry_thread_;
};

conductor::PrefillPolicy placement_policy(const RouterOptions& options) {
  // check_engines: every engine names the same kv_pool, or none does.
  if (options.config.serve.policy == conductor::PrefillPolicy::kGlobalCacheAware &&
      (options.engines.empty() || options.engines.front().kv_pool.empty())) {
    return conductor::PrefillPolicy::kCacheAware;
  }
  return options.config.serve.policy;
}

Result<std::unique_ptr<Router>> Router::start(RouterOptions options) {
  CRESCENT_RETURN_IF_ERROR(check_engines(options.engines, "router"));
  auto impl = std::make_unique<Impl>(std::move(options));
  CRESCENT_RETURN_IF_ERROR(impl->start());
  return std::unique_ptr<Router>(new Router(std::move(impl)));
}

Router::Router(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Router::~Router() = default;

conductor::Decision Router::relay(serve::RelayedRequest request, serve::RelayCallbacks callbacks, uint64_t& id) {
  return impl_->relay(std::move(request), std::move(callbacks), id);
}
void Router::cancel(uint64_t id) { impl_->cancel(id); }
int64_t Router::max_context_tokens() const { return impl_->max_context_tokens(); }
size_t Router::requests_in_flight() const { return impl_->requests_in_flight(); }
std::string Router::metrics_text() const { return impl_->metrics_text(); }
std::pair<uint32_t, uint32_t> Router::instances_up() const { return impl_->instances_up(); }
std::vector<double> Router::take_overhead_samples_s() { return impl_->take_overhead_samples_s(); }

}  // namespace crescent::router
