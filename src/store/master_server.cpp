#include "store/master_server.h"

#include <fmt/format.h>
#include <prometheus/histogram.h>

#include <atomic>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "common/socket_io.h"
#include "store.pb.h"
#include "store/control_rpc.h"
#include "store/metrics.h"
#include "store/rpc_convert.h"
#include "transfer/metadata.h"

namespace crescent::store {
namespace {

using rpc_convert::key_views;
using rpc_convert::to_proto;

void to_proto(const Result<std::vector<ReplicaLocation>>& result, rpc::ReplicaList* out) {
  to_proto(result.status(), out->mutable_status());
  if (!result.ok()) return;
  for (const ReplicaLocation& r : *result) to_proto(r, out->add_replicas());
  if (!result->empty()) out->set_size_bytes(result->front().size_bytes);
}

void to_proto(const Result<ReadGrant>& result, rpc::ReplicaList* out) {
  to_proto(result.status(), out->mutable_status());
  if (!result.ok()) return;
  for (const ReplicaLocation& r : result->replicas) to_proto(r, out->add_replicas());
  out->set_size_bytes(result->size_bytes);
  out->set_lease_ttl_ms(static_cast<uint64_t>(result->lease_ttl.count()));
}

/// The master's control-protocol methods: each handler parses its request, runs to completion on the
/// connection's thread (Master calls only take its lock briefly) and records its latency.
class Service {
 public:
  Service(Master& master, std::string transfer_metadata, prometheus::Family<prometheus::Histogram>& latency,
          const std::atomic<bool>& leading)
      : master_(master),
        transfer_metadata_(std::move(transfer_metadata)),
        latency_(latency),
        leading_(leading) {
    on<rpc::HelloRequest, rpc::HelloReply>(
        MasterMethod::kHello, "hello", [this](const rpc::HelloRequest*, rpc::HelloReply* reply) {
          reply->set_transfer_metadata(transfer_metadata_);
          reply->set_lease_ttl_ms(static_cast<uint64_t>(master_.options().lease_ttl.count()));
          reply->set_segment_ttl_ms(static_cast<uint64_t>(master_.options().segment_ttl.count()));
        });
    on<rpc::MountSegmentRequest, rpc::StatusReply>(
        MasterMethod::kMountSegment, "mount_segment",
        [this](const rpc::MountSegmentRequest* request, rpc::StatusReply* reply) {
          std::vector<HeldObject> held;
          held.reserve(static_cast<size_t>(request->held_size()));
          for (const rpc::HeldObject& h : request->held()) held.push_back(rpc_convert::from_proto(h));
          to_proto(master_.mount_segment(
                       {request->segment(), request->owner(), request->host_id(), request->capacity_bytes(),
                        request->ssd_capacity_bytes(), request->incarnation()},
                       held),
                   reply->mutable_status());
        });
    on<rpc::SegmentRequest, rpc::StatusReply>(
        MasterMethod::kUnmountSegment, "unmount_segment",
        [this](const rpc::SegmentRequest* request, rpc::StatusReply* reply) {
          to_proto(master_.unmount_segment(request->segment()), reply->mutable_status());
        });
    on<rpc::RenewSegmentRequest, rpc::RenewSegmentReply>(
        MasterMethod::kRenewSegment, "renew_segment",
        [this](const rpc::RenewSegmentRequest* request, rpc::RenewSegmentReply* reply) {
          SegmentReport report;
          for (const rpc::HeldObject& h : request->spilled())
            report.spilled.push_back(rpc_convert::from_proto(h));
          for (const rpc::HeldObject& h : request->loaded())
            report.loaded.push_back(rpc_convert::from_proto(h));
          for (const rpc::HeldObject& h : request->failed())
            report.failed.push_back(rpc_convert::from_proto(h));
          report.ssd_dropped.assign(request->ssd_dropped().begin(), request->ssd_dropped().end());
          Result<SegmentChanges> changes =
              master_.renew_segment(request->segment(), request->since_version(), report);
          to_proto(changes.status(), reply->mutable_status());
          if (!changes.ok()) return;
          reply->set_version(changes->version);
          reply->set_full(changes->full);
          for (const SegmentChange& c : changes->changes) {
            rpc::SegmentChange* out = reply->add_changes();
            out->set_kind(static_cast<uint32_t>(c.kind));
            rpc_convert::to_proto(c.object, out->mutable_object());
          }
        });
    on<rpc::PutStartRequest, rpc::ReplicaListsReply>(
        MasterMethod::kPutStart, "put_start",
        [this](const rpc::PutStartRequest* request, rpc::ReplicaListsReply* reply) {
          Result<ReplicateConfig> config = rpc_convert::from_proto(request->config());
          std::vector<uint64_t> sizes(request->sizes_bytes().begin(), request->sizes_bytes().end());
          if (config.ok() && sizes.size() != static_cast<size_t>(request->keys_size())) {
            config = Status::invalid_argument(
                fmt::format("put_start: {} keys but {} sizes", request->keys_size(), sizes.size()));
          }
          if (!config.ok()) {
            for (int i = 0; i < request->keys_size(); ++i)
              to_proto(config.status(), reply->add_results()->mutable_status());
            return;
          }
          for (const auto& result : master_.put_start_batch(key_views(request->keys()), sizes, *config,
                                                            request->writer_host_id())) {
            to_proto(result, reply->add_results());
          }
        });
    on<rpc::PutFinishRequest, rpc::StatusesReply>(
        MasterMethod::kPutEnd, "put_end",
        [this](const rpc::PutFinishRequest* request, rpc::StatusesReply* reply) {
          for (const Status& s : master_.put_end_batch(key_views(request->keys()), unwritten(*request)))
            to_proto(s, reply->add_statuses());
        });
    on<rpc::PutFinishRequest, rpc::StatusesReply>(
        MasterMethod::kPutRevoke, "put_revoke",
        [this](const rpc::PutFinishRequest* request, rpc::StatusesReply* reply) {
          for (const Status& s : master_.put_revoke_batch(key_views(request->keys()), unwritten(*request))) {
            to_proto(s, reply->add_statuses());
          }
        });
    on<rpc::KeysRequest, rpc::ReplicaListsReply>(
        MasterMethod::kGetReplicaList, "get_replica_list",
        [this](const rpc::KeysRequest* request, rpc::ReplicaListsReply* reply) {
          for (const auto& result : master_.get_replica_list_batch(key_views(request->keys()))) {
            to_proto(result, reply->add_results());
          }
        });
    on<rpc::KeysRequest, rpc::ExistsReply>(MasterMethod::kExists, "exists",
                                           [this](const rpc::KeysRequest* request, rpc::ExistsReply* reply) {
                                             for (bool e : master_.exists_batch(key_views(request->keys())))
                                               reply->add_exists(e);
                                           });
    on<rpc::KeysRequest, rpc::StatusesReply>(
        MasterMethod::kRemove, "remove", [this](const rpc::KeysRequest* request, rpc::StatusesReply* reply) {
          for (const Status& s : master_.remove_batch(key_views(request->keys())))
            to_proto(s, reply->add_statuses());
        });
    on<rpc::RemoveAllRequest, rpc::RemoveAllReply>(
        MasterMethod::kRemoveAll, "remove_all",
        [this](const rpc::RemoveAllRequest*, rpc::RemoveAllReply* reply) {
          reply->set_removed(master_.remove_all());
        });
    on<rpc::StatsRequest, rpc::StatsReply>(MasterMethod::kStats, "stats",
                                           [this](const rpc::StatsRequest*, rpc::StatsReply* reply) {
                                             for (const auto& [name, value] : stats_fields(master_.stats())) {
                                               (*reply->mutable_counters())[std::string(name)] = value;
                                             }
                                             for (const SegmentInfo& s : master_.segments()) {
                                               rpc::SegmentInfo* out = reply->add_segments();
                                               out->set_segment(s.segment);
                                               out->set_owner(s.owner);
                                               out->set_host_id(s.host_id);
                                               out->set_tier(static_cast<uint32_t>(s.tier));
                                               out->set_capacity_bytes(s.capacity_bytes);
                                               out->set_used_bytes(s.used_bytes);
                                               out->set_replicas(s.replicas);
                                               out->set_ssd_capacity_bytes(s.ssd_capacity_bytes);
                                               out->set_ssd_used_bytes(s.ssd_used_bytes);
                                             }
                                           });
  }

  /// The segments each key's writer could not write (empty when it reported none).
  static std::vector<std::vector<std::string>> unwritten(const rpc::PutFinishRequest& request) {
    std::vector<std::vector<std::string>> out;
    out.reserve(static_cast<size_t>(request.unwritten_size()));
    for (const rpc::SegmentNames& names : request.unwritten())
      out.emplace_back(names.segments().begin(), names.segments().end());
    return out;
  }

  /// ControlHandler: the reply body of `method` for `body`.
  Result<std::string> handle(uint16_t method, std::string_view body) {
    if (method >= methods_.size() || !methods_[method].run) {
      return Status::invalid_argument(fmt::format("unknown store master method {}", method));
    }
    if (!leading_.load()) {  // clients find the leader in etcd and retry there
      return Status::unavailable("this store master is not serving (a standby, or shutting down)");
    }
    const Method& m = methods_[method];
    const auto start = std::chrono::steady_clock::now();
    Result<std::string> reply = m.run(body);
    m.latency->Observe(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return reply;
  }

 private:
  struct Method {
    std::function<Result<std::string>(std::string_view)> run;
    prometheus::Histogram* latency = nullptr;
  };

  /// Registers `method` named `name`: parse a Request, run `body`, serialize the Reply.
  template <typename Request, typename Reply, typename Body>
  void on(MasterMethod method, const char* name, Body body) {
    static const prometheus::Histogram::BucketBoundaries kBuckets = {
        1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 1e-1};
    const auto id = static_cast<size_t>(method);
    if (methods_.size() <= id) methods_.resize(id + 1);
    methods_[id].latency = &latency_.Add({{"method", name}}, kBuckets);
    methods_[id].run = [name, body](std::string_view bytes) -> Result<std::string> {
      Request request;
      if (!request.ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) {
        return Status::invalid_argument(fmt::format("malformed {} request ({} bytes)", name, bytes.size()));
      }
      Reply reply;
      body(&request, &reply);
      return reply.SerializeAsString();
    };
  }

  Master& master_;
  std::string transfer_metadata_;
  prometheus::Family<prometheus::Histogram>& latency_;
  const std::atomic<bool>& leading_;
  std::vector<Method> methods_;  // by MasterMethod id
};

/// The gauges and counters of Master::stats, computed at each scrape.
std::vector<prometheus::MetricFamily> collect_master_metrics(const Master& master) {
  std::vector<prometheus::MetricFamily> out;
  const MasterStats stats = master.stats();
  add_gauge(out, "crescent_store_objects", "Complete objects", static_cast<double>(stats.objects));
  add_gauge(out, "crescent_store_processing_objects", "Puts started and not yet ended",
            static_cast<double>(stats.processing_objects));
  add_gauge(out, "crescent_store_segments", "Mounted segments", static_cast<double>(stats.segments));
  add_gauge(out, "crescent_store_capacity_bytes", "Bytes of mounted segments and their owners' SSD tiers",
            static_cast<double>(stats.dram_capacity_bytes), {{"tier", "dram"}});
  add_sample(out.back(), static_cast<double>(stats.ssd_capacity_bytes), {{"tier", "ssd"}});
  add_gauge(out, "crescent_store_used_bytes", "Bytes allocated in mounted segments, and held on SSD tiers",
            static_cast<double>(stats.dram_used_bytes), {{"tier", "dram"}});
  add_sample(out.back(), static_cast<double>(stats.ssd_used_bytes), {{"tier", "ssd"}});
  const std::pair<const char*, uint64_t> counters[] = {{"puts_started", stats.puts_started},
                                                       {"puts_ended", stats.puts_ended},
                                                       {"puts_revoked", stats.puts_revoked},
                                                       {"puts_reclaimed", stats.puts_reclaimed},
                                                       {"puts_no_space", stats.puts_no_space},
                                                       {"gets", stats.gets},
                                                       {"hits", stats.hits},
                                                       {"misses", stats.misses},
                                                       {"leases_granted", stats.leases_granted},
                                                       {"leases_expired", stats.leases_expired},
                                                       {"evictions", stats.evictions},
                                                       {"evicted_bytes", stats.evicted_bytes},
                                                       {"removes", stats.removes},
                                                       {"segments_expired", stats.segments_expired},
                                                       {"segments_replaced", stats.segments_replaced},
                                                       {"objects_restored", stats.objects_restored},
                                                       {"objects_rejected", stats.objects_rejected},
                                                       {"spills", stats.spills},
                                                       {"loads", stats.loads},
                                                       {"replicas_unwritten", stats.replicas_unwritten},
                                                       {"segments_suspected", stats.segments_suspected}};
  for (const auto& [name, value] : counters) {
    add_counter(out, fmt::format("crescent_store_{}_total", name), fmt::format("MasterStats::{}", name),
                static_cast<double>(value));
  }
  return out;
}

}  // namespace

class MasterServer::Impl {
 public:
  explicit Impl(MasterServerOptions options) : options(std::move(options)), master(this->options.master) {}

  ~Impl() {
    leading = false;   // stop answering before resigning: never two leaders serving
    election.reset();  // resign: a standby takes over while this one shuts down
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    if (ticker.joinable()) ticker.join();
    server.reset();
  }

  MasterServerOptions options;
  Master master;
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::unique_ptr<Service> service;
  std::unique_ptr<ControlServer> server;
  std::unique_ptr<MetricsEndpoint> metrics;
  std::string address;
  std::string metrics_address;
  std::atomic<bool> leading{false};
  std::unique_ptr<LeaderElection> election;
  std::thread ticker;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
};

Result<std::unique_ptr<MasterServer>> MasterServer::start(MasterServerOptions options) {
  CRESCENT_RETURN_IF_ERROR(validate(options.master));
  if (options.tick_interval.count() <= 0) {
    return Status::invalid_argument(
        fmt::format("tick_interval must be > 0 ms, got {}", options.tick_interval.count()));
  }
  if (options.transfer_metadata.empty()) {
    options.transfer_metadata =
        options.etcd.endpoint.empty() ? transfer::default_metadata_spec() : "etcd:" + options.etcd.endpoint;
  }
  auto impl = std::make_unique<Impl>(std::move(options));
  impl->leading = impl->options.etcd.endpoint.empty();
  auto& latency = prometheus::BuildHistogram()
                      .Name("crescent_store_rpc_latency_seconds")
                      .Help("Time the master spends on one RPC, by method")
                      .Register(*impl->registry);
  impl->service =
      std::make_unique<Service>(impl->master, impl->options.transfer_metadata, latency, impl->leading);
  Service* service = impl->service.get();
  auto server = ControlServer::start(
      impl->options.listen_address,
      [service](uint16_t method, std::string_view body) { return service->handle(method, body); },
      store_member_key(impl->options.secret));
  if (!server.ok()) {
    return Status(server.status().code(),
                  fmt::format("cannot serve the store master on {}: {}", impl->options.listen_address,
                              server.status().message()));
  }
  impl->server = std::move(*server);
  // The listen address parsed when the server started, so this cannot fail.
  const auto host_port = net::split_host_port(impl->options.listen_address).value();
  std::string host = host_port.first;
  if (net::is_wildcard_host(host)) {
    // Bound to every address: published under the one the other members reach.
    host = impl->options.advertise_host;
    if (host.empty() && !impl->options.etcd.endpoint.empty()) {
      auto etcd = net::url_host_port(impl->options.etcd.endpoint);
      auto local = etcd.ok() ? net::local_address_toward(etcd->first, etcd->second)
                             : Result<std::string>(etcd.status());
      if (!local.ok()) return local.status();
      host = *local;
    }
    if (host.empty()) host = "127.0.0.1";
  }
  impl->address = net::endpoint_key(host, impl->server->port());
  if (!impl->options.metrics_address.empty()) {
    Master* master = &impl->master;
    const ControlServer* server = impl->server.get();
    auto metrics = MetricsEndpoint::start(impl->options.metrics_address, impl->registry, [master, server] {
      std::vector<prometheus::MetricFamily> out = collect_master_metrics(*master);
      add_counter(out, "crescent_store_clients_refused_total",
                  "Connections to the master closed unserved: no proof of membership",
                  static_cast<double>(server->clients_refused()));
      return out;
    });
    if (!metrics.ok()) return metrics.status();
    impl->metrics = std::move(*metrics);
    impl->metrics_address = impl->metrics->address();
  }
  Impl* raw = impl.get();
  if (!impl->options.etcd.endpoint.empty()) {
    auto election = LeaderElection::start(
        election_options(impl->options.etcd), impl->address, [raw](int64_t) { raw->leading = true; },
        [raw] {
          raw->leading = false;
          if (raw->options.on_leadership_lost) raw->options.on_leadership_lost();
        });
    if (!election.ok()) return election.status();
    impl->election = std::move(*election);
  }
  impl->ticker = std::thread([raw] {
    std::unique_lock<std::mutex> lock(raw->mu);
    while (!raw->cv.wait_for(lock, raw->options.tick_interval, [raw] { return raw->stopping; })) {
      lock.unlock();
      raw->master.tick();
      lock.lock();
    }
  });
  return std::unique_ptr<MasterServer>(new MasterServer(std::move(impl)));
}

MasterServer::MasterServer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MasterServer::~MasterServer() = default;
const std::string& MasterServer::address() const {
  return impl_->address;
}
const std::string& MasterServer::metrics_address() const {
  return impl_->metrics_address;
}
const std::string& MasterServer::transfer_metadata() const {
  return impl_->options.transfer_metadata;
}
Master& MasterServer::master() {
  return impl_->master;
}
bool MasterServer::is_leader() const {
  return impl_->leading.load();
}

}  // namespace crescent::store
