// `crescent store master|node|stat|put|get|rm`: run the KV cache pool's master and storage nodes, and look at
// or change its contents from a shell (docs/store.md). Exit codes: 0 ok, 2 bad input, 1 anything else (not
// found, master unreachable, no space).
#include <fmt/format.h>
#include <signal.h>

#include <atomic>
#include <fstream>
#include <functional>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <thread>

#include "cli/commands.h"
#include "cli/flags.h"
#include "common/atomic_file.h"
#include "common/socket_io.h"
#include "store/client.h"
#include "store/master_client.h"
#include "store/master_server.h"
#include "store/storage_node.h"
#include "transfer/transfer_engine.h"

namespace crescent::cli {
namespace {

using namespace crescent::store;

/// "error: ..." on stderr; exit 2 for bad input, 1 otherwise.
int store_fail(const Status& status) {
  fmt::print(stderr, "error: {}\n", status.message());
  return status.code() == StatusCode::kInvalidArgument ? kExitBadInput : 1;
}

struct MasterArgs {
  std::string listen;  // empty: 127.0.0.1:50051, or with --etcd port 50051 on the interface toward etcd
  std::string advertise_host;
  std::string metrics = "127.0.0.1:9151";
  std::string transfer_metadata;
  long lease_ttl_ms = 5000;
  long segment_ttl_ms = 10000;
  long placement_stale_after_ms = 1000;
  long put_timeout_ms = 30000;
  double high_watermark = 0.95;
  double eviction_fraction = 0.05;
  std::string strategy = "random";
  std::string etcd;
  long leader_ttl_s = 5;
  std::string etcd_prefix = "/crescent-store";
  std::string cluster_secret_file;
};

/// Set from the election thread when this master is deposed; run_master then exits 1.
std::atomic<bool> g_deposed{false};

// `peer` (a URL or host:port) given: this machine's address toward it (what the peer reaches us on);
// otherwise `fallback`. `flag` names what to give instead when no route is found.
Result<std::string> address_toward(const std::string& peer, const std::string& fallback,
                                   std::string_view flag) {
  if (peer.empty()) return fallback;
  auto host_port = net::url_host_port(peer);
  if (!host_port.ok()) return host_port.status();
  auto local = net::local_address_toward(host_port->first, host_port->second);
  if (!local.ok()) {
    return Status(local.status().code(), fmt::format("finding this machine's address toward {}: {} (give {})",
                                                     peer, local.status().message(), flag));
  }
  return *local;
}

int run_master(const MasterArgs& args) {
  MasterServerOptions options;
  Result<ClusterSecret> secret = load_cluster_secret(args.cluster_secret_file);
  if (!secret.ok()) return store_fail(secret.status());
  options.secret = *secret;
  options.listen_address = args.listen;
  if (options.listen_address.empty()) {
    auto host = address_toward(args.etcd, "127.0.0.1", "--listen");
    if (!host.ok()) return store_fail(host.status());
    options.listen_address = net::endpoint_key(*host, 50051);
  }
  options.advertise_host = args.advertise_host;
  options.metrics_address = args.metrics;
  options.transfer_metadata = args.transfer_metadata;
  options.master.lease_ttl = std::chrono::milliseconds(args.lease_ttl_ms);
  options.master.segment_ttl = std::chrono::milliseconds(args.segment_ttl_ms);
  options.master.placement_stale_after = std::chrono::milliseconds(args.placement_stale_after_ms);
  options.master.put_timeout = std::chrono::milliseconds(args.put_timeout_ms);
  options.master.high_watermark = args.high_watermark;
  options.master.eviction_fraction = args.eviction_fraction;
  Result<AllocationStrategy> strategy = parse_strategy(args.strategy);
  if (!strategy.ok())
    return store_fail(Status::invalid_argument("--strategy: " + strategy.status().message()));
  options.master.strategy = *strategy;
  options.etcd.endpoint = args.etcd;
  options.etcd.prefix = args.etcd_prefix;
  options.etcd.leader_ttl = std::chrono::seconds(args.leader_ttl_s);
  options.on_leadership_lost = [] {
    g_deposed = true;
    wake_stop_signal_wait();
  };
  const sigset_t signals = block_stop_signals();
  auto server = MasterServer::start(options);
  if (!server.ok()) return store_fail(server.status());
  fmt::print(
      "store master on {} (metrics {}, transfer metadata {}{})\n", (*server)->address(),
      (*server)->metrics_address().empty() ? "off" : (*server)->metrics_address(),
      (*server)->transfer_metadata(),
      args.etcd.empty() ? "" : fmt::format(", campaigning in etcd {} under {}", args.etcd, args.etcd_prefix));
  std::fflush(stdout);
  // Says when this master starts leading (tests and operators read it). Joined before the server goes: a
  // standby stopped while it waits must not ask a destroyed server.
  std::atomic<bool> stopping{false};
  std::thread leading_watch;
  if (!args.etcd.empty()) {
    leading_watch = std::thread([&stopping, server = server->get()] {
      while (!stopping && !server->is_leader() && !g_deposed) {
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
      if (!stopping && server->is_leader()) {
        fmt::print("store master: leading\n");
        std::fflush(stdout);
      }
    });
  }
  const int signal = wait_for_stop_signal(signals);
  stopping = true;
  if (leading_watch.joinable()) leading_watch.join();
  if (g_deposed) {
    fmt::print(stderr, "error: store master lost its leadership in etcd (lease expired); stopping\n");
    return 1;
  }
  fmt::print("store master: signal {}, stopping\n", signal);
  return 0;
}

struct NodeArgs {
  std::string master = default_master_address();
  std::string etcd;
  std::string etcd_prefix = "/crescent-store";
  std::string dram = "1GiB";
  std::string ssd;
  std::string ssd_capacity;
  std::string name;
  std::string tcp_host;  // empty: the interface that reaches the master
  std::string metrics = "127.0.0.1:0";
  std::string transports = "shm,tcp";
  std::string cluster_secret_file;
};

Result<std::vector<transfer::TransportKind>> parse_transports(const std::string& text) {
  Result<std::vector<std::string>> items = parse_list("--transports", text);
  if (!items.ok()) return items.status();
  std::vector<transfer::TransportKind> out;
  for (const std::string& item : *items) {
    Result<transfer::TransportKind> kind = transfer::parse_transport(item);
    if (!kind.ok()) return Status::invalid_argument("--transports: " + kind.status().message());
    out.push_back(*kind);
  }
  return out;
}

int run_node(const NodeArgs& args) {
  StorageNodeOptions options;
  Result<ClusterSecret> secret = load_cluster_secret(args.cluster_secret_file);
  if (!secret.ok()) return store_fail(secret.status());
  options.master.secret = *secret;
  options.master.address = args.master;
  options.master.etcd.endpoint = args.etcd;
  options.master.etcd.prefix = args.etcd_prefix;
  Result<uint64_t> dram = parse_size("--dram", args.dram);
  if (!dram.ok()) return store_fail(dram.status());
  if (*dram == 0) return store_fail(Status::invalid_argument("--dram: must be more than 0 bytes"));
  options.dram_bytes = *dram;
  if (!args.ssd.empty() || !args.ssd_capacity.empty()) {
    if (args.ssd.empty() || args.ssd_capacity.empty()) {
      return store_fail(Status::invalid_argument("--ssd and --ssd-capacity go together"));
    }
    Result<uint64_t> ssd_capacity = parse_size("--ssd-capacity", args.ssd_capacity);
    if (!ssd_capacity.ok()) return store_fail(ssd_capacity.status());
    if (*ssd_capacity == 0)
      return store_fail(Status::invalid_argument("--ssd-capacity: must be more than 0 bytes"));
    options.ssd_dir = args.ssd;
    options.ssd_capacity_bytes = *ssd_capacity;
  }
  options.name = args.name;
  options.tcp_host = args.tcp_host;
  options.metrics_address = args.metrics;
  Result<std::vector<transfer::TransportKind>> transports = parse_transports(args.transports);
  if (!transports.ok()) return store_fail(transports.status());
  options.transports = *transports;
  const sigset_t signals = block_stop_signals();
  auto node = StorageNode::start(options);
  if (!node.ok()) return store_fail(node.status());
  fmt::print("store node: segment {} ({} bytes of DRAM{}), master {} (metrics {})\n", (*node)->segment(),
             *dram,
             options.ssd_dir.empty()
                 ? ""
                 : fmt::format(", {} bytes of SSD in {}", options.ssd_capacity_bytes, options.ssd_dir),
             args.etcd.empty() ? args.master : "led in etcd " + args.etcd,
             (*node)->metrics_address().empty() ? "off" : (*node)->metrics_address());
  if (!options.ssd_dir.empty()) {
    const store::SsdTier::Adopted& adopted = (*node)->ssd_adopted();
    fmt::print(
        "store node: adopted {} objects ({} bytes) from {} in {:.2f} s; {} files failed a check or did "
        "not fit and were deleted\n",
        adopted.objects, adopted.bytes, options.ssd_dir, adopted.seconds, adopted.dropped);
  }
  std::fflush(stdout);
  const int signal = wait_for_stop_signal(signals);
  fmt::print("store node: signal {}, unmounting\n", signal);
  return 0;
}

/// Where the shell commands find the master: an address, or the leader in etcd.
struct MasterTarget {
  std::string address;
  std::string etcd;
  std::string etcd_prefix;
  std::optional<ClusterSecret> secret;

  MasterClientOptions options() const {
    MasterClientOptions o;
    o.secret = secret;
    o.address = address;
    o.etcd.endpoint = etcd;
    o.etcd.prefix = etcd_prefix;
    o.failover_budget = std::chrono::milliseconds(3000);
    return o;
  }
  std::string name() const { return etcd.empty() ? address : "led in etcd " + etcd; }
};

Result<std::unique_ptr<Client>> connect_client(const MasterTarget& master) {
  ClientOptions options;
  options.master = master.options();
  options.staging_bytes = 4 << 20;
  return Client::create(options);
}

int run_stat(const MasterTarget& target, bool json) {
  auto master = MasterClient::connect(target.options());
  if (!master.ok()) return store_fail(master.status());
  auto snapshot = (*master)->stats();
  if (!snapshot.ok()) return store_fail(snapshot.status());
  if (json) {
    nlohmann::ordered_json out;
    out["master"] = (*master)->address();
    for (const auto& [name, value] : stats_fields(snapshot->stats)) out["stats"][std::string(name)] = value;
    out["segments"] = nlohmann::ordered_json::array();
    for (const SegmentInfo& s : snapshot->segments) {
      out["segments"].push_back({{"segment", s.segment},
                                 {"owner", s.owner},
                                 {"host_id", s.host_id},
                                 {"tier", tier_name(s.tier)},
                                 {"capacity_bytes", s.capacity_bytes},
                                 {"used_bytes", s.used_bytes},
                                 {"replicas", s.replicas},
                                 {"ssd_capacity_bytes", s.ssd_capacity_bytes},
                                 {"ssd_used_bytes", s.ssd_used_bytes}});
    }
    fmt::print("{}\n", dump_json(out, 2));
    return 0;
  }
  fmt::print("store master {}: {} segment{}\n", (*master)->address(), snapshot->segments.size(),
             snapshot->segments.size() == 1 ? "" : "s");
  fmt::print("  {:<40} {:>14} {:>14} {:>6} {:>14} {:>14} {:>9}  {}\n", "segment", "DRAM B", "used B", "used",
             "SSD B", "SSD used B", "replicas", "owner");
  for (const SegmentInfo& s : snapshot->segments) {
    const double used = s.capacity_bytes == 0 ? 0.0
                                              : 100.0 * static_cast<double>(s.used_bytes) /
                                                    static_cast<double>(s.capacity_bytes);
    fmt::print("  {:<40} {:>14} {:>14} {:>5.1f}% {:>14} {:>14} {:>9}  {}\n", s.segment, s.capacity_bytes,
               s.used_bytes, used, s.ssd_capacity_bytes, s.ssd_used_bytes, s.replicas, s.owner);
  }
  for (const auto& [name, value] : stats_fields(snapshot->stats)) fmt::print("  {:<22} {}\n", name, value);
  return 0;
}

int run_put(const MasterTarget& master, const std::string& key, const std::string& file, long replicas,
            const std::string& pin_name) {
  Result<PinKind> pin = parse_pin(pin_name);
  if (!pin.ok()) return store_fail(Status::invalid_argument("--pin: " + pin.status().message()));
  std::ifstream in(file, std::ios::binary);
  if (!in) return store_fail(Status::invalid_argument(fmt::format("--file {}: cannot be read", file)));
  std::string value((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (value.empty()) return store_fail(Status::invalid_argument(fmt::format("--file {}: is empty", file)));
  auto client = connect_client(master);
  if (!client.ok()) return store_fail(client.status());
  ConstBuffer buffer{value.data(), value.size()};
  Status put =
      (*client)->put(key, {&buffer, 1},
                     {.replica_num = static_cast<uint32_t>(replicas), .preferred_segment = "", .pin = *pin});
  if (!put.ok()) return store_fail(put);
  fmt::print("stored {} bytes under {} ({} replica{})\n", value.size(), key, replicas,
             replicas == 1 ? "" : "s");
  return 0;
}

int run_get(const MasterTarget& master, const std::string& key, const std::string& file) {
  auto client = connect_client(master);
  if (!client.ok()) return store_fail(client.status());
  auto value = (*client)->get_value(key);
  if (!value.ok()) return store_fail(value.status());
  Status written = write_file_atomically(
      file, std::string_view(reinterpret_cast<const char*>(value->data()), value->size()));
  if (!written.ok()) return store_fail(written);
  fmt::print(stderr, "read {} bytes of {} into {}\n", value->size(), key, file);
  return 0;
}

int run_rm(const MasterTarget& master, const std::string& key, bool all) {
  auto client = connect_client(master);
  if (!client.ok()) return store_fail(client.status());
  if (all) {
    auto removed = (*client)->remove_all();
    if (!removed.ok()) return store_fail(removed.status());
    fmt::print("removed {} object{}\n", *removed, *removed == 1 ? "" : "s");
    return 0;
  }
  if (key.empty()) return store_fail(Status::invalid_argument("store rm: give a KEY or --all"));
  Status removed = (*client)->remove(key);
  if (!removed.ok()) return store_fail(removed);
  return 0;
}

}  // namespace

void register_store(CLI::App& app, int& exit_code) {
  CLI::App* store = app.add_subcommand("store", "The KV cache pool: master, storage nodes, and shell access");
  store->require_subcommand(1);

  auto master_args = std::make_shared<MasterArgs>();
  CLI::App* master =
      store->add_subcommand("master", "Run the store's master (metadata only) until SIGINT/SIGTERM");
  master->add_option("--listen", master_args->listen,
                     "control-protocol address host:port, port 0 picks one (default: 127.0.0.1:50051; with "
                     "--etcd, port 50051 on the interface that reaches etcd)");
  master->add_option("--advertise-host", master_args->advertise_host,
                     "with --listen on every address (0.0.0.0:P): the host nodes and clients reach it on");
  master->add_option("--metrics", master_args->metrics, "/metrics address host:port ('' = off)")
      ->capture_default_str();
  master->add_option(
      "--transfer-metadata", master_args->transfer_metadata,
      "where segments are published: dir:PATH or etcd:URL (default: dir:/tmp/crescent-store-UID/metadata)");
  master->add_option("--lease-ttl-ms", master_args->lease_ttl_ms, "read lease")->capture_default_str();
  master
      ->add_option("--segment-ttl-ms", master_args->segment_ttl_ms,
                   "a segment not renewed this long is unmounted")
      ->capture_default_str();
  master
      ->add_option("--placement-stale-after-ms", master_args->placement_stale_after_ms,
                   "a segment not renewed this long gets no new replicas (at most --segment-ttl-ms)")
      ->capture_default_str();
  master->add_option("--put-timeout-ms", master_args->put_timeout_ms, "a put not ended by then is reclaimed")
      ->capture_default_str();
  master
      ->add_option("--high-watermark", master_args->high_watermark, "evict above this fraction of DRAM used")
      ->capture_default_str();
  master
      ->add_option("--eviction-fraction", master_args->eviction_fraction,
                   "fraction of capacity one eviction frees")
      ->capture_default_str();
  master->add_option("--strategy", master_args->strategy, "replica placement: random, most-free, local-first")
      ->capture_default_str();
  master->add_option(
      "--etcd", master_args->etcd,
      "campaign for leadership in this etcd (http://HOST:PORT); several masters: one leads, the others "
      "stand by");
  master
      ->add_option("--leader-ttl-s", master_args->leader_ttl_s,
                   "the leader's etcd lease: a standby takes over "
                   "this long after the leader dies")
      ->check(CLI::Range(1, 600))
      ->capture_default_str();
  master->add_option("--etcd-prefix", master_args->etcd_prefix, "key prefix of this store in etcd")
      ->capture_default_str();
  add_cluster_secret_option(master, master_args->cluster_secret_file,
                            "only nodes and clients holding it are served");
  master->callback(
      [master_args, &exit_code] { run_guarded(exit_code, [&] { return run_master(*master_args); }); });

  auto node_args = std::make_shared<NodeArgs>();
  CLI::App* node = store->add_subcommand("node", "Run a storage node contributing DRAM until SIGINT/SIGTERM");
  node->add_option("--master", node_args->master,
                   "master address (default $CRESCENT_STORE_MASTER or 127.0.0.1:50051)")
      ->capture_default_str();
  node->add_option("--etcd", node_args->etcd, "find the leading master in this etcd instead of --master");
  node->add_option("--etcd-prefix", node_args->etcd_prefix, "key prefix of this store in etcd")
      ->capture_default_str();
  node->add_option("--dram", node_args->dram, "DRAM segment size, e.g. 4GiB")->capture_default_str();
  node->add_option("--ssd", node_args->ssd,
                   "directory of an SSD tier: objects evicted from DRAM are kept there");
  node->add_option("--ssd-capacity", node_args->ssd_capacity, "size of the SSD tier, e.g. 64GiB");
  node->add_option("--name", node_args->name,
                   "engine name, unique in the cluster (default store-node-HOST-PID)");
  node->add_option("--tcp-host", node_args->tcp_host,
                   "address clients reach this node on (default: the interface that reaches the master)");
  node->add_option("--metrics", node_args->metrics, "/metrics address host:port ('' = off)")
      ->capture_default_str();
  node->add_option("--transports", node_args->transports, "comma list of shm, tcp, ucx")
      ->capture_default_str();
  add_cluster_secret_option(node, node_args->cluster_secret_file, "the master's, from the same file");
  node->callback([node_args, &exit_code] { run_guarded(exit_code, [&] { return run_node(*node_args); }); });

  struct ShellArgs {
    std::string master = default_master_address();
    std::string etcd;
    std::string etcd_prefix = "/crescent-store";
    std::string key;
    std::string file;
    long replicas = 1;
    std::string pin = "none";
    bool json = false;
    bool all = false;
    std::string cluster_secret_file;
  };
  auto shell = std::make_shared<ShellArgs>();
  auto add_master = [&](CLI::App* cmd) {
    cmd->add_option("--master", shell->master,
                    "master address (default $CRESCENT_STORE_MASTER or 127.0.0.1:50051)");
    cmd->add_option("--etcd", shell->etcd, "find the leading master in this etcd instead of --master");
    cmd->add_option("--etcd-prefix", shell->etcd_prefix, "key prefix of this store in etcd");
    add_cluster_secret_option(cmd, shell->cluster_secret_file, "the store's, from the same file");
  };
  // The master to call, as a member: `run` with it, or the error that the secret could not be had.
  auto with_target = [shell](const std::function<int(const MasterTarget&)>& run) {
    Result<ClusterSecret> secret = load_cluster_secret(shell->cluster_secret_file);
    if (!secret.ok()) return store_fail(secret.status());
    return run(MasterTarget{shell->master, shell->etcd, shell->etcd_prefix, *secret});
  };
  CLI::App* stat = store->add_subcommand("stat", "Segments, objects, hits and misses, evictions, leases");
  add_master(stat);
  stat->add_flag("--json", shell->json, "JSON instead of a table");
  stat->callback([shell, with_target, &exit_code] {
    run_guarded(exit_code,
                [&] { return with_target([&](const MasterTarget& t) { return run_stat(t, shell->json); }); });
  });

  CLI::App* put = store->add_subcommand("put", "Store a file's bytes under KEY");
  add_master(put);
  put->add_option("KEY", shell->key, "key (1..1024 bytes)")->required();
  put->add_option("--file", shell->file, "the value")->required();
  put->add_option("--replicas", shell->replicas, "replicas on distinct segments")->check(CLI::Range(1, 64));
  put->add_option("--pin", shell->pin, "none, soft or hard");
  put->callback([shell, with_target, &exit_code] {
    run_guarded(exit_code, [&] {
      return with_target([&](const MasterTarget& t) {
        return run_put(t, shell->key, shell->file, shell->replicas, shell->pin);
      });
    });
  });

  CLI::App* get = store->add_subcommand("get", "Write KEY's value to a file");
  add_master(get);
  get->add_option("KEY", shell->key, "key")->required();
  get->add_option("--file", shell->file, "where to write the value")->required();
  get->callback([shell, with_target, &exit_code] {
    run_guarded(exit_code, [&] {
      return with_target([&](const MasterTarget& t) { return run_get(t, shell->key, shell->file); });
    });
  });

  CLI::App* rm = store->add_subcommand("rm", "Remove KEY (or --all: every object not being read)");
  add_master(rm);
  rm->add_option("KEY", shell->key, "key");
  rm->add_flag("--all", shell->all, "remove everything not under a read lease");
  rm->callback([shell, with_target, &exit_code] {
    run_guarded(exit_code, [&] {
      return with_target([&](const MasterTarget& t) { return run_rm(t, shell->key, shell->all); });
    });
  });
}

}  // namespace crescent::cli
