// A DRAM segment offered to the pool by a storage node or by a client (as Mooncake's inference instances do):
// memory from the transfer engine (shareable, so same-host peers reach it over shm), exposed under a name,
// mounted on the master and kept mounted by a renewal thread, which also keeps the owner's own index of the
// complete objects in the segment (from the master's change feed; with an SSD tier, an SSD thread carries out
// the feed's spill and load orders and updates the index as they complete). When the master forgets the
// segment (it restarted, or a standby took over), the segment is mounted again with that index, so the
// objects whose bytes are still here become readable again. A node restarted on its SSD directory offers the
// files it finds there with its first mount (ssd_tier.h).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"
#include "store/master_client.h"
#include "store/ssd_tier.h"
#include "transfer/transfer_engine.h"

namespace crescent::store {

class MountedSegment {
 public:
  /// How the segment is kept.
  struct Options {
    std::chrono::milliseconds sync_interval{100};  // renewals (and index updates), at most segment_ttl / 3
    std::string ssd_dir = "";                      // "" = no SSD tier
    uint64_t ssd_capacity_bytes = 0;               // required with ssd_dir
    /// Tests: every SSD order waits this long before its I/O (a slow disk).
    std::chrono::milliseconds ssd_delay_for_testing{0};
  };

  /// Allocates `capacity_bytes` from `engine`, exposes it as segment `name` and mounts it on the master as
  /// owned by `owner`. A thread renews the mount every `options.sync_interval` (at most segment_ttl / 3),
  /// applying the changes to the index, and mounts it again with the index when the master no longer knows
  /// it. With options.ssd_dir, the files a previous run left there are adopted (SsdTier::open) and offered
  /// with the first mount, and a second thread carries out the spill and load orders on the SSD tier, in feed
  /// order, so that file I/O never delays a renewal; their outcomes go out with a renewal at once. Each mount
  /// carries a new incarnation, so a node restarted under its old name replaces its dead segment. Errors:
  /// the engine's (kIoError when memory cannot be had, kAlreadyExists for a taken name), the SSD tier's, or
  /// the master's. `engine` and `master` must outlive the segment.
  static Result<std::unique_ptr<MountedSegment>> mount(transfer::TransferEngine& engine, MasterClient& master,
                                                       std::string name, std::string owner,
                                                       uint64_t capacity_bytes, const Options& options);
  /// Stops renewing, unmounts from the master (best effort: an unreachable master lets the lease run out),
  /// withdraws the segment and frees its memory.
  ~MountedSegment();
  MountedSegment(const MountedSegment&) = delete;
  MountedSegment& operator=(const MountedSegment&) = delete;

  const std::string& name() const;
  uint64_t capacity_bytes() const;
  /// Times the segment was mounted again after the master had lost it.
  uint64_t remounts() const;
  /// Spills the SSD tier could not write (each logged at the first failure and every power of two after).
  uint64_t ssd_spill_failures() const;
  /// Complete objects in the owner's index now (DRAM tier).
  uint64_t indexed_objects() const;
  /// Objects and bytes on the SSD tier now (0 without one).
  uint64_t ssd_objects() const;
  uint64_t ssd_used_bytes() const;
  uint64_t ssd_capacity_bytes() const;
  /// What the SSD tier adopted from a previous run's files when the segment was mounted (all 0 without one).
  const SsdTier::Adopted& ssd_adopted() const;

  class Impl;

 private:
  explicit MountedSegment(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::store
