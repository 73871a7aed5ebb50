#include "store/client.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>

#include "common/socket_io.h"
#include "store/mounted_segment.h"
#include "store/segment_allocator.h"
#include "transfer/metadata.h"

namespace crescent::store {
namespace {

using transfer::TransferOp;
using transfer::TransferRequest;
using Clock = std::chrono::steady_clock;

/// A contiguous piece of this process's memory a transfer reads into or writes from.
struct Piece {
  std::byte* data = nullptr;
  uint64_t size_bytes = 0;
};

uint64_t total_bytes(std::span<const Piece> pieces) {
  uint64_t n = 0;
  for (const Piece& p : pieces) n += p.size_bytes;
  return n;
}

std::string engine_name() {
  static std::atomic<int> counter{0};
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  return fmt::format("store-client-{}-{}-{}", host, ::getpid(), counter.fetch_add(1));
}

}  // namespace

class Client::Impl {
 public:
  /// Where one value's bytes sit locally during a transfer: the caller's registered memory, a staging range
  /// (copied in before a write, out after a read), or caller memory registered for this call only.
  struct Local {
    std::vector<Piece> transfer_pieces;      // what the transfer requests use
    std::vector<Piece> user_pieces;          // the caller's buffers
    std::optional<uint64_t> staging_offset;  // set when staged
    uint64_t staging_size = 0;
    std::vector<void*> temporarily_registered;
  };

  ClientOptions options;
  std::unique_ptr<MasterClient> master;
  std::shared_ptr<transfer::MetadataService> metadata;
  std::unique_ptr<transfer::TransferEngine> engine;
  std::string host_id = transfer::local_host_id();
  std::unique_ptr<MountedSegment> segment;

  std::mutex mu;                             // guards the members below
  std::map<uintptr_t, uint64_t> registered;  // caller regions: start -> length
  std::byte* staging = nullptr;
  std::unique_ptr<SegmentAllocator> staging_allocator;
  std::unordered_map<std::string, transfer::SegmentHandle> handles;

  std::atomic<uint64_t> puts{0}, gets{0}, bytes_written{0}, bytes_read{0}, staged_bytes{0},
      replica_fallbacks{0}, leases_expired{0}, replicas_unwritten{0};

  ~Impl() {
    segment.reset();
    if (engine && staging != nullptr) (void)engine->free_memory(staging);
  }

  bool is_registered(const std::byte* data, uint64_t size) {
    std::lock_guard<std::mutex> lock(mu);
    auto it = registered.upper_bound(reinterpret_cast<uintptr_t>(data));
    if (it == registered.begin()) return false;
    --it;
    const uintptr_t start = reinterpret_cast<uintptr_t>(data);
    return start >= it->first && start + size <= it->first + it->second;
  }

  /// Local memory for a value of `size` held in `user`: zero copy when every piece is registered, else one
  /// staging range (copied into now when `copy_in`), else the pieces registered for this call.
  Result<Local> prepare(std::span<const Piece> user, uint64_t size, bool copy_in) {
    Local local;
    local.user_pieces.assign(user.begin(), user.end());
    if (std::all_of(user.begin(), user.end(),
                    [&](const Piece& p) { return is_registered(p.data, p.size_bytes); })) {
      local.transfer_pieces = local.user_pieces;
      return local;
    }
    {
      std::lock_guard<std::mutex> lock(mu);
      local.staging_offset = staging_allocator ? staging_allocator->allocate(size) : std::nullopt;
    }
    if (local.staging_offset) {
      local.staging_size = size;
      std::byte* base = staging + *local.staging_offset;
      local.transfer_pieces = {{base, size}};
      if (copy_in) {
        uint64_t at = 0;
        for (const Piece& p : user) {
          const uint64_t n = std::min(p.size_bytes, size - at);
          std::memcpy(base + at, p.data, n);
          at += n;
        }
        staged_bytes += size;
      }
      return local;
    }
    for (const Piece& p : user) {  // the staging pool is full or too small: register the caller's memory
      if (is_registered(p.data, p.size_bytes)) continue;
      Status st = engine->register_memory(p.data, p.size_bytes);
      if (!st.ok()) {
        release(local);
        return Status(st.code(),
                      "staging pool full, and the buffer could not be registered: " + st.message());
      }
      local.temporarily_registered.push_back(p.data);
    }
    local.transfer_pieces = local.user_pieces;
    return local;
  }

  /// Copies a staged read out to the caller's buffers.
  void copy_out(const Local& local, uint64_t size) {
    if (!local.staging_offset) return;
    const std::byte* base = staging + *local.staging_offset;
    uint64_t at = 0;
    for (const Piece& p : local.user_pieces) {
      const uint64_t n = std::min(p.size_bytes, size - at);
      std::memcpy(p.data, base + at, n);
      at += n;
      if (at == size) break;
    }
    staged_bytes += size;
  }

  void release(Local& local) {
    if (local.staging_offset) {
      std::lock_guard<std::mutex> lock(mu);
      staging_allocator->free(*local.staging_offset, local.staging_size);
      local.staging_offset.reset();
    }
    for (void* p : local.temporarily_registered) (void)engine->unregister_memory(p);
    local.temporarily_registered.clear();
  }

  Result<transfer::SegmentHandle> handle(const std::string& segment) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (auto it = handles.find(segment); it != handles.end()) return it->second;
    }
    Result<transfer::SegmentHandle> opened = engine->open_segment(segment);
    if (!opened.ok()) return opened.status();
    std::lock_guard<std::mutex> lock(mu);
    handles[segment] = *opened;
    return opened;
  }

  /// A segment whose transfer failed is looked up again next time (its owner may have restarted).
  void forget(const std::string& segment) {
    std::lock_guard<std::mutex> lock(mu);
    handles.erase(segment);
  }

  /// Forgets `segment` and looks it up again: true when it was re-published meanwhile (its owner restarted
  /// under its name, at a new address), so that a transfer that failed at the old one is worth trying again.
  bool moved(const std::string& segment) {
    std::optional<transfer::SegmentHandle> old;
    {
      std::lock_guard<std::mutex> lock(mu);
      if (auto it = handles.find(segment); it != handles.end()) old = it->second;
    }
    forget(segment);
    if (!old) return false;
    Result<transfer::SegmentHandle> now = handle(segment);
    return now.ok() && *now != *old;
  }

  /// Requests moving `size` bytes between `local` and `replica` (the first `size` bytes of the local pieces).
  Status add_requests(TransferOp op, const Local& local, const ReplicaLocation& replica, uint64_t size,
                      std::vector<TransferRequest>& out) {
    Result<transfer::SegmentHandle> segment = handle(replica.segment);
    if (!segment.ok()) return Status::transfer_failed(segment.status().message());
    uint64_t at = 0;
    for (const Piece& p : local.transfer_pieces) {
      if (at == size) break;
      const uint64_t n = std::min(p.size_bytes, size - at);
      out.push_back({op, p.data, *segment, replica.offset_bytes + at, n});
      at += n;
    }
    return Status();
  }

  /// Runs one transfer batch to completion; one status per request (failed ones carry the engine's error).
  Result<std::vector<transfer::TransferStatus>> run(const std::vector<TransferRequest>& requests) {
    std::vector<transfer::TransferStatus> out(requests.size());
    if (requests.empty()) return out;
    Result<transfer::BatchId> batch = engine->allocate_batch(requests.size());
    if (!batch.ok()) return batch.status();
    Status submitted = engine->submit(*batch, requests);
    if (!submitted.ok()) {
      (void)engine->free_batch(*batch);
      return Status::transfer_failed(submitted.message());
    }
    // The engine fails every request by its request_timeout, so this ends; nothing may be released before.
    for (;;) {
      Result<transfer::BatchSummary> summary = engine->wait(*batch, options.transfer_timeout);
      if (!summary.ok() || summary->pending() == 0) break;
    }
    for (size_t i = 0; i < requests.size(); ++i) {
      Result<transfer::TransferStatus> s = engine->status(*batch, i);
      out[i] = s.ok() ? *s : transfer::TransferStatus{transfer::TransferState::kFailed, s.status().message()};
    }
    (void)engine->free_batch(*batch);
    return out;
  }

  /// Puts of `keys`: put_start, one transfer batch writing every replica of every key, then put_end for the
  /// keys with at least one replica written (naming the segments whose write failed: the master drops those
  /// replicas and places nothing more there until their owners renew) and put_revoke for the others. A key
  /// none of whose replicas could be written because their segments failed is started again, up to
  /// kPutRounds times: the master then places it on other segments.
  Result<std::vector<Status>> write(std::span<const std::string_view> keys,
                                    std::span<const std::vector<Piece>> values,
                                    const ReplicateConfig& config) {
    constexpr int kPutRounds = 3;
    const size_t n = keys.size();
    std::vector<Status> results(n);
    std::vector<uint64_t> sizes(n);
    for (size_t i = 0; i < n; ++i) {
      sizes[i] = total_bytes(values[i]);
      if (sizes[i] == 0)
        results[i] = Status::invalid_argument(fmt::format("put: the value of key #{} is empty", i));
    }
    std::vector<Local> locals(n);
    std::vector<size_t> round;  // the keys to start in this round
    // Stage before asking the master, so a put_start is never left waiting on a copy.
    for (size_t i = 0; i < n; ++i) {
      if (!results[i].ok()) continue;
      Result<Local> local = prepare(values[i], sizes[i], /*copy_in=*/true);
      if (!local.ok()) {
        results[i] = local.status();
        continue;
      }
      locals[i] = std::move(*local);
      round.push_back(i);
    }
    for (int attempt = 1; attempt <= kPutRounds && !round.empty(); ++attempt) {
      std::vector<std::string_view> asked;
      std::vector<uint64_t> asked_sizes;
      for (size_t i : round) {
        asked.push_back(keys[i]);
        asked_sizes.push_back(sizes[i]);
      }
      // Keys the master is making room for (spilling to SSD) answer kUnavailable and are asked again.
      auto started = master->put_start(asked, asked_sizes, config, host_id);
      if (started.ok()) {
        Status retried = ask_again(*started, [&](const std::vector<size_t>& again) {
          std::vector<std::string_view> retry_keys;
          std::vector<uint64_t> retry_sizes;
          for (size_t a : again) {
            retry_keys.push_back(asked[a]);
            retry_sizes.push_back(asked_sizes[a]);
          }
          return master->put_start(retry_keys, retry_sizes, config, host_id);
        });
        if (!retried.ok()) started = retried;
      }
      if (!started.ok()) {
        if (attempt == 1) {  // the call fails as a whole only when the master cannot be reached
          for (Local& l : locals) release(l);
          return started.status();
        }
        for (size_t i : round) results[i] = started.status();
        break;
      }
      // One transfer batch for every replica of every key; [first, last) of its requests per replica.
      std::vector<TransferRequest> requests;
      std::vector<std::vector<ReplicaLocation>> replicas(round.size());
      std::vector<std::vector<std::pair<size_t, size_t>>> ranges(round.size());
      std::vector<std::vector<std::string>> unwritten(round.size());  // segments whose write failed
      std::vector<std::string> last_error(round.size());
      for (size_t a = 0; a < round.size(); ++a) {
        const size_t i = round[a];
        Result<std::vector<ReplicaLocation>>& r = (*started)[a];
        if (!r.ok()) {
          results[i] = r.status();
          continue;
        }
        replicas[a] = std::move(*r);
        for (const ReplicaLocation& replica : replicas[a]) {
          const size_t first = requests.size();
          Status added = add_requests(TransferOp::kWrite, locals[i], replica, sizes[i], requests);
          if (!added.ok()) {  // its segment cannot be opened: e.g. its owner process exited
            requests.resize(first);
            unwritten[a].push_back(replica.segment);
            last_error[a] = added.message();
          }
          ranges[a].emplace_back(first, requests.size());
        }
      }
      Result<std::vector<transfer::TransferStatus>> done = run(requests);
      std::vector<std::string_view> to_end, to_revoke;
      std::vector<std::vector<std::string>> end_unwritten, revoke_unwritten;
      std::vector<size_t> end_index;
      std::vector<size_t> next_round;
      for (size_t a = 0; a < round.size(); ++a) {
        const size_t i = round[a];
        if (replicas[a].empty()) continue;  // put_start failed: nothing to end or revoke
        if (!done.ok()) {                   // this engine could not run the batch: no segment is to blame
          results[i] = done.status();
          to_revoke.push_back(keys[i]);
          revoke_unwritten.emplace_back();
          continue;
        }
        size_t written = 0;
        for (size_t r = 0; r < replicas[a].size(); ++r) {
          const auto [first, last] = ranges[a][r];
          if (first == last) continue;  // not even started (in unwritten already)
          bool ok = true;
          for (size_t q = first; q < last; ++q) {
            if ((*done)[q].state != transfer::TransferState::kCompleted) {
              ok = false;
              last_error[a] = (*done)[q].error;
            }
          }
          if (ok) {
            ++written;
          } else {
            unwritten[a].push_back(replicas[a][r].segment);
          }
        }
        for (const std::string& segment : unwritten[a]) forget(segment);  // looked up again next time
        replicas_unwritten += unwritten[a].size();
        if (written > 0) {
          to_end.push_back(keys[i]);
          end_unwritten.push_back(unwritten[a]);
          end_index.push_back(i);
          bytes_written += sizes[i] * written;
          continue;
        }
        to_revoke.push_back(keys[i]);
        revoke_unwritten.push_back(unwritten[a]);
        results[i] =
            Status::transfer_failed(fmt::format("writing every replica failed; last: {}", last_error[a]));
        if (attempt < kPutRounds) next_round.push_back(i);  // the master places it elsewhere now
      }
      if (!to_revoke.empty()) {
        // Best effort (put_timeout reclaims otherwise); a key to start again must be gone first.
        auto revoked = master->put_revoke(to_revoke, revoke_unwritten);
        if (!revoked.ok()) next_round.clear();
      }
      if (!to_end.empty()) {
        auto ended = master->put_end(to_end, end_unwritten);
        for (size_t e = 0; e < end_index.size(); ++e) {
          if (!ended.ok()) {
            results[end_index[e]] = ended.status();
          } else {
            results[end_index[e]] = (*ended)[e];
          }
        }
      }
      round = std::move(next_round);
    }
    for (Local& l : locals) release(l);
    puts += n;
    return results;
  }

  /// Reads granted objects into `outs` (one piece list per key): one transfer batch for the first replica of
  /// every key (same-host replicas first), further batches only for keys whose transfer failed, then the
  /// lease check per key against `sent` + its lease.
  std::vector<Result<uint64_t>> read(std::span<const std::string_view> keys,
                                     std::vector<Result<ReadGrant>>& grants,
                                     std::span<const std::vector<Piece>> outs,
                                     const std::vector<Clock::time_point>& sent) {
    const size_t n = keys.size();
    std::vector<Result<uint64_t>> results(n, Status::internal("not read"));
    std::vector<Local> locals(n);
    std::vector<size_t> next_replica(n, 0);
    std::vector<bool> pending(n, false);
    std::vector<bool> retried(n, false);  // a replica was tried again at its segment's new address
    for (size_t i = 0; i < n; ++i) {
      if (!grants[i].ok()) {
        results[i] = grants[i].status();
        continue;
      }
      ReadGrant& grant = *grants[i];
      const uint64_t room = total_bytes(outs[i]);
      if (room < grant.size_bytes) {
        results[i] = Status::invalid_argument(fmt::format(
            "the value of key #{} is {} bytes; the buffers hold {} bytes", i, grant.size_bytes, room));
        continue;
      }
      std::stable_partition(grant.replicas.begin(), grant.replicas.end(),
                            [&](const ReplicaLocation& r) { return r.host_id == host_id; });
      Result<Local> local = prepare(outs[i], grant.size_bytes, /*copy_in=*/false);
      if (!local.ok()) {
        results[i] = local.status();
        continue;
      }
      locals[i] = std::move(*local);
      pending[i] = true;
    }
    std::vector<std::string> last_error(n);
    while (std::find(pending.begin(), pending.end(), true) != pending.end()) {
      std::vector<TransferRequest> requests;
      std::vector<std::pair<size_t, size_t>> range(n, {0, 0});
      for (size_t i = 0; i < n; ++i) {
        if (!pending[i]) continue;
        const ReadGrant& grant = *grants[i];
        if (next_replica[i] >= grant.replicas.size()) {
          results[i] = Status::transfer_failed(
              fmt::format("reading every replica of key #{} failed; last: {}", i, last_error[i]));
          pending[i] = false;
          continue;
        }
        range[i].first = requests.size();
        Status added = add_requests(TransferOp::kRead, locals[i], grant.replicas[next_replica[i]],
                                    grant.size_bytes, requests);
        if (!added.ok()) {
          requests.resize(range[i].first);
          last_error[i] = added.message();
          ++next_replica[i];
          continue;  // try the next replica in the next round
        }
        range[i].second = requests.size();
      }
      if (requests.empty()) continue;
      Result<std::vector<transfer::TransferStatus>> done = run(requests);
      for (size_t i = 0; i < n; ++i) {
        if (!pending[i] || range[i].first == range[i].second) continue;
        bool failed = !done.ok();
        std::string error = done.ok() ? "" : done.status().message();
        for (size_t r = range[i].first; done.ok() && r < range[i].second; ++r) {
          if ((*done)[r].state != transfer::TransferState::kCompleted) {
            failed = true;
            error = (*done)[r].error;
          }
        }
        if (!failed) {
          pending[i] = false;
          results[i] = grants[i]->size_bytes;
        } else {
          last_error[i] = error;
          const std::string& segment = grants[i]->replicas[next_replica[i]].segment;
          if (!retried[i] && moved(segment)) {
            retried[i] = true;  // the same replica, once, at its owner's new address
            continue;
          }
          if (retried[i]) forget(segment);
          ++next_replica[i];
          ++replica_fallbacks;
        }
      }
    }
    for (size_t i = 0; i < n; ++i) {
      if (results[i].ok()) {
        // The lease check, after the bytes arrived: a read finished past its lease may hold another object's
        // bytes (docs/store.md, "Design").
        if (options.before_lease_check_for_testing) options.before_lease_check_for_testing(keys[i]);
        const Clock::time_point lease_end = sent[i] + grants[i]->lease_ttl;
        if (Clock::now() >= lease_end) {
          results[i] = Status::lease_expired(fmt::format(
              "the read of key #{} finished after its {} ms lease ran out; its bytes are not valid", i,
              grants[i]->lease_ttl.count()));
          ++leases_expired;
        } else {
          copy_out(locals[i], *results[i]);
          bytes_read += *results[i];
        }
      }
      release(locals[i]);
    }
    gets += n;
    return results;
  }

  /// Asks again, every 20 ms within ssd_wait, for the keys whose result is kUnavailable (a load from SSD or
  /// room being made for a put): `ask(indexes)` answers for those keys, in order. The call's error when the
  /// master cannot be reached.
  template <typename T, typename Ask>
  Status ask_again(std::vector<Result<T>>& results, Ask&& ask) {
    const Clock::time_point give_up = Clock::now() + options.ssd_wait;
    while (Clock::now() < give_up) {
      std::vector<size_t> again;
      for (size_t i = 0; i < results.size(); ++i) {
        if (results[i].status().code() == StatusCode::kUnavailable) again.push_back(i);
      }
      if (again.empty()) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      auto answers = ask(again);
      if (!answers.ok()) return answers.status();
      for (size_t r = 0; r < again.size(); ++r) results[again[r]] = std::move((*answers)[r]);
    }
    return Status();
  }

  /// get_replica_list for `keys`, asking again within ssd_wait for keys being loaded from SSD. `sent` gets
  /// each key's send time: its lease counts from there (never later than the master's count).
  Result<std::vector<Result<ReadGrant>>> grant(std::span<const std::string_view> keys,
                                               std::vector<Clock::time_point>& sent) {
    sent.assign(keys.size(), Clock::now());
    auto grants = master->get_replica_list(keys);
    if (!grants.ok()) return grants;
    Status retried = ask_again(*grants, [&](const std::vector<size_t>& again) {
      std::vector<std::string_view> retry_keys;
      for (size_t i : again) retry_keys.push_back(keys[i]);
      const Clock::time_point now = Clock::now();
      for (size_t i : again) sent[i] = now;
      return master->get_replica_list(retry_keys);
    });
    if (!retried.ok()) return retried;
    return grants;
  }

  Result<std::vector<Result<uint64_t>>> get(std::span<const std::string_view> keys,
                                            std::span<const std::vector<Piece>> outs) {
    std::vector<Clock::time_point> sent;
    auto grants = grant(keys, sent);
    if (!grants.ok()) return grants.status();
    return read(keys, *grants, outs, sent);
  }
};

namespace {

std::vector<Piece> pieces_of(std::span<const Buffer> buffers) {
  std::vector<Piece> out;
  for (const Buffer& b : buffers) out.push_back({static_cast<std::byte*>(b.data), b.size_bytes});
  return out;
}

std::vector<Piece> pieces_of(std::span<const ConstBuffer> buffers) {
  std::vector<Piece> out;
  // Writes only read from these; Piece is shared with reads, hence the const_cast.
  for (const ConstBuffer& b : buffers)
    out.push_back({static_cast<std::byte*>(const_cast<void*>(b.data)), b.size_bytes});
  return out;
}

}  // namespace

Result<std::unique_ptr<Client>> Client::create(ClientOptions options) {
  auto impl = std::make_unique<Impl>();
  impl->options = std::move(options);
  auto master = MasterClient::connect(impl->options.master);
  if (!master.ok()) return master.status();
  impl->master = std::move(*master);
  auto metadata = transfer::open_metadata(impl->master->info().transfer_metadata);
  if (!metadata.ok()) {
    return Status(metadata.status().code(),
                  "opening the transfer metadata the master named: " + metadata.status().message());
  }
  impl->metadata = *metadata;
  transfer::EngineOptions engine_options;
  engine_options.name = impl->options.name.empty() ? engine_name() : impl->options.name;
  engine_options.metadata = impl->metadata;
  engine_options.transports = impl->options.transports;
  engine_options.secret = impl->options.master.secret;
  engine_options.tcp.listen_host = impl->options.tcp_host;
  if (engine_options.tcp.listen_host.empty()) {
    auto host = net::split_host_port(impl->master->address());
    auto local =
        host.ok() ? net::local_address_toward(host->first, host->second) : Result<std::string>(host.status());
    if (!local.ok()) return local.status();
    engine_options.tcp.listen_host = *local;
  }
  engine_options.failure.request_timeout = impl->options.transfer_timeout;
  auto engine = transfer::TransferEngine::create(engine_options);
  if (!engine.ok()) return engine.status();
  impl->engine = std::move(*engine);
  if (impl->options.staging_bytes > 0) {
    auto staging = impl->engine->allocate_memory(impl->options.staging_bytes);
    if (!staging.ok()) return staging.status();
    impl->staging = static_cast<std::byte*>(*staging);
    impl->staging_allocator = std::make_unique<SegmentAllocator>(impl->options.staging_bytes);
  }
  if (impl->options.segment_bytes > 0) {
    auto segment =
        MountedSegment::mount(*impl->engine, *impl->master, impl->engine->name() + "/dram",
                              impl->engine->name(), impl->options.segment_bytes, MountedSegment::Options{});
    if (!segment.ok()) return segment.status();
    impl->segment = std::move(*segment);
  }
  return std::unique_ptr<Client>(new Client(std::move(impl)));
}

Client::Client(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Client::~Client() = default;

Status Client::register_buffer(void* data, uint64_t size_bytes) {
  CRESCENT_RETURN_IF_ERROR(impl_->engine->register_memory(data, size_bytes));
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->registered[reinterpret_cast<uintptr_t>(data)] = size_bytes;
  return Status();
}

Status Client::unregister_buffer(void* data) {
  CRESCENT_RETURN_IF_ERROR(impl_->engine->unregister_memory(data));
  std::lock_guard<std::mutex> lock(impl_->mu);
  impl_->registered.erase(reinterpret_cast<uintptr_t>(data));
  return Status();
}

Status Client::put(std::string_view key, std::span<const ConstBuffer> value, const ReplicateConfig& config) {
  CRESCENT_RETURN_IF_ERROR(validate_key(key));
  std::vector<std::vector<Piece>> values = {pieces_of(value)};
  auto results = impl_->write({&key, 1}, values, config);
  if (!results.ok()) return results.status();
  return (*results)[0];
}

Result<uint64_t> Client::get(std::string_view key, std::span<const Buffer> out) {
  CRESCENT_RETURN_IF_ERROR(validate_key(key));
  std::vector<std::vector<Piece>> outs = {pieces_of(out)};
  auto results = impl_->get({&key, 1}, outs);
  if (!results.ok()) return results.status();
  return std::move((*results)[0]);
}

Result<std::vector<std::byte>> Client::get_value(std::string_view key) {
  CRESCENT_RETURN_IF_ERROR(validate_key(key));
  std::vector<Clock::time_point> sent;
  auto grants = impl_->grant({&key, 1}, sent);
  if (!grants.ok()) return grants.status();
  if (!(*grants)[0].ok()) return (*grants)[0].status();
  std::vector<std::byte> value((*grants)[0]->size_bytes);
  std::vector<std::vector<Piece>> pieces = {{{value.data(), value.size()}}};
  auto read = impl_->read({&key, 1}, *grants, pieces, sent);
  if (!read[0].ok()) return read[0].status();
  return value;
}

Result<bool> Client::exists(std::string_view key) {
  CRESCENT_RETURN_IF_ERROR(validate_key(key));
  auto results = impl_->master->exists({&key, 1});
  if (!results.ok()) return results.status();
  return static_cast<bool>((*results)[0]);
}

Status Client::remove(std::string_view key) {
  CRESCENT_RETURN_IF_ERROR(validate_key(key));
  auto results = impl_->master->remove({&key, 1});
  if (!results.ok()) return results.status();
  return (*results)[0];
}

Result<uint64_t> Client::remove_all() {
  return impl_->master->remove_all();
}

Result<std::vector<Status>> Client::batch_put(std::span<const std::string_view> keys,
                                              std::span<const ConstBuffer> values,
                                              const ReplicateConfig& config) {
  if (keys.size() != values.size()) {
    return Status::invalid_argument(
        fmt::format("batch_put: {} keys but {} values", keys.size(), values.size()));
  }
  std::vector<std::vector<Piece>> pieces;
  pieces.reserve(values.size());
  for (const ConstBuffer& v : values) pieces.push_back(pieces_of(std::span<const ConstBuffer>(&v, 1)));
  return impl_->write(keys, pieces, config);
}

Result<std::vector<Result<uint64_t>>> Client::batch_get(std::span<const std::string_view> keys,
                                                        std::span<const Buffer> out) {
  if (keys.size() != out.size()) {
    return Status::invalid_argument(
        fmt::format("batch_get: {} keys but {} buffers", keys.size(), out.size()));
  }
  std::vector<std::vector<Piece>> pieces;
  pieces.reserve(out.size());
  for (const Buffer& b : out) pieces.push_back(pieces_of(std::span<const Buffer>(&b, 1)));
  return impl_->get(keys, pieces);
}

Result<std::vector<bool>> Client::batch_exists(std::span<const std::string_view> keys) {
  return impl_->master->exists(keys);
}

std::string Client::block_key(BlockKey key) const {
  return kv::pool_block_key(impl_->options.block_key_prefix, key);
}

Result<std::vector<Status>> Client::put_blocks(std::span<const BlockKey> keys,
                                               std::span<const ConstBuffer> blocks,
                                               const ReplicateConfig& config) {
  std::vector<std::string> names;
  names.reserve(keys.size());
  for (BlockKey k : keys) names.push_back(block_key(k));
  std::vector<std::string_view> views(names.begin(), names.end());
  auto results = batch_put(views, blocks, config);
  if (!results.ok()) return results;
  for (Status& s : *results) {
    if (s.code() == StatusCode::kAlreadyExists) s = Status();
  }
  return results;
}

Result<size_t> Client::get_prefix(std::span<const BlockKey> keys, std::span<const Buffer> blocks) {
  if (keys.size() != blocks.size()) {
    return Status::invalid_argument(
        fmt::format("get_prefix: {} keys but {} buffers", keys.size(), blocks.size()));
  }
  std::vector<std::string> names;
  names.reserve(keys.size());
  for (BlockKey k : keys) names.push_back(block_key(k));
  std::vector<std::string_view> views(names.begin(), names.end());
  std::vector<Clock::time_point> sent;
  auto grants = impl_->grant(views, sent);
  if (!grants.ok()) return grants.status();
  size_t found = 0;
  while (found < grants->size() && (*grants)[found].ok()) ++found;
  grants->erase(grants->begin() + static_cast<long>(found), grants->end());
  std::vector<std::vector<Piece>> pieces;
  for (size_t i = 0; i < found; ++i) pieces.push_back(pieces_of(blocks.subspan(i, 1)));
  std::vector<Result<uint64_t>> read = impl_->read(std::span(views).first(found), *grants, pieces, sent);
  size_t leading = 0;
  while (leading < read.size() && read[leading].ok()) ++leading;
  return leading;
}

ClientStats Client::stats() const {
  return {impl_->puts.load(),           impl_->gets.load(),
          impl_->bytes_written.load(),  impl_->bytes_read.load(),
          impl_->staged_bytes.load(),   impl_->replica_fallbacks.load(),
          impl_->leases_expired.load(), impl_->replicas_unwritten.load()};
}

MasterClient& Client::master() {
  return *impl_->master;
}
transfer::TransferEngine& Client::engine() {
  return *impl_->engine;
}

}  // namespace crescent::store
