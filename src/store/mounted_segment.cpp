#include "store/mounted_segment.h"

#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "store/ssd_tier.h"

namespace crescent::store {

class MountedSegment::Impl {
 public:
  Impl(transfer::TransferEngine& engine, MasterClient& master) : engine(engine), master(master) {}

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    if (renewer.joinable()) renewer.join();
    if (mounted) (void)master.unmount_segment(mount.segment);
    if (exposed) (void)engine.withdraw_segment(mount.segment);
    if (memory != nullptr) (void)engine.free_memory(memory);
  }

  void renew_loop() {
    const auto period =
        std::max(std::chrono::milliseconds(10), std::min(sync_interval, master.info().segment_ttl / 3));
    std::unique_lock<std::mutex> lock(mu);
    while (!cv.wait_for(lock, period, [this] { return stopping; })) {
      lock.unlock();
      sync();
      lock.lock();
    }
  }

  /// One renewal: apply the master's changes to the index, or mount again with the index when it forgot us.
  void sync() {
    // Reports of orders carried out go with the renewal; orders carried out now are reported at once.
    for (int round = 0; round < 2; ++round) {
      if (!sync_once() || !has_reports()) return;
    }
  }

  bool has_reports() const {
    return !report.spilled.empty() || !report.loaded.empty() || !report.failed.empty() ||
           !report.ssd_dropped.empty();
  }

  /// One renewal; false when the master could not be reached or did not know the segment.
  bool sync_once() {
    Result<SegmentChanges> changes = master.renew_segment(mount.segment, version, report);
    if (changes.ok()) {
      report = {};  // delivered
      if (changes->full) reset_to(*changes);
      for (const SegmentChange& c : changes->changes) apply(c);
      version = changes->version;
      return true;
    }
    if (changes.status().code() != StatusCode::kNotFound) return false;  // unreachable: again next period
    std::vector<HeldObject> held;
    {
      std::lock_guard<std::mutex> lock(index_mu);
      held.reserve(index.size());
      for (const auto& [key, where] : index) held.push_back({key, where.first, where.second});
      if (ssd) {
        for (const auto& [key, size] : ssd->held()) held.push_back({key, 0, size, ReplicaTier::kSsd});
      }
    }
    Status mounted_again = master.mount_segment(mount, held);
    // kAlreadyExists: a retried mount the master had already taken.
    if (mounted_again.ok() || mounted_again.code() == StatusCode::kAlreadyExists) {
      ++remounts;
      report = {};                       // the new master knows nothing of the old orders
      version = kUnknownSegmentVersion;  // the next renewal brings the new master's view in full
    }
    return false;
  }

  /// One change of the feed, in order (`full`: the first of a full list clears the DRAM index).
  /// A full list replaces what the owner believes it holds: the DRAM index is rebuilt from it, and SSD files
  /// it does not list are deleted (removed while the list was being made, or refused at a re-mount).
  void reset_to(const SegmentChanges& full) {
    std::lock_guard<std::mutex> lock(index_mu);
    index.clear();
    if (!ssd) return;
    std::unordered_set<std::string> listed;
    for (const SegmentChange& c : full.changes) {
      if (c.kind == ChangeKind::kAdded && c.object.tier == ReplicaTier::kSsd) listed.insert(c.object.key);
    }
    for (const auto& [key, size] : ssd->held()) {
      if (!listed.contains(key)) ssd->remove(key);
    }
  }

  /// One change of the feed, in order.
  void apply(const SegmentChange& c) {
    std::lock_guard<std::mutex> lock(index_mu);
    const HeldObject& o = c.object;
    std::byte* range = static_cast<std::byte*>(memory) + o.offset_bytes;
    switch (c.kind) {
      case ChangeKind::kAdded:
        if (o.tier == ReplicaTier::kDram) index[o.key] = {o.offset_bytes, o.size_bytes};
        break;
      case ChangeKind::kRemoved:
        index.erase(o.key);
        if (ssd) ssd->remove(o.key);
        break;
      case ChangeKind::kEvicted:
        index.erase(o.key);
        break;
      case ChangeKind::kSpill: {
        if (!ssd || o.offset_bytes + o.size_bytes > mount.capacity_bytes) {
          report.failed.push_back({o.key, o.offset_bytes, o.size_bytes});
          break;
        }
        const Status written = ssd->write(o.key, range, o.size_bytes, report.ssd_dropped);
        if (!written.ok()) {
          report.failed.push_back({o.key, o.offset_bytes, o.size_bytes});
          break;
        }
        report.spilled.push_back({o.key, o.offset_bytes, o.size_bytes});
        index.erase(o.key);
        break;
      }
      case ChangeKind::kLoad: {
        const Status read = !ssd || o.offset_bytes + o.size_bytes > mount.capacity_bytes
                                ? Status::invalid_argument("no SSD tier, or a range outside the segment")
                                : ssd->read(o.key, range, o.size_bytes);
        if (!read.ok()) {
          report.failed.push_back({o.key, o.offset_bytes, o.size_bytes});
          // No file, or an unreadable one: the master must forget this SSD copy, or readers wait on it.
          if (ssd) ssd->remove(o.key);
          report.ssd_dropped.push_back(o.key);
          break;
        }
        report.loaded.push_back({o.key, o.offset_bytes, o.size_bytes});
        index[o.key] = {o.offset_bytes, o.size_bytes};
        break;
      }
    }
  }

  transfer::TransferEngine& engine;
  MasterClient& master;
  SegmentMount mount;
  void* memory = nullptr;
  bool exposed = false;
  bool mounted = false;
  std::chrono::milliseconds sync_interval{100};
  std::atomic<uint64_t> remounts{0};
  uint64_t version = kUnknownSegmentVersion;  // of the index; renewal thread only
  SegmentReport report;                       // to send with the next renewal; renewal thread only
  std::unique_ptr<SsdTier> ssd;               // used by the renewal thread; sizes read under index_mu
  mutable std::mutex index_mu;
  std::unordered_map<std::string, std::pair<uint64_t, uint64_t>> index;  // key -> (offset, size)
  std::thread renewer;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
};

Result<std::unique_ptr<MountedSegment>> MountedSegment::mount(transfer::TransferEngine& engine,
                                                              MasterClient& master, std::string name,
                                                              std::string owner, uint64_t capacity_bytes,
                                                              const Options& options) {
  auto impl = std::make_unique<Impl>(engine, master);
  impl->sync_interval = options.sync_interval;
  impl->mount = {std::move(name), std::move(owner), transfer::local_host_id(), capacity_bytes};
  if (!options.ssd_dir.empty()) {
    auto ssd = SsdTier::open(options.ssd_dir, options.ssd_capacity_bytes);
    if (!ssd.ok()) return ssd.status();
    impl->ssd = std::move(*ssd);
    impl->mount.ssd_capacity_bytes = options.ssd_capacity_bytes;
  }
  Result<void*> memory = engine.allocate_memory(capacity_bytes);
  if (!memory.ok()) return memory.status();
  impl->memory = *memory;
  CRESCENT_RETURN_IF_ERROR(engine.expose_segment(impl->mount.segment, impl->memory, capacity_bytes));
  impl->exposed = true;
  CRESCENT_RETURN_IF_ERROR(master.mount_segment(impl->mount));
  impl->mounted = true;
  Impl* raw = impl.get();
  impl->renewer = std::thread([raw] { raw->renew_loop(); });
  return std::unique_ptr<MountedSegment>(new MountedSegment(std::move(impl)));
}

MountedSegment::MountedSegment(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
MountedSegment::~MountedSegment() = default;
const std::string& MountedSegment::name() const {
  return impl_->mount.segment;
}
uint64_t MountedSegment::capacity_bytes() const {
  return impl_->mount.capacity_bytes;
}
uint64_t MountedSegment::remounts() const {
  return impl_->remounts.load();
}
uint64_t MountedSegment::indexed_objects() const {
  std::lock_guard<std::mutex> lock(impl_->index_mu);
  return impl_->index.size();
}
uint64_t MountedSegment::ssd_objects() const {
  std::lock_guard<std::mutex> lock(impl_->index_mu);
  return impl_->ssd ? impl_->ssd->held().size() : 0;
}
uint64_t MountedSegment::ssd_used_bytes() const {
  std::lock_guard<std::mutex> lock(impl_->index_mu);
  return impl_->ssd ? impl_->ssd->used_bytes() : 0;
}
uint64_t MountedSegment::ssd_capacity_bytes() const {
  return impl_->mount.ssd_capacity_bytes;
}

}  // namespace crescent::store
