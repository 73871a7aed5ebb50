#include "store/master.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "store/segment_allocator.h"

namespace crescent::store {
namespace {

using std::chrono::milliseconds;

/// A master on a hand-driven clock with `segments` DRAM segments of `capacity_bytes` each ("seg0", ...).
class MasterTest : public ::testing::Test {
 protected:
  void start(size_t segments, uint64_t capacity_bytes, MasterOptions options = {}) {
    options.clock = [this] { return now_; };
    master_ = std::make_unique<Master>(options);
    for (size_t i = 0; i < segments; ++i) {
      ASSERT_TRUE(master_
                      ->mount_segment({fmt::format("seg{}", i), fmt::format("node{}", i),
                                       fmt::format("host{}", i), capacity_bytes})
                      .ok());
    }
  }
  void advance(milliseconds d) { now_ += d; }
  /// One segment "seg" of `dram_bytes` with a 1 MiB SSD tier behind it, eviction only when full; returns the
  /// version its owner starts from (the first, full renewal).
  uint64_t start_with_ssd(uint64_t dram_bytes) {
    MasterOptions options{.high_watermark = 1.0};
    options.clock = [this] { return now_; };
    master_ = std::make_unique<Master>(options);
    EXPECT_TRUE(
        master_->mount_segment({"seg", "node", "host", dram_bytes, /*ssd_capacity_bytes=*/1 << 20}).ok());
    return master_->renew_segment("seg").value().version;
  }
  /// put_start + put_end; the status of whichever failed.
  Status put(const std::string& key, uint64_t size, ReplicateConfig config = {}) {
    auto replicas = master_->put_start(key, size, config);
    if (!replicas.ok()) return replicas.status();
    return master_->put_end(key);
  }

  std::chrono::steady_clock::time_point now_{};
  std::unique_ptr<Master> master_;
};

TEST_F(MasterTest, ReadersNeverSeeAProcessingObject) {
  start(2, 1 << 20);
  auto replicas = master_->put_start("k", 1000, {.replica_num = 2});
  ASSERT_TRUE(replicas.ok()) << replicas.status().to_string();
  ASSERT_EQ(replicas->size(), 2u);
  EXPECT_NE((*replicas)[0].segment, (*replicas)[1].segment);  // distinct segments
  EXPECT_EQ(master_->get_replica_list("k").status().code(), StatusCode::kNotFound);
  EXPECT_FALSE(master_->exists("k"));
  EXPECT_EQ(master_->remove("k").code(), StatusCode::kNotFound);
  EXPECT_EQ(master_->put_start("k", 1000, {}).status().code(), StatusCode::kAlreadyExists);
  ASSERT_TRUE(master_->put_end("k").ok());
  auto grant = master_->get_replica_list("k");
  ASSERT_TRUE(grant.ok());
  EXPECT_EQ(grant->size_bytes, 1000u);
  EXPECT_EQ(grant->replicas.size(), 2u);
  EXPECT_TRUE(master_->exists("k"));
  EXPECT_EQ(master_->put_start("k", 10, {}).status().code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(master_->put_end("k").code(), StatusCode::kNotFound);  // already ended
}

TEST_F(MasterTest, RevokeAndReclaimFreeTheSpace) {
  start(1, 1 << 20, {.put_timeout = milliseconds(1000)});
  ASSERT_TRUE(master_->put_start("a", 4096, {}).ok());
  EXPECT_EQ(master_->segments()[0].used_bytes, 4096u);
  ASSERT_TRUE(master_->put_revoke("a").ok());
  EXPECT_EQ(master_->segments()[0].used_bytes, 0u);
  EXPECT_EQ(master_->put_end("a").code(), StatusCode::kNotFound);

  ASSERT_TRUE(master_->put_start("b", 4096, {}).ok());
  advance(milliseconds(500));
  ASSERT_TRUE(master_->put_start("c", 4096, {}).ok());
  advance(milliseconds(600));  // b is 1.1 s old, c 0.6 s
  master_->tick();
  EXPECT_EQ(master_->put_end("b").code(), StatusCode::kNotFound);
  EXPECT_TRUE(master_->put_end("c").ok());
  EXPECT_EQ(master_->stats().puts_reclaimed, 1u);
  EXPECT_EQ(master_->segments()[0].used_bytes, 4096u);
}

TEST_F(MasterTest, LeaseBlocksRemoveAndEvictionUntilItExpires) {
  start(1, 64 * 10, {.lease_ttl = milliseconds(100)});
  ASSERT_TRUE(put("leased", 64 * 5).ok());
  ASSERT_TRUE(master_->get_replica_list("leased").ok());
  EXPECT_EQ(master_->remove("leased").code(), StatusCode::kFailedPrecondition);
  // A put that needs the leased object's space: nothing else to evict.
  EXPECT_EQ(master_->put_start("big", 64 * 10, {}).status().code(), StatusCode::kNoSpace);
  advance(milliseconds(101));
  EXPECT_TRUE(master_->put_start("big", 64 * 10, {}).ok());  // evicts the object whose lease ended
  EXPECT_FALSE(master_->exists("leased"));
  EXPECT_EQ(master_->stats().evictions, 1u);
}

TEST_F(MasterTest, PutEvictsLeastRecentlyUsedFirst) {
  start(1, 64 * 4, {.high_watermark = 1.0});
  for (const char* key : {"a", "b", "c", "d"}) ASSERT_TRUE(put(key, 64).ok());
  ASSERT_TRUE(master_->get_replica_list("a").ok());  // a becomes most recent; b is now the oldest
  advance(milliseconds(10000));                      // past the lease
  ASSERT_TRUE(put("e", 64).ok());
  EXPECT_FALSE(master_->exists("b"));
  for (const char* key : {"a", "c", "d", "e"}) EXPECT_TRUE(master_->exists(key)) << key;
}

TEST_F(MasterTest, EvictionSkipsPinnedAndProcessingObjects) {
  start(1, 64 * 4, {.high_watermark = 1.0});
  ASSERT_TRUE(put("hard", 64, {.pin = PinKind::kHard}).ok());
  ASSERT_TRUE(put("soft", 64, {.pin = PinKind::kSoft}).ok());
  ASSERT_TRUE(master_->put_start("writing", 64, {}).ok());
  ASSERT_TRUE(put("plain", 64).ok());
  ASSERT_TRUE(put("new1", 64).ok());  // evicts plain, the only unpinned complete object
  EXPECT_FALSE(master_->exists("plain"));
  ASSERT_TRUE(put("new2", 64).ok());  // evicts new1
  EXPECT_FALSE(master_->exists("new1"));
  // Fill the last slot with a leased object: only the soft pin is left to give way, and it does.
  ASSERT_TRUE(master_->get_replica_list("new2").ok());
  ASSERT_TRUE(put("new3", 64).ok());
  EXPECT_FALSE(master_->exists("soft"));
  EXPECT_TRUE(master_->exists("hard"));
  EXPECT_TRUE(master_->put_end("writing").ok());
  EXPECT_TRUE(master_->exists("new2"));
  // Now everything is hard-pinned, leased or complete-but-recent... make all unevictable and ask again.
  ASSERT_TRUE(master_->get_replica_list("new3").ok());
  ASSERT_TRUE(master_->get_replica_list("writing").ok());
  auto refused = master_->put_start("no-room", 64, {});
  EXPECT_EQ(refused.status().code(), StatusCode::kNoSpace) << refused.status().to_string();
  EXPECT_EQ(master_->stats().puts_no_space, 1u);
}

TEST_F(MasterTest, AValueThatCanNeverFitDoesNotEmptyThePool) {
  start(1, 64 * 64, {.high_watermark = 1.0});
  // Hard pins at every other 64-byte slot: evicting all the rest never leaves 128 contiguous bytes.
  for (int i = 0; i < 64; ++i) {
    const PinKind pin = i % 2 == 0 ? PinKind::kHard : PinKind::kNone;
    ASSERT_TRUE(put(fmt::format("k{}", i), 64, {.pin = pin}).ok()) << i;
  }
  auto refused = master_->put_start("wide", 128, {});
  EXPECT_EQ(refused.status().code(), StatusCode::kNoSpace) << refused.status().to_string();
  EXPECT_NE(refused.status().message().find("cannot fit even if every evictable object were evicted"),
            std::string::npos)
      << refused.status().to_string();
  // The check runs after a few evictions failed to make room, not after all 32.
  EXPECT_LT(master_->stats().evictions, 8u);
  int plain_left = 0;
  for (int i = 1; i < 64; i += 2) plain_left += master_->exists(fmt::format("k{}", i)) ? 1 : 0;
  EXPECT_GT(plain_left, 24);
  // A value that fits once one object goes still evicts that one and succeeds.
  EXPECT_TRUE(put("narrow", 64).ok());
}

TEST_F(MasterTest, WatermarkEvictionFreesTheFraction) {
  // 100 slots of 64 bytes; above 90% used, evict 20% of capacity.
  start(1, 64 * 100, {.high_watermark = 0.9, .eviction_fraction = 0.2});
  for (int i = 0; i < 90; ++i) ASSERT_TRUE(put(fmt::format("k{}", i), 64).ok());
  EXPECT_EQ(master_->stats().evictions, 0u);
  ASSERT_TRUE(put("k90", 64).ok());  // 91% > 90%: evict down to 71%
  EXPECT_EQ(master_->stats().evictions, 20u);
  EXPECT_EQ(master_->segments()[0].used_bytes, 64u * 71);
  for (int i = 0; i < 20; ++i) EXPECT_FALSE(master_->exists(fmt::format("k{}", i)));  // the oldest went
  for (int i = 20; i <= 90; ++i) EXPECT_TRUE(master_->exists(fmt::format("k{}", i)));
}

TEST_F(MasterTest, SegmentThatStopsRenewingIsUnmountedWithItsReplicas) {
  start(2, 1 << 20, {.segment_ttl = milliseconds(1000)});
  ASSERT_TRUE(put("both", 100, {.replica_num = 2}).ok());
  ASSERT_TRUE(put("only0", 100, {.preferred_segment = "seg0"}).ok());
  advance(milliseconds(600));
  ASSERT_TRUE(master_->renew_segment("seg1").ok());
  advance(milliseconds(600));  // seg0 last renewed 1.2 s ago, seg1 0.6 s ago
  master_->tick();
  ASSERT_EQ(master_->segments().size(), 1u);
  EXPECT_EQ(master_->segments()[0].segment, "seg1");
  EXPECT_EQ(master_->stats().segments_expired, 1u);
  EXPECT_FALSE(master_->exists("only0"));
  auto grant = master_->get_replica_list("both");
  ASSERT_TRUE(grant.ok());
  ASSERT_EQ(grant->replicas.size(), 1u);
  EXPECT_EQ(grant->replicas[0].segment, "seg1");
  EXPECT_EQ(master_->renew_segment("seg0").status().code(), StatusCode::kNotFound);
}

TEST_F(MasterTest, OwnersFollowTheirSegmentsChangesAndRebuildARestartedMaster) {
  start(2, 1 << 20);
  auto full = master_->renew_segment("seg0", kUnknownSegmentVersion);
  ASSERT_TRUE(full.ok());
  EXPECT_TRUE(full->full);
  EXPECT_TRUE(full->changes.empty());
  uint64_t seen = full->version;
  ASSERT_TRUE(put("a", 100, {.replica_num = 2}).ok());
  ASSERT_TRUE(put("b", 200, {.preferred_segment = "seg0"}).ok());
  ASSERT_TRUE(master_->put_start("processing", 10, {.preferred_segment = "seg0"}).ok());  // not in any index
  ASSERT_TRUE(master_->remove("a").ok());
  auto changes = master_->renew_segment("seg0", seen);
  ASSERT_TRUE(changes.ok());
  EXPECT_FALSE(changes->full);
  ASSERT_EQ(changes->changes.size(), 3u);  // a added, b added, a removed: in order
  EXPECT_EQ(changes->changes[0].kind, ChangeKind::kAdded);
  EXPECT_EQ(changes->changes[0].object.key, "a");
  EXPECT_EQ(changes->changes[1].object.key, "b");
  EXPECT_EQ(changes->changes[1].object.size_bytes, 200u);
  EXPECT_EQ(changes->changes[2].kind, ChangeKind::kRemoved);
  EXPECT_EQ(changes->changes[2].object.key, "a");
  const uint64_t b_offset = changes->changes[1].object.offset_bytes;
  seen = changes->version;
  auto none = master_->renew_segment("seg0", seen);
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->changes.empty());  // acknowledged changes are not sent again

  // A new master (restart or failover) rebuilt from the owners' re-mounts.
  ASSERT_TRUE(put("c", 300, {.replica_num = 2}).ok());
  auto seg0 = master_->renew_segment("seg0", kUnknownSegmentVersion);
  auto seg1 = master_->renew_segment("seg1", kUnknownSegmentVersion);
  ASSERT_TRUE(seg0.ok() && seg1.ok());
  auto held = [](const SegmentChanges& c) {
    std::vector<HeldObject> out;
    for (const SegmentChange& change : c.changes) out.push_back(change.object);
    return out;
  };
  std::vector<HeldObject> held0 = held(*seg0), held1 = held(*seg1);
  EXPECT_EQ(held0.size(), 2u);                   // b, c
  EXPECT_EQ(held1.size(), 1u);                   // c
  held1.push_back({"elsewhere", 1 << 19, 200});  // free on seg1: restored
  held1.push_back({"overlap", 64, 64});          // inside c's range on seg1: rejected
  held1.push_back({"c", 0, 999});                // size differs from seg0's c: rejected
  MasterOptions options;
  options.clock = [this] { return now_; };
  master_ = std::make_unique<Master>(options);
  ASSERT_TRUE(master_->mount_segment({"seg0", "node0", "host0", 1 << 20}, held0).ok());
  ASSERT_TRUE(master_->mount_segment({"seg1", "node1", "host1", 1 << 20}, held1).ok());
  auto c = master_->get_replica_list("c");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->replicas.size(), 2u);
  auto b = master_->get_replica_list("b");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->replicas[0].offset_bytes, b_offset);
  EXPECT_EQ(master_->stats().objects_restored, 4u);  // b, c twice, elsewhere
  EXPECT_EQ(master_->stats().objects_rejected, 2u);  // overlap, and c of another size
  EXPECT_FALSE(master_->exists("overlap"));
  // Restored space is taken: a new value cannot land on b's bytes.
  auto fresh = master_->put_start("fresh", 200, {.preferred_segment = "seg0"});
  ASSERT_TRUE(fresh.ok());
  EXPECT_NE((*fresh)[0].offset_bytes, b_offset);
}

// Issue 25 §4: a node restarted under its fixed name mounts at once, replacing its dead incarnation's
// segment (whose DRAM died with it), and its SSD objects come back with the mount; a retried mount of the
// same incarnation and another owner's mount of the name are refused as before.
TEST_F(MasterTest, ARestartedOwnerReplacesItsDeadSegmentAndOffersItsSsdObjects) {
  MasterOptions options{.high_watermark = 1.0};
  options.clock = [this] { return now_; };
  master_ = std::make_unique<Master>(options);
  SegmentMount first{"node/dram", "node", "host", 1 << 20, /*ssd_capacity_bytes=*/1 << 20, /*incarnation=*/7};
  ASSERT_TRUE(master_->mount_segment(first).ok());
  ASSERT_TRUE(master_->mount_segment({"other/dram", "other", "host2", 1 << 20}).ok());
  ASSERT_TRUE(put("in-dram", 100, {.preferred_segment = "node/dram"}).ok());
  ASSERT_TRUE(put("both", 100, {.replica_num = 2}).ok());
  EXPECT_EQ(master_->mount_segment(first).code(), StatusCode::kAlreadyExists);  // a retry
  SegmentMount thief = first;
  thief.owner = "thief";
  thief.incarnation = 8;
  EXPECT_EQ(master_->mount_segment(thief).code(), StatusCode::kAlreadyExists);
  SegmentMount unsaid = first;
  unsaid.incarnation = 0;
  EXPECT_EQ(master_->mount_segment(unsaid).code(), StatusCode::kAlreadyExists);

  SegmentMount restarted = first;
  restarted.incarnation = 9;
  const std::vector<HeldObject> on_ssd = {{"spilled", 0, 500, ReplicaTier::kSsd},
                                          {"both", 0, 999, ReplicaTier::kSsd}};  // "both" of another size
  ASSERT_TRUE(master_->mount_segment(restarted, on_ssd).ok());
  EXPECT_EQ(master_->stats().segments_replaced, 1u);
  EXPECT_EQ(master_->segments().size(), 2u);
  EXPECT_FALSE(master_->exists("in-dram"));  // only in the dead incarnation's DRAM
  auto both = master_->get_replica_list("both");
  ASSERT_TRUE(both.ok());
  ASSERT_EQ(both->replicas.size(), 1u);
  EXPECT_EQ(both->replicas[0].segment, "other/dram");
  EXPECT_EQ(master_->stats().objects_rejected, 1u);
  // The SSD object is known again; a read orders it loaded into the new segment.
  EXPECT_TRUE(master_->exists("spilled"));
  auto changes = master_->renew_segment("node/dram", kUnknownSegmentVersion);
  ASSERT_TRUE(changes.ok());
  ASSERT_EQ(changes->changes.size(), 1u);
  EXPECT_EQ(changes->changes[0].object.key, "spilled");
  EXPECT_EQ(changes->changes[0].object.tier, ReplicaTier::kSsd);
}

TEST_F(MasterTest, EvictionSpillsToTheSsdTierAndAReadLoadsItBack) {
  uint64_t seen = start_with_ssd(64 * 4);
  for (const char* key : {"a", "b", "c", "d"}) ASSERT_TRUE(put(key, 64).ok());
  seen = master_->renew_segment("seg", seen).value().version;  // the four kAdded
  // No room, and every object needs a spill first: the put is told to come back; "a" is ordered spilled.
  auto waiting = master_->put_start("e", 64, {});
  EXPECT_EQ(waiting.status().code(), StatusCode::kUnavailable) << waiting.status().to_string();
  auto orders = master_->renew_segment("seg", seen);
  ASSERT_TRUE(orders.ok());
  ASSERT_EQ(orders->changes.size(), 1u);
  EXPECT_EQ(orders->changes[0].kind, ChangeKind::kSpill);
  EXPECT_EQ(orders->changes[0].object.key, "a");
  const HeldObject spilled = orders->changes[0].object;
  EXPECT_TRUE(master_->get_replica_list("a").ok());  // still readable from DRAM while being written out
  advance(milliseconds(6000));                       // past that lease
  // Not removable until the owner reports: its range must not be handed to another object meanwhile.
  Status remove_while_spilling = master_->remove("a");
  EXPECT_EQ(remove_while_spilling.code(), StatusCode::kFailedPrecondition)
      << remove_while_spilling.to_string();
  EXPECT_EQ(master_->remove_all(), 3u);  // b, c and d; not a
  for (const char* key : {"b", "c", "d"}) ASSERT_TRUE(put(key, 64).ok());
  seen = master_->renew_segment("seg", orders->version).value().version;
  // The owner reports the file written: the range is freed and the put goes through.
  seen = master_->renew_segment("seg", seen, {.spilled = {spilled}}).value().version;
  ASSERT_TRUE(put("e", 64).ok());
  EXPECT_EQ(master_->stats().ssd_used_bytes, 64u);
  EXPECT_TRUE(master_->exists("a"));
  // A read of the SSD-only object orders a load into free room (made here by removing "c").
  ASSERT_TRUE(master_->remove("c").ok());
  auto loading = master_->get_replica_list("a");
  EXPECT_EQ(loading.status().code(), StatusCode::kUnavailable) << loading.status().to_string();
  auto load = master_->renew_segment("seg", seen);
  ASSERT_TRUE(load.ok());
  ASSERT_FALSE(load->changes.empty());
  const SegmentChange& order = load->changes.back();
  EXPECT_EQ(order.kind, ChangeKind::kLoad);
  EXPECT_EQ(order.object.key, "a");
  EXPECT_EQ(master_->get_replica_list("a").status().code(), StatusCode::kUnavailable);  // not loaded yet
  seen = master_->renew_segment("seg", load->version, {.loaded = {order.object}}).value().version;
  auto grant = master_->get_replica_list("a");
  ASSERT_TRUE(grant.ok()) << grant.status().to_string();
  ASSERT_EQ(grant->replicas.size(), 1u);
  EXPECT_EQ(grant->replicas[0].offset_bytes, order.object.offset_bytes);
  EXPECT_EQ(master_->stats().loads, 1u);
  // The SSD file being dropped by the owner leaves the DRAM copy; removing the object tells the owner.
  ASSERT_TRUE(master_->renew_segment("seg", seen, {.ssd_dropped = {"a"}}).ok());
  EXPECT_EQ(master_->stats().ssd_used_bytes, 0u);
  advance(milliseconds(6000));
  ASSERT_TRUE(master_->remove("a").ok());
  auto removed = master_->renew_segment("seg", seen);
  ASSERT_TRUE(removed.ok());
  EXPECT_EQ(removed->changes.back().kind, ChangeKind::kRemoved);
}

TEST_F(MasterTest, ASpillFinishedUnderAReadLeaseKeepsTheDramCopy) {
  uint64_t seen = start_with_ssd(64 * 2);
  ASSERT_TRUE(put("a", 64).ok());
  ASSERT_TRUE(put("b", 64).ok());
  EXPECT_EQ(master_->put_start("c", 64, {}).status().code(), StatusCode::kUnavailable);  // "a" spills
  auto orders = master_->renew_segment("seg", seen);
  ASSERT_TRUE(orders.ok());
  const HeldObject a = orders->changes.back().object;
  auto lease = master_->get_replica_list("a");  // a reader, while the file is written
  ASSERT_TRUE(lease.ok());
  ASSERT_TRUE(master_->renew_segment("seg", orders->version, {.spilled = {a}}).ok());
  // The leased range was not freed under the reader; both copies now exist.
  EXPECT_EQ(master_->segments()[0].used_bytes, 128u);
  EXPECT_EQ(master_->segments()[0].ssd_used_bytes, 64u);
  auto again = master_->get_replica_list("a");
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->replicas[0].offset_bytes, a.offset_bytes);
  advance(milliseconds(6000));
  ASSERT_TRUE(put("c", 64).ok());  // evicting "a" now frees its DRAM at once: the SSD copy exists
  EXPECT_TRUE(master_->exists("a"));
}

TEST_F(MasterTest, NoRangeIsFreedUnderALeaseOrALoadWhateverTheOwnerReports) {
  uint64_t seen = start_with_ssd(64 * 2);
  ASSERT_TRUE(put("a", 64).ok());
  ASSERT_TRUE(put("b", 64).ok());
  EXPECT_EQ(master_->put_start("c", 64, {}).status().code(), StatusCode::kUnavailable);  // "a" spills
  auto orders = master_->renew_segment("seg", seen);
  const HeldObject a = orders->changes.back().object;
  ASSERT_TRUE(master_->get_replica_list("a").ok());  // a reader takes a lease on the spilling copy
  seen = master_->renew_segment("seg", orders->version, {.failed = {a}}).value().version;  // the write failed
  EXPECT_TRUE(master_->exists("a"));  // kept: the reader's range is not freed
  EXPECT_EQ(master_->segments()[0].used_bytes, 128u);
}

TEST_F(MasterTest, AnObjectBeingLoadedFromSsdCannotBeRemoved) {
  uint64_t seen = start_with_ssd(64 * 2);
  // Spill everything reported written as soon as it is ordered; return the load order if one comes.
  auto serve_orders = [&]() -> std::optional<HeldObject> {
    auto changes = master_->renew_segment("seg", seen);
    SegmentReport report;
    std::optional<HeldObject> load;
    for (const SegmentChange& c : changes->changes) {
      if (c.kind == ChangeKind::kSpill) report.spilled.push_back(c.object);
      if (c.kind == ChangeKind::kLoad) load = c.object;
    }
    seen = master_->renew_segment("seg", changes->version, report).value().version;
    return load;
  };
  ASSERT_TRUE(put("a", 64).ok());
  ASSERT_TRUE(put("b", 64).ok());
  EXPECT_EQ(master_->put_start("c", 64, {}).status().code(), StatusCode::kUnavailable);  // "a" spills
  serve_orders();
  ASSERT_TRUE(put("c", 64).ok());  // the segment holds b and c; a is on SSD only
  EXPECT_EQ(master_->get_replica_list("a").status().code(), StatusCode::kUnavailable);  // "b" spills for room
  serve_orders();
  EXPECT_EQ(master_->get_replica_list("a").status().code(), StatusCode::kUnavailable);  // load ordered
  EXPECT_TRUE(serve_orders().has_value());  // the owner has the load order, and has not reported it done:
  // a remove must wait, or the owner would write the file over whatever took the range.
  EXPECT_EQ(master_->remove("a").code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(master_->remove_all(), 2u);  // b (on SSD) and c
  EXPECT_TRUE(master_->exists("a"));
}

TEST_F(MasterTest, AFailedSpillDropsTheCopyAndAnSsdOnlyObjectGoesWithItsFile) {
  uint64_t seen = start_with_ssd(64 * 2);
  ASSERT_TRUE(put("a", 64).ok());
  ASSERT_TRUE(put("b", 64).ok());
  EXPECT_EQ(master_->put_start("c", 64, {}).status().code(), StatusCode::kUnavailable);
  auto orders = master_->renew_segment("seg", seen);
  ASSERT_TRUE(orders.ok());
  const HeldObject a = orders->changes.back().object;
  seen = master_->renew_segment("seg", orders->version, {.failed = {a}}).value().version;
  EXPECT_FALSE(master_->exists("a"));  // its only copy could not be written out
  EXPECT_EQ(master_->segments()[0].used_bytes, 64u);
  ASSERT_TRUE(put("c", 64).ok());
  EXPECT_EQ(master_->put_start("d", 64, {}).status().code(), StatusCode::kUnavailable);  // "b" spills
  orders = master_->renew_segment("seg", seen);
  const HeldObject b = orders->changes.back().object;
  seen = master_->renew_segment("seg", orders->version, {.spilled = {b}}).value().version;
  ASSERT_TRUE(master_->renew_segment("seg", seen, {.ssd_dropped = {"b"}}).ok());
  EXPECT_FALSE(master_->exists("b"));  // its file was its last copy
  for (const SegmentInfo& info : master_->segments()) EXPECT_EQ(info.ssd_used_bytes, 0u);
}

TEST_F(MasterTest, BadInputGetsOneClearErrorEach) {
  start(2, 4096);
  auto code = [&](std::string key, uint64_t size, ReplicateConfig c) {
    auto r = master_->put_start(key, size, c);
    return std::pair(r.status().code(), r.status().message());
  };
  EXPECT_EQ(code("", 1, {}).first, StatusCode::kInvalidArgument);
  auto [long_code, long_message] = code(std::string(kMaxKeyBytes + 1, 'x'), 1, {});
  EXPECT_EQ(long_code, StatusCode::kInvalidArgument);
  EXPECT_NE(long_message.find("1025 bytes"), std::string::npos) << long_message;
  EXPECT_EQ(code("k", 0, {}).first, StatusCode::kInvalidArgument);
  auto [big_code, big_message] = code("k", 4097, {});
  EXPECT_EQ(big_code, StatusCode::kInvalidArgument);
  EXPECT_NE(big_message.find("largest 4096 bytes"), std::string::npos) << big_message;
  auto [rep_code, rep_message] = code("k", 1, {.replica_num = 3});
  EXPECT_EQ(rep_code, StatusCode::kInvalidArgument);
  EXPECT_NE(rep_message.find("replica_num 3 is more than the 2 segments"), std::string::npos) << rep_message;
  EXPECT_EQ(code("k", 1, {.replica_num = 0}).first, StatusCode::kInvalidArgument);
  EXPECT_EQ(master_->stats().puts_started, 0u);  // nothing half-written
  for (const SegmentInfo& s : master_->segments()) EXPECT_EQ(s.used_bytes, 0u);
  EXPECT_EQ(master_->mount_segment({"seg0", "x", "h", 10}).code(), StatusCode::kAlreadyExists);
  EXPECT_EQ(master_->mount_segment({"s", "x", "h", 0}).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(master_->unmount_segment("nope").code(), StatusCode::kNotFound);
  EXPECT_FALSE(validate(MasterOptions{.high_watermark = 1.5}).ok());
  EXPECT_FALSE(validate(MasterOptions{.lease_ttl = milliseconds(0)}).ok());
}

TEST_F(MasterTest, StrategiesPlaceReplicasAsNamed) {
  MasterOptions most_free{.strategy = AllocationStrategy::kMostFree};
  start(3, 1 << 20, most_free);
  ASSERT_TRUE(put("x", 1000, {.preferred_segment = "seg1"}).ok());
  // most-free now avoids seg1 for the first replica of the next put.
  auto next = master_->put_start("y", 1000, {});
  ASSERT_TRUE(next.ok());
  EXPECT_NE((*next)[0].segment, "seg1");

  MasterOptions local{.strategy = AllocationStrategy::kLocalFirst};
  start(3, 1 << 20, local);
  for (int i = 0; i < 20; ++i) {
    auto r = master_->put_start(fmt::format("k{}", i), 100, {.replica_num = 2}, "host2");
    ASSERT_TRUE(r.ok());
    EXPECT_EQ((*r)[0].segment, "seg2");
    EXPECT_NE((*r)[1].segment, "seg2");
  }
}

TEST_F(MasterTest, RemoveAllSparesLeasedObjectsAndFreesEverythingElse) {
  start(2, 1 << 20);
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(put(fmt::format("k{}", i), 1000, {.replica_num = 2}).ok());
  ASSERT_TRUE(master_->get_replica_list("k3").ok());
  EXPECT_EQ(master_->remove_all(), 9u);
  EXPECT_TRUE(master_->exists("k3"));
  advance(milliseconds(6000));
  EXPECT_TRUE(master_->remove("k3").ok());
  for (const SegmentInfo& s : master_->segments()) EXPECT_EQ(s.used_bytes, 0u);
  EXPECT_EQ(master_->stats().objects, 0u);
}

TEST_F(MasterTest, BatchCallsAnswerPerKey) {
  start(1, 1 << 20);
  std::vector<std::string_view> keys = {"a", "b", "a"};
  std::vector<uint64_t> sizes = {10, 20, 30};
  auto started = master_->put_start_batch(keys, sizes, {});
  EXPECT_TRUE(started[0].ok());
  EXPECT_TRUE(started[1].ok());
  EXPECT_EQ(started[2].status().code(), StatusCode::kAlreadyExists);
  auto ended = master_->put_end_batch(std::vector<std::string_view>{"a", "b"});
  EXPECT_TRUE(ended[0].ok() && ended[1].ok());
  auto exists = master_->exists_batch(std::vector<std::string_view>{"a", "zz", "b"});
  EXPECT_EQ(exists, (std::vector<bool>{true, false, true}));
  auto grants = master_->get_replica_list_batch(std::vector<std::string_view>{"b", "zz"});
  ASSERT_TRUE(grants[0].ok());
  EXPECT_EQ(grants[0]->size_bytes, 20u);
  EXPECT_EQ(grants[1].status().code(), StatusCode::kNotFound);
  MasterStats stats = master_->stats();
  EXPECT_EQ(stats.hits, 1u);
  EXPECT_EQ(stats.misses, 1u);
}

// A writer that could not write a replica (its node died) names the segment at put_end: the replica is
// dropped and the put completes with the rest; that segment takes no new replicas until its owner renews it
// (a dead owner never does), so the next puts go to live segments, with fewer replicas if need be.
TEST_F(MasterTest, AReplicaItsWriterCouldNotWriteIsDroppedAndItsSegmentAvoidedUntilItRenews) {
  start(2, 1 << 20);
  auto both = master_->put_start("both", 1000, {.replica_num = 2});
  ASSERT_TRUE(both.ok());
  ASSERT_EQ(both->size(), 2u);
  const std::vector<std::string> dead = {"seg0"};
  ASSERT_TRUE(master_->put_end("both", dead).ok());
  auto grant = master_->get_replica_list("both");
  ASSERT_TRUE(grant.ok());
  ASSERT_EQ(grant->replicas.size(), 1u);
  EXPECT_EQ(grant->replicas[0].segment, "seg1");
  EXPECT_EQ(master_->segments()[0].used_bytes, 0u) << "seg0's range was freed";
  EXPECT_EQ(master_->stats().replicas_unwritten, 1u);
  EXPECT_EQ(master_->stats().segments_suspected, 1u);

  // Until seg0's owner renews, puts go to seg1: asked for two replicas they get one, and seg0 is skipped
  // even when preferred.
  for (int i = 0; i < 10; ++i) {
    auto two = master_->put_start(fmt::format("two{}", i), 100, {.replica_num = 2});
    ASSERT_TRUE(two.ok()) << two.status().to_string();
    ASSERT_EQ(two->size(), 1u);
    EXPECT_EQ((*two)[0].segment, "seg1");
    auto preferred = master_->put_start(fmt::format("pref{}", i), 100, {.preferred_segment = "seg0"});
    ASSERT_TRUE(preferred.ok());
    EXPECT_EQ((*preferred)[0].segment, "seg1");
  }
  ASSERT_TRUE(master_->renew_segment("seg0").ok());  // alive after all (a path that failed once)
  auto back = master_->put_start("back", 100, {.replica_num = 2});
  ASSERT_TRUE(back.ok());
  EXPECT_EQ(back->size(), 2u);

  // A put none of whose replicas was written is revoked and frees its space.
  auto lost = master_->put_start("lost", 1000, {.replica_num = 2});
  ASSERT_TRUE(lost.ok());
  const std::vector<std::string> all = {"seg0", "seg1"};
  EXPECT_EQ(master_->put_end("lost", all).code(), StatusCode::kTransferFailed);
  EXPECT_FALSE(master_->exists("lost"));
  EXPECT_EQ(master_->put_start("again", 10, {}).status().code(), StatusCode::kUnavailable)
      << "every segment is reported unreachable";
  ASSERT_TRUE(master_->renew_segment("seg1").ok());
  EXPECT_TRUE(master_->put_start("again", 10, {}).ok());
  // put_revoke reports the same way.
  ASSERT_TRUE(master_->renew_segment("seg0").ok());
  auto revoked = master_->put_start("revoked", 10, {.preferred_segment = "seg1"});
  ASSERT_TRUE(revoked.ok());
  ASSERT_EQ((*revoked)[0].segment, "seg1");
  const std::vector<std::string> seg1 = {"seg1"};
  ASSERT_TRUE(master_->put_revoke("revoked", seg1).ok());
  auto elsewhere = master_->put_start("elsewhere", 10, {.preferred_segment = "seg1"});
  ASSERT_TRUE(elsewhere.ok());
  EXPECT_EQ((*elsewhere)[0].segment, "seg0");
}

// A segment whose owner stopped renewing gets no new replicas after placement_stale_after (1 s), long
// before segment_ttl (10 s) unmounts it; when none was renewed lately (the master itself stalled), any goes.
TEST_F(MasterTest, ASegmentNotRenewedForASecondGetsNoNewReplicas) {
  start(2, 1 << 20);
  for (int step = 0; step < 12; ++step) {  // 1.2 s: seg1's owner renews every 100 ms, seg0's is silent
    advance(milliseconds(100));
    ASSERT_TRUE(master_->renew_segment("seg1").ok());
  }
  for (int i = 0; i < 10; ++i) {
    auto r = master_->put_start(fmt::format("k{}", i), 100, {.replica_num = 2, .preferred_segment = "seg0"});
    ASSERT_TRUE(r.ok());
    ASSERT_EQ(r->size(), 1u);
    EXPECT_EQ((*r)[0].segment, "seg1");
  }
  EXPECT_EQ(master_->segments().size(), 2u) << "still mounted: its objects stay until segment_ttl";
  advance(milliseconds(1500));  // nobody renewed: the master's own stall, not the nodes'
  auto r = master_->put_start("stalled", 100, {.replica_num = 2});
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->size(), 2u);
  EXPECT_FALSE(validate(MasterOptions{.placement_stale_after = milliseconds(0)}).ok());
}

}  // namespace
}  // namespace crescent::store
