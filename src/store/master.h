// The store's master (paper §3.2; docs/store.md): metadata only. It knows the mounted
// segments and, for every key, where its replicas lie and whether they are written yet; it never touches
// value bytes, which clients move to and from segments through the transfer engine.
//
// Life of an object: put_start allocates one range per replica on distinct segments and records the object as
// processing (invisible to readers); the client writes the bytes; put_end makes it complete, put_revoke frees
// it, and a put never ended is reclaimed after put_timeout. get_replica_list returns a complete object's
// replicas and grants a read lease: until it passes, neither eviction nor remove touches the object.
//
// Eviction (docs/store.md, "Design"): when used DRAM bytes exceed high_watermark of the mounted
// capacity, the least recently used evictable objects are dropped until eviction_fraction of the capacity is
// freed; a put that finds no room evicts until it fits. Evictable: complete, no live lease, not hard-pinned,
// and not soft-pinned unless a put has nothing else to free.
//
// Time comes from MasterOptions::clock, so tests drive leases and timeouts without sleeping. Thread-safe: one
// mutex; the batch calls take it once for all their keys.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "store/types.h"

namespace crescent::store {

/// The master's clock (std::chrono::steady_clock::now in production).
using MasterClock = std::function<std::chrono::steady_clock::time_point()>;

/// Settings of a master. Defaults follow Mooncake's (docs/store.md) unless said otherwise.
struct MasterOptions {
  std::chrono::milliseconds lease_ttl{5000};     // read lease granted by get_replica_list
  std::chrono::milliseconds segment_ttl{10000};  // a segment not renewed for this long is unmounted
  /// A segment not renewed for this long (its owner renews every 100 ms) gets no new replicas; it keeps its
  /// objects until segment_ttl. So a dead node's segment stops being chosen within about this long, not
  /// segment_ttl. When no segment was renewed that recently (the master itself was stalled), any goes.
  std::chrono::milliseconds placement_stale_after{1000};
  std::chrono::milliseconds put_timeout{30000};     // a put not ended by then is reclaimed
  std::chrono::milliseconds soft_pin_ttl{1800000};  // a soft pin lasts this long after the put ends (30 min)
  double high_watermark = 0.95;     // fraction of DRAM capacity above which eviction runs, (0, 1]
  double eviction_fraction = 0.05;  // fraction of DRAM capacity one eviction round frees, (0, 1]
  AllocationStrategy strategy = AllocationStrategy::kRandom;
  uint64_t seed = 1;            // for kRandom
  MasterClock clock = nullptr;  // nullptr: steady_clock::now
};

/// kInvalidArgument naming the first field out of range (watermark or fraction outside (0, 1], a zero TTL).
Status validate(const MasterOptions& options);

/// A segment a node or client offers to the pool.
struct SegmentMount {
  std::string segment;  // transfer-engine segment name (unique)
  std::string owner;    // who mounted it (a node or client id); its lease renewals keep the segment
  std::string host_id;  // the owner's machine (transfer::SegmentDescriptor::host_id), for local reads
  uint64_t capacity_bytes = 0;
  /// > 0: the owner keeps an SSD tier of this many bytes behind the segment. Objects evicted from the segment
  /// are then spilled to it (written to files by the owner) instead of dropped, and read back on demand.
  uint64_t ssd_capacity_bytes = 0;
  /// Which start of the owner mounts (a random number per process; 0 = not said). A mount of a segment
  /// name already mounted by the same owner under another incarnation is that owner restarted: the dead
  /// incarnation's segment is unmounted first (its memory died with it), so a node restarted under a fixed
  /// name does not wait out segment_ttl. The same incarnation again is a retried mount (kAlreadyExists).
  uint64_t incarnation = 0;
};

/// A complete object as the owner of the segment holding it records it in its own index, so that a master
/// that restarts or takes over rebuilds its metadata from the owners' re-mounts (docs/store.md, "Design").
struct HeldObject {
  std::string key;
  uint64_t offset_bytes = 0;  // in the segment (DRAM tier); unused for the SSD tier
  uint64_t size_bytes = 0;
  ReplicaTier tier = ReplicaTier::kDram;
};

/// What a change in a segment's feed tells its owner.
enum class ChangeKind : uint8_t {
  kAdded,    // a complete object now lies at (offset, size) in the segment
  kRemoved,  // the object is gone from this owner, both tiers (key alone): delete its SSD file too
  kEvicted,  // the object's DRAM copy here is gone (key alone); its SSD file here, if any, stays
  kSpill,    // order: write the bytes at (offset, size) to the SSD tier, then report it spilled
  kLoad,     // order: read the object's SSD file into (offset, size), then report it loaded
};

/// One change to a segment's objects, in feed order.
struct SegmentChange {
  ChangeKind kind = ChangeKind::kAdded;
  HeldObject object;
};

/// What the owner of a segment with an SSD tier reports when it renews: orders done and files dropped.
struct SegmentReport {
  std::vector<HeldObject> spilled = {};       // kSpill done (key, offset): the DRAM range may be freed
  std::vector<HeldObject> loaded = {};        // kLoad done (key, offset): the DRAM copy is readable
  std::vector<std::string> ssd_dropped = {};  // SSD files deleted to stay within the SSD capacity
  std::vector<HeldObject> failed = {};  // orders that failed (key, offset): a spill is dropped, a load undone
};

/// What a segment's owner learns when it renews: the changes since the version it acknowledged, in order.
struct SegmentChanges {
  uint64_t version = 0;  // the segment's version after these changes (acknowledge it in the next renew)
  bool full = false;     // the acknowledged version was unknown: `changes` adds everything the segment holds
  std::vector<SegmentChange> changes;
};

/// renew_segment's since_version when the owner knows nothing yet: the answer is a full list.
inline constexpr uint64_t kUnknownSegmentVersion = ~uint64_t{0};

/// A mounted segment as the master sees it.
struct SegmentInfo {
  std::string segment;
  std::string owner;
  std::string host_id;
  ReplicaTier tier = ReplicaTier::kDram;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;          // allocated (aligned sizes), processing objects included
  uint64_t replicas = 0;            // replicas placed on it, both tiers
  uint64_t ssd_capacity_bytes = 0;  // the owner's SSD tier (0: none)
  uint64_t ssd_used_bytes = 0;      // value bytes of SSD replicas there
};

/// What a reader gets: the complete replicas of one object and how long its lease lasts, counted from when
/// the request reached the master (a client counts it from when it sent the request, which is earlier).
struct ReadGrant {
  uint64_t size_bytes = 0;
  std::vector<ReplicaLocation> replicas;
  std::chrono::milliseconds lease_ttl{0};
};

/// Counters since the master started (monotonic) and current gauges.
struct MasterStats {
  uint64_t objects = 0;             // complete objects
  uint64_t processing_objects = 0;  // puts started, not yet ended
  uint64_t segments = 0;
  uint64_t dram_capacity_bytes = 0;
  uint64_t dram_used_bytes = 0;
  uint64_t puts_started = 0;
  uint64_t puts_ended = 0;
  uint64_t puts_revoked = 0;
  uint64_t puts_reclaimed = 0;  // processing puts dropped after put_timeout
  uint64_t puts_no_space = 0;
  uint64_t gets = 0;  // get_replica_list calls (per key)
  uint64_t hits = 0;  // ... that found a complete object
  uint64_t misses = 0;
  uint64_t leases_granted = 0;
  uint64_t leases_expired = 0;  // leases that ran out (a lease extended before it ran out ends once)
  uint64_t evictions = 0;       // objects evicted
  uint64_t evicted_bytes = 0;
  uint64_t removes = 0;
  uint64_t segments_expired = 0;   // unmounted because their owner stopped renewing
  uint64_t segments_replaced = 0;  // unmounted because their owner mounted again after a restart
  uint64_t objects_restored = 0;   // complete objects rebuilt from re-mounting owners' indexes
  uint64_t objects_rejected = 0;   // ... refused (overlapping ranges, size mismatch with another replica)
  uint64_t ssd_capacity_bytes = 0;
  uint64_t ssd_used_bytes = 0;  // value bytes of SSD replicas
  uint64_t spills = 0;          // DRAM replicas written to an SSD tier on eviction
  uint64_t loads = 0;           // SSD replicas read back into DRAM for a reader
  uint64_t replicas_unwritten =
      0;  // replicas a writer could not write (their segment's owner was gone): dropped
  uint64_t segments_suspected = 0;  // times a writer reported a segment unreachable (no new replicas until
                                    // its owner renews it)
};

/// Every MasterStats field as (name, value), in declaration order: the one list the RPC reply, `store stat`
/// and /metrics are built from. from_stats_fields reads it back (unknown names ignored, missing ones 0).
std::vector<std::pair<std::string_view, uint64_t>> stats_fields(const MasterStats& stats);
MasterStats from_stats_fields(const std::vector<std::pair<std::string, uint64_t>>& fields);

class Master {
 public:
  /// REQUIRES: validate(options) is ok.
  explicit Master(MasterOptions options);
  ~Master();
  Master(const Master&) = delete;
  Master& operator=(const Master&) = delete;

  /// Adds a DRAM segment; its lease starts now. `held` are the complete objects its owner already holds there
  /// (a re-mount after the master restarted or failed over): each becomes a complete object, or one more
  /// replica of an object of the same key and size, unless its range overlaps another (then it is counted in
  /// objects_rejected and its bytes will be overwritten). kInvalidArgument for an empty name or owner or zero
  /// capacity; kAlreadyExists when a segment of that name is mounted.
  Status mount_segment(const SegmentMount& mount, std::span<const HeldObject> held = {});
  /// Removes a segment; every replica on it disappears, and objects left without replicas are dropped
  /// (processing ones too: their put_end then fails). kNotFound when not mounted.
  Status unmount_segment(std::string_view segment);
  /// Renews a segment's lease (the owner's heartbeat) and returns the changes to its complete objects since
  /// `since_version`, which the owner thereby acknowledges (the master forgets changes up to it). A version
  /// the master does not know (kUnknownSegmentVersion, or one from a previous master) gets a full list.
  /// kNotFound when not mounted (expired or never mounted: the owner should mount again).
  Result<SegmentChanges> renew_segment(std::string_view segment,
                                       uint64_t since_version = kUnknownSegmentVersion,
                                       const SegmentReport& report = {});

  /// Phase 1 of a put: allocates `size_bytes` on config.replica_num distinct segments (evicting first when
  /// there is no room) and records the object as processing. `writer_host_id` serves kLocalFirst. Only
  /// segments that can be written now take replicas: renewed within placement_stale_after and not reported
  /// unreachable since (put_end's `unwritten_segments`); when fewer than replica_num are, the object gets
  /// one replica on each of them (a put must not fail because one node died).
  /// Errors: kInvalidArgument (bad key, size 0, replica_num 0 or more than the segments mounted, a value
  /// larger than every segment); kAlreadyExists (the key is complete or being written); kNoSpace (nothing
  /// evictable makes room); kUnavailable (every segment was reported unreachable since its last renewal, or
  /// room is being made by spills to SSD: retry shortly).
  Result<std::vector<ReplicaLocation>> put_start(std::string_view key, uint64_t size_bytes,
                                                 const ReplicateConfig& config,
                                                 std::string_view writer_host_id = "");
  /// Phase 3: the bytes are written to every replica but those on `unwritten_segments` (segments the writer
  /// could not write: their owner died, or the path to it failed). Those replicas are freed and dropped, and
  /// each such segment takes no new replicas until its owner renews it. The object becomes complete and
  /// visible with the rest. kNotFound when no put of `key` is in progress (never started, revoked,
  /// reclaimed, or its segments went away); kTransferFailed (the put revoked) when no replica is left.
  Status put_end(std::string_view key, std::span<const std::string> unwritten_segments = {});
  /// Abandons a put in progress and frees its space; `unwritten_segments` are reported unreachable as for
  /// put_end. kNotFound as for put_end.
  Status put_revoke(std::string_view key, std::span<const std::string> unwritten_segments = {});

  /// The readable DRAM replicas of a complete object, with a read lease. kNotFound when absent or still
  /// processing. An object held only on an SSD tier is ordered loaded into its owner's segment and answers
  /// kUnavailable ("loading from SSD", retry shortly), or kNoSpace when that segment has no room for it.
  Result<ReadGrant> get_replica_list(std::string_view key);
  /// Whether a complete object exists (no lease, no LRU touch).
  bool exists(std::string_view key);
  /// Removes a complete object and frees its space. kNotFound when absent or processing; kFailedPrecondition
  /// while a read lease is live or a spill to or load from SSD is under way ("retry shortly").
  Status remove(std::string_view key);
  /// Removes every complete object without a live lease or a spill or load under way; returns how many.
  uint64_t remove_all();

  /// The batch forms: one lock for all keys, one result per key in order.
  std::vector<Result<std::vector<ReplicaLocation>>> put_start_batch(std::span<const std::string_view> keys,
                                                                    std::span<const uint64_t> sizes_bytes,
                                                                    const ReplicateConfig& config,
                                                                    std::string_view writer_host_id = "");
  /// `unwritten_segments`: empty, or one list per key (put_end's).
  std::vector<Status> put_end_batch(std::span<const std::string_view> keys,
                                    std::span<const std::vector<std::string>> unwritten_segments = {});
  std::vector<Status> put_revoke_batch(std::span<const std::string_view> keys,
                                       std::span<const std::vector<std::string>> unwritten_segments = {});
  std::vector<Result<ReadGrant>> get_replica_list_batch(std::span<const std::string_view> keys);
  std::vector<bool> exists_batch(std::span<const std::string_view> keys);
  std::vector<Status> remove_batch(std::span<const std::string_view> keys);

  /// Background duties, run by the server every few hundred milliseconds: unmounts segments whose lease
  /// passed, reclaims puts older than put_timeout, and evicts while above the high watermark.
  void tick();

  MasterStats stats() const;
  /// Mounted segments, sorted by name.
  std::vector<SegmentInfo> segments() const;
  const MasterOptions& options() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace crescent::store
