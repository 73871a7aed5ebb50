#include "store/mounted_segment.h"

#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>

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
    Result<SegmentChanges> changes = master.renew_segment(mount.segment, version);
    if (changes.ok()) {
      std::lock_guard<std::mutex> lock(index_mu);
      if (changes->full) index.clear();
      for (const SegmentChange& c : changes->changes) {
        if (c.added) {
          index[c.object.key] = {c.object.offset_bytes, c.object.size_bytes};
        } else {
          index.erase(c.object.key);
        }
      }
      version = changes->version;
      return;
    }
    if (changes.status().code() != StatusCode::kNotFound) return;  // unreachable: try again next period
    std::vector<HeldObject> held;
    {
      std::lock_guard<std::mutex> lock(index_mu);
      held.reserve(index.size());
      for (const auto& [key, where] : index) held.push_back({key, where.first, where.second});
    }
    if (master.mount_segment(mount, held).ok()) {
      ++remounts;
      version = kUnknownSegmentVersion;  // the next renewal brings the new master's view in full
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
                                                              std::chrono::milliseconds sync_interval) {
  auto impl = std::make_unique<Impl>(engine, master);
  impl->sync_interval = sync_interval;
  impl->mount = {std::move(name), std::move(owner), transfer::local_host_id(), capacity_bytes};
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

}  // namespace crescent::store
