#include "serve/remote_cluster.h"

#include <fmt/format.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <charconv>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <zmq.hpp>
#include <zmq_addon.hpp>

#include "common/clock.h"
#include "common/leader_election.h"
#include "common/socket_io.h"
#include "serve/etcd_registry.h"
#include "serve/instance_wire.h"
#include "serve/kv_blocks.h"
#include "serve/kv_events.h"
#include "serve/members_only.h"

namespace crescent::serve {
namespace {

// A peer-chosen name as it may appear in a log line: control characters (a forged newline) become '?'.
std::string printable(std::string name) {
  if (name.size() > 64) name.resize(64);
  for (char& c : name) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = '?';
  }
  return name;
}

}  // namespace

class RemoteCluster::Impl final : public cluster::InstanceLinks {
 public:
  explicit Impl(const RemoteClusterOptions& options)
      : options_(options),
        core_(options.cluster, *this),
        router_(context_, zmq::socket_type::router),
        wake_fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
    // The config's instances are expected from the start (/health counts them); others join as they come.
    const cluster::ClusterConfig& config = options.cluster.config;
    for (uint32_t i = 0; i < config.prefill_instances; ++i) add_slot(InstanceRole::kPrefill, i, i);
    for (uint32_t i = 0; i < config.decode_instances; ++i) add_slot(InstanceRole::kDecode, i, i);
    // Nothing is up until it says hello.
    for (uint32_t i = 0; i < config.prefill_instances; ++i) core_.state().on_prefill_down(i, 0);
    for (uint32_t i = 0; i < config.decode_instances; ++i) core_.state().on_decode_down(i);
  }

  Status bind() {
    if (!options_.secret) {
      return Status::invalid_argument(
          "the Conductor's control socket admits members only: give the cluster secret");
    }
    auto zap = MembersOnly::start(context_, *options_.secret);
    if (!zap.ok()) return zap.status();
    zap_ = std::move(*zap);
    try {
      make_member_server(router_, *options_.secret);
      router_.set(zmq::sockopt::router_mandatory, 1);  // a send to an instance that left fails, not vanishes
      // No handover: each incarnation of an instance has a routing id of its own ("prefill-0#INCARNATION"),
      // so no connection takes over another's, and a restarted instance is a new peer.
      router_.set(zmq::sockopt::linger, 0);
      // No high-water mark: an order is never dropped because an instance was slow to read (a stalled
      // instance's queue grows until it reads again or is declared down).
      router_.set(zmq::sockopt::sndhwm, 0);
      router_.set(zmq::sockopt::rcvhwm, 0);
      router_.bind(net::zmq_bindable(options_.control_endpoint));
      endpoint_ = router_.get(zmq::sockopt::last_endpoint);
      // Connections that close: an instance whose process died (here or on another machine) is down at once,
      // without waiting for its heartbeat timeout.
      const std::string monitor_endpoint =
          fmt::format("inproc://crescent-control-monitor-{}", fmt::ptr(this));
      // And handshakes that fail: clients without the cluster's keys (counted,
      // crescent_control_clients_refused_total).
      constexpr int kEvents = ZMQ_EVENT_DISCONNECTED | ZMQ_EVENT_HANDSHAKE_FAILED_NO_DETAIL |
                              ZMQ_EVENT_HANDSHAKE_FAILED_PROTOCOL | ZMQ_EVENT_HANDSHAKE_FAILED_AUTH;
      if (zmq_socket_monitor(router_.handle(), monitor_endpoint.c_str(), kEvents) != 0) {
        throw zmq::error_t();
      }
      monitor_ = zmq::socket_t(context_, zmq::socket_type::pair);
      monitor_.connect(monitor_endpoint);
    } catch (const zmq::error_t& e) {
      return Status::unavailable(fmt::format("cannot bind the Conductor's control socket '{}': {}",
                                             options_.control_endpoint, e.what()));
    }
    if (wake_fd_ < 0) return Status::io_error("eventfd failed");
    if (Status advertised = advertise(); !advertised.ok()) return advertised;
    if (!options_.etcd_endpoint.empty()) {
      auto client = EtcdClient::create(options_.etcd_endpoint, std::chrono::seconds(2));
      if (!client.ok()) return client.status();
      registry_ = std::make_unique<EtcdClient>(*client);
      // Several Conductors may run: the one holding PREFIX/conductor leads (its value, the control endpoint,
      // is where instances connect); the others stand by, answering 503 until they lead.
      auto election = LeaderElection::start(
          {.endpoint = options_.etcd_endpoint,
           .key = etcd_conductor_key(options_.etcd_prefix),
           .leader_ttl = options_.leader_ttl,
           .request_timeout = std::chrono::milliseconds(1000)},
          endpoint_, [this](int64_t lease) { elected(lease); },
          [this] {
            log("lost the lead (its etcd lease may have expired): stopping");
            if (options_.on_leadership_lost) options_.on_leadership_lost();
          });
      if (!election.ok()) return election.status();
      election_ = std::move(*election);
      registry_thread_ = std::thread([this] { registry_loop(); });
    }
    control_thread_ = std::thread([this] { control_loop(); });
    kv_thread_ = std::thread([this] { kv_event_loop(); });
    return Status();
  }

  ~Impl() override {
    election_.reset();  // resigns first: a standby takes over at once, and no callback comes later
    stopping_ = true;
    wake();
    if (control_thread_.joinable()) control_thread_.join();
    if (kv_thread_.joinable()) kv_thread_.join();
    if (registry_thread_.joinable()) registry_thread_.join();
    if (wake_fd_ >= 0) ::close(wake_fd_);
  }

  const std::string& endpoint() const { return endpoint_; }

  // A control socket bound to every address is published under the host instances reach it on.
  Status advertise() {
    auto bound = net::url_host_port(endpoint_);
    if (!bound.ok()) return bound.status();
    if (!net::is_wildcard_host(bound->first)) return Status();
    std::string host = options_.advertise_host;
    if (host.empty() && !options_.etcd_endpoint.empty()) {
      auto etcd = net::url_host_port(options_.etcd_endpoint);
      if (!etcd.ok()) return etcd.status();
      auto local = net::local_address_toward(etcd->first, etcd->second);
      if (!local.ok()) return local.status();
      host = *local;
    }
    if (host.empty()) host = "127.0.0.1";
    endpoint_ = fmt::format("tcp://{}:{}", host.find(':') != std::string::npos ? "[" + host + "]" : host,
                            bound->second);
    return Status();
  }

  bool wait_until_all_up(std::chrono::milliseconds timeout) {
    const cluster::ClusterConfig& config = options_.cluster.config;
    std::unique_lock lock(mu_);
    return up_cv_.wait_for(lock, timeout, [&] {
      const auto [prefill, decode] = placeable();
      return prefill >= config.prefill_instances && decode >= config.decode_instances;
    });
  }

  std::pair<uint32_t, uint32_t> instances_up() {
    std::lock_guard lock(mu_);
    return placeable();
  }

  std::string leader_http_url() {
    std::lock_guard lock(mu_);
    return leading_ ? std::string() : leader_http_;
  }

  conductor::Decision submit(cluster::ClusterRequest request, cluster::RequestCallbacks callbacks,
                             uint64_t& id) {
    std::lock_guard lock(mu_);
    const double now = now_s();
    // A Conductor that has just taken the lead places nothing until it knows the instances' caches (or
    // kMaxHoldS passed): the first requests see the prefix hits they saw before.
    if (now < hold_until_s_ && !caches_known()) {
      conductor::Decision held;
      held.rejected = conductor::RejectReason::kNoInstance;
      return held;
    }
    return core_.place(std::move(request), std::move(callbacks), id, now);
  }
  void cancel(uint64_t id) {
    std::lock_guard lock(mu_);
    core_.cancel(id, now_s());
  }
  int64_t max_context_tokens() const { return core_.max_context_tokens(); }
  size_t requests_in_flight() {
    std::lock_guard lock(mu_);
    return core_.requests_in_flight();
  }
  std::string metrics_text() {
    cluster::LoadGauges gauges;
    {
      std::lock_guard lock(mu_);
      kv::DecodePoolLoad pool;
      gauges.prefill_caches_synced = 0;
      for (const Slot& s : slots_) {
        if (!s.up || s.draining) continue;
        if (s.role == InstanceRole::kPrefill) {
          gauges.requests_waiting += s.outstanding;
          ++gauges.prefill_instances_up;
          gauges.prefill_caches_synced += s.cache_synced ? 1 : 0;
          continue;
        }
        ++gauges.decode_instances_up;
        pool.add(s.load);
      }
      gauges.add_decode_pool(pool);
    }
    core_.metrics().observe_clients_refused(clients_refused_.load());
    return core_.metrics().scrape(gauges);
  }

  // ---- cluster::InstanceLinks (called with mu_ held) ----
  void send_prefill(InstanceId p, uint64_t id, const cluster::ClusterRequest& request,
                    std::span<const BlockKey>, const engine::EngineCore::ArrangedPrefix& prefix, InstanceId d,
                    double now_s) override {
    InstanceMessage m;
    m.kind = InstanceMessage::Kind::kPrefill;
    m.request_id = id;
    m.token_ids = request.prompt_token_ids;
    m.output_tokens = request.max_tokens;
    m.reused_tokens = prefix.reused_tokens;
    m.fetched_tokens = prefix.fetched_tokens;
    m.ready_in_s = std::max(0.0, prefix.ready_s - now_s);
    m.decode_index = decode_slot(d).index;
    m.seed = request.seed;
    m.temperature = request.temperature;
    m.top_p = request.top_p;
    m.top_logprobs = request.top_logprobs;
    m.output_offset = request.output_offset;
    core_.metrics().observe_placed_on(prefill_slot(p).name);
    post(prefill_slot(p), m);
  }
  void send_expect(InstanceId d, uint64_t id, const cluster::ClusterRequest& request, double) override {
    InstanceMessage m;
    m.kind = InstanceMessage::Kind::kExpect;
    m.request_id = id;
    m.input_tokens = std::ssize(request.prompt_token_ids);
    m.output_tokens = request.max_tokens;
    // Which blocks its KV must be: a block another request's prefill wrote into reused room is refused.
    m.block_keys = kv::shipped_block_keys(request.prompt_token_ids, options_.cluster.block_size_tokens,
                                          options_.cluster.block_key_seed);
    m.seed = request.seed;
    m.temperature = request.temperature;
    m.top_p = request.top_p;
    m.top_logprobs = request.top_logprobs;
    m.output_offset = request.output_offset;
    core_.metrics().observe_placed_on(decode_slot(d).name);
    post(decode_slot(d), m);
  }
  void send_kv_coming(InstanceId d, uint64_t id, int64_t input_tokens, double prefill_s) override {
    if (const cluster::RequestSummary* summary = core_.summary(id)) {
      rooms_[id] = {.prefill = summary->prefill_instance, .decode = d, .since_s = now_s()};
    }
    InstanceMessage m;
    m.kind = InstanceMessage::Kind::kKvComing;
    m.request_id = id;
    m.input_tokens = input_tokens;
    m.ready_in_s = prefill_s;
    post(decode_slot(d), m);
  }
  void send_kv_handoff(InstanceId d, uint64_t id, int64_t, int64_t first_token, double) override {
    // The prefill instance has written the KV into the decode instance's reservation before saying done.
    InstanceMessage m;
    m.kind = InstanceMessage::Kind::kKvArrived;
    m.request_id = id;
    m.first_token = first_token;
    rooms_.erase(id);  // its prefill instance wrote it all: the room is the request's alone
    post(decode_slot(d), m);
  }
  void send_cancel(InstanceId p, InstanceId d, uint64_t id) override {
    InstanceMessage m;
    m.kind = InstanceMessage::Kind::kCancel;
    m.request_id = id;
    post(prefill_slot(p), m);
    post(decode_slot(d), m);
    // Its room at decode stays out of use until its prefill instance says it writes no more there.
    if (auto room = rooms_.extract(id)) {
      room.mapped().since_s = now_s();
      dropped_rooms_.insert(std::move(room));
    }
  }

 private:
  struct Slot {
    InstanceRole role = InstanceRole::kPrefill;
    uint32_t index = 0;          // in its name, "prefill-INDEX"
    InstanceId id = 0;           // the Conductor's number for it (ClusterState), within its role
    bool up = false;             // in the view: its requests go on (and, unless draining, new ones come)
    bool draining = false;       // up, finishing what it has: nothing new is placed there (it said so)
    bool said_draining = false;  // its last report said it drains (applied whenever it is up)
    bool cache_synced = false;   // prefill: its full KV report (after the reset) applied since it came up
    bool reporting = false;      // its reports arrive (within heartbeat_timeout_s)
    bool registered = false;     // with etcd: its key is there (its lease is alive)
    int64_t registration =
        0;  // with etcd: its key's create_revision when last read (a new one: re-registered)
    uint64_t incarnation = 0;
    double last_seen_s = 0;
    kv::DecodeLoad load;
    int64_t outstanding = 0;
    uint64_t blocks_verified = 0, checksum_failures = 0;  // as the instance last reported them
    std::string kv_events_endpoint, kv_replay_endpoint;
    uint64_t kv_generation = 0;  // bumped when the KV event endpoints change (a new incarnation)
    std::string name;            // "prefill-0": its name in logs and etcd
    std::string routing_id;      // its current incarnation's ZeroMQ routing id, "prefill-0#INCARNATION"
    int fd = -1;                 // the control connection it last sent on
    const std::string& identity() const { return name; }
  };

  // This Conductor now leads (with etcd): instances find it and come up; until it knows their caches (or
  // kMaxHoldS) requests are answered 503 with Retry-After.
  // Its HTTP URL goes under the leadership's `lease` for standbys to forward to.
  void elected(int64_t lease) {
    static constexpr double kMaxHoldS = 2;
    {
      std::lock_guard lock(mu_);
      hold_until_s_ = now_s() + kMaxHoldS;
      leading_ = true;
      leader_http_.clear();
      log(fmt::format("leading ({} holds {})", etcd_conductor_key(options_.etcd_prefix), endpoint_));
    }
    if (options_.http_url.empty()) return;
    auto put = registry_->transaction(
        {}, {EtcdClient::put_op(etcd_conductor_http_key(options_.etcd_prefix), options_.http_url, lease)},
        {});
    if (!put.ok()) log(fmt::format("could not publish its HTTP URL: {}", put.status().message()));
  }

  // Whether at least one prefill and one decode instance are up and every registered prefill instance is up
  // with its whole cache learned (cache_synced).
  bool caches_known() const {
    const auto [prefill, decode] = placeable();
    if (prefill == 0 || decode == 0) return false;
    for (const Slot* s : prefill_slots_) {
      if (s->registered && !s->said_draining && !(s->up && s->cache_synced)) return false;
    }
    return true;
  }

  // The most instances the Conductor keeps track of: a member naming ever new instances cannot grow its
  // memory without bound.
  static constexpr size_t kMaxSlots = 4096;

  double now_s() const { return clock_.now_s(); }
  Slot& prefill_slot(InstanceId p) { return *prefill_slots_[p]; }
  Slot& decode_slot(InstanceId d) { return *decode_slots_[d]; }
  size_t prefill_count() {
    std::lock_guard lock(mu_);
    return prefill_slots_.size();
  }
  // Instances new requests may go to (up and not draining): (prefill, decode).
  std::pair<uint32_t, uint32_t> placeable() const {
    std::pair<uint32_t, uint32_t> up{0, 0};
    for (const Slot& s : slots_) {
      if (s.up && !s.draining) ++(s.role == InstanceRole::kPrefill ? up.first : up.second);
    }
    return up;
  }

  // The slot of instance `role`-`index`, numbered `id` in the Conductor's state.
  Slot& add_slot(InstanceRole role, uint32_t index, InstanceId id) {
    Slot& s = slots_.emplace_back();
    s.role = role;
    s.index = index;
    s.id = id;
    s.name = fmt::format("{}-{}", to_string(role), index);
    slot_by_name_.emplace(s.name, &s);
    (role == InstanceRole::kPrefill ? prefill_slots_ : decode_slots_).push_back(&s);
    return s;
  }

  // The slot of the instance named `name` ("prefill-N", "decode-N"). One not seen before joins (membership
  // at run time): a new slot, down until it reports. nullptr for a name of no instance, or past kMaxSlots.
  Slot* find_or_add_slot(std::string_view name) {
    if (auto it = slot_by_name_.find(std::string(name)); it != slot_by_name_.end()) return it->second;
    if (slots_.size() >= kMaxSlots) return nullptr;
    for (const InstanceRole role : {InstanceRole::kPrefill, InstanceRole::kDecode}) {
      const std::string_view prefix = to_string(role);
      if (!name.starts_with(prefix) || name.size() < prefix.size() + 2 || name[prefix.size()] != '-')
        continue;
      const std::string_view digits = name.substr(prefix.size() + 1);
      uint32_t index = 0;
      const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), index);
      // Canonical digits only ("prefill-07" is not "prefill-7"), as instances name themselves.
      if (error != std::errc() || end != digits.data() + digits.size() ||
          (digits.size() > 1 && digits.front() == '0')) {
        return nullptr;
      }
      const InstanceId id =
          role == InstanceRole::kPrefill ? core_.add_prefill_instance() : core_.add_decode_instance();
      Slot& slot = add_slot(role, index, id);
      log(fmt::format("{} joins (not in the config: instance {} of its role here)", slot.name, id));
      return &slot;
    }
    return nullptr;
  }

  void wake() {
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
  }

  void post(const Slot& slot, const InstanceMessage& m) {
    if (!slot.up) return;  // its requests have failed already
    outbox_.emplace_back(slot.routing_id, encode(m));
    wake();
  }

  void log(const std::string& line) {
    if (options_.log_instances) fmt::print(stderr, "conductor: {}\n", line);
  }

  // A control message dropped for `reason`: counted (crescent_control_messages_dropped_total), and logged
  // the first time and at every power of two, so a flood of junk writes a few lines, not one each.
  void dropped(std::string_view reason, const std::string& what) {
    const uint64_t n = core_.metrics().observe_control_dropped(reason);
    if ((n & (n - 1)) == 0) log(fmt::format("dropped {} ({} {} so far)", what, n, reason));
  }

  // An instance is up while it reports and (with etcd) is registered; `why` says why it would go down.
  void update_up(Slot& slot, const std::string& why) {
    const bool up = slot.reporting && (registry_ == nullptr || slot.registered);
    if (up == slot.up) return;
    if (!up) {
      instance_down(slot, why);
      return;
    }
    slot.up = true;
    slot.draining = false;
    slot.cache_synced = false;
    // Whatever it still holds from before (it was cut off, stalled, or served an earlier Conductor) was
    // failed or forgotten here: it drops it all before taking new orders (one connection keeps messages in
    // order).
    InstanceMessage reset;
    reset.kind = InstanceMessage::Kind::kReset;
    post(slot, reset);
    if (slot.role == InstanceRole::kPrefill) {
      core_.state().on_prefill_up(slot.id);
    } else {
      core_.state().on_decode_up(slot.id);
    }
    log(fmt::format("{} up", slot.identity()));
    if (slot.said_draining) instance_draining(slot);
    up_cv_.notify_all();
  }

  void instance_down(Slot& slot, const std::string& why) {
    slot.up = false;
    slot.draining = false;
    slot.load = {};
    slot.outstanding = 0;
    log(fmt::format("{} down ({})", slot.identity(), why));
    if (slot.role == InstanceRole::kPrefill) {
      core_.on_prefill_down(slot.id, now_s());
    } else {
      core_.on_decode_down(slot.id, now_s());
    }
  }

  // An instance that is up says it drains (SIGTERM): nothing new goes there from now on, what it has goes
  // on, and it hears so (kDrainAck, after any order already queued for it) before it may leave.
  void instance_draining(Slot& slot) {
    if (!slot.draining) {
      slot.draining = true;
      log(fmt::format("{} draining: no new requests go there", slot.identity()));
      if (slot.role == InstanceRole::kPrefill) {
        core_.on_prefill_draining(slot.id, now_s());
      } else {
        core_.on_decode_draining(slot.id);
      }
    }
    InstanceMessage ack;
    ack.kind = InstanceMessage::Kind::kDrainAck;
    post(slot, ack);
  }

  void handle(const std::string& routing_id, const InstanceMessage& m) {
    const double now = now_s();
    const std::string_view name = std::string_view(routing_id).substr(0, routing_id.find('#'));
    const bool report = m.kind == InstanceMessage::Kind::kHello || m.kind == InstanceMessage::Kind::kLoad;
    Slot* slot = nullptr;
    if (auto it = slot_by_name_.find(std::string(name)); it != slot_by_name_.end()) {
      slot = it->second;
    } else if (report) {
      slot = find_or_add_slot(name);  // a new member says hello: it joins
    }
    if (slot == nullptr) {
      dropped(
          "unknown_sender",
          fmt::format("a message from '{}': not an instance's name (prefill-N, decode-N), or {} instances "
                      "are known already",
                      printable(routing_id), kMaxSlots));
      return;
    }
    // A hello comes once from each incarnation as it starts: the newest takes the slot (a restart). Anything
    // else counts only from the incarnation that holds it; an older one (a process that was stopped and
    // resumed after its successor started) is not heard.
    if (routing_id != slot->routing_id && m.kind != InstanceMessage::Kind::kHello &&
        !(slot->routing_id.empty() && m.kind == InstanceMessage::Kind::kLoad)) {
      dropped("stale_incarnation", fmt::format("a message from '{}', which {} has replaced",
                                               printable(routing_id), slot->routing_id));
      return;
    }
    if (m.kind == InstanceMessage::Kind::kHello || m.kind == InstanceMessage::Kind::kLoad) {
      if (slot->reporting && (slot->incarnation != m.incarnation || routing_id != slot->routing_id)) {
        slot->reporting = false;  // a new process under the old name: what the old one had is gone
        update_up(*slot, "restarted");
      }
      if (!slot->reporting) {
        // The instance's check counts run from its own start. A process new to this slot counts from 0; one
        // this Conductor had not heard from before (it started after the instance, or took over from another
        // Conductor) reported what it had counted to another: only what is new from here counts here, so the
        // Conductors' counters add up. One heard from again after a silence goes on from its last report.
        if (slot->incarnation != m.incarnation) {
          const bool first_heard = slot->incarnation == 0;
          slot->blocks_verified = first_heard ? m.blocks_verified : 0;
          slot->checksum_failures = first_heard ? m.checksum_failures : 0;
        }
        slot->reporting = true;
        slot->routing_id = routing_id;
        slot->incarnation = m.incarnation;
        slot->kv_events_endpoint = m.kv_events_endpoint;
        slot->kv_replay_endpoint = m.kv_replay_endpoint;
        ++slot->kv_generation;
      }
      slot->last_seen_s = now;
      // Checks counted since the instance started: add what is new since its last report.
      core_.metrics().observe_kv_checks(
          m.blocks_verified - std::min(m.blocks_verified, slot->blocks_verified),
          m.checksum_failures - std::min(m.checksum_failures, slot->checksum_failures));
      slot->blocks_verified = m.blocks_verified;
      slot->checksum_failures = m.checksum_failures;
      slot->load = m.load;
      slot->outstanding = m.outstanding;
      slot->said_draining = m.draining;
      update_up(*slot, "");
      if (slot->up && m.draining) instance_draining(*slot);
      if (slot->up && !slot->draining && slot->role == InstanceRole::kDecode)
        core_.state().on_decode_report(slot->id, m.load);
      return;
    }
    // A prefill instance writes no more KV for this request (even one from before it went down says so
    // truly): a room dropped meanwhile at decode may be used again.
    if (m.kind == InstanceMessage::Kind::kKvWritesEnded || m.kind == InstanceMessage::Kind::kPrefillDone) {
      free_dropped_room(*slot, m.request_id);
      if (m.kind == InstanceMessage::Kind::kKvWritesEnded) return;
    }
    if (!slot->up) return;  // a straggler from before it went down
    slot->last_seen_s = now;
    if (!placed_here(*slot, m)) {
      dropped("not_placed_here", fmt::format("a message of kind {} from {} about a request not placed there",
                                             static_cast<int>(m.kind), slot->name));
      return;
    }
    switch (m.kind) {
      case InstanceMessage::Kind::kPrefillStart:
        core_.on_prefill_start(m.request_id, m.hit_tokens, now);
        break;
      case InstanceMessage::Kind::kFirstToken:
        core_.on_first_token(slot->id, m.request_id, m.first_token, now,
                             m.logprobs.empty() ? nullptr : &m.logprobs.front());
        break;
      case InstanceMessage::Kind::kPrefillDone:
        if (!m.error.empty()) {
          core_.fail(m.request_id, "prefill_failed", m.error, now);
        } else {
          cluster::ServeMetrics& metrics = core_.metrics();
          metrics.observe_kv_bytes_moved("prefill_to_decode", m.kv_bytes);
          metrics.observe_kv_writes(m.kv_chunks);
          if (m.kv_bytes > 0) metrics.observe_kv_transport(m.kv_transport, m.kv_bytes);
          metrics.observe_kv_bytes_moved("pool_read", m.pool_read_bytes);
          metrics.observe_kv_bytes_moved("pool_write", m.pool_write_bytes);
          metrics.observe_pool_prefix(m.pool_hit_tokens, m.fetched_tokens_expected - m.pool_hit_tokens);
          metrics.observe_prefill_computed(m.computed_tokens);
          core_.on_kv_shipped(m.request_id, now);
        }
        break;
      case InstanceMessage::Kind::kPoolWritten:
        core_.metrics().observe_kv_bytes_moved("pool_write", m.pool_write_bytes);
        break;
      case InstanceMessage::Kind::kReserved:
        if (const cluster::RequestSummary* s = core_.summary(m.request_id)) {
          InstanceMessage target = m;
          target.kind = InstanceMessage::Kind::kKvTarget;
          post(prefill_slot(s->prefill_instance), target);
        }
        break;
      case InstanceMessage::Kind::kTokens:
        core_.on_tokens(m.request_ids, m.tokens, now, m.logprob_rows, m.logprobs);
        break;
      case InstanceMessage::Kind::kKvTimeout:
        core_.fail(m.request_id, "kv_transfer_failed",
                   fmt::format("its KV did not reach {} within kv_transfer_timeout_s", slot->name), now);
        break;
      case InstanceMessage::Kind::kKvError:
        core_.fail(m.request_id, "kv_transfer_failed", m.error, now);
        break;
      default:
        log(fmt::format("ignored a message of kind {} from {}", static_cast<int>(m.kind), slot->name));
        break;
    }
  }

  // Prefill instance `slot` writes no more of request `id`'s KV: if the request was dropped with room
  // reserved at decode, that room may be used again.
  void free_dropped_room(const Slot& slot, uint64_t id) {
    auto it = dropped_rooms_.find(id);
    if (it == dropped_rooms_.end() || slot.role != InstanceRole::kPrefill || it->second.prefill != slot.id) {
      return;
    }
    InstanceMessage m;
    m.kind = InstanceMessage::Kind::kRoomFree;
    m.request_id = id;
    post(decode_slot(it->second.decode), m);
    dropped_rooms_.erase(it);
  }

  // Whether `m`, from `slot`, is about requests placed on that instance: reports of a prefill from the
  // request's prefill instance, of its decode (room, KV, tokens) from its decode instance. A kTokens
  // message keeps its ids placed there (the rest were checked above: no message names none).
  bool placed_here(const Slot& slot, const InstanceMessage& m) {
    const auto on = [&](uint64_t id, InstanceRole role) {
      const cluster::RequestSummary* s = core_.summary(id);
      if (s == nullptr) return true;  // finished or failed meanwhile: the core ignores it
      return slot.role == role &&
             (role == InstanceRole::kPrefill ? s->prefill_instance : s->decode_instance) == slot.id;
    };
    switch (m.kind) {
      case InstanceMessage::Kind::kPrefillStart:
      case InstanceMessage::Kind::kFirstToken:
      case InstanceMessage::Kind::kPrefillDone:
      case InstanceMessage::Kind::kPoolWritten:
        return on(m.request_id, InstanceRole::kPrefill);
      case InstanceMessage::Kind::kReserved:
      case InstanceMessage::Kind::kKvTimeout:
      case InstanceMessage::Kind::kKvError:
        return on(m.request_id, InstanceRole::kDecode);
      case InstanceMessage::Kind::kTokens:
        for (uint64_t id : m.request_ids) {
          if (!on(id, InstanceRole::kDecode)) return false;
        }
        return true;
      default:
        return true;
    }
  }

  // The control socket's connection `fd` closed: the instance that last sent on it is gone (a restarted one
  // that already sent on a new connection is not).
  void connection_closed(int fd) {
    auto it = identity_of_fd_.find(fd);
    if (it == identity_of_fd_.end()) return;
    const std::string identity = std::move(it->second);
    identity_of_fd_.erase(it);
    std::lock_guard lock(mu_);
    for (Slot& s : slots_) {
      if (s.routing_id != identity || s.fd != fd) continue;
      s.fd = -1;
      if (s.role == InstanceRole::kPrefill) {
        // Its process is gone (a stopped one keeps its connection): it writes nowhere any more.
        std::vector<uint64_t> ids;
        for (const auto& [id, room] : dropped_rooms_) {
          if (room.prefill == s.id) ids.push_back(id);
        }
        for (uint64_t id : ids) free_dropped_room(s, id);
      }
      if (!s.reporting) continue;
      s.reporting = false;
      update_up(s, "its connection closed");
    }
  }

  // Reads the control socket's monitor: [event id (2 bytes) + value (4 bytes), endpoint].
  void read_monitor() {
    for (;;) {
      std::vector<zmq::message_t> frames;
      if (!zmq::recv_multipart(monitor_, std::back_inserter(frames), zmq::recv_flags::dontwait)) return;
      if (frames.empty() || frames[0].size() < 6) continue;
      uint16_t event = 0;
      int32_t value = 0;
      std::memcpy(&event, frames[0].data(), sizeof(event));
      std::memcpy(&value, static_cast<const char*>(frames[0].data()) + 2, sizeof(value));
      if (event == ZMQ_EVENT_DISCONNECTED) {
        connection_closed(value);
      } else {
        ++clients_refused_;
      }
    }
  }

  void control_loop() {
    zmq::pollitem_t items[3] = {{router_.handle(), 0, ZMQ_POLLIN, 0},
                                {nullptr, wake_fd_, ZMQ_POLLIN, 0},
                                {monitor_.handle(), 0, ZMQ_POLLIN, 0}};
    const double heartbeat_s = options_.cluster.config.serve.heartbeat_timeout_s;
    double last_check_s = now_s();
    std::vector<std::pair<std::string, std::string>> sending;
    while (!stopping_) {
      zmq::poll(items, 3, std::chrono::milliseconds(20));
      uint64_t drained = 0;
      (void)!::read(wake_fd_, &drained, sizeof(drained));
      // Closed connections first: a restarted instance's new connection may reuse the old one's fd, and its
      // messages (read below) come after the old one's close was reported.
      read_monitor();
      for (;;) {
        std::vector<zmq::message_t> frames;
        if (!zmq::recv_multipart(router_, std::back_inserter(frames), zmq::recv_flags::dontwait)) break;
        if (frames.size() != 2) continue;
        // Which connection it came on (ZMQ_SRCFD: deprecated, still the only way to tie a routing id to a
        // connection), so the connection's close can be told apart from an older one's.
        const int fd = zmq_msg_get(frames[1].handle(), ZMQ_SRCFD);  // -1 when unknown (cppzmq's get throws)
        if (fd >= 0) identity_of_fd_[fd] = frames[0].to_string();
        auto m = decode_instance_message(frames[1].to_string_view());
        std::lock_guard lock(mu_);
        if (fd >= 0) {
          for (Slot& s : slots_) {
            if (s.routing_id == frames[0].to_string_view()) s.fd = fd;
          }
        }
        if (!m.ok()) {
          dropped("malformed", fmt::format("a malformed message from '{}': {}",
                                           printable(frames[0].to_string()), m.status().message()));
          continue;
        }
        handle(frames[0].to_string(), *m);
      }
      {
        std::lock_guard lock(mu_);
        const double now = now_s();
        // This loop itself ran late (the machine is overloaded, or this process was stopped): the silence
        // may be ours, not the instances'. Credit them the stall rather than declaring everyone down.
        if (now - last_check_s > heartbeat_s / 4) {
          for (Slot& s : slots_) s.last_seen_s += now - last_check_s;
        }
        last_check_s = now;
        // Rooms its decode instance has used again by now (kHeldRoomTimeoutS), and announced KV of requests
        // long gone by a path that did not say so.
        std::erase_if(dropped_rooms_,
                      [&](const auto& e) { return now - e.second.since_s > kHeldRoomTimeoutS; });
        std::erase_if(rooms_, [&](const auto& e) {
          return now - e.second.since_s > 10 * kHeldRoomTimeoutS && core_.summary(e.first) == nullptr;
        });
        for (Slot& s : slots_) {
          if (s.reporting && now - s.last_seen_s > heartbeat_s) {
            s.reporting = false;
            update_up(s, fmt::format("silent for {:.1f} s", now - s.last_seen_s));
          }
        }
        // An instance that reports but never answers: its requests fail at their stage deadlines.
        // Logged at the first and at every power of two, as dropped messages are.
        if (const size_t expired = core_.expire_deadlines(now); expired > 0) {
          const uint64_t before = deadlines_passed_;
          deadlines_passed_ += expired;
          if (std::bit_floor(deadlines_passed_) > before) {
            log(fmt::format(
                "{} request{} failed at a stage deadline so far (an instance that does not answer? "
                "crescent_requests_failed_total)",
                deadlines_passed_, deadlines_passed_ == 1 ? "" : "s"));
          }
        }
        sending.swap(outbox_);
      }
      for (auto& [identity, bytes] : sending) {
        try {
          std::array<zmq::const_buffer, 2> frames{zmq::buffer(identity), zmq::buffer(bytes)};
          if (!zmq::send_multipart(router_, frames, zmq::send_flags::dontwait)) {
            log(fmt::format("could not send an order to {} (its queue is full)", identity));
          }
        } catch (const zmq::error_t&) {
          // EHOSTUNREACH: the instance left; its heartbeat timeout (or its process's exit) fails its
          // requests.
        }
      }
      sending.clear();
    }
  }

  // With etcd: which instances are registered, every 200 ms. While etcd cannot be read the last answer
  // stands, and for a while after an outage a missing key does not take a reporting instance down: its lease
  // may have expired during the outage, and it registers again at its next keepalive (LeasedKey).
  void registry_loop() {
    const std::string prefix = etcd_instances_prefix(options_.etcd_prefix);
    constexpr double kGraceAfterOutageS = 3;  // > an instance's keepalive period (lease TTL / 3) + a poll
    double last_outage_s = -kGraceAfterOutageS;
    while (!stopping_) {
      auto entries = registry_->list(prefix);
      if (!entries.ok()) last_outage_s = now_s();
      if (entries.ok()) {
        const bool grace = now_s() - last_outage_s < kGraceAfterOutageS;
        std::lock_guard lock(mu_);
        for (Slot& s : slots_) {
          auto entry = std::find_if(entries->begin(), entries->end(),
                                    [&](const auto& e) { return e.first == prefix + s.identity(); });
          const bool registered = entry != entries->end();
          if (registered && s.registered && entry->second.create_revision != s.registration) {
            // Its key was deleted and put again between two reads (its lease lapsed and it registered anew,
            // an outage's grace included): whatever etcd dropped with the old lease is gone, so it leaves the
            // view now and comes back at the next read, reset.
            s.registration = entry->second.create_revision;
            s.registered = false;
            update_up(s, "its etcd lease lapsed");
            continue;
          }
          if (!registered && grace && s.reporting) continue;
          s.registered = registered;
          s.registration = registered ? entry->second.create_revision : 0;
          update_up(s, s.reporting ? "its etcd lease lapsed" : "it stopped");
        }
      }
      // Standing by: where the leader's HTTP is, for forwarding (leader_forward.h).
      bool leading = false;
      {
        std::lock_guard lock(mu_);
        leading = leading_;
      }
      if (!leading) {
        auto http = registry_->get(etcd_conductor_http_key(options_.etcd_prefix));
        std::lock_guard lock(mu_);
        if (http.ok() && !leading_) leader_http_ = http->has_value() ? (*http)->value : std::string();
      }
      for (int i = 0; i < 10 && !stopping_; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  // One subscriber per prefill instance that is up, reconnected when it restarts. Until an instance's full
  // cache report (published when it is reset on coming up) has been applied, the subscriber asks its replay
  // socket for what it holds every kCatchUpPeriodS: a PUB message published before the subscription was
  // connected is otherwise seen only when a later one arrives.
  void kv_event_loop() {
    constexpr double kCatchUpPeriodS = 0.25;
    struct Subscription {
      uint64_t generation = 0;
      std::unique_ptr<KvEventSubscriber> subscriber;
      double next_catch_up_s = 0;
    };
    std::vector<Subscription> subs;
    while (!stopping_) {
      bool any = false;
      subs.resize(prefill_count());  // instances that joined since
      for (InstanceId p = 0; p < subs.size(); ++p) {
        std::string endpoint, replay;
        uint64_t generation = 0;
        bool up = false, synced = false;
        {
          std::lock_guard lock(mu_);
          const Slot& s = prefill_slot(p);
          // A draining instance's cache is no longer placed on: its events are not followed.
          up = s.up && !s.draining && !s.kv_events_endpoint.empty();
          synced = s.cache_synced;
          generation = s.kv_generation;
          endpoint = s.kv_events_endpoint;
          replay = s.kv_replay_endpoint;
        }
        if (!up) {
          subs[p].subscriber.reset();
          continue;
        }
        if (!subs[p].subscriber || subs[p].generation != generation) {
          auto sub = KvEventSubscriber::connect(endpoint, replay, "", &*options_.secret);
          if (!sub.ok()) continue;
          subs[p] = {generation, std::move(*sub), 0};
        }
        any = true;
        const auto on_batch = [&](uint64_t, const KvEventBatch& batch) {
          std::lock_guard lock(mu_);
          Slot& s = prefill_slot(p);
          if (s.up && !s.draining && s.kv_generation == generation) {
            apply_kv_events(batch, s.id, core_.state(), now_s());
            // A batch that starts by clearing is a whole cache (the instance's full report).
            if (!batch.events.empty() && batch.events.front().kind == KvEvent::Kind::kAllCleared)
              s.cache_synced = true;
          }
        };
        // Batches lost for good: what the Conductor knew of the instance's cache may be stale. It forgets it
        // and asks the instance for its whole cache again.
        const auto on_gap = [&](uint64_t, uint64_t) {
          std::lock_guard lock(mu_);
          Slot& s = prefill_slot(p);
          core_.state().on_kv_cleared(s.id);
          if (s.up && s.kv_generation == generation && s.cache_synced) {
            s.cache_synced = false;
            InstanceMessage report;
            report.kind = InstanceMessage::Kind::kCacheReport;
            post(s, report);
          }
        };
        if (!synced && now_s() >= subs[p].next_catch_up_s) {
          subs[p].subscriber->catch_up(on_batch, on_gap);
          subs[p].next_catch_up_s = now_s() + kCatchUpPeriodS;
        }
        subs[p].subscriber->poll(std::chrono::milliseconds(5), on_batch, on_gap);
      }
      if (!any) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  }

  const RemoteClusterOptions options_;
  mutable std::mutex mu_;  // the core, the slots and the outbox
  std::condition_variable up_cv_;
  cluster::ConductorCore core_;
  std::deque<Slot> slots_;  // every instance ever known, in the order they came (the config's first)
  std::unordered_map<std::string, Slot*> slot_by_name_;
  // Decode rooms of requests whose KV is coming (kKvComing sent, kKvArrived not yet), by request id; and
  // those of requests dropped meanwhile, kept until their prefill instance writes no more there
  // (kKvWritesEnded, kPrefillDone, or its connection closed: its process is gone), when the decode instance
  // gets kRoomFree.
  struct Room {
    InstanceId prefill = 0, decode = 0;
    double since_s = 0;  // when the KV was announced, or the request dropped
  };
  std::unordered_map<uint64_t, Room> rooms_, dropped_rooms_;
  std::vector<Slot*> prefill_slots_, decode_slots_;  // by InstanceId (the state's number) in each role
  std::vector<std::pair<std::string, std::string>> outbox_;  // (identity, message) to send
  zmq::context_t context_;
  std::unique_ptr<MembersOnly> zap_;          // admits members only to router_ (closed after it)
  std::atomic<uint64_t> clients_refused_{0};  // router_'s failed handshakes (the monitor's events)
  zmq::socket_t router_;                      // the control thread's
  zmq::socket_t monitor_;                     // the control thread's: router_'s closed connections
  uint64_t deadlines_passed_ = 0;             // requests failed at a stage deadline (under mu_)
  std::unordered_map<int, std::string>
      identity_of_fd_;  // the control thread's: who last sent on each connection
  std::string endpoint_;
  const int wake_fd_;
  const SteadyClock clock_;
  std::atomic<bool> stopping_{false};
  std::unique_ptr<EtcdClient> registry_;      // with etcd
  std::unique_ptr<LeaderElection> election_;  // with etcd: for PREFIX/conductor
  bool leading_ = false;                      // with etcd: this Conductor holds PREFIX/conductor (under mu_)
  std::string leader_http_;  // with etcd, standing by: the leader's HTTP URL as last read (under mu_)
  double hold_until_s_ = 0;  // once elected: requests wait for the instances' caches until then (under mu_)
  std::thread control_thread_, kv_thread_, registry_thread_;
};

Result<std::unique_ptr<RemoteCluster>> RemoteCluster::start(const RemoteClusterOptions& options) {
  CRESCENT_RETURN_IF_ERROR(validate(options.cluster));
  auto impl = std::make_unique<Impl>(options);
  CRESCENT_RETURN_IF_ERROR(impl->bind());
  return std::unique_ptr<RemoteCluster>(new RemoteCluster(std::move(impl)));
}

RemoteCluster::RemoteCluster(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
RemoteCluster::~RemoteCluster() = default;

const std::string& RemoteCluster::control_endpoint() const {
  return impl_->endpoint();
}
bool RemoteCluster::wait_until_all_up(std::chrono::milliseconds timeout) const {
  return impl_->wait_until_all_up(timeout);
}
std::string RemoteCluster::leader_http_url() const {
  return impl_->leader_http_url();
}
std::pair<uint32_t, uint32_t> RemoteCluster::instances_up() const {
  return impl_->instances_up();
}
conductor::Decision RemoteCluster::submit(cluster::ClusterRequest request,
                                          cluster::RequestCallbacks callbacks, uint64_t& id) {
  return impl_->submit(std::move(request), std::move(callbacks), id);
}
void RemoteCluster::cancel(uint64_t id) {
  impl_->cancel(id);
}
int64_t RemoteCluster::max_context_tokens() const {
  return impl_->max_context_tokens();
}
size_t RemoteCluster::requests_in_flight() const {
  return impl_->requests_in_flight();
}
std::string RemoteCluster::metrics_text() const {
  return impl_->metrics_text();
}

}  // namespace crescent::serve
