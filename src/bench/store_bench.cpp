#include "bench/store_bench.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <fstream>
#include <optional>
#include <random>
#include <thread>

#include "bench/redis_baseline.h"
#include "common/child_process.h"
#include "common/percentile.h"
#include "common/secret.h"
#include "common/temp_dir.h"
#include "store/client.h"
#include "store/master_client.h"

namespace crescent::bench {
namespace {

using store::Buffer;
using store::Client;
using store::ConstBuffer;
using Clock = std::chrono::steady_clock;

/// The master and the node of the bench, child processes in a private directory (members are destroyed in
/// reverse order: the node is stopped, then the master, then the directory removed).
struct StoreProcesses {
  TempDir dir;
  std::unique_ptr<ChildProcess> master;
  std::unique_ptr<ChildProcess> node;
  std::string address;
  std::optional<ClusterSecret> secret;  // members only, as in production: the handshake's cost is measured
};

Result<std::unique_ptr<StoreProcesses>> start_store(const StoreBenchOptions& options) {
  auto p = std::make_unique<StoreProcesses>();
  Result<TempDir> created = TempDir::create("crescent-bench-store");
  if (!created.ok()) return created.status();
  p->dir = std::move(*created);
  const std::string& dir = p->dir.path();
  p->secret = ClusterSecret::generate();
  const std::string secret_file = dir + "/cluster-secret";
  CRESCENT_RETURN_IF_ERROR(p->secret->write_to(secret_file));
  auto master = ChildProcess::start(
      {options.crescent_binary, "store", "master", "--listen", "127.0.0.1:0", "--metrics", "",
       "--transfer-metadata", "dir:" + dir + "/metadata", "--cluster-secret-file", secret_file},
      dir + "/master.log");
  if (!master.ok()) return master.status();
  p->master = std::move(*master);
  auto line = p->master->wait_for_line("store master on ", std::chrono::seconds(20));
  if (!line.ok()) return line.status();
  const size_t at = line->find("on ") + 3;
  p->address = line->substr(at, line->find(' ', at) - at);
  auto node = ChildProcess::start({options.crescent_binary, "store", "node", "--master", p->address, "--dram",
                                   std::to_string(options.node_dram_bytes), "--metrics", "", "--name",
                                   fmt::format("bench-node-{}", ::getpid()), "--transports", "shm,tcp",
                                   "--cluster-secret-file", secret_file},
                                  dir + "/node.log");
  if (!node.ok()) return node.status();
  p->node = std::move(*node);
  auto mounted = p->node->wait_for_line("store node: segment", std::chrono::seconds(60));
  if (!mounted.ok()) return mounted.status();
  return p;
}

/// Keys a get run reads, per thread: enough for one batch, at most 64 and 64 MiB.
uint64_t keys_per_thread(const KvRunSpec& spec) {
  return std::max<uint64_t>(spec.batch, std::clamp<uint64_t>((64ull << 20) / spec.value_bytes, 1, 64));
}

/// Value bytes with an 8-byte tag at the front, so a get can check it read the right object.
void fill_value(std::byte* out, uint64_t size, uint64_t tag) {
  for (uint64_t i = 0; i < size; ++i) out[i] = static_cast<std::byte>('a' + (i + tag) % 26);
  std::memcpy(out, &tag, std::min<uint64_t>(8, size));
}

bool has_tag(const std::byte* value, uint64_t size, uint64_t tag) {
  return std::memcmp(value, &tag, std::min<uint64_t>(8, size)) == 0;
}

/// One thread's worker: registered buffers for a batch (zero copy), its own keys.
class CrescentWorker {
 public:
  CrescentWorker(Client& client, const KvRunSpec& spec, int thread, int run)
      : client_(client), spec_(spec), thread_(thread), run_(run), memory_(spec.batch * spec.value_bytes) {}
  ~CrescentWorker() { (void)client_.unregister_buffer(memory_.data()); }

  Status setup() {
    CRESCENT_RETURN_IF_ERROR(client_.register_buffer(memory_.data(), memory_.size()));
    if (spec_.op == "put") {
      for (size_t b = 0; b < spec_.batch; ++b) fill_value(slot(b), spec_.value_bytes, b);
      return Status();
    }
    const uint64_t n = keys_per_thread(spec_);
    for (uint64_t k = 0; k < n; ++k) keys_.push_back(fmt::format("g{}-t{}-k{}", run_, thread_, k));
    for (uint64_t k = 0; k < n; k += spec_.batch) {  // preload, a batch at a time, from the worker's buffers
      std::vector<std::string_view> keys;
      std::vector<ConstBuffer> values;
      for (uint64_t b = 0; b < spec_.batch && k + b < n; ++b) {
        fill_value(slot(b), spec_.value_bytes, k + b);
        keys.push_back(keys_[k + b]);
        values.push_back({slot(b), spec_.value_bytes});
      }
      auto put = client_.batch_put(keys, values);
      if (!put.ok()) return put.status();
      for (const Status& s : *put) CRESCENT_RETURN_IF_ERROR(s);
    }
    return Status();
  }

  Status call() {
    std::vector<std::string> names;
    std::vector<std::string_view> keys;
    names.reserve(spec_.batch);
    if (spec_.op == "put") {
      std::vector<ConstBuffer> values;
      for (size_t b = 0; b < spec_.batch; ++b) {
        names.push_back(fmt::format("p{}-t{}-{}", run_, thread_, seq_++));
        values.push_back({slot(b), spec_.value_bytes});
      }
      keys.assign(names.begin(), names.end());
      auto put = client_.batch_put(keys, values);
      if (!put.ok()) return put.status();
      for (const Status& s : *put) CRESCENT_RETURN_IF_ERROR(s);
      return Status();
    }
    std::vector<Buffer> out;
    std::vector<uint64_t> tags;
    for (size_t b = 0; b < spec_.batch; ++b) {
      const uint64_t k = seq_++ % keys_.size();
      keys.push_back(keys_[k]);
      tags.push_back(k);
      out.push_back({slot(b), spec_.value_bytes});
    }
    auto got = client_.batch_get(keys, out);
    if (!got.ok()) return got.status();
    for (size_t b = 0; b < spec_.batch; ++b) {
      if (!(*got)[b].ok()) return (*got)[b].status();
      if (*(*got)[b] != spec_.value_bytes || !has_tag(slot(b), spec_.value_bytes, tags[b])) {
        return Status::internal(fmt::format("get {} returned the wrong bytes", keys[b]));
      }
    }
    return Status();
  }

 private:
  std::byte* slot(size_t b) { return memory_.data() + b * spec_.value_bytes; }

  Client& client_;
  KvRunSpec spec_;
  int thread_;
  int run_;
  std::vector<std::byte> memory_;
  std::vector<std::string> keys_;
  uint64_t seq_ = 0;
};

KvRunResult run_crescent(const StoreProcesses& store, const KvRunSpec& spec, int run) {
  store::ClientOptions options;
  options.master.address = store.address;
  options.master.secret = store.secret;
  options.staging_bytes = 8 << 20;
  options.transports = {spec.system == "crescent-shm" ? transfer::TransportKind::kShm
                                                      : transfer::TransportKind::kTcp};
  auto client = Client::create(options);
  if (!client.ok()) {
    KvRunResult failed;
    failed.spec = spec;
    failed.error = client.status().to_string();
    return failed;
  }
  KvRunResult result = drive_kv_load(spec, [&](int thread) -> Result<KvWorker> {
    auto worker = std::make_shared<CrescentWorker>(**client, spec, thread, run);
    CRESCENT_RETURN_IF_ERROR(worker->setup());
    return KvWorker([worker] { return worker->call(); });
  });
  (void)(*client)->remove_all();  // leave the next run an empty store
  return result;
}

uint64_t rss_bytes(pid_t pid) {
  std::ifstream in(fmt::format("/proc/{}/status", pid));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6)) * 1024;  // "VmRSS:   1234 kB"
  }
  return 0;
}

/// batch_exists of 1 key at several thread counts, then the master with `objects` objects: RSS per object and
/// get_replica_list latency.
Status run_metadata(const StoreBenchOptions& options, StoreProcesses& store, StoreBenchReport& report) {
  store::MasterClientOptions master_options;
  master_options.address = store.address;
  master_options.secret = store.secret;
  auto master = store::MasterClient::connect(master_options);
  if (!master.ok()) return master.status();
  for (int threads : options.metadata_threads) {
    KvRunSpec spec{"crescent-metadata", "exists", 1, threads, 1, options.duration};
    KvRunResult r = drive_kv_load(spec, [&](int) -> Result<KvWorker> {
      return KvWorker([&] {
        const std::string_view key = "absent-key";
        auto e = (*master)->exists({&key, 1});
        return e.status();
      });
    });
    if (!r.error.empty()) return Status::internal(r.error);
    report.metadata_runs.push_back({threads, r.ops_per_s, r.p50_us, r.p99_us});
  }
  if (options.metadata_objects == 0) return Status();
  // Metadata only: a segment that exists for the master alone (no bytes are moved), large enough for every
  // object.
  CRESCENT_RETURN_IF_ERROR((*master)->mount_segment({"bench-metadata-only", "bench", "none", 1ull << 40}));
  // Acknowledge the segment's change feed as a node would, so the master does not keep it for us.
  auto feed = (*master)->renew_segment("bench-metadata-only", store::kUnknownSegmentVersion);
  if (!feed.ok()) return feed.status();
  uint64_t acknowledged = feed->version;
  const uint64_t before = rss_bytes(store.master->pid());
  constexpr size_t kBatch = 1000;
  std::vector<std::string> names(kBatch);
  std::vector<std::string_view> keys(kBatch);
  std::vector<uint64_t> sizes(kBatch, 512 << 10);
  for (uint64_t start = 0; start < options.metadata_objects; start += kBatch) {
    const size_t n = std::min<uint64_t>(kBatch, options.metadata_objects - start);
    for (size_t i = 0; i < n; ++i) {
      names[i] = fmt::format("kv/{:016x}", start + i);
      keys[i] = names[i];
    }
    store::ReplicateConfig config{
        .replica_num = 1, .preferred_segment = "bench-metadata-only", .pin = store::PinKind::kNone};
    auto started = (*master)->put_start(std::span(keys).first(n), std::span(sizes).first(n), config, "");
    if (!started.ok()) return started.status();
    for (const auto& s : *started) CRESCENT_RETURN_IF_ERROR(s.status());
    auto ended = (*master)->put_end(std::span(keys).first(n));
    if (!ended.ok()) return ended.status();
    feed = (*master)->renew_segment("bench-metadata-only", acknowledged);
    if (!feed.ok()) return feed.status();
    acknowledged = feed->version;
  }
  const uint64_t after = rss_bytes(store.master->pid());
  report.master_objects = options.metadata_objects;
  report.master_rss_bytes_per_object = static_cast<double>(after > before ? after - before : 0) /
                                       static_cast<double>(options.metadata_objects);
  std::mt19937_64 rng(1);
  std::vector<double> latencies_us;
  const auto end = Clock::now() + options.duration * 2;
  while (Clock::now() < end) {
    const std::string name = fmt::format("kv/{:016x}", rng() % options.metadata_objects);
    const std::string_view key = name;
    const auto t0 = Clock::now();
    auto grant = (*master)->get_replica_list({&key, 1});
    latencies_us.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
    if (!grant.ok()) return grant.status();
    CRESCENT_RETURN_IF_ERROR((*grant)[0].status());
  }
  std::sort(latencies_us.begin(), latencies_us.end());
  report.get_replica_list_p50_us = nearest_rank(latencies_us, 50);
  report.get_replica_list_p99_us = nearest_rank(latencies_us, 99);
  return Status();
}

}  // namespace

Result<StoreBenchReport> run_store_bench(const StoreBenchOptions& options) {
  if (options.crescent_binary.empty()) return Status::invalid_argument("bench store: no crescent binary");
  for (const std::string& s : options.systems) {
    if (s != "crescent-tcp" && s != "crescent-shm" && s != "redis") {
      return Status::invalid_argument(
          fmt::format("--systems: unknown system '{}' (valid: crescent-tcp, crescent-shm, redis)", s));
    }
  }
  for (const std::string& op : options.ops) {
    if (op != "put" && op != "get")
      return Status::invalid_argument(fmt::format("--ops: unknown op '{}' (put, get)", op));
  }
  auto store = start_store(options);
  if (!store.ok()) return store.status();
  std::unique_ptr<RedisServer> redis;
  StoreBenchReport report;
  if (std::find(options.systems.begin(), options.systems.end(), "redis") != options.systems.end()) {
    auto started = RedisServer::start();
    if (!started.ok()) {
      report.warnings.push_back("redis baseline not run: " + started.status().to_string());
    } else {
      redis = std::move(*started);
    }
  }
  int run = 0;
  for (uint64_t value : options.value_bytes) {
    for (int threads : options.threads) {
      for (size_t batch : options.batches) {
        for (const std::string& op : options.ops) {
          for (const std::string& system : options.systems) {
            KvRunSpec spec{system, op, value, threads, batch, options.duration};
            KvRunResult result;
            if (system == "redis") {
              if (!redis) continue;
              result = drive_kv_load(
                  spec, [&](int thread) { return make_redis_worker(redis->port(), spec, thread); });
            } else {
              result = run_crescent(**store, spec, run++);
            }
            report.runs.push_back(result);
            if (options.progress) options.progress(result);
          }
        }
      }
    }
  }
  Status metadata = run_metadata(options, **store, report);
  if (!metadata.ok()) report.warnings.push_back("metadata figures not measured: " + metadata.to_string());
  return report;
}

}  // namespace crescent::bench
