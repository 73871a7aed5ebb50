#include "store/mounted_segment.h"

#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

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
    const auto period = std::max(std::chrono::milliseconds(10), master.info().segment_ttl / 3);
    std::unique_lock<std::mutex> lock(mu);
    while (!cv.wait_for(lock, period, [this] { return stopping; })) {
      lock.unlock();
      Status renewed = master.renew_segment(mount.segment);
      if (renewed.code() == StatusCode::kNotFound && master.mount_segment(mount).ok()) ++remounts;
      lock.lock();
    }
  }

  transfer::TransferEngine& engine;
  MasterClient& master;
  SegmentMount mount;
  void* memory = nullptr;
  bool exposed = false;
  bool mounted = false;
  std::atomic<uint64_t> remounts{0};
  std::thread renewer;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
};

Result<std::unique_ptr<MountedSegment>> MountedSegment::mount(transfer::TransferEngine& engine,
                                                              MasterClient& master, std::string name,
                                                              std::string owner, uint64_t capacity_bytes) {
  auto impl = std::make_unique<Impl>(engine, master);
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
const std::string& MountedSegment::name() const { return impl_->mount.segment; }
uint64_t MountedSegment::capacity_bytes() const { return impl_->mount.capacity_bytes; }
uint64_t MountedSegment::remounts() const { return impl_->remounts.load(); }

}  // namespace crescent::store
