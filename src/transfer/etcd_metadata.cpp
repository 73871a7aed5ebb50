// The etcd-backed MetadataService: etcd 3.4+ spoken to through its v3 JSON gateway with EtcdClient
// (etcd_client.h), so the only client dependency is an HTTP library.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <set>
#include <thread>

#include "common/etcd_client.h"
#include "transfer/metadata.h"

namespace crescent::transfer {
namespace {

using nlohmann::json;

std::string this_host() {
  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  return host;
}

/// A random number drawn once per process: with the host and pid it tells this process from an earlier one
/// that had the same pid (a restarted container's processes start at the same pids).
uint64_t this_process_token() {
  static const uint64_t token = (uint64_t{std::random_device{}()} << 32) | std::random_device{}();
  return token;
}

std::string claim_value(std::string_view engine) {
  // The owner's pid and host serve error messages ("claimed by pid N on host H") and let a restarted owner
  // take back a claim its dead predecessor left (claim_left_by_dead_process); the key holds the name, so
  // bytes that are not UTF-8 may be replaced here rather than fail the claim.
  return json{{"engine", engine},
              {"pid", static_cast<int64_t>(getpid())},
              {"host", this_host()},
              {"process", std::to_string(this_process_token())}}
      .dump(-1, ' ', false, json::error_handler_t::replace);
}

/// Whether a claim's value names a process of this host that no longer runs: its pid is gone, or it is this
/// process's pid under another process token (an earlier incarnation). Such a claim only waits out its
/// lease; an owner restarted under the same name may take it at once instead of failing for lease_ttl.
bool claim_left_by_dead_process(const std::string& value) {
  json owner = json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (!owner.is_object() || !owner.contains("pid") || !owner["pid"].is_number_integer() ||
      owner.value("host", "") != this_host()) {
    return false;
  }
  const auto pid = owner["pid"].get<int64_t>();
  if (pid <= 0) return false;
  if (pid == getpid()) return owner.value("process", "") != std::to_string(this_process_token());
  return ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
}

std::string describe_claim_owner(const std::string& value) {
  json owner = json::parse(value, nullptr, /*allow_exceptions=*/false);
  if (!owner.is_object() || !owner.contains("pid") || !owner.contains("host") || !owner["host"].is_string()) {
    return "another process";
  }
  return fmt::format("pid {} on host {}", owner["pid"].dump(), owner["host"].get<std::string>());
}

class EtcdMetadata final : public MetadataService {
 public:
  EtcdMetadata(const EtcdOptions& options, EtcdClient etcd)
      : etcd_(std::move(etcd)), prefix_(options.prefix), lease_ttl_(options.lease_ttl) {
    while (prefix_.ends_with('/')) prefix_.pop_back();  // "/crescent/" and "/crescent" name the same keys
    // Our lease expired behind the keepalive thread's back; have it restore the claims now. Set without
    // mutex_ (lookups do not hold it), so a wakeup may be missed; the next tick then catches it.
    etcd_.set_lease_lost_callback([this] {
      lease_suspect_.store(true);
      wake_.notify_all();
    });
  }

  ~EtcdMetadata() override {
    {
      std::lock_guard lock(mutex_);
      stop_ = true;
    }
    wake_.notify_all();
    if (keepalive_thread_.joinable()) keepalive_thread_.join();
    // Revoking deletes every key attached to the lease: the claims and descriptors vanish now instead of
    // one TTL later. Best effort: if etcd is unreachable they still expire with the lease.
    if (lease_id_ != 0) (void)etcd_.revoke_lease(lease_id_);
  }

  /// Grants the lease and starts its keepalive thread.
  Status start() {
    auto lease = etcd_.grant_lease(lease_ttl_);
    if (!lease.ok()) return lease.status();
    lease_id_ = *lease;
    keepalive_thread_ = std::thread([this] { keepalive_loop(); });
    return Status();
  }

  Status claim_engine(std::string_view engine) override {
    CRESCENT_RETURN_IF_ERROR(validate_metadata_name("engine", engine));
    std::lock_guard lock(mutex_);
    std::string name(engine);
    if (engines_.contains(name)) {
      return Status::already_exists(fmt::format("engine '{}' is already claimed by this process", engine));
    }
    std::optional<EtcdKeyValue> owner;
    auto created = etcd_.create_if_absent(engine_key(name), claim_value(engine), lease_id_, &owner);
    if (!created.ok()) return created.status();
    if (!*created && owner.has_value() && claim_left_by_dead_process(owner->value)) {
      // The dead process's lease goes, and with it every key it held (its segments too, which this engine
      // publishes again); then the name is claimed as usual. An error: it ran out meanwhile.
      (void)etcd_.revoke_lease(owner->lease);
      owner.reset();
      created = etcd_.create_if_absent(engine_key(name), claim_value(engine), lease_id_, &owner);
      if (!created.ok()) return created.status();
    }
    if (!*created) {
      std::string who = owner.has_value() ? describe_claim_owner(owner->value) : "another owner";
      return Status::already_exists(
          fmt::format("engine '{}' is already claimed in etcd at {} under '{}' (by {})", engine,
                      etcd_.endpoint(), prefix_, who));
    }
    engines_.insert(std::move(name));
    return Status();
  }

  Status release_engine(std::string_view engine) override {
    std::lock_guard lock(mutex_);
    auto claimed = engines_.find(std::string(engine));
    if (claimed == engines_.end()) return Status();
    // Segments first, so that nobody sees them once the name is free to be claimed again. Each delete is
    // conditional on the key still holding our lease: after a lease loss the name may belong to a new owner.
    for (auto it = segments_.begin(); it != segments_.end();) {
      if (it->second.engine != engine) {
        ++it;
        continue;
      }
      CRESCENT_RETURN_IF_ERROR(etcd_.delete_if_lease(segment_key(it->first), lease_id_).status());
      it = segments_.erase(it);
    }
    CRESCENT_RETURN_IF_ERROR(etcd_.delete_if_lease(engine_key(*claimed), lease_id_).status());
    engines_.erase(claimed);
    return Status();
  }

  Status publish(const SegmentDescriptor& descriptor) override {
    CRESCENT_RETURN_IF_ERROR(validate_metadata_name("segment", descriptor.name));
    std::string value;
    try {
      value = descriptor.to_json().dump();
    } catch (const json::exception& e) {  // e.g. a string field that is not UTF-8
      return Status::invalid_argument(fmt::format(
          "publish: descriptor of segment '{}' cannot be serialized: {}", descriptor.name, e.what()));
    }
    std::lock_guard lock(mutex_);
    if (!engines_.contains(descriptor.engine)) {
      return Status::failed_precondition(fmt::format(
          "publish: engine '{}' of segment '{}' is not claimed by this process (claim_engine first; "
          "a claim is also lost when its lease expires and another owner takes the name)",
          descriptor.engine, descriptor.name));
    }
    const std::string key = segment_key(descriptor.name);
    // Create if absent, else replace if it is ours (our lease and our engine). A failed compare of the
    // second step means the key changed hands in between; start over, a bounded number of times.
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::optional<EtcdKeyValue> existing;
      auto created = etcd_.create_if_absent(key, value, lease_id_, &existing);
      if (!created.ok()) return created.status();
      if (!*created) {
        if (!existing.has_value()) continue;  // deleted in between
        std::string owner = owner_engine(existing->value);
        if (existing->lease != lease_id_ || owner != descriptor.engine) {
          return Status::already_exists(
              fmt::format("segment '{}' is already published in etcd at {} under '{}' by engine '{}'",
                          descriptor.name, etcd_.endpoint(), prefix_, owner));
        }
        auto replaced = etcd_.transaction({EtcdClient::compare_lease(key, lease_id_)},
                                          {EtcdClient::put_op(key, value, lease_id_)}, {});
        if (!replaced.ok()) return replaced.status();
        if (!replaced->succeeded) continue;
      }
      segments_[descriptor.name] = PublishedSegment{descriptor.engine, std::move(value)};
      return Status();
    }
    return Status::unavailable(
        fmt::format("publish: segment '{}' kept changing owner in etcd at {} while publishing; retry",
                    descriptor.name, etcd_.endpoint()));
  }

  Status withdraw(std::string_view segment) override {
    std::lock_guard lock(mutex_);
    auto it = segments_.find(std::string(segment));
    if (it == segments_.end()) {
      return Status::not_found(
          fmt::format("withdraw: segment '{}' is not published by this process", segment));
    }
    auto deleted = etcd_.delete_if_lease(segment_key(it->first), lease_id_);
    if (!deleted.ok()) return deleted.status();
    segments_.erase(it);
    if (!*deleted) {
      return Status::not_found(
          fmt::format("withdraw: segment '{}' was no longer ours in etcd at {} (its lease expired)", segment,
                      etcd_.endpoint()));
    }
    return Status();
  }

  Result<SegmentDescriptor> lookup(std::string_view segment) override {
    auto kv = etcd_.get(segment_key(segment));
    if (!kv.ok()) return kv.status();
    if (!kv->has_value()) {
      return Status::not_found(
          fmt::format("segment '{}' not found in etcd at {} under '{}'", segment, etcd_.endpoint(), prefix_));
    }
    auto where = [&] {
      return fmt::format("segment '{}' in etcd at {} under '{}'", segment, etcd_.endpoint(), prefix_);
    };
    json parsed = json::parse((*kv)->value, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_discarded()) return Status::invalid_argument(fmt::format("{}: value is not JSON", where()));
    auto descriptor = SegmentDescriptor::from_json(parsed);
    if (!descriptor.ok()) {
      return Status::invalid_argument(fmt::format("{}: {}", where(), descriptor.status().message()));
    }
    if (descriptor->name != segment) {
      return Status::invalid_argument(
          fmt::format("{}: holds the descriptor of segment '{}'", where(), descriptor->name));
    }
    return descriptor;
  }

  Result<std::vector<std::string>> list_segments() override {
    const std::string start = prefix_ + "/segments/";
    auto keys = etcd_.list_keys(start);
    if (!keys.ok()) return keys.status();
    std::vector<std::string> names;
    for (const std::string& key : *keys) {
      if (key.starts_with(start)) names.push_back(key.substr(start.size()));
    }
    std::sort(names.begin(), names.end());
    return names;
  }

 private:
  struct PublishedSegment {
    std::string engine;
    std::string value;  // the JSON stored in etcd, kept to restore it under a new lease
  };

  std::string engine_key(std::string_view engine) const {
    return fmt::format("{}/engines/{}", prefix_, engine);
  }
  std::string segment_key(std::string_view segment) const {
    return fmt::format("{}/segments/{}", prefix_, segment);
  }

  static std::string owner_engine(const std::string& value) {
    json parsed = json::parse(value, nullptr, /*allow_exceptions=*/false);
    if (parsed.is_object() && parsed.contains("engine") && parsed["engine"].is_string()) {
      return parsed["engine"].get<std::string>();
    }
    return "?";
  }

  void keepalive_loop() {
    const auto interval = std::chrono::duration_cast<std::chrono::milliseconds>(lease_ttl_) / 3;
    std::unique_lock lock(mutex_);
    while (true) {
      wake_.wait_for(lock, interval, [&] { return stop_ || lease_suspect_.load(); });
      if (stop_) return;
      lease_suspect_.store(false);
      const int64_t lease = lease_id_;
      lock.unlock();
      auto alive = etcd_.keep_alive(lease);  // a network error is retried at the next tick
      lock.lock();
      if (stop_) return;
      if (alive.ok() && !*alive && lease == lease_id_) restore_under_new_lease();
    }
  }

  /// The lease is gone (etcd was unreachable for longer than the TTL, or someone revoked it), and with it
  /// every key. Re-creates what is still free under a new lease and forgets what another owner took.
  /// REQUIRES: mutex_ held.
  void restore_under_new_lease() {
    auto lease = etcd_.grant_lease(lease_ttl_);
    if (!lease.ok()) return;  // still unreachable; the next tick retries
    auto abandon = [&] { (void)etcd_.revoke_lease(*lease); };
    std::set<std::string> engines;
    for (const std::string& engine : engines_) {
      auto created = etcd_.create_if_absent(engine_key(engine), claim_value(engine), *lease);
      if (!created.ok()) return abandon();
      if (*created) engines.insert(engine);
    }
    std::map<std::string, PublishedSegment> segments;
    for (auto& [name, segment] : segments_) {
      if (!engines.contains(segment.engine)) continue;
      auto created = etcd_.create_if_absent(segment_key(name), segment.value, *lease);
      if (!created.ok()) return abandon();
      if (*created) segments.emplace(name, segment);
    }
    lease_id_ = *lease;
    engines_ = std::move(engines);
    segments_ = std::move(segments);
  }

  EtcdClient etcd_;     // its lease-lost callback nudges the keepalive thread
  std::string prefix_;  // without a trailing '/'
  const std::chrono::seconds lease_ttl_;

  std::mutex mutex_;  // guards the fields below; held across a mutation's etcd calls to serialize mutations
  std::condition_variable wake_;
  bool stop_ = false;
  int64_t lease_id_ = 0;
  std::set<std::string> engines_;                     // claimed by this instance
  std::map<std::string, PublishedSegment> segments_;  // published by this instance, by name
  std::atomic<bool> lease_suspect_{false};            // a call saw "lease not found": check before the tick
  std::thread keepalive_thread_;
};

}  // namespace

Result<std::shared_ptr<MetadataService>> make_etcd_metadata(const EtcdOptions& options) {
  // etcd raises a TTL below its minimum (1.5 election timeouts: 2 s by default) to that minimum; the
  // keepalive period stays a third of what was asked, which is only more frequent than needed.
  if (options.lease_ttl < std::chrono::seconds(1)) {
    return Status::invalid_argument(
        fmt::format("etcd lease_ttl must be at least 1 s, got {} s", options.lease_ttl.count()));
  }
  auto etcd = EtcdClient::create(options.endpoint, options.request_timeout);
  if (!etcd.ok()) return etcd.status();
  auto service = std::make_shared<EtcdMetadata>(options, std::move(*etcd));
  CRESCENT_RETURN_IF_ERROR(service->start());
  return std::shared_ptr<MetadataService>(std::move(service));
}

}  // namespace crescent::transfer
