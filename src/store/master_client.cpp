#include "store/master_client.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <thread>

#include "common/socket_io.h"
#include "store.pb.h"
#include "store/control_rpc.h"
#include "store/rpc_convert.h"

namespace crescent::store {

std::string default_master_address() {
  const char* env = std::getenv("CRESCENT_STORE_MASTER");
  return env != nullptr && *env != '\0' ? std::string(env) : std::string("127.0.0.1:50051");
}

namespace {

using rpc_convert::from_proto;
using rpc_convert::to_proto;

template <typename Repeated>
void add_keys(Repeated* out, std::span<const std::string_view> keys) {
  out->Reserve(static_cast<int>(keys.size()));
  for (std::string_view key : keys) out->Add(std::string(key));
}

Result<std::vector<Status>> statuses(const rpc::StatusesReply& reply, size_t expected) {
  if (static_cast<size_t>(reply.statuses_size()) != expected) {
    return Status::internal(
        fmt::format("master answered {} statuses for {} keys", reply.statuses_size(), expected));
  }
  std::vector<Status> out;
  out.reserve(expected);
  for (const rpc::Status& s : reply.statuses()) out.push_back(from_proto(s));
  return out;
}

/// One result per key from a ReplicaListsReply: the key's error, or `convert` of its list.
template <typename T, typename Convert>
Result<std::vector<Result<T>>> replica_lists(const rpc::ReplicaListsReply& reply, size_t keys,
                                             Convert&& convert) {
  if (static_cast<size_t>(reply.results_size()) != keys) {
    return Status::internal(
        fmt::format("master answered {} results for {} keys", reply.results_size(), keys));
  }
  std::vector<Result<T>> out;
  out.reserve(keys);
  for (const rpc::ReplicaList& list : reply.results()) {
    Status status = from_proto(list.status());
    if (status.ok()) {
      out.emplace_back(convert(list));
    } else {
      out.emplace_back(std::move(status));
    }
  }
  return out;
}

/// Calls that may run twice with the same effect: retried even when the first attempt may have run.
bool safe_to_repeat(MasterMethod method) {
  switch (method) {
    case MasterMethod::kHello:
    case MasterMethod::kGetReplicaList:  // a second lease on the same object
    case MasterMethod::kExists:
    case MasterMethod::kStats:
      return true;
    default:
      return false;
  }
}

}  // namespace

class MasterClient::Impl {
 public:
  MasterClientOptions options;
  mutable std::mutex mu;
  std::shared_ptr<ControlChannel> channel;  // to the master (with etcd: the leader) now; guarded by mu
  MasterInfo info;

  bool uses_etcd() const { return !options.etcd.endpoint.empty(); }

  std::shared_ptr<ControlChannel> current() const {
    std::lock_guard<std::mutex> lock(mu);
    return channel;
  }

  void connect_to(const std::string& address) {
    auto fresh =
        std::make_shared<ControlChannel>(address, options.idle_connections, store_member_key(options.secret));
    std::lock_guard<std::mutex> lock(mu);
    channel = std::move(fresh);
  }

  /// With etcd: follows the leader to its current address (kept when etcd names none, or cannot be reached).
  void follow_leader() {
    if (!uses_etcd()) return;
    Result<std::string> leader = find_leader(options.etcd);
    std::shared_ptr<ControlChannel> now = current();
    if (leader.ok() && (now == nullptr || *leader != now->address())) connect_to(*leader);
  }

  /// One RPC with a deadline per attempt, retried with back-off while the master is unreachable; a call that
  /// may already have run is retried only when safe_to_repeat.
  template <typename Request, typename Reply>
  Status call(const char* what, MasterMethod method, const Request& request, Reply* reply) {
    const std::string request_bytes = request.SerializeAsString();
    std::chrono::milliseconds backoff = options.initial_backoff;
    Status status;
    const auto budget_end = std::chrono::steady_clock::now() + options.failover_budget;
    int attempt = 1;
    std::string address;
    for (;; ++attempt) {
      std::shared_ptr<ControlChannel> target = current();
      if (target == nullptr) {
        status = Status::unavailable("no leader found in etcd");
      } else {
        address = target->address();
        bool may_have_run = false;
        Result<std::string> answer =
            target->call(static_cast<uint16_t>(method), request_bytes,
                         std::chrono::steady_clock::now() + options.rpc_timeout, &may_have_run);
        if (answer.ok()) {
          if (reply->ParseFromString(*answer)) return Status();
          return Status::internal(fmt::format("store master at {} sent a malformed {} reply ({} bytes)",
                                              address, what, answer->size()));
        }
        status = answer.status();
        if (status.code() == StatusCode::kDeadlineExceeded) {
          follow_leader();  // a leader that stopped answering may have been replaced: the next call finds out
          break;            // not retried: the call may have taken effect
        }
        if (status.code() != StatusCode::kUnavailable) break;
        if (may_have_run && !safe_to_repeat(method)) {  // a put or a remove must not be carried out twice
          follow_leader();
          status = Status::unavailable(status.message() + " (the master may have carried the call out)");
          break;
        }
      }
      const bool more =
          attempt < options.max_attempts || (uses_etcd() && std::chrono::steady_clock::now() < budget_end);
      if (!more) break;
      std::this_thread::sleep_for(backoff);
      backoff = std::min(backoff * 2, std::chrono::milliseconds(500));
      follow_leader();
    }
    if (address.empty())
      address = uses_etcd() ? "(leader in etcd " + options.etcd.endpoint + ")" : options.address;
    switch (status.code()) {
      case StatusCode::kUnavailable:
        return Status::unavailable(fmt::format("store master at {} unreachable after {} attempt{} ({}): {}",
                                               address, attempt, attempt == 1 ? "" : "s", what,
                                               status.message()));
      case StatusCode::kDeadlineExceeded:
        return Status::deadline_exceeded(fmt::format("store master at {} did not answer {} within {} ms",
                                                     address, what, options.rpc_timeout.count()));
      default:
        return Status(status.code(),
                      fmt::format("store master at {} refused {}: {}", address, what, status.message()));
    }
  }

  Result<std::vector<Result<std::vector<ReplicaLocation>>>> put_start(std::span<const std::string_view> keys,
                                                                      std::span<const uint64_t> sizes,
                                                                      const ReplicateConfig& config,
                                                                      std::string_view writer_host_id) {
    rpc::PutStartRequest request;
    add_keys(request.mutable_keys(), keys);
    request.mutable_sizes_bytes()->Add(sizes.begin(), sizes.end());
    to_proto(config, request.mutable_config());
    request.set_writer_host_id(std::string(writer_host_id));
    rpc::ReplicaListsReply reply;
    CRESCENT_RETURN_IF_ERROR(call("put_start", MasterMethod::kPutStart, request, &reply));
    return replica_lists<std::vector<ReplicaLocation>>(reply, keys.size(), [](const rpc::ReplicaList& list) {
      std::vector<ReplicaLocation> replicas;
      for (const rpc::Replica& r : list.replicas()) replicas.push_back(from_proto(r));
      return replicas;
    });
  }

  /// put_end or put_revoke of `keys`, with the segments each key's writer could not write.
  template <MasterMethod Method>
  Result<std::vector<Status>> finish_call(const char* what, std::span<const std::string_view> keys,
                                          std::span<const std::vector<std::string>> unwritten) {
    rpc::PutFinishRequest request;
    add_keys(request.mutable_keys(), keys);
    if (std::any_of(unwritten.begin(), unwritten.end(), [](const auto& names) { return !names.empty(); })) {
      for (const std::vector<std::string>& names : unwritten) {
        rpc::SegmentNames* out = request.add_unwritten();
        for (const std::string& name : names) out->add_segments(name);
      }
    }
    rpc::StatusesReply reply;
    CRESCENT_RETURN_IF_ERROR(call(what, Method, request, &reply));
    return statuses(reply, keys.size());
  }

  template <MasterMethod Method>
  Result<std::vector<Status>> keys_call(const char* what, std::span<const std::string_view> keys) {
    rpc::KeysRequest request;
    add_keys(request.mutable_keys(), keys);
    rpc::StatusesReply reply;
    CRESCENT_RETURN_IF_ERROR(call(what, Method, request, &reply));
    return statuses(reply, keys.size());
  }
};

Result<std::unique_ptr<MasterClient>> MasterClient::connect(MasterClientOptions options) {
  if (options.address.empty() && options.etcd.endpoint.empty()) {
    return Status::invalid_argument("store master address is empty");
  }
  if (options.etcd.endpoint.empty()) {
    if (auto host_port = net::split_host_port(options.address); !host_port.ok()) {
      return Status::invalid_argument("store master " + host_port.status().message());
    }
  }
  if (options.max_attempts < 1) {
    return Status::invalid_argument(fmt::format("max_attempts must be >= 1, got {}", options.max_attempts));
  }
  if (options.idle_connections < 1 || options.idle_connections > 1024) {
    return Status::invalid_argument(
        fmt::format("idle_connections must be in 1..1024, got {}", options.idle_connections));
  }
  if (options.rpc_timeout.count() <= 0) {
    return Status::invalid_argument(
        fmt::format("rpc_timeout must be > 0 ms, got {}", options.rpc_timeout.count()));
  }
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  if (impl->uses_etcd()) {
    impl->follow_leader();  // no leader yet: call() keeps looking within failover_budget
  } else {
    impl->connect_to(impl->options.address);
  }
  rpc::HelloRequest request;
  rpc::HelloReply reply;
  CRESCENT_RETURN_IF_ERROR(impl->call("hello", MasterMethod::kHello, request, &reply));
  impl->info = {reply.transfer_metadata(), std::chrono::milliseconds(reply.lease_ttl_ms()),
                std::chrono::milliseconds(reply.segment_ttl_ms())};
  return std::unique_ptr<MasterClient>(new MasterClient(std::move(impl)));
}

MasterClient::MasterClient(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MasterClient::~MasterClient() = default;
const MasterInfo& MasterClient::info() const {
  return impl_->info;
}
std::string MasterClient::address() const {
  auto target = impl_->current();
  return target ? target->address() : std::string();
}

Status MasterClient::mount_segment(const SegmentMount& mount, std::span<const HeldObject> held) {
  rpc::MountSegmentRequest request;
  request.set_segment(mount.segment);
  request.set_owner(mount.owner);
  request.set_host_id(mount.host_id);
  request.set_capacity_bytes(mount.capacity_bytes);
  request.set_ssd_capacity_bytes(mount.ssd_capacity_bytes);
  request.set_incarnation(mount.incarnation);
  for (const HeldObject& h : held) to_proto(h, request.add_held());
  rpc::StatusReply reply;
  CRESCENT_RETURN_IF_ERROR(impl_->call("mount_segment", MasterMethod::kMountSegment, request, &reply));
  return from_proto(reply.status());
}

Status MasterClient::unmount_segment(std::string_view segment) {
  rpc::SegmentRequest request;
  request.set_segment(std::string(segment));
  rpc::StatusReply reply;
  CRESCENT_RETURN_IF_ERROR(impl_->call("unmount_segment", MasterMethod::kUnmountSegment, request, &reply));
  return from_proto(reply.status());
}

Result<SegmentChanges> MasterClient::renew_segment(std::string_view segment, uint64_t since_version,
                                                   const SegmentReport& report) {
  rpc::RenewSegmentRequest request;
  request.set_segment(std::string(segment));
  request.set_since_version(since_version);
  for (const HeldObject& h : report.spilled) to_proto(h, request.add_spilled());
  for (const HeldObject& h : report.loaded) to_proto(h, request.add_loaded());
  for (const HeldObject& h : report.failed) to_proto(h, request.add_failed());
  for (const std::string& key : report.ssd_dropped) request.add_ssd_dropped(key);
  rpc::RenewSegmentReply reply;
  CRESCENT_RETURN_IF_ERROR(impl_->call("renew_segment", MasterMethod::kRenewSegment, request, &reply));
  CRESCENT_RETURN_IF_ERROR(from_proto(reply.status()));
  SegmentChanges changes{reply.version(), reply.full(), {}};
  changes.changes.reserve(static_cast<size_t>(reply.changes_size()));
  for (const rpc::SegmentChange& c : reply.changes()) {
    if (c.kind() > static_cast<uint32_t>(ChangeKind::kLoad)) {
      return Status::internal(fmt::format("master sent an unknown change kind {}", c.kind()));
    }
    changes.changes.push_back({static_cast<ChangeKind>(c.kind()), from_proto(c.object())});
  }
  return changes;
}

Result<std::vector<Result<std::vector<ReplicaLocation>>>> MasterClient::put_start(
    std::span<const std::string_view> keys, std::span<const uint64_t> sizes_bytes,
    const ReplicateConfig& config, std::string_view writer_host_id) {
  return impl_->put_start(keys, sizes_bytes, config, writer_host_id);
}

Result<std::vector<Status>> MasterClient::put_end(
    std::span<const std::string_view> keys, std::span<const std::vector<std::string>> unwritten_segments) {
  return impl_->finish_call<MasterMethod::kPutEnd>("put_end", keys, unwritten_segments);
}
Result<std::vector<Status>> MasterClient::put_revoke(
    std::span<const std::string_view> keys, std::span<const std::vector<std::string>> unwritten_segments) {
  return impl_->finish_call<MasterMethod::kPutRevoke>("put_revoke", keys, unwritten_segments);
}
Result<std::vector<Status>> MasterClient::remove(std::span<const std::string_view> keys) {
  return impl_->keys_call<MasterMethod::kRemove>("remove", keys);
}

Result<std::vector<Result<ReadGrant>>> MasterClient::get_replica_list(
    std::span<const std::string_view> keys) {
  rpc::KeysRequest request;
  add_keys(request.mutable_keys(), keys);
  rpc::ReplicaListsReply reply;
  CRESCENT_RETURN_IF_ERROR(impl_->call("get_replica_list", MasterMethod::kGetReplicaList, request, &reply));
  return replica_lists<ReadGrant>(reply, keys.size(), [](const rpc::ReplicaList& list) {
    ReadGrant grant{list.size_bytes(), {}, std::chrono::milliseconds(list.lease_ttl_ms())};
    for (const rpc::Replica& r : list.replicas()) grant.replicas.push_back(from_proto(r));
    return grant;
  });
}

Result<std::vector<bool>> MasterClient::exists(std::span<const std::string_view> keys) {
  rpc::KeysRequest request;
  add_keys(request.mutable_keys(), keys);
  rpc::ExistsReply reply;
  CRESCENT_RETURN_IF_ERROR(impl_->call("exists", MasterMethod::kExists, request, &reply));
  if (static_cast<size_t>(reply.exists_size()) != keys.size()) {
    return Status::internal(
        fmt::format("master answered {} results for {} keys", reply.exists_size(), keys.size()));
  }
  return std::vector<bool>(reply.exists().begin(), reply.exists().end());
}

Result<uint64_t> MasterClient::remove_all() {
  rpc::RemoveAllRequest request;
  rpc::RemoveAllReply reply;
  CRESCENT_RETURN_IF_ERROR(impl_->call("remove_all", MasterMethod::kRemoveAll, request, &reply));
  return reply.removed();
}

Result<MasterSnapshot> MasterClient::stats() {
  rpc::StatsRequest request;
  rpc::StatsReply reply;
  CRESCENT_RETURN_IF_ERROR(impl_->call("stats", MasterMethod::kStats, request, &reply));
  std::vector<std::pair<std::string, uint64_t>> fields(reply.counters().begin(), reply.counters().end());
  MasterSnapshot snapshot{from_stats_fields(fields), {}};
  for (const rpc::SegmentInfo& s : reply.segments()) {
    snapshot.segments.push_back({s.segment(), s.owner(), s.host_id(),
                                 s.tier() == 1 ? ReplicaTier::kSsd : ReplicaTier::kDram, s.capacity_bytes(),
                                 s.used_bytes(), s.replicas(), s.ssd_capacity_bytes(), s.ssd_used_bytes()});
  }
  return snapshot;
}

}  // namespace crescent::store
