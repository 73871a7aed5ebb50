#include "store/storage_node.h"

#include <fmt/format.h>
#include <unistd.h>

#include "common/socket_io.h"
#include "store/metrics.h"
#include "store/mounted_segment.h"
#include "transfer/metadata.h"

namespace crescent::store {

class StorageNode::Impl {
 public:
  ~Impl() {
    metrics.reset();
    segment.reset();  // before the engine it lives in
  }

  StorageNodeOptions options;
  std::unique_ptr<MasterClient> master;
  std::unique_ptr<transfer::TransferEngine> engine;
  std::unique_ptr<MountedSegment> segment;
  std::unique_ptr<MetricsEndpoint> metrics;
  std::string metrics_address;
};

namespace {

std::vector<prometheus::MetricFamily> collect_node_metrics(const transfer::TransferEngine& engine,
                                                           const MountedSegment& segment) {
  std::vector<prometheus::MetricFamily> out;
  add_counter(out, "crescent_store_node_remounts_total",
              "Times the segment was mounted again after the master lost it",
              static_cast<double>(segment.remounts()));
  add_gauge(out, "crescent_store_node_capacity_bytes", "Bytes this node contributes, by tier",
            static_cast<double>(segment.capacity_bytes()), {{"tier", "dram"}});
  add_sample(out.back(), static_cast<double>(segment.ssd_capacity_bytes()), {{"tier", "ssd"}});
  add_gauge(out, "crescent_store_node_ssd_used_bytes", "Bytes of objects in this node's SSD tier",
            static_cast<double>(segment.ssd_used_bytes()));
  add_counter(out, "crescent_store_node_ssd_spill_failures_total",
              "Spills the SSD tier could not write (those objects were dropped)",
              static_cast<double>(segment.ssd_spill_failures()));
  add_gauge(out, "crescent_store_node_ssd_adopted_objects",
            "SSD tier files a previous run left that this node adopted at start (checksums verified)",
            static_cast<double>(segment.ssd_adopted().objects));
  add_gauge(out, "crescent_store_node_ssd_adopt_dropped_files",
            "SSD tier files found at start and deleted: failed a check, half written, or over capacity",
            static_cast<double>(segment.ssd_adopted().dropped));
  add_gauge(out, "crescent_store_node_objects", "Objects this node holds, by tier",
            static_cast<double>(segment.indexed_objects()), {{"tier", "dram"}});
  add_sample(out.back(), static_cast<double>(segment.ssd_objects()), {{"tier", "ssd"}});
  const transfer::EngineStats stats = engine.stats();
  add_counter(out, "crescent_store_node_transfer_bytes_total",
              "Payload bytes the node's transfer engine moved", static_cast<double>(stats.bytes_transferred));
  add_counter(out, "crescent_store_node_remote_accesses_refused_total",
              "Peer accesses refused (unknown segment, out of bounds)",
              static_cast<double>(stats.remote_accesses_refused));
  add_counter(out, "crescent_store_node_peers_refused_total",
              "Connections to the node's transfer engine closed unserved: no proof of membership",
              static_cast<double>(stats.peers_refused));
  return out;
}

}  // namespace

Result<std::unique_ptr<StorageNode>> StorageNode::start(StorageNodeOptions options) {
  if (options.dram_bytes == 0) return Status::invalid_argument("store node: --dram is 0 bytes");
  if (!options.ssd_dir.empty() && options.ssd_capacity_bytes == 0) {
    return Status::invalid_argument("store node: --ssd needs --ssd-capacity of more than 0 bytes");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  if (impl->options.name.empty()) {
    char host[256] = {};
    ::gethostname(host, sizeof(host) - 1);
    impl->options.name = fmt::format("store-node-{}-{}", host, ::getpid());
  }
  auto master = MasterClient::connect(impl->options.master);
  if (!master.ok()) return master.status();
  impl->master = std::move(*master);
  auto metadata = transfer::open_metadata(impl->master->info().transfer_metadata);
  if (!metadata.ok()) return metadata.status();
  transfer::EngineOptions engine_options;
  engine_options.name = impl->options.name;
  engine_options.metadata = *metadata;
  engine_options.transports = impl->options.transports;
  engine_options.secret = impl->options.master.secret;
  engine_options.tcp.listen_host = impl->options.tcp_host;
  if (engine_options.tcp.listen_host.empty()) {
    // Clients reach this node's segment on the interface the master is reached through.
    auto host = net::split_host_port(impl->master->address());
    auto local =
        host.ok() ? net::local_address_toward(host->first, host->second) : Result<std::string>(host.status());
    if (!local.ok()) return local.status();
    engine_options.tcp.listen_host = *local;
  }
  auto engine = transfer::TransferEngine::create(engine_options);
  if (!engine.ok()) return engine.status();
  impl->engine = std::move(*engine);
  auto segment = MountedSegment::mount(*impl->engine, *impl->master, impl->options.name + "/dram",
                                       impl->options.name, impl->options.dram_bytes,
                                       {.sync_interval = impl->options.sync_interval,
                                        .ssd_dir = impl->options.ssd_dir,
                                        .ssd_capacity_bytes = impl->options.ssd_capacity_bytes,
                                        .ssd_delay_for_testing = impl->options.ssd_delay_for_testing});
  if (!segment.ok()) return segment.status();
  impl->segment = std::move(*segment);
  if (!impl->options.metrics_address.empty()) {
    const transfer::TransferEngine* e = impl->engine.get();
    const MountedSegment* s = impl->segment.get();
    auto metrics = MetricsEndpoint::start(impl->options.metrics_address, nullptr,
                                          [e, s] { return collect_node_metrics(*e, *s); });
    if (!metrics.ok()) return metrics.status();
    impl->metrics = std::move(*metrics);
    impl->metrics_address = impl->metrics->address();
  }
  return std::unique_ptr<StorageNode>(new StorageNode(std::move(impl)));
}

StorageNode::StorageNode(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
StorageNode::~StorageNode() = default;
const std::string& StorageNode::segment() const {
  return impl_->segment->name();
}
const std::string& StorageNode::metrics_address() const {
  return impl_->metrics_address;
}
uint64_t StorageNode::indexed_objects() const {
  return impl_->segment->indexed_objects();
}
uint64_t StorageNode::ssd_spill_failures() const {
  return impl_->segment->ssd_spill_failures();
}
const SsdTier::Adopted& StorageNode::ssd_adopted() const {
  return impl_->segment->ssd_adopted();
}

}  // namespace crescent::store
