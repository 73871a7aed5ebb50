#include "store/mounted_segment.h"

#include <fmt/format.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "store/ssd_tier.h"

namespace crescent::store {

class MountedSegment::Impl {
 public:
  /// An order for the SSD worker.
  struct Order {
    ChangeKind kind = ChangeKind::kSpill;  // kSpill, kLoad, or kRemoved (delete the file)
    HeldObject object;
  };

  Impl(transfer::TransferEngine& engine, MasterClient& master) : engine(engine), master(master) {}

  ~Impl() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    {
      std::lock_guard<std::mutex> lock(queue_mu);
      // Orders still queued are dropped (the node is leaving); a renewer waiting in settle_ssd returns.
      ssd_stopping = true;
    }
    cv.notify_all();
    queue_cv.notify_all();
    if (renewer.joinable()) renewer.join();
    if (ssd_worker.joinable()) ssd_worker.join();
    if (mounted) (void)master.unmount_segment(mount.segment);
    if (exposed) (void)engine.withdraw_segment(mount.segment);
    if (memory != nullptr) (void)engine.free_memory(memory);
  }

  /// Renews every period, and at once when the SSD worker has carried out orders (a reader may be waiting for
  /// a load).
  void renew_loop() {
    const auto period =
        std::max(std::chrono::milliseconds(10), std::min(sync_interval, master.info().segment_ttl / 3));
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait_for(lock, period, [this] { return stopping || reports_ready; });
      if (stopping) return;
      reports_ready = false;
      lock.unlock();
      sync();
      lock.lock();
    }
  }

  /// One renewal with the reports of orders carried out so far: apply the master's changes to the index, or
  /// mount again with the index when it forgot us. An unreachable master is tried again next period.
  void sync() {
    take_done_reports();
    Result<SegmentChanges> changes = master.renew_segment(mount.segment, version, report);
    if (changes.ok()) {
      report = {};  // delivered
      if (changes->full) reset_to(*changes);
      for (const SegmentChange& c : changes->changes) apply(c);
      version = changes->version;
      return;
    }
    if (changes.status().code() != StatusCode::kNotFound) return;  // unreachable: again next period
    // The master forgot the segment. Its spill and load orders are dropped (a load still to come would write
    // into a range the new master may hand to a new object); the one under way and file deletions finish
    // first, so the list below has neither half-done work nor removed objects.
    settle_ssd(/*drop_spills_and_loads=*/true);
    std::vector<HeldObject> held;
    {
      std::lock_guard<std::mutex> lock(index_mu);
      held.reserve(index.size());
      for (const auto& [key, where] : index) held.push_back({key, where.first, where.second});
    }
    if (ssd) {
      std::lock_guard<std::mutex> lock(tier_mu);
      for (const auto& [key, size] : ssd->held()) held.push_back({key, 0, size, ReplicaTier::kSsd});
    }
    Status mounted_again = master.mount_segment(mount, held);
    // kAlreadyExists: a retried mount the master had already taken.
    if (mounted_again.ok() || mounted_again.code() == StatusCode::kAlreadyExists) {
      ++remounts;
      report = {};  // the new master knows nothing of the old orders
      {
        std::lock_guard<std::mutex> lock(queue_mu);
        done = {};
      }
      version = kUnknownSegmentVersion;  // the next renewal brings the new master's view in full
    }
  }

  /// Moves the SSD worker's reports into the next renewal's.
  void take_done_reports() {
    std::lock_guard<std::mutex> lock(queue_mu);
    auto move_all = [](auto& from, auto& to) {
      to.insert(to.end(), std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
      from.clear();
    };
    move_all(done.spilled, report.spilled);
    move_all(done.loaded, report.loaded);
    move_all(done.failed, report.failed);
    move_all(done.ssd_dropped, report.ssd_dropped);
  }

  /// Waits until the SSD worker is idle, all queued orders carried out, or with `drop_spills_and_loads` only
  /// the file deletions among them. Returns early when the segment is being destroyed.
  void settle_ssd(bool drop_spills_and_loads) {
    std::unique_lock<std::mutex> lock(queue_mu);
    if (drop_spills_and_loads) {
      std::erase_if(orders, [](const Order& o) { return o.kind != ChangeKind::kRemoved; });
    }
    queue_cv.wait(lock, [this] { return (orders.empty() && !ssd_busy) || ssd_stopping; });
  }

  /// Queues an order for the SSD worker (spill, load, or the removal of a file), carried out in feed order.
  void queue_order(ChangeKind kind, const HeldObject& object) {
    {
      std::lock_guard<std::mutex> lock(queue_mu);
      orders.push_back({kind, object});
    }
    queue_cv.notify_all();
  }

  /// The SSD worker: carries out orders one at a time, off the renewal thread, so that file I/O does not
  /// delay the periodic renewals (past segment_ttl the master would drop the segment).
  void ssd_loop() {
    std::unique_lock<std::mutex> lock(queue_mu);
    for (;;) {
      queue_cv.wait(lock, [this] { return ssd_stopping || !orders.empty(); });
      if (ssd_stopping) return;
      const Order order = std::move(orders.front());
      orders.pop_front();
      ssd_busy = true;
      lock.unlock();
      SegmentReport outcome;
      if (ssd_delay.count() > 0) std::this_thread::sleep_for(ssd_delay);
      carry_out(order, outcome);
      lock.lock();
      ssd_busy = false;
      // Reported at once when a reader may wait (a load) or the queue is done; a burst of spills is reported
      // every 10 ms, not once per file.
      const auto now = std::chrono::steady_clock::now();
      const bool any = !outcome.spilled.empty() || !outcome.loaded.empty() || !outcome.failed.empty() ||
                       !outcome.ssd_dropped.empty();
      const bool urgent = !outcome.loaded.empty() || orders.empty() ||
                          now - last_report_signal >= std::chrono::milliseconds(10);
      for (HeldObject& h : outcome.spilled) done.spilled.push_back(std::move(h));
      for (HeldObject& h : outcome.loaded) done.loaded.push_back(std::move(h));
      for (HeldObject& h : outcome.failed) done.failed.push_back(std::move(h));
      for (std::string& k : outcome.ssd_dropped) done.ssd_dropped.push_back(std::move(k));
      queue_cv.notify_all();  // settle_ssd
      if (any && urgent) {
        last_report_signal = now;
        lock.unlock();
        {
          std::lock_guard<std::mutex> renew_lock(mu);
          reports_ready = true;
        }
        cv.notify_all();
        lock.lock();
      }
    }
  }

  /// Publishes the SSD tier's size for metrics. REQUIRES: tier_mu held.
  void note_ssd_size() {
    ssd_objects_now = ssd->objects();
    ssd_used_bytes_now = ssd->used_bytes();
  }

  /// One order on the SSD tier; what the master must hear goes to `outcome`.
  void carry_out(const Order& order, SegmentReport& outcome) {
    const HeldObject& o = order.object;
    std::byte* range = static_cast<std::byte*>(memory) + o.offset_bytes;
    const bool in_segment =
        o.size_bytes <= mount.capacity_bytes && o.offset_bytes <= mount.capacity_bytes - o.size_bytes;
    switch (order.kind) {
      case ChangeKind::kRemoved: {
        std::lock_guard<std::mutex> lock(tier_mu);
        ssd->remove(o.key);
        note_ssd_size();
        break;
      }
      case ChangeKind::kSpill: {
        Status written = Status::invalid_argument("a range outside the segment");
        if (in_segment) {
          std::lock_guard<std::mutex> lock(tier_mu);
          written = ssd->write(o.key, range, o.size_bytes, outcome.ssd_dropped);
          note_ssd_size();
        }
        if (!written.ok()) {
          outcome.failed.push_back({o.key, o.offset_bytes, o.size_bytes});
          // Counted; logged the first time and then at every power of two, so a full or broken disk is
          // seen without a line per object.
          const uint64_t failures = ++spill_failures;
          if ((failures & (failures - 1)) == 0) {
            fmt::print(stderr, "store node: {} spill{} to the SSD tier failed; the latest: {}\n", failures,
                       failures == 1 ? "" : "s", written.message());
          }
          break;
        }
        outcome.spilled.push_back({o.key, o.offset_bytes, o.size_bytes});
        std::lock_guard<std::mutex> lock(index_mu);
        // Only this range's entry: the feed may have brought a newer object of the key meanwhile.
        if (auto it = index.find(o.key);
            it != index.end() && it->second == std::make_pair(o.offset_bytes, o.size_bytes)) {
          index.erase(it);
        }
        break;
      }
      case ChangeKind::kLoad: {
        Status read = Status::invalid_argument("a range outside the segment");
        {
          std::lock_guard<std::mutex> lock(tier_mu);
          if (in_segment) read = ssd->read(o.key, range, o.size_bytes);
          // No file, or an unreadable one: the master must forget this SSD copy, or readers wait on it.
          if (!read.ok()) ssd->remove(o.key);
          note_ssd_size();
        }
        if (!read.ok()) {
          outcome.failed.push_back({o.key, o.offset_bytes, o.size_bytes});
          outcome.ssd_dropped.push_back(o.key);
          break;
        }
        outcome.loaded.push_back({o.key, o.offset_bytes, o.size_bytes});
        std::lock_guard<std::mutex> lock(index_mu);
        index[o.key] = {o.offset_bytes, o.size_bytes};
        break;
      }
      default:
        break;
    }
  }

  /// One change of the feed, in order (`full`: the first of a full list clears the DRAM index).
  /// A full list replaces what the owner believes it holds: the DRAM index is rebuilt from it, and SSD files
  /// it does not list are deleted (removed while the list was being made, or refused at a re-mount).
  void reset_to(const SegmentChanges& full) {
    // Settled first: an order finishing later would change the index or the files after the reset.
    if (ssd) settle_ssd(/*drop_spills_and_loads=*/false);
    {
      std::lock_guard<std::mutex> lock(index_mu);
      index.clear();
    }
    if (!ssd) return;
    std::lock_guard<std::mutex> lock(tier_mu);
    std::unordered_set<std::string> listed;
    for (const SegmentChange& c : full.changes) {
      if (c.kind == ChangeKind::kAdded && c.object.tier == ReplicaTier::kSsd) listed.insert(c.object.key);
    }
    for (const auto& [key, size] : ssd->held()) {
      if (!listed.contains(key)) ssd->remove(key);
    }
    note_ssd_size();
  }

  /// One change of the feed, in order. SSD work goes to the SSD worker, in the same order.
  void apply(const SegmentChange& c) {
    const HeldObject& o = c.object;
    switch (c.kind) {
      case ChangeKind::kAdded:
        if (o.tier == ReplicaTier::kDram) {
          std::lock_guard<std::mutex> lock(index_mu);
          index[o.key] = {o.offset_bytes, o.size_bytes};
        }
        break;
      case ChangeKind::kRemoved: {
        {
          std::lock_guard<std::mutex> lock(index_mu);
          index.erase(o.key);
        }
        if (ssd) queue_order(ChangeKind::kRemoved, o);
        break;
      }
      case ChangeKind::kEvicted: {
        std::lock_guard<std::mutex> lock(index_mu);
        index.erase(o.key);
        break;
      }
      case ChangeKind::kSpill:
      case ChangeKind::kLoad:
        if (ssd) {
          queue_order(c.kind, o);
        } else {
          report.failed.push_back({o.key, o.offset_bytes, o.size_bytes});
          if (c.kind == ChangeKind::kLoad) report.ssd_dropped.push_back(o.key);
        }
        break;
    }
  }

  transfer::TransferEngine& engine;
  MasterClient& master;
  SegmentMount mount;
  void* memory = nullptr;
  bool exposed = false;
  bool mounted = false;
  std::chrono::milliseconds sync_interval{100};
  std::chrono::milliseconds ssd_delay{0};  // Options::ssd_delay_for_testing
  std::atomic<uint64_t> remounts{0};
  std::atomic<uint64_t> spill_failures{0};    // spills the SSD tier could not write (the object is dropped)
  uint64_t version = kUnknownSegmentVersion;  // of the index; renewal thread only
  SegmentReport report;                       // to send with the next renewal; renewal thread only
  mutable std::mutex index_mu;
  std::unordered_map<std::string, std::pair<uint64_t, uint64_t>> index;  // key -> (offset, size)
  std::thread renewer;
  std::mutex mu;  // renewer's wake-ups
  std::condition_variable cv;
  bool stopping = false;       // guarded by mu
  bool reports_ready = false;  // guarded by mu: the SSD worker has news for the master

  // The SSD tier and its worker. Lock order: queue_mu is never held with tier_mu or index_mu.
  std::unique_ptr<SsdTier> ssd;  // null without an SSD tier; used under tier_mu
  mutable std::mutex tier_mu;
  std::mutex queue_mu;
  std::condition_variable queue_cv;
  std::deque<Order> orders;   // guarded by queue_mu
  SegmentReport done;         // guarded by queue_mu: outcomes not yet taken into `report`
  bool ssd_busy = false;      // guarded by queue_mu: an order is being carried out
  bool ssd_stopping = false;  // guarded by queue_mu
  std::chrono::steady_clock::time_point last_report_signal{};  // guarded by queue_mu
  // The SSD tier's size, for metrics without waiting for file I/O under tier_mu.
  std::atomic<uint64_t> ssd_objects_now{0};
  std::atomic<uint64_t> ssd_used_bytes_now{0};
  SsdTier::Adopted ssd_adopted;  // what the SSD tier adopted when it opened
  std::thread ssd_worker;
};

Result<std::unique_ptr<MountedSegment>> MountedSegment::mount(transfer::TransferEngine& engine,
                                                              MasterClient& master, std::string name,
                                                              std::string owner, uint64_t capacity_bytes,
                                                              const Options& options) {
  auto impl = std::make_unique<Impl>(engine, master);
  impl->sync_interval = options.sync_interval;
  impl->ssd_delay = options.ssd_delay_for_testing;
  impl->mount = {std::move(name), std::move(owner), transfer::local_host_id(), capacity_bytes};
  impl->mount.incarnation = std::random_device{}() | (uint64_t{std::random_device{}()} << 32) | 1;
  // The SSD files a previous run of this node left are offered to the master with the first mount: it takes
  // those it can (master.h, mount_segment), and the first renewal's full list deletes the others (reset_to).
  std::vector<HeldObject> adopted;
  if (!options.ssd_dir.empty()) {
    auto ssd = SsdTier::open(options.ssd_dir, options.ssd_capacity_bytes);
    if (!ssd.ok()) return ssd.status();
    impl->ssd = std::move(*ssd);
    impl->mount.ssd_capacity_bytes = options.ssd_capacity_bytes;
    for (const auto& [key, size] : impl->ssd->held()) adopted.push_back({key, 0, size, ReplicaTier::kSsd});
    impl->ssd_adopted = impl->ssd->adopted();
    std::lock_guard<std::mutex> lock(impl->tier_mu);
    impl->note_ssd_size();
  }
  Result<void*> memory = engine.allocate_memory(capacity_bytes);
  if (!memory.ok()) return memory.status();
  impl->memory = *memory;
  CRESCENT_RETURN_IF_ERROR(engine.expose_segment(impl->mount.segment, impl->memory, capacity_bytes));
  impl->exposed = true;
  CRESCENT_RETURN_IF_ERROR(master.mount_segment(impl->mount, adopted));
  impl->mounted = true;
  Impl* raw = impl.get();
  if (impl->ssd) impl->ssd_worker = std::thread([raw] { raw->ssd_loop(); });
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
uint64_t MountedSegment::ssd_spill_failures() const {
  return impl_->spill_failures.load();
}
uint64_t MountedSegment::indexed_objects() const {
  std::lock_guard<std::mutex> lock(impl_->index_mu);
  return impl_->index.size();
}
uint64_t MountedSegment::ssd_objects() const {
  return impl_->ssd_objects_now.load();
}
uint64_t MountedSegment::ssd_used_bytes() const {
  return impl_->ssd_used_bytes_now.load();
}
uint64_t MountedSegment::ssd_capacity_bytes() const {
  return impl_->mount.ssd_capacity_bytes;
}
const SsdTier::Adopted& MountedSegment::ssd_adopted() const {
  return impl_->ssd_adopted;
}

}  // namespace crescent::store
