#include "transfer/transfer_engine.h"

#include <fmt/format.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "transfer/transport.h"

namespace crescent::transfer {

std::string_view transport_name(TransportKind kind) {
  switch (kind) {
    case TransportKind::kTcp:
      return "tcp";
    case TransportKind::kShm:
      return "shm";
    case TransportKind::kUcx:
      return "ucx";
  }
  return "?";
}

Result<TransportKind> parse_transport(std::string_view name) {
  for (auto kind : {TransportKind::kTcp, TransportKind::kShm, TransportKind::kUcx}) {
    if (transport_name(kind) == name) return kind;
  }
  return Status::invalid_argument(fmt::format("unknown transport '{}' (expected tcp, shm or ucx)", name));
}

namespace internal {

// A batch: a fixed array of request states (stable addresses for the transports) and completion counts.
class Batch {
 public:
  explicit Batch(size_t capacity) : capacity_(capacity), requests_(new RequestState[capacity]) {}

  size_t capacity() const { return capacity_; }
  size_t submitted() const { return submitted_.load(std::memory_order_acquire); }
  RequestState& request(size_t index) { return requests_[index]; }
  const RequestState& request(size_t index) const { return requests_[index]; }
  // Reserves `count` request slots for one submit; returns the first index, or nullopt when they do not fit.
  // Reserving (under the engine mutex) keeps two submitters from ever sharing indexes.
  std::optional<size_t> reserve(size_t count) {
    std::lock_guard lock(mu_);
    if (count > capacity_ - reserved_) return std::nullopt;
    reserved_ += count;
    return reserved_ - count;
  }
  size_t room() {
    std::lock_guard lock(mu_);
    return capacity_ - reserved_;
  }
  // Marks `count` more requests as submitted (after their states were reset, before they start).
  void add_submitted(size_t count) {
    std::lock_guard lock(mu_);
    submitted_.fetch_add(count, std::memory_order_release);
  }

  // Publishes a request's final state and counts it, under one lock: whoever sees the state (status()) and
  // then asks the batch (free_batch, wait) finds it counted.
  void on_request_done(std::atomic<int>& state, bool failed) {
    std::lock_guard lock(mu_);
    state.store(static_cast<int>(failed ? TransferState::kFailed : TransferState::kCompleted),
                std::memory_order_release);
    (failed ? failed_ : completed_)++;
    if (completed_ + failed_ == submitted_.load(std::memory_order_relaxed)) done_.notify_all();
  }

  BatchSummary wait(std::chrono::milliseconds timeout) {
    // Capped at a day: wait_for(milliseconds::max()) would overflow the clock and return at once.
    timeout = std::min<std::chrono::milliseconds>(timeout, std::chrono::hours(24));
    std::unique_lock lock(mu_);
    done_.wait_for(lock, timeout, [&] { return completed_ + failed_ == submitted_.load(); });
    return summary_locked();
  }

  BatchSummary summary() {
    std::lock_guard lock(mu_);
    return summary_locked();
  }

 private:
  BatchSummary summary_locked() const {
    return {.submitted = submitted_.load(), .completed = completed_, .failed = failed_};
  }

  const size_t capacity_;
  std::unique_ptr<RequestState[]> requests_;
  std::atomic<size_t> submitted_{0};
  std::mutex mu_;
  size_t reserved_ = 0;  // slots handed out by reserve(), >= submitted_
  std::condition_variable done_;
  size_t completed_ = 0;
  size_t failed_ = 0;
};

void RequestState::reset(Batch* batch, std::atomic<int64_t>* region_in_flight, Counters* counters) {
  state_.store(static_cast<int>(TransferState::kPending), std::memory_order_relaxed);
  parts_left_.store(1, std::memory_order_relaxed);
  failed_.store(false, std::memory_order_relaxed);
  error_.clear();
  batch_ = batch;
  region_in_flight_ = region_in_flight;
  counters_ = counters;
}

void RequestState::part_done(const Status& status, uint64_t bytes) {
  if (!status.ok()) {
    std::lock_guard lock(error_mu_);
    if (!failed_.exchange(true)) error_ = status.message();
  } else {
    counters_->bytes_transferred.fetch_add(bytes, std::memory_order_relaxed);
  }
  if (parts_left_.fetch_sub(1, std::memory_order_acq_rel) != 1) return;
  const bool failed = failed_.load(std::memory_order_acquire);
  (failed ? counters_->requests_failed : counters_->requests_completed)
      .fetch_add(1, std::memory_order_relaxed);
  region_in_flight_->fetch_sub(1, std::memory_order_release);
  batch_->on_request_done(state_, failed);
}

TransferStatus RequestState::status() const {
  TransferStatus status;
  status.state = static_cast<TransferState>(state_.load(std::memory_order_acquire));
  if (status.state == TransferState::kFailed) {
    std::lock_guard lock(error_mu_);
    status.error = error_;
  }
  return status;
}

void SegmentTable::add(const LocalSegment& segment) {
  std::unique_lock lock(mu_);
  segments_[segment.id] = segment;
}

void SegmentTable::remove(uint64_t id) {
  std::unique_lock lock(mu_);  // waits for every View held
  segments_.erase(id);
}

SegmentTable::View SegmentTable::view() const {
  View view;
  view.lock_ = std::shared_lock(mu_);
  view.table_ = this;
  return view;
}

Result<std::byte*> SegmentTable::View::range(uint64_t id, uint64_t offset_bytes,
                                             uint64_t length_bytes) const {
  auto it = table_->segments_.find(id);
  if (it == table_->segments_.end()) {
    return Status::not_found(fmt::format("no segment with id {} is exposed", id));
  }
  const LocalSegment& segment = it->second;
  if (length_bytes == 0) {
    return Status::invalid_argument(fmt::format("zero-length access to segment '{}'", segment.name));
  }
  if (offset_bytes > segment.length_bytes || length_bytes > segment.length_bytes - offset_bytes) {
    return Status::out_of_range(fmt::format("access [{}, +{}) outside segment '{}' of {} bytes", offset_bytes,
                                            length_bytes, segment.name, segment.length_bytes));
  }
  return segment.base + offset_bytes;
}

}  // namespace internal

std::string local_host_id() {
  char host[256] = {};
  ::gethostname(host, sizeof(host) - 1);
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot_id);
  return fmt::format("{}/{}", host, boot_id);
}

namespace {

using internal::Clock;

struct Region {
  std::byte* base = nullptr;
  size_t length = 0;
  int memfd = -1;  // memory from allocate_memory
  std::atomic<int64_t> in_flight{0};
  int exposed_segments = 0;  // guarded by the engine mutex
};

struct OpenedSegment {
  SegmentDescriptor descriptor;
  TransportKind kind = TransportKind::kTcp;
  std::shared_ptr<internal::RemoteSegment> path;
};

Status validate_options(const EngineOptions& o) {
  if (o.name.empty()) return Status::invalid_argument("transfer engine: name must not be empty");
  if (!o.metadata) return Status::invalid_argument("transfer engine: a metadata service is required");
  if (o.transports.empty())
    return Status::invalid_argument("transfer engine: at least one transport is required");
  for (size_t i = 0; i < o.transports.size(); ++i) {
    for (size_t j = 0; j < i; ++j) {
      if (o.transports[i] == o.transports[j]) {
        return Status::invalid_argument(
            fmt::format("transfer engine: transport '{}' listed twice", transport_name(o.transports[i])));
      }
    }
  }
  if (o.tcp.lanes_per_peer < 1 || o.tcp.lanes_per_peer > 64) {
    return Status::invalid_argument(
        fmt::format("transfer engine: tcp.lanes_per_peer must be 1..64, got {}", o.tcp.lanes_per_peer));
  }
  if (o.tcp.slice_bytes < 4096 || o.tcp.slice_bytes > (64ull << 20)) {
    return Status::invalid_argument(
        fmt::format("transfer engine: tcp.slice_bytes must be 4 KiB..64 MiB, got {}", o.tcp.slice_bytes));
  }
  const auto& f = o.failure;
  if (f.request_timeout.count() < 1 || f.connect_timeout.count() < 1 || f.path_cooldown.count() < 0) {
    return Status::invalid_argument("transfer engine: timeouts must be positive and cool-down >= 0");
  }
  if (f.retry_budget < 0 || f.max_endpoints < 1) {
    return Status::invalid_argument(
        fmt::format("transfer engine: retry_budget must be >= 0 and max_endpoints >= 1, got {} and {}",
                    f.retry_budget, f.max_endpoints));
  }
  return Status();
}

}  // namespace

class TransferEngine::Impl {
 public:
  explicit Impl(EngineOptions options) : options_(std::move(options)), host_id_(local_host_id()) {}

  ~Impl() {
    // Withdraw first, so peers stop finding this engine's segments before its transports stop answering.
    std::vector<std::string> names;
    for (const auto& [name, _] : exposed_) names.push_back(name);
    for (const auto& name : names) (void)withdraw_segment(name);
    for (auto& transport : transports_) transport->shutdown();
    transports_.clear();
    if (claimed_) (void)options_.metadata->release_engine(options_.name);
    for (auto& [base, region] : regions_) {
      if (region->memfd >= 0) {
        ::munmap(region->base, region->length);
        ::close(region->memfd);
      }
    }
  }

  Status start() {
    CRESCENT_RETURN_IF_ERROR(options_.metadata->claim_engine(options_.name));
    claimed_ = true;
    internal::TransportContext context{.engine_name = options_.name,
                                       .host_id = host_id_,
                                       .options = &options_,
                                       .segments = &segments_,
                                       .counters = &counters_};
    for (TransportKind kind : options_.transports) {
      Result<std::unique_ptr<internal::Transport>> transport = Status::internal("unreachable");
      switch (kind) {
        case TransportKind::kTcp:
          transport = internal::make_tcp_transport(context);
          break;
        case TransportKind::kShm:
          transport = internal::make_shm_transport(context);
          break;
        case TransportKind::kUcx:
          transport = internal::make_ucx_transport(context);
          break;
      }
      if (!transport.ok()) {
        for (auto& started : transports_) started->shutdown();
        transports_.clear();
        (void)options_.metadata->release_engine(options_.name);
        claimed_ = false;
        return transport.status();
      }
      transports_.push_back(std::move(transport).value());
    }
    return Status();
  }

  const std::string& name() const { return options_.name; }

  Status register_memory(void* address, size_t length, int memfd = -1) {
    if (address == nullptr || length == 0) {
      return Status::invalid_argument(
          fmt::format("register_memory: null address or zero length ({} bytes)", length));
    }
    const auto begin = reinterpret_cast<uintptr_t>(address);
    if (begin + length < begin) {
      return Status::invalid_argument(
          fmt::format("register_memory: range {} +{} overflows", address, length));
    }
    std::lock_guard lock(mu_);
    auto* base = static_cast<std::byte*>(address);
    auto next = regions_.lower_bound(base);
    if (next != regions_.end() && next->first < base + length) {
      return Status::already_exists(fmt::format("register_memory: [{}, +{}) overlaps the region at {}",
                                                address, length, static_cast<void*>(next->first)));
    }
    if (next != regions_.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second->length > base) {
        return Status::already_exists(fmt::format("register_memory: [{}, +{}) overlaps the region at {}",
                                                  address, length, static_cast<void*>(prev->first)));
      }
    }
    auto region = std::make_unique<Region>();
    region->base = base;
    region->length = length;
    region->memfd = memfd;
    regions_.emplace(base, std::move(region));
    return Status();
  }

  Status unregister_memory(void* address, bool allocated) {
    std::unique_ptr<Region> region;
    {
      std::lock_guard lock(mu_);
      auto it = regions_.find(static_cast<std::byte*>(address));
      if (it == regions_.end() || (allocated && it->second->memfd < 0)) {
        return Status::not_found(
            fmt::format("{}: no {} starts at {}", allocated ? "free_memory" : "unregister_memory",
                        allocated ? "memory from allocate_memory" : "registered region", address));
      }
      if (!allocated && it->second->memfd >= 0) {
        return Status::invalid_argument(
            fmt::format("unregister_memory: {} came from allocate_memory; use free_memory", address));
      }
      if (it->second->exposed_segments > 0) {
        return Status::failed_precondition(fmt::format("the region at {} still backs {} exposed segment(s)",
                                                       address, it->second->exposed_segments));
      }
      if (it->second->in_flight.load() > 0) {
        return Status::failed_precondition(fmt::format("the region at {} is used by {} pending request(s)",
                                                       address, it->second->in_flight.load()));
      }
      region = std::move(it->second);
      regions_.erase(it);
    }
    if (region->memfd >= 0) {
      ::munmap(region->base, region->length);
      ::close(region->memfd);
    }
    return Status();
  }

  Result<void*> allocate_memory(size_t length) {
    if (length == 0) return Status::invalid_argument("allocate_memory: zero length");
    const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
    const size_t mapped = (length + page - 1) / page * page;
    const int fd = ::memfd_create(fmt::format("crescent-{}", options_.name).c_str(), MFD_CLOEXEC);
    if (fd < 0)
      return Status::io_error(fmt::format("allocate_memory: memfd_create: {}", std::strerror(errno)));
    if (::ftruncate(fd, static_cast<off_t>(mapped)) != 0) {
      const int err = errno;
      ::close(fd);
      return Status::io_error(
          fmt::format("allocate_memory: {} bytes: ftruncate: {}", length, std::strerror(err)));
    }
    // MAP_POPULATE pre-faults: first-touch page faults run at a fraction of copy speed.
    void* memory = ::mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (memory == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return Status::io_error(fmt::format("allocate_memory: {} bytes: mmap: {}", length, std::strerror(err)));
    }
    Status registered = register_memory(memory, mapped, fd);
    if (!registered.ok()) {
      ::munmap(memory, mapped);
      ::close(fd);
      return registered;
    }
    return memory;
  }

  // The name is reserved and the region pinned (exposed_segments) under mu_; the slow part (transports'
  // expose, which may wait on a UCX progress thread, and the metadata publish, which may be an etcd round
  // trip) runs without mu_, so submit/status/wait never wait on the network.
  Status expose_segment(std::string_view name, void* address, size_t length) {
    internal::LocalSegment segment;
    Region* region = nullptr;
    {
      std::lock_guard lock(mu_);
      if (exposed_.contains(std::string(name))) {
        return Status::already_exists(fmt::format("expose_segment: this engine already exposes '{}'", name));
      }
      region = find_region(static_cast<std::byte*>(address), length);
      if (length == 0) return Status::invalid_argument(fmt::format("expose_segment '{}': zero length", name));
      if (region == nullptr) {
        return Status::invalid_argument(fmt::format(
            "expose_segment '{}': [{}, +{}) is not inside one registered region", name, address, length));
      }
      segment = internal::LocalSegment{
          .id = next_segment_id_++,
          .name = std::string(name),
          .base = static_cast<std::byte*>(address),
          .length_bytes = length,
          .memfd = region->memfd,
          .memfd_offset_bytes = static_cast<uint64_t>(static_cast<std::byte*>(address) - region->base)};
      region->exposed_segments++;
      exposed_.emplace(segment.name, Exposed{.segment = segment, .region = region, .ready = false});
    }
    Status published = publish_segment(segment);
    std::lock_guard lock(mu_);
    if (!published.ok()) {
      exposed_.erase(segment.name);
      region->exposed_segments--;
      return published;
    }
    exposed_.at(segment.name).ready = true;
    return Status();
  }

  Status withdraw_segment(std::string_view name) {
    Exposed exposed;
    {
      std::lock_guard lock(mu_);
      auto it = exposed_.find(std::string(name));
      if (it == exposed_.end() || !it->second.ready) {
        return Status::not_found(fmt::format("withdraw_segment: this engine does not expose '{}'", name));
      }
      it->second.ready = false;  // being withdrawn: the name stays reserved, the region pinned, until done
      exposed = it->second;
    }
    (void)options_.metadata->withdraw(name);
    for (auto& transport : transports_) transport->withdraw(exposed.segment);
    segments_.remove(exposed.segment.id);  // waits for peers' accesses in progress
    std::lock_guard lock(mu_);
    exposed_.erase(exposed.segment.name);
    exposed.region->exposed_segments--;  // only now may the region be unregistered and freed
    return Status();
  }

  Result<SegmentHandle> open_segment(std::string_view name) {
    Result<SegmentDescriptor> descriptor = options_.metadata->lookup(name);
    if (!descriptor.ok()) return descriptor.status();
    {
      // Opening the same segment again reuses its path (an shm mapping, a ucx rkey) unless it was re-exposed.
      std::lock_guard lock(mu_);
      auto it = opened_by_name_.find(descriptor->name);
      if (it != opened_by_name_.end() && opened_[it->second].descriptor.to_json() == descriptor->to_json()) {
        return it->second;
      }
    }
    std::string tried;
    for (auto& transport : transports_) {
      const std::string kind(transport_name(transport->kind()));
      if (!descriptor->transports.contains(kind)) continue;
      Result<std::shared_ptr<internal::RemoteSegment>> path = transport->open(*descriptor);
      if (!path.ok()) {
        tried += fmt::format("; {}: {}", kind, path.status().message());
        continue;
      }
      std::lock_guard lock(mu_);
      const auto handle = static_cast<SegmentHandle>(opened_.size());
      opened_by_name_[descriptor->name] = handle;
      opened_.push_back(OpenedSegment{.descriptor = std::move(descriptor).value(),
                                      .kind = transport->kind(),
                                      .path = std::move(path).value()});
      return handle;
    }
    std::string offered;
    for (const auto& [kind, _] : descriptor->transports.items())
      offered += (offered.empty() ? "" : ",") + kind;
    return Status::unavailable(
        fmt::format("open_segment '{}': no transport of this engine reaches it (owner {} "
                    "serves {}){}",
                    name, descriptor->engine, offered, tried));
  }

  Result<TransportKind> segment_transport(SegmentHandle handle) const {
    std::lock_guard lock(mu_);
    if (handle >= opened_.size()) return Status::not_found(fmt::format("unknown segment handle {}", handle));
    return opened_[handle].kind;
  }

  Result<BatchId> allocate_batch(size_t capacity) {
    if (capacity < 1 || capacity > (1u << 20)) {
      return Status::invalid_argument(
          fmt::format("allocate_batch: capacity must be 1..1048576, got {}", capacity));
    }
    std::lock_guard lock(mu_);
    const BatchId id = next_batch_id_++;
    batches_.emplace(id, std::make_shared<internal::Batch>(capacity));
    return id;
  }

  Status submit(BatchId id, std::span<const TransferRequest> requests) {
    std::shared_ptr<internal::Batch> batch;
    struct Checked {
      Region* region;
      internal::RemoteSegment* path;
    };
    std::vector<Checked> checked(requests.size());
    size_t first = 0;
    {
      std::lock_guard lock(mu_);
      auto it = batches_.find(id);
      if (it == batches_.end()) return Status::not_found(fmt::format("submit: unknown batch {}", id));
      batch = it->second;
      if (requests.size() > batch->capacity() - batch->submitted()) {
        return Status::out_of_range(fmt::format("submit: batch {} has room for {} more request(s), got {}",
                                                id, batch->capacity() - batch->submitted(), requests.size()));
      }
      for (size_t i = 0; i < requests.size(); ++i) {
        const TransferRequest& r = requests[i];
        if (r.length_bytes == 0)
          return Status::invalid_argument(fmt::format("submit: request {}: zero length", i));
        Region* region = find_region(static_cast<std::byte*>(r.local_address), r.length_bytes);
        if (region == nullptr) {
          return Status::invalid_argument(
              fmt::format("submit: request {}: local range [{}, +{}) is not inside registered memory", i,
                          r.local_address, r.length_bytes));
        }
        if (r.segment >= opened_.size()) {
          return Status::invalid_argument(
              fmt::format("submit: request {}: unknown segment handle {}", i, r.segment));
        }
        const uint64_t segment_length = opened_[r.segment].descriptor.length_bytes;
        if (r.offset_bytes > segment_length || r.length_bytes > segment_length - r.offset_bytes) {
          return Status::invalid_argument(
              fmt::format("submit: request {}: [{}, +{}) outside segment '{}' of {} bytes", i, r.offset_bytes,
                          r.length_bytes, opened_[r.segment].descriptor.name, segment_length));
        }
        checked[i] = {region, opened_[r.segment].path.get()};
      }
      // Counted under the lock, so unregister_memory never frees a region a request is about to use.
      for (const Checked& c : checked) c.region->in_flight.fetch_add(1);
      first = *batch->reserve(requests.size());  // room was checked under this lock
    }
    const auto deadline = Clock::now() + options_.failure.request_timeout;
    for (size_t i = 0; i < requests.size(); ++i) {
      batch->request(first + i).reset(batch.get(), &checked[i].region->in_flight, &counters_);
    }
    batch->add_submitted(requests.size());
    for (size_t i = 0; i < requests.size(); ++i) {
      const TransferRequest& r = requests[i];
      checked[i].path->submit({.op = r.op,
                               .local = static_cast<std::byte*>(r.local_address),
                               .offset_bytes = r.offset_bytes,
                               .length_bytes = r.length_bytes,
                               .deadline = deadline,
                               .state = &batch->request(first + i)});
    }
    return Status();
  }

  Result<TransferStatus> status(BatchId id, size_t index) const {
    std::shared_ptr<internal::Batch> batch = find_batch(id);
    if (!batch) return Status::not_found(fmt::format("status: unknown batch {}", id));
    if (index >= batch->submitted()) {
      return Status::out_of_range(fmt::format(
          "status: batch {} has {} submitted request(s), asked for index {}", id, batch->submitted(), index));
    }
    return batch->request(index).status();
  }

  Result<BatchSummary> wait(BatchId id, std::chrono::milliseconds timeout) {
    std::shared_ptr<internal::Batch> batch = find_batch(id);
    if (!batch) return Status::not_found(fmt::format("wait: unknown batch {}", id));
    return batch->wait(timeout);
  }

  Status free_batch(BatchId id) {
    std::lock_guard lock(mu_);
    auto it = batches_.find(id);
    if (it == batches_.end()) return Status::not_found(fmt::format("free_batch: unknown batch {}", id));
    const BatchSummary summary = it->second->summary();
    if (summary.pending() > 0) {
      return Status::failed_precondition(fmt::format(
          "free_batch: batch {} has {} pending request(s); wait for them first", id, summary.pending()));
    }
    batches_.erase(it);
    return Status();
  }

  EngineStats stats() const {
    return {.requests_completed = counters_.requests_completed.load(),
            .requests_failed = counters_.requests_failed.load(),
            .bytes_transferred = counters_.bytes_transferred.load(),
            .slices_retried = counters_.slices_retried.load(),
            .remote_accesses_refused = counters_.remote_accesses_refused.load(),
            .peers_refused = counters_.peers_refused.load(),
            .endpoints_evicted = counters_.endpoints_evicted.load()};
  }

  Status break_tcp_lane(SegmentHandle handle, int lane) {
    std::shared_ptr<internal::RemoteSegment> path;
    {
      std::lock_guard lock(mu_);
      if (handle >= opened_.size())
        return Status::not_found(fmt::format("unknown segment handle {}", handle));
      if (opened_[handle].kind != TransportKind::kTcp) {
        return Status::not_found(fmt::format("segment handle {} does not use tcp", handle));
      }
      path = opened_[handle].path;
    }
    return path->break_lane_for_testing(lane);
  }

 private:
  struct Exposed {
    internal::LocalSegment segment;
    Region* region = nullptr;
    bool ready = false;  // published; false while being exposed or withdrawn
  };

  // Serves `segment` on every transport that can and publishes its descriptor; undoes it all on failure.
  Status publish_segment(const internal::LocalSegment& segment) {
    SegmentDescriptor descriptor{.name = segment.name,
                                 .engine = options_.name,
                                 .host_id = host_id_,
                                 .length_bytes = segment.length_bytes,
                                 .transports = nlohmann::json::object()};
    segments_.add(segment);
    auto undo = [&](Status status) {
      for (auto& t : transports_) t->withdraw(segment);
      segments_.remove(segment.id);
      return status;
    };
    for (auto& transport : transports_) {
      nlohmann::json entry;
      if (Status exposed = transport->expose(segment, entry); !exposed.ok()) return undo(exposed);
      if (!entry.is_null())
        descriptor.transports[std::string(transport_name(transport->kind()))] = std::move(entry);
    }
    if (descriptor.transports.empty()) {
      return undo(Status::invalid_argument(fmt::format(
          "expose_segment '{}': none of this engine's transports can serve it (shm alone serves only "
          "memory from allocate_memory)",
          segment.name)));
    }
    if (Status published = options_.metadata->publish(descriptor); !published.ok()) return undo(published);
    return Status();
  }

  // The registered region holding all of [address, address + length), or null. REQUIRES: mu_ held.
  Region* find_region(std::byte* address, size_t length) const {
    auto it = regions_.upper_bound(address);
    if (it == regions_.begin()) return nullptr;
    Region* region = std::prev(it)->second.get();
    const size_t offset = static_cast<size_t>(address - region->base);
    if (offset > region->length || length > region->length - offset) return nullptr;
    return region;
  }

  std::shared_ptr<internal::Batch> find_batch(BatchId id) const {
    std::lock_guard lock(mu_);
    auto it = batches_.find(id);
    return it == batches_.end() ? nullptr : it->second;
  }

  EngineOptions options_;
  const std::string host_id_;
  bool claimed_ = false;
  internal::Counters counters_;
  internal::SegmentTable segments_;
  std::vector<std::unique_ptr<internal::Transport>> transports_;

  mutable std::mutex mu_;
  std::map<std::byte*, std::unique_ptr<Region>> regions_;
  std::unordered_map<std::string, Exposed> exposed_;
  uint64_t next_segment_id_ = 1;
  std::vector<OpenedSegment> opened_;
  std::unordered_map<std::string, SegmentHandle> opened_by_name_;  // newest handle per segment name
  std::unordered_map<BatchId, std::shared_ptr<internal::Batch>> batches_;
  BatchId next_batch_id_ = 1;
};

Result<std::unique_ptr<TransferEngine>> TransferEngine::create(EngineOptions options) {
  CRESCENT_RETURN_IF_ERROR(validate_options(options));
  auto impl = std::make_unique<Impl>(std::move(options));
  CRESCENT_RETURN_IF_ERROR(impl->start());
  return std::unique_ptr<TransferEngine>(new TransferEngine(std::move(impl)));
}

TransferEngine::TransferEngine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TransferEngine::~TransferEngine() = default;

const std::string& TransferEngine::name() const {
  return impl_->name();
}
Status TransferEngine::register_memory(void* address, size_t length_bytes) {
  return impl_->register_memory(address, length_bytes);
}
Status TransferEngine::unregister_memory(void* address) {
  return impl_->unregister_memory(address, false);
}
Result<void*> TransferEngine::allocate_memory(size_t length_bytes) {
  return impl_->allocate_memory(length_bytes);
}
Status TransferEngine::free_memory(void* address) {
  return impl_->unregister_memory(address, true);
}
Status TransferEngine::expose_segment(std::string_view name, void* address, size_t length_bytes) {
  return impl_->expose_segment(name, address, length_bytes);
}
Status TransferEngine::withdraw_segment(std::string_view name) {
  return impl_->withdraw_segment(name);
}
Result<SegmentHandle> TransferEngine::open_segment(std::string_view name) {
  return impl_->open_segment(name);
}
Result<TransportKind> TransferEngine::segment_transport(SegmentHandle segment) const {
  return impl_->segment_transport(segment);
}
Result<BatchId> TransferEngine::allocate_batch(size_t capacity) {
  return impl_->allocate_batch(capacity);
}
Status TransferEngine::submit(BatchId batch, std::span<const TransferRequest> requests) {
  return impl_->submit(batch, requests);
}
Result<TransferStatus> TransferEngine::status(BatchId batch, size_t index) const {
  return impl_->status(batch, index);
}
Result<BatchSummary> TransferEngine::wait(BatchId batch, std::chrono::milliseconds timeout) {
  return impl_->wait(batch, timeout);
}
Status TransferEngine::free_batch(BatchId batch) {
  return impl_->free_batch(batch);
}
EngineStats TransferEngine::stats() const {
  return impl_->stats();
}
Status TransferEngine::break_tcp_lane_for_testing(SegmentHandle segment, int lane) {
  return impl_->break_tcp_lane(segment, lane);
}

}  // namespace crescent::transfer
