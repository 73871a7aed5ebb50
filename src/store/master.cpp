#include "store/master.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <map>
#include <mutex>
#include <random>
#include <unordered_map>

#include "store/segment_allocator.h"

namespace crescent::store {

Status validate(const MasterOptions& options) {
  auto fraction_ok = [](double v) { return v > 0 && v <= 1; };
  if (!fraction_ok(options.high_watermark)) {
    return Status::invalid_argument(
        fmt::format("high_watermark must be in (0, 1], got {}", options.high_watermark));
  }
  if (!fraction_ok(options.eviction_fraction)) {
    return Status::invalid_argument(
        fmt::format("eviction_fraction must be in (0, 1], got {}", options.eviction_fraction));
  }
  const std::pair<const char*, std::chrono::milliseconds> durations[] = {
      {"lease_ttl", options.lease_ttl},
      {"segment_ttl", options.segment_ttl},
      {"placement_stale_after", options.placement_stale_after},
      {"put_timeout", options.put_timeout},
      {"soft_pin_ttl", options.soft_pin_ttl}};
  for (const auto& [name, value] : durations) {
    if (value.count() <= 0)
      return Status::invalid_argument(fmt::format("{} must be > 0 ms, got {}", name, value.count()));
  }
  return Status();
}

namespace {

/// MasterStats's fields by name; stats_fields and from_stats_fields both read this table.
constexpr std::pair<std::string_view, uint64_t MasterStats::*> kStatsFields[] = {
    {"objects", &MasterStats::objects},
    {"processing_objects", &MasterStats::processing_objects},
    {"segments", &MasterStats::segments},
    {"dram_capacity_bytes", &MasterStats::dram_capacity_bytes},
    {"dram_used_bytes", &MasterStats::dram_used_bytes},
    {"puts_started", &MasterStats::puts_started},
    {"puts_ended", &MasterStats::puts_ended},
    {"puts_revoked", &MasterStats::puts_revoked},
    {"puts_reclaimed", &MasterStats::puts_reclaimed},
    {"puts_no_space", &MasterStats::puts_no_space},
    {"gets", &MasterStats::gets},
    {"hits", &MasterStats::hits},
    {"misses", &MasterStats::misses},
    {"leases_granted", &MasterStats::leases_granted},
    {"leases_expired", &MasterStats::leases_expired},
    {"evictions", &MasterStats::evictions},
    {"evicted_bytes", &MasterStats::evicted_bytes},
    {"removes", &MasterStats::removes},
    {"segments_expired", &MasterStats::segments_expired},
    {"segments_replaced", &MasterStats::segments_replaced},
    {"objects_restored", &MasterStats::objects_restored},
    {"objects_rejected", &MasterStats::objects_rejected},
    {"ssd_capacity_bytes", &MasterStats::ssd_capacity_bytes},
    {"ssd_used_bytes", &MasterStats::ssd_used_bytes},
    {"spills", &MasterStats::spills},
    {"loads", &MasterStats::loads},
    {"replicas_unwritten", &MasterStats::replicas_unwritten},
    {"segments_suspected", &MasterStats::segments_suspected},
};
static_assert(sizeof(MasterStats) == std::size(kStatsFields) * sizeof(uint64_t),
              "a MasterStats field has no name");

}  // namespace

std::vector<std::pair<std::string_view, uint64_t>> stats_fields(const MasterStats& stats) {
  std::vector<std::pair<std::string_view, uint64_t>> out;
  for (const auto& [name, field] : kStatsFields) out.emplace_back(name, stats.*field);
  return out;
}

MasterStats from_stats_fields(const std::vector<std::pair<std::string, uint64_t>>& fields) {
  MasterStats stats;
  for (const auto& [name, value] : fields) {
    for (const auto& [known, field] : kStatsFields) {
      if (known == name) stats.*field = value;
    }
  }
  return stats;
}

namespace {

using Nanos = int64_t;

Nanos to_nanos(std::chrono::milliseconds d) {
  return std::chrono::nanoseconds(d).count();
}

/// A key as it appears in messages: printable bytes kept, others as \xNN, cut at 80 characters.
std::string printable_key(std::string_view key) {
  std::string out;
  for (unsigned char c : key) {
    if (out.size() >= 80) return out + "...";
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  return out;
}

/// A DRAM replica is kReady, kSpilling (being written to its segment's SSD tier; still readable, its range
/// held until the owner reports the file written) or kLoading (its range holds nothing valid until the owner
/// reports the SSD file read in). An SSD replica is always kReady and has no range.
enum class ReplicaState : uint8_t { kReady, kSpilling, kLoading };

struct Replica {
  uint32_t segment_id = 0;
  uint64_t offset_bytes = 0;
  ReplicaTier tier = ReplicaTier::kDram;
  ReplicaState state = ReplicaState::kReady;

  bool holds_range() const { return tier == ReplicaTier::kDram; }
  bool readable() const { return tier == ReplicaTier::kDram && state != ReplicaState::kLoading; }
};

enum class ObjectState : uint8_t { kProcessing, kComplete };

/// One key's metadata. Complete objects sit on the intrusive LRU list, processing ones on the processing list
/// (oldest first); the same two links serve both (no allocation per touch).
struct Object {
  Object* lru_prev = nullptr;
  Object* lru_next = nullptr;
  const std::string* key = nullptr;  // the map node's key (nodes do not move)
  uint64_t size_bytes = 0;
  Nanos lease_until = 0;  // no eviction or remove before this
  Nanos deadline = 0;     // processing: reclaimed at this time; complete with a soft pin: the pin's end
  std::vector<Replica> replicas;
  ObjectState state = ObjectState::kProcessing;
  PinKind pin = PinKind::kNone;
};

struct Segment {
  uint32_t id = 0;
  SegmentMount mount;
  SegmentAllocator allocator;
  Nanos lease_until = 0;
  Nanos renewed_at = 0;  // mounted or last renewed
  bool suspect = false;  // a writer could not write it since its last renewal: no new replicas
  uint64_t replicas = 0;
  // The owner's index feed: changes with versions log_base + 1 .. version, not yet acknowledged.
  uint64_t version = 0;
  uint64_t log_base = 0;
  std::deque<SegmentChange> log;
  uint64_t ssd_used_bytes = 0;  // value bytes of SSD replicas on this owner
  uint64_t spilling_bytes = 0;  // aligned DRAM bytes ordered spilled, not yet reported

  bool has_ssd() const { return mount.ssd_capacity_bytes > 0; }

  Segment(uint32_t id_, SegmentMount mount_, Nanos now, Nanos ttl)
      : id(id_),
        mount(std::move(mount_)),
        allocator(mount.capacity_bytes),
        lease_until(now + ttl),
        renewed_at(now) {}
};

struct KeyHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

}  // namespace

class Master::Impl {
 public:
  explicit Impl(MasterOptions options) : options_(std::move(options)), rng_(options_.seed) {
    if (!options_.clock) options_.clock = [] { return std::chrono::steady_clock::now(); };
  }

  Nanos now() const { return std::chrono::nanoseconds(options_.clock().time_since_epoch()).count(); }

  // ---- segments ----

  Status mount(const SegmentMount& mount, std::span<const HeldObject> held) {
    if (mount.segment.empty()) return Status::invalid_argument("mount: segment name is empty");
    if (mount.owner.empty())
      return Status::invalid_argument(fmt::format("mount {}: owner is empty", mount.segment));
    if (mount.capacity_bytes == 0) {
      return Status::invalid_argument(fmt::format("mount {}: capacity is 0 bytes", mount.segment));
    }
    if (auto it = segment_by_name_.find(mount.segment); it != segment_by_name_.end()) {
      const SegmentMount& mounted = segments_[it->second]->mount;
      if (mount.incarnation == 0 || mounted.owner != mount.owner ||
          mounted.incarnation == mount.incarnation) {
        return Status::already_exists(fmt::format("segment {} is already mounted", mount.segment));
      }
      (void)unmount(mount.segment);  // the owner restarted: what that segment held died with it
      ++stats_.segments_replaced;
    }
    const auto id = static_cast<uint32_t>(segments_.size());
    segments_.push_back(std::make_unique<Segment>(id, mount, now(), to_nanos(options_.segment_ttl)));
    segment_by_name_.emplace(mount.segment, id);
    live_segments_.push_back(id);
    for (const HeldObject& h : held) restore(*segments_[id], h);
    return Status();
  }

  /// One object of a re-mounting owner's index (mount_segment's contract).
  void restore(Segment& segment, const HeldObject& held) {
    auto it = objects_.find(held.key);
    const bool joins = it != objects_.end();
    const bool ssd = held.tier == ReplicaTier::kSsd;
    if (!validate_key(held.key).ok() || held.size_bytes == 0 || (ssd && !segment.has_ssd()) ||
        (joins && (it->second.state != ObjectState::kComplete || it->second.size_bytes != held.size_bytes)) ||
        (!ssd && !segment.allocator.allocate_at(held.offset_bytes, held.size_bytes))) {
      ++stats_.objects_rejected;
      return;
    }
    ++segment.replicas;
    ++stats_.objects_restored;
    Replica replica{segment.id, ssd ? 0 : held.offset_bytes, held.tier, ReplicaState::kReady};
    if (ssd) segment.ssd_used_bytes += held.size_bytes;
    // Readers may hold leases from the previous master: nothing restored is freed before they could end.
    const Nanos leased_until = now() + to_nanos(options_.lease_ttl);
    if (joins) {
      it->second.replicas.push_back(replica);
      it->second.lease_until = std::max(it->second.lease_until, leased_until);
      return;
    }
    auto [inserted, ok] = objects_.try_emplace(held.key);
    Object& object = inserted->second;
    object.key = &inserted->first;
    object.size_bytes = held.size_bytes;
    object.replicas = {replica};
    object.state = ObjectState::kComplete;
    object.lease_until = leased_until;
    lru_.link_front(object);
  }

  Status unmount(std::string_view name) {
    auto it = segment_by_name_.find(name);
    if (it == segment_by_name_.end())
      return Status::not_found(fmt::format("segment {} is not mounted", name));
    const uint32_t id = it->second;
    segment_by_name_.erase(it);
    std::erase(live_segments_, id);
    for (auto object = objects_.begin(); object != objects_.end();) {
      auto& replicas = object->second.replicas;
      std::erase_if(replicas, [id](const Replica& r) { return r.segment_id == id; });
      if (replicas.empty()) {
        list_of(object->second).unlink(object->second);
        object = objects_.erase(object);
      } else {
        ++object;
      }
    }
    segments_[id].reset();
    return Status();
  }

  Result<SegmentChanges> renew(std::string_view name, uint64_t since, const SegmentReport& report) {
    Segment* segment = find_segment(name);
    if (segment == nullptr) {
      return Status::not_found(fmt::format("segment {} is not mounted (its lease may have expired)", name));
    }
    segment->renewed_at = now();
    segment->lease_until = segment->renewed_at + to_nanos(options_.segment_ttl);
    segment->suspect = false;  // its owner is alive
    apply(*segment, report);
    SegmentChanges out;
    out.version = segment->version;
    if (since < segment->log_base || since > segment->version) {
      out.full = true;  // everything the segment's owner holds now, both tiers, and the orders still open
      for (Object* o = lru_.head; o != nullptr; o = o->lru_next) {
        for (const Replica& r : o->replicas) {
          if (r.segment_id != segment->id) continue;
          const HeldObject held{*o->key, r.offset_bytes, o->size_bytes, r.tier};
          if (r.state != ReplicaState::kLoading) out.changes.push_back({ChangeKind::kAdded, held});
          if (r.state == ReplicaState::kSpilling) out.changes.push_back({ChangeKind::kSpill, held});
          if (r.state == ReplicaState::kLoading) out.changes.push_back({ChangeKind::kLoad, held});
        }
      }
      since = segment->version;
    } else {
      out.changes.assign(segment->log.begin() + static_cast<long>(since - segment->log_base),
                         segment->log.end());
    }
    // The owner acknowledged `since`: forget the changes up to it.
    while (segment->log_base < since && !segment->log.empty()) {
      segment->log.pop_front();
      ++segment->log_base;
    }
    segment->log_base = std::max(segment->log_base, since);
    return out;
  }

  /// The owner's report of spills and loads done, SSD files dropped and orders failed (SegmentReport).
  void apply(Segment& segment, const SegmentReport& report) {
    const Nanos t = now();
    // The replica of `key` on this segment in `state` at `offset` (a report about an older object of the same
    // key, or one removed meanwhile, finds none and is ignored).
    auto find = [&](const std::string& key, ReplicaState state,
                    uint64_t offset) -> std::pair<Object*, Replica*> {
      auto it = objects_.find(key);
      if (it == objects_.end()) return {nullptr, nullptr};
      for (Replica& r : it->second.replicas) {
        if (r.segment_id == segment.id && r.tier == ReplicaTier::kDram && r.state == state &&
            r.offset_bytes == offset) {
          return {&it->second, &r};
        }
      }
      return {nullptr, nullptr};
    };
    for (const HeldObject& h : report.spilled) {
      auto [object, replica] = find(h.key, ReplicaState::kSpilling, h.offset_bytes);
      if (object == nullptr) continue;
      segment.spilling_bytes -= aligned_size_bytes(object->size_bytes);
      segment.ssd_used_bytes += object->size_bytes;
      if (object->lease_until > t) {
        // A reader took a lease while the file was written: the DRAM copy stays until a later eviction (which
        // then frees it at once, the SSD copy existing).
        replica->state = ReplicaState::kReady;
        ++segment.replicas;
        object->replicas.push_back({segment.id, 0, ReplicaTier::kSsd, ReplicaState::kReady});
        continue;
      }
      segment.allocator.free(replica->offset_bytes, object->size_bytes);
      *replica = {segment.id, 0, ReplicaTier::kSsd, ReplicaState::kReady};
    }
    for (const HeldObject& h : report.loaded) {
      auto [object, replica] = find(h.key, ReplicaState::kLoading, h.offset_bytes);
      if (object != nullptr) replica->state = ReplicaState::kReady;
    }
    for (const HeldObject& h : report.failed) {
      for (ReplicaState state : {ReplicaState::kSpilling, ReplicaState::kLoading}) {
        auto [object, replica] = find(h.key, state, h.offset_bytes);
        if (object == nullptr) continue;
        if (state == ReplicaState::kSpilling) {
          segment.spilling_bytes -= aligned_size_bytes(object->size_bytes);
          if (object->lease_until > t) {  // a reader holds the range: keep the copy, evict it again later
            replica->state = ReplicaState::kReady;
            break;
          }
          record(segment.id, ChangeKind::kEvicted, {h.key, 0, 0});  // the owner's index drops it too
        }
        remove_replica(*object, static_cast<size_t>(replica - object->replicas.data()));
        break;
      }
    }
    for (const std::string& key : report.ssd_dropped) {
      auto it = objects_.find(key);
      if (it == objects_.end()) continue;
      auto& replicas = it->second.replicas;
      for (size_t i = 0; i < replicas.size(); ++i) {
        if (replicas[i].segment_id == segment.id && replicas[i].tier == ReplicaTier::kSsd) {
          remove_replica(it->second, i);
          break;
        }
      }
    }
  }

  /// Frees replica `i` of `object` and forgets it; forgets the object too when it was the last.
  /// REQUIRES: object is complete.
  void remove_replica(Object& object, size_t i) {
    const Replica r = object.replicas[i];
    Segment& segment = *segments_[r.segment_id];
    if (r.holds_range()) {
      segment.allocator.free(r.offset_bytes, object.size_bytes);
    } else {
      segment.ssd_used_bytes -= object.size_bytes;
    }
    --segment.replicas;
    object.replicas.erase(object.replicas.begin() + static_cast<long>(i));
    if (object.replicas.empty()) {
      if (object.lease_until != 0) ++stats_.leases_expired;
      list_of(object).unlink(object);
      objects_.erase(objects_.find(*object.key));
    }
  }

  /// Appends a change to the feed of every segment holding one of `object`'s replicas.
  void record(uint32_t segment_id, ChangeKind kind, HeldObject object) {
    Segment& segment = *segments_[segment_id];
    segment.log.push_back({kind, std::move(object)});
    ++segment.version;
  }

  Segment* find_segment(std::string_view name) {
    auto it = segment_by_name_.find(name);
    return it == segment_by_name_.end() ? nullptr : segments_[it->second].get();
  }

  // ---- puts ----

  Result<std::vector<ReplicaLocation>> put_start(std::string_view key, uint64_t size_bytes,
                                                 const ReplicateConfig& config,
                                                 std::string_view writer_host) {
    CRESCENT_RETURN_IF_ERROR(validate_key(key));
    if (size_bytes == 0)
      return Status::invalid_argument(fmt::format("put {}: size is 0 bytes", printable_key(key)));
    if (config.replica_num == 0) {
      return Status::invalid_argument(fmt::format("put {}: replica_num is 0", printable_key(key)));
    }
    if (config.replica_num > live_segments_.size()) {
      return Status::invalid_argument(
          fmt::format("put {}: replica_num {} is more than the {} segment{} mounted", printable_key(key),
                      config.replica_num, live_segments_.size(), live_segments_.size() == 1 ? "" : "s"));
    }
    // Compared before aligning: a size near 2^64 would wrap to 0 when aligned.
    const uint64_t aligned = size_bytes > (uint64_t{1} << 62) ? ~uint64_t{0} : aligned_size_bytes(size_bytes);
    size_t large_enough = 0;
    uint64_t largest = 0;
    for (uint32_t id : live_segments_) {
      largest = std::max(largest, segments_[id]->mount.capacity_bytes);
      if (segments_[id]->mount.capacity_bytes >= aligned) ++large_enough;
    }
    if (large_enough < config.replica_num) {
      return Status::invalid_argument(
          fmt::format("put {}: a value of {} bytes needs {} segment{} of at least that size; {} mounted "
                      "(largest {} bytes)",
                      printable_key(key), size_bytes, config.replica_num, config.replica_num == 1 ? "" : "s",
                      large_enough, largest));
    }
    if (auto it = objects_.find(key); it != objects_.end()) {
      return Status::already_exists(
          fmt::format("key {} {}", printable_key(key),
                      it->second.state == ObjectState::kComplete ? "already exists" : "is being written"));
    }
    const Nanos t = now();
    // Replicas go to segments that can be written now; with fewer of those than asked, one on each.
    const std::vector<uint32_t> placeable = placeable_segments(t);
    if (placeable.empty()) {
      return Status::unavailable(fmt::format(
          "put {}: every mounted segment was reported unreachable since its last renewal; retry shortly",
          printable_key(key)));
    }
    ReplicateConfig asked = config;
    asked.replica_num = std::min<uint32_t>(config.replica_num, static_cast<uint32_t>(placeable.size()));
    std::optional<std::vector<Replica>> replicas = allocate(size_bytes, asked, writer_host, placeable);
    // Make room with what frees space at once (dropping, or evicting a DRAM copy that has an SSD copy)...
    // After a few evictions that did not make room, check that evicting everything evictable could (ranges
    // must be contiguous): a value that can never fit must not empty the pool on its way to "no space".
    constexpr int kEvictionsBeforeFeasibilityCheck = 8;
    int evicted = 0;
    bool feasible = true;
    for (bool allow_soft_pins : {false, true}) {
      if (replicas || !feasible) break;
      for (Object* victim = lru_.tail; victim != nullptr && !replicas;) {
        Object* next = victim->lru_prev;
        if (evictable(*victim, t, allow_soft_pins) && frees_at_once(*victim)) {
          if (++evicted == kEvictionsBeforeFeasibilityCheck &&
              !eviction_can_fit(size_bytes, asked.replica_num, placeable, t)) {
            feasible = false;
            break;
          }
          evict(*victim);
          replicas = allocate(size_bytes, asked, writer_host, placeable);
        }
        victim = next;
      }
    }
    if (!feasible) {
      ++stats_.puts_no_space;
      return Status::no_space(fmt::format(
          "no space for key {}: {} bytes x {} replica{} cannot fit even if every evictable object "
          "were evicted (what is left is leased, pinned or being written, and free ranges must be "
          "contiguous)",
          printable_key(key), size_bytes, config.replica_num, config.replica_num == 1 ? "" : "s"));
    }
    if (!replicas) {
      // ... else order spills to SSD tiers: the room comes when the owners report them written.
      const uint64_t needed = aligned_size_bytes(size_bytes) * asked.replica_num;
      uint64_t ordered = spilling_bytes();
      for (Object* victim = lru_.tail; victim != nullptr && ordered < needed;) {
        Object* next = victim->lru_prev;
        if (evictable(*victim, t, false)) ordered += evict(*victim);
        victim = next;
      }
      if (ordered > 0) {
        return Status::unavailable(fmt::format(
            "no room for key {} yet: {} bytes are being spilled to SSD to make room; retry shortly",
            printable_key(key), ordered));
      }
      ++stats_.puts_no_space;
      return Status::no_space(
          fmt::format("no space for key {}: {} bytes x {} replica{}, and nothing more can be evicted ({} "
                      "bytes of {} used; "
                      "the rest is leased, pinned or being written)",
                      printable_key(key), size_bytes, config.replica_num, config.replica_num == 1 ? "" : "s",
                      used_bytes(), capacity_bytes()));
    }
    auto [it, inserted] = objects_.try_emplace(std::string(key));
    Object& object = it->second;
    object.key = &it->first;
    object.size_bytes = size_bytes;
    object.replicas = std::move(*replicas);
    object.state = ObjectState::kProcessing;
    object.pin = config.pin;
    object.deadline = t + to_nanos(options_.put_timeout);
    for (const Replica& r : object.replicas) ++segments_[r.segment_id]->replicas;
    processing_.link_front(object);
    ++stats_.puts_started;
    evict_above_watermark(t);
    return locations(object);
  }

  Status put_end(std::string_view key, std::span<const std::string> unwritten) {
    Object* object = find_processing(key);
    if (object == nullptr) return no_put_in_progress(key);
    suspect(unwritten);
    for (size_t i = object->replicas.size(); i-- > 0;) {
      const Replica r = object->replicas[i];
      Segment& segment = *segments_[r.segment_id];
      if (std::find(unwritten.begin(), unwritten.end(), segment.mount.segment) == unwritten.end()) continue;
      segment.allocator.free(r.offset_bytes, object->size_bytes);
      --segment.replicas;
      object->replicas.erase(object->replicas.begin() + static_cast<long>(i));
      ++stats_.replicas_unwritten;
    }
    if (object->replicas.empty()) {
      drop(*object);
      ++stats_.puts_revoked;
      return Status::transfer_failed(fmt::format(
          "put {}: no replica was written (every segment it was given was unreachable)", printable_key(key)));
    }
    list_of(*object).unlink(*object);
    object->state = ObjectState::kComplete;
    object->deadline = object->pin == PinKind::kSoft ? now() + to_nanos(options_.soft_pin_ttl) : 0;
    lru_.link_front(*object);
    for (const Replica& r : object->replicas) {
      record(r.segment_id, ChangeKind::kAdded, {*object->key, r.offset_bytes, object->size_bytes});
    }
    ++stats_.puts_ended;
    return Status();
  }

  Status put_revoke(std::string_view key, std::span<const std::string> unwritten) {
    Object* object = find_processing(key);
    if (object == nullptr) return no_put_in_progress(key);
    suspect(unwritten);
    for (const Replica& r : object->replicas) {
      if (std::find(unwritten.begin(), unwritten.end(), segments_[r.segment_id]->mount.segment) !=
          unwritten.end()) {
        ++stats_.replicas_unwritten;
      }
    }
    drop(*object);
    ++stats_.puts_revoked;
    return Status();
  }

  /// A writer could not write to these segments: none takes new replicas until its owner renews it (a dead
  /// owner never does, and its segment expires after segment_ttl). Names not mounted are ignored.
  void suspect(std::span<const std::string> names) {
    for (const std::string& name : names) {
      Segment* segment = find_segment(name);
      if (segment == nullptr || segment->suspect) continue;
      segment->suspect = true;
      ++stats_.segments_suspected;
    }
  }

  Object* find_processing(std::string_view key) {
    auto it = objects_.find(key);
    return it == objects_.end() || it->second.state != ObjectState::kProcessing ? nullptr : &it->second;
  }

  Status no_put_in_progress(std::string_view key) const {
    CRESCENT_RETURN_IF_ERROR(validate_key(key));
    return Status::not_found(
        fmt::format("no put of key {} is in progress (never started, already ended, revoked, reclaimed after "
                    "{} ms, or its "
                    "segments were unmounted)",
                    printable_key(key), options_.put_timeout.count()));
  }

  // ---- reads and removal ----

  Result<ReadGrant> get_replica_list(std::string_view key) {
    ++stats_.gets;
    Object* object = find_complete(key);
    if (object == nullptr) {
      ++stats_.misses;
      CRESCENT_RETURN_IF_ERROR(validate_key(key));
      return Status::not_found(fmt::format("key {} not found", printable_key(key)));
    }
    const Nanos t = now();
    lru_.unlink(*object);
    lru_.link_front(*object);
    const bool readable = std::any_of(object->replicas.begin(), object->replicas.end(),
                                      [](const Replica& r) { return r.readable(); });
    if (!readable) return load_from_ssd(*object, t);
    ++stats_.hits;
    ++stats_.leases_granted;
    if (object->lease_until != 0 && object->lease_until <= t)
      ++stats_.leases_expired;  // the previous one ran out
    object->lease_until = std::max(object->lease_until, t + to_nanos(options_.lease_ttl));
    return ReadGrant{object->size_bytes, locations(*object), options_.lease_ttl};
  }

  /// An object held only on SSD tiers: orders its owner to load it into its segment (once) and answers
  /// kUnavailable until the owner reports it loaded; kNoSpace when the segment has no room even after
  /// evicting what frees space at once.
  Status load_from_ssd(Object& object, Nanos t) {
    if (std::any_of(object.replicas.begin(), object.replicas.end(),
                    [](const Replica& r) { return r.state == ReplicaState::kLoading; })) {
      return Status::unavailable(
          fmt::format("key {} is being loaded from SSD; retry shortly", printable_key(*object.key)));
    }
    const Replica source = object.replicas.front();  // an SSD replica: there is no readable DRAM one
    Segment& segment = *segments_[source.segment_id];
    std::optional<uint64_t> offset = segment.allocator.allocate(object.size_bytes);
    for (Object* victim = lru_.tail; victim != nullptr && !offset;) {
      Object* next = victim->lru_prev;
      if (victim != &object && evictable(*victim, t, false) && frees_at_once(*victim) &&
          std::any_of(victim->replicas.begin(), victim->replicas.end(),
                      [&](const Replica& r) { return r.segment_id == segment.id && r.holds_range(); })) {
        evict(*victim);
        offset = segment.allocator.allocate(object.size_bytes);
      }
      victim = next;
    }
    if (!offset) {
      // Order spills of what holds the segment; the load is ordered once the room is there.
      uint64_t ordered = segment.spilling_bytes;
      for (Object* victim = lru_.tail;
           victim != nullptr && ordered < aligned_size_bytes(object.size_bytes);) {
        Object* next = victim->lru_prev;
        if (victim != &object && evictable(*victim, t, false) &&
            std::any_of(victim->replicas.begin(), victim->replicas.end(),
                        [&](const Replica& r) { return r.segment_id == segment.id && r.holds_range(); })) {
          ordered += evict(*victim);
        }
        victim = next;
      }
      if (ordered > 0) {
        return Status::unavailable(
            fmt::format("key {} is on SSD; making room in {} to load it; retry shortly",
                        printable_key(*object.key), segment.mount.segment));
      }
      // Room held only by read leases comes back when they end: worth waiting for, unlike pins.
      for (Object* o = lru_.tail; o != nullptr; o = o->lru_prev) {
        if (o->lease_until > t && evictable(*o, o->lease_until, false) &&
            std::any_of(o->replicas.begin(), o->replicas.end(),
                        [&](const Replica& r) { return r.segment_id == segment.id && r.holds_range(); })) {
          return Status::unavailable(
              fmt::format("key {} is on SSD; its segment {} is held by read leases; retry",
                          printable_key(*object.key), segment.mount.segment));
        }
      }
      return Status::no_space(
          fmt::format("key {} is on the SSD tier of {} and its segment has no room to load it",
                      printable_key(*object.key), segment.mount.segment));
    }
    object.replicas.push_back({segment.id, *offset, ReplicaTier::kDram, ReplicaState::kLoading});
    ++segment.replicas;
    ++stats_.loads;
    record(segment.id, ChangeKind::kLoad, {*object.key, *offset, object.size_bytes});
    return Status::unavailable(
        fmt::format("key {} is being loaded from SSD; retry shortly", printable_key(*object.key)));
  }

  /// Whether a load from SSD into one of the object's ranges is under way (the owner will write that range).
  static bool loading(const Object& object) {
    return std::any_of(object.replicas.begin(), object.replicas.end(),
                       [](const Replica& r) { return r.state == ReplicaState::kLoading; });
  }

  /// Whether a spill or a load of one of the object's ranges is under way. Its range must stay allocated
  /// until the owner reports: freed and handed to another object, a late spill of it would write the new
  /// object's bytes into this key's file, and its report could be taken for the new object's spill.
  static bool moving(const Object& object) {
    return std::any_of(object.replicas.begin(), object.replicas.end(),
                       [](const Replica& r) { return r.state != ReplicaState::kReady; });
  }

  Object* find_complete(std::string_view key) {
    auto it = objects_.find(key);
    return it == objects_.end() || it->second.state != ObjectState::kComplete ? nullptr : &it->second;
  }

  Status remove(std::string_view key) {
    Object* object = find_complete(key);
    if (object == nullptr) {
      CRESCENT_RETURN_IF_ERROR(validate_key(key));
      return Status::not_found(fmt::format("key {} not found", printable_key(key)));
    }
    const Nanos t = now();
    if (moving(*object)) {
      return Status::failed_precondition(fmt::format("key {} is being {} SSD; retry shortly",
                                                     printable_key(key),
                                                     loading(*object) ? "loaded from" : "spilled to"));
    }
    if (object->lease_until > t) {
      return Status::failed_precondition(fmt::format("key {} is being read (its lease ends in {} ms)",
                                                     printable_key(key),
                                                     (object->lease_until - t) / 1000000));
    }
    drop(*object);
    ++stats_.removes;
    return Status();
  }

  uint64_t remove_all() {
    const Nanos t = now();
    uint64_t removed = 0;
    for (Object* object = lru_.tail; object != nullptr;) {
      Object* next = object->lru_prev;
      if (object->lease_until <= t && !moving(*object)) {
        drop(*object);
        ++removed;
      }
      object = next;
    }
    stats_.removes += removed;
    return removed;
  }

  // ---- background ----

  void tick() {
    const Nanos t = now();
    for (uint32_t id : std::vector<uint32_t>(live_segments_)) {
      if (segments_[id]->lease_until <= t) {
        (void)unmount(segments_[id]->mount.segment);
        ++stats_.segments_expired;
      }
    }
    // Puts start in deadline order (one put_timeout for all), so the expired ones are at the tail.
    while (processing_.tail != nullptr && processing_.tail->deadline <= t) {
      drop(*processing_.tail);
      ++stats_.puts_reclaimed;
    }
    evict_above_watermark(t);
  }

  MasterStats stats() const {
    MasterStats s = stats_;
    s.segments = live_segments_.size();
    s.dram_capacity_bytes = capacity_bytes();
    s.dram_used_bytes = used_bytes();
    s.objects = lru_.size;
    s.processing_objects = processing_.size;
    for (uint32_t id : live_segments_) {
      s.ssd_capacity_bytes += segments_[id]->mount.ssd_capacity_bytes;
      s.ssd_used_bytes += segments_[id]->ssd_used_bytes;
    }
    return s;
  }

  std::vector<SegmentInfo> segment_infos() const {
    std::vector<SegmentInfo> out;
    for (const auto& [name, id] : segment_by_name_) {
      const Segment& s = *segments_[id];
      out.push_back({s.mount.segment, s.mount.owner, s.mount.host_id, ReplicaTier::kDram,
                     s.mount.capacity_bytes, s.allocator.used_bytes(), s.replicas, s.mount.ssd_capacity_bytes,
                     s.ssd_used_bytes});
    }
    return out;
  }

  const MasterOptions& options() const { return options_; }

  std::mutex mu;

 private:
  uint64_t used_bytes() const {
    uint64_t used = 0;
    for (uint32_t id : live_segments_) used += segments_[id]->allocator.used_bytes();
    return used;
  }
  uint64_t capacity_bytes() const {
    uint64_t capacity = 0;
    for (uint32_t id : live_segments_) capacity += segments_[id]->mount.capacity_bytes;
    return capacity;
  }

  /// The segments new replicas may go to at `t`: renewed within placement_stale_after and not reported
  /// unreachable since. When none was renewed that recently (the master itself was stalled, or a test's
  /// clock jumped), every segment not reported unreachable.
  std::vector<uint32_t> placeable_segments(Nanos t) const {
    const Nanos stale = to_nanos(std::min(options_.placement_stale_after, options_.segment_ttl));
    std::vector<uint32_t> fresh, reported_alive;
    for (uint32_t id : live_segments_) {
      const Segment& segment = *segments_[id];
      if (segment.suspect) continue;
      reported_alive.push_back(id);
      if (t - segment.renewed_at <= stale) fresh.push_back(id);
    }
    return fresh.empty() ? reported_alive : fresh;
  }

  /// `segments` in the order the strategy tries them: the preferred segment first, then by strategy.
  std::vector<uint32_t> candidate_order(const ReplicateConfig& config, std::string_view writer_host,
                                        std::vector<uint32_t> order) {
    switch (options_.strategy) {
      case AllocationStrategy::kRandom:
        std::shuffle(order.begin(), order.end(), rng_);
        break;
      case AllocationStrategy::kMostFree:
        std::stable_sort(order.begin(), order.end(), [&](uint32_t a, uint32_t b) {
          return segments_[a]->allocator.free_bytes() > segments_[b]->allocator.free_bytes();
        });
        break;
      case AllocationStrategy::kLocalFirst:
        std::shuffle(order.begin(), order.end(), rng_);
        if (!writer_host.empty()) {
          std::stable_partition(order.begin(), order.end(),
                                [&](uint32_t id) { return segments_[id]->mount.host_id == writer_host; });
        }
        break;
    }
    if (!config.preferred_segment.empty()) {
      std::stable_partition(order.begin(), order.end(), [&](uint32_t id) {
        return segments_[id]->mount.segment == config.preferred_segment;
      });
    }
    return order;
  }

  /// One range on each of config.replica_num distinct segments of `segments`, or nullopt (nothing kept) when
  /// they do not fit.
  std::optional<std::vector<Replica>> allocate(uint64_t size_bytes, const ReplicateConfig& config,
                                               std::string_view writer_host,
                                               const std::vector<uint32_t>& segments) {
    std::vector<Replica> replicas;
    for (uint32_t id : candidate_order(config, writer_host, segments)) {
      if (std::optional<uint64_t> offset = segments_[id]->allocator.allocate(size_bytes)) {
        replicas.push_back({id, *offset});
        if (replicas.size() == config.replica_num) return replicas;
      }
    }
    for (const Replica& r : replicas) segments_[r.segment_id]->allocator.free(r.offset_bytes, size_bytes);
    return std::nullopt;
  }

  bool evictable(const Object& object, Nanos t, bool allow_soft_pins) const {
    if (object.state != ObjectState::kComplete || object.lease_until > t) return false;
    // Something to free, and no spill or load under way.
    bool has_ready_range = false;
    for (const Replica& r : object.replicas) {
      if (r.state != ReplicaState::kReady) return false;
      has_ready_range |= r.holds_range();
    }
    if (!has_ready_range) return false;
    switch (object.pin) {
      case PinKind::kNone:
        return true;
      case PinKind::kHard:
        return false;
      case PinKind::kSoft:
        return allow_soft_pins || object.deadline <= t;
    }
    return false;
  }

  /// Whether evicting every object evictable at `t` (soft pins included) would leave a contiguous free range
  /// of `size_bytes` on `replica_num` distinct segments of `segments`. O(objects): for puts that evicting
  /// has not helped.
  bool eviction_can_fit(uint64_t size_bytes, uint32_t replica_num, const std::vector<uint32_t>& segments,
                        Nanos t) const {
    std::unordered_map<uint32_t, std::vector<std::pair<uint64_t, uint64_t>>> freeable;  // segment -> ranges
    for (const auto& [key, object] : objects_) {
      if (!evictable(object, t, /*allow_soft_pins=*/true)) continue;
      for (const Replica& r : object.replicas) {
        if (r.holds_range()) freeable[r.segment_id].emplace_back(r.offset_bytes, object.size_bytes);
      }
    }
    const uint64_t aligned = aligned_size_bytes(size_bytes);
    uint32_t fitting = 0;
    for (uint32_t id : segments) {
      auto it = freeable.find(id);
      const uint64_t largest =
          it == freeable.end() ? segments_[id]->allocator.largest_free_bytes()
                               : segments_[id]->allocator.largest_free_bytes_if_freed(std::move(it->second));
      if (largest >= aligned) ++fitting;
    }
    return fitting >= replica_num;
  }

  /// Whether evicting `object` frees all its DRAM now: none of its DRAM replicas needs a spill first.
  bool frees_at_once(const Object& object) const {
    for (const Replica& r : object.replicas) {
      if (r.holds_range() && needs_spill(object, r)) return false;
    }
    return true;
  }

  /// A DRAM replica on a segment with an SSD tier where the object has no SSD copy yet.
  bool needs_spill(const Object& object, const Replica& dram) const {
    if (!segments_[dram.segment_id]->has_ssd()) return false;
    return std::none_of(object.replicas.begin(), object.replicas.end(), [&](const Replica& r) {
      return r.segment_id == dram.segment_id && r.tier == ReplicaTier::kSsd;
    });
  }

  uint64_t spilling_bytes() const {
    uint64_t n = 0;
    for (uint32_t id : live_segments_) n += segments_[id]->spilling_bytes;
    return n;
  }

  void evict_above_watermark(Nanos t) {
    const uint64_t capacity = capacity_bytes();
    // Bytes ordered spilled are as good as freed: counting them again would spill more than the fraction.
    uint64_t used = used_bytes() - std::min(used_bytes(), spilling_bytes());
    if (capacity == 0 || static_cast<double>(used) <= options_.high_watermark * static_cast<double>(capacity))
      return;
    const double target =
        static_cast<double>(used) - options_.eviction_fraction * static_cast<double>(capacity);
    for (Object* victim = lru_.tail; victim != nullptr && static_cast<double>(used) > target;) {
      Object* next = victim->lru_prev;
      if (evictable(*victim, t, false)) used -= std::min(used, evict(*victim));
      victim = next;
    }
  }

  /// Evicts an object's DRAM replicas: a replica on a segment with an SSD tier is spilled there (its range is
  /// freed when the owner reports the file written) or, when an SSD copy exists, just freed; elsewhere it is
  /// dropped. The object is forgotten when no replica is left. Returns the DRAM bytes freed or ordered
  /// spilled. REQUIRES: evictable(object).
  uint64_t evict(Object& object) {
    ++stats_.evictions;
    const uint64_t aligned = aligned_size_bytes(object.size_bytes);
    uint64_t freed = 0;
    for (size_t i = object.replicas.size(); i-- > 0;) {
      Replica& r = object.replicas[i];
      if (!r.holds_range()) continue;
      Segment& segment = *segments_[r.segment_id];
      freed += aligned;
      if (needs_spill(object, r)) {
        r.state = ReplicaState::kSpilling;
        segment.spilling_bytes += aligned;
        ++stats_.spills;
        record(segment.id, ChangeKind::kSpill, {*object.key, r.offset_bytes, object.size_bytes});
        continue;
      }
      // Dropped here; an SSD copy on this owner (if any) stays.
      const bool keeps_ssd_copy = segment.has_ssd();
      record(segment.id, keeps_ssd_copy ? ChangeKind::kEvicted : ChangeKind::kRemoved, {*object.key, 0, 0});
      const bool last = object.replicas.size() == 1;
      remove_replica(object, i);
      if (last) break;  // the object is forgotten: do not touch it again
    }
    stats_.evicted_bytes += freed;
    return freed;
  }

  /// Frees an object's space and forgets it.
  void drop(Object& object) {
    if (object.lease_until != 0) ++stats_.leases_expired;  // drop never happens under a live lease
    for (const Replica& r : object.replicas) {
      Segment& segment = *segments_[r.segment_id];
      if (object.state == ObjectState::kComplete)
        record(segment.id, ChangeKind::kRemoved, {*object.key, 0, 0});
      if (r.holds_range()) {
        segment.allocator.free(r.offset_bytes, object.size_bytes);
        if (r.state == ReplicaState::kSpilling)
          segment.spilling_bytes -= aligned_size_bytes(object.size_bytes);
      } else {
        segment.ssd_used_bytes -= object.size_bytes;
      }
      --segment.replicas;
    }
    list_of(object).unlink(object);
    objects_.erase(objects_.find(*object.key));
  }

  /// The readable DRAM replicas (all of them for a processing object: where to write).
  std::vector<ReplicaLocation> locations(const Object& object) const {
    std::vector<ReplicaLocation> out;
    out.reserve(object.replicas.size());
    for (const Replica& r : object.replicas) {
      if (!r.readable()) continue;
      const Segment& segment = *segments_[r.segment_id];
      out.push_back({segment.mount.segment, segment.mount.host_id, r.offset_bytes, object.size_bytes,
                     ReplicaTier::kDram});
    }
    return out;
  }

  /// An intrusive doubly linked list through Object::lru_prev/lru_next: head newest, tail oldest.
  struct ObjectList {
    Object* head = nullptr;
    Object* tail = nullptr;
    uint64_t size = 0;

    void link_front(Object& object) {
      object.lru_prev = nullptr;
      object.lru_next = head;
      (head != nullptr ? head->lru_prev : tail) = &object;
      head = &object;
      ++size;
    }
    void unlink(Object& object) {
      (object.lru_prev != nullptr ? object.lru_prev->lru_next : head) = object.lru_next;
      (object.lru_next != nullptr ? object.lru_next->lru_prev : tail) = object.lru_prev;
      object.lru_prev = object.lru_next = nullptr;
      --size;
    }
  };

  /// Complete objects are on the LRU list (tail evicted first); processing ones on the processing list.
  ObjectList& list_of(const Object& object) {
    return object.state == ObjectState::kComplete ? lru_ : processing_;
  }

  MasterOptions options_;
  std::mt19937_64 rng_;
  std::unordered_map<std::string, Object, KeyHash, std::equal_to<>> objects_;
  std::vector<std::unique_ptr<Segment>> segments_;  // by id; null once unmounted
  std::map<std::string, uint32_t, std::less<>> segment_by_name_;
  std::vector<uint32_t> live_segments_;
  ObjectList lru_;         // complete objects: head most recently used
  ObjectList processing_;  // puts in progress: head newest, tail oldest (next to be reclaimed)
  MasterStats stats_;
};

Master::Master(MasterOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
Master::~Master() = default;

#define CRESCENT_LOCKED std::lock_guard<std::mutex> lock(impl_->mu)

Status Master::mount_segment(const SegmentMount& mount, std::span<const HeldObject> held) {
  CRESCENT_LOCKED;
  return impl_->mount(mount, held);
}
Status Master::unmount_segment(std::string_view segment) {
  CRESCENT_LOCKED;
  return impl_->unmount(segment);
}
Result<SegmentChanges> Master::renew_segment(std::string_view segment, uint64_t since_version,
                                             const SegmentReport& report) {
  CRESCENT_LOCKED;
  return impl_->renew(segment, since_version, report);
}
Result<std::vector<ReplicaLocation>> Master::put_start(std::string_view key, uint64_t size_bytes,
                                                       const ReplicateConfig& config,
                                                       std::string_view writer_host_id) {
  CRESCENT_LOCKED;
  return impl_->put_start(key, size_bytes, config, writer_host_id);
}
Status Master::put_end(std::string_view key, std::span<const std::string> unwritten_segments) {
  CRESCENT_LOCKED;
  return impl_->put_end(key, unwritten_segments);
}
Status Master::put_revoke(std::string_view key, std::span<const std::string> unwritten_segments) {
  CRESCENT_LOCKED;
  return impl_->put_revoke(key, unwritten_segments);
}
Result<ReadGrant> Master::get_replica_list(std::string_view key) {
  CRESCENT_LOCKED;
  return impl_->get_replica_list(key);
}
bool Master::exists(std::string_view key) {
  CRESCENT_LOCKED;
  return impl_->find_complete(key) != nullptr;
}
Status Master::remove(std::string_view key) {
  CRESCENT_LOCKED;
  return impl_->remove(key);
}
uint64_t Master::remove_all() {
  CRESCENT_LOCKED;
  return impl_->remove_all();
}

std::vector<Result<std::vector<ReplicaLocation>>> Master::put_start_batch(
    std::span<const std::string_view> keys, std::span<const uint64_t> sizes_bytes,
    const ReplicateConfig& config, std::string_view writer_host_id) {
  CRESCENT_LOCKED;
  std::vector<Result<std::vector<ReplicaLocation>>> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i) {
    if (i >= sizes_bytes.size()) {
      out.emplace_back(Status::invalid_argument(fmt::format("put batch: no size for key {}", i)));
    } else {
      out.push_back(impl_->put_start(keys[i], sizes_bytes[i], config, writer_host_id));
    }
  }
  return out;
}

namespace {
template <typename Out, typename F>
std::vector<Out> each_key(std::span<const std::string_view> keys, F&& f) {
  std::vector<Out> out;
  out.reserve(keys.size());
  for (std::string_view key : keys) out.push_back(f(key));
  return out;
}

// The unwritten segments of key `i` of a batch: its list when one per key was given, else none.
std::span<const std::string> unwritten_of(std::span<const std::vector<std::string>> unwritten, size_t i) {
  return i < unwritten.size() ? std::span<const std::string>(unwritten[i]) : std::span<const std::string>();
}
}  // namespace

std::vector<Status> Master::put_end_batch(std::span<const std::string_view> keys,
                                          std::span<const std::vector<std::string>> unwritten_segments) {
  CRESCENT_LOCKED;
  std::vector<Status> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i)
    out.push_back(impl_->put_end(keys[i], unwritten_of(unwritten_segments, i)));
  return out;
}
std::vector<Status> Master::put_revoke_batch(std::span<const std::string_view> keys,
                                             std::span<const std::vector<std::string>> unwritten_segments) {
  CRESCENT_LOCKED;
  std::vector<Status> out;
  out.reserve(keys.size());
  for (size_t i = 0; i < keys.size(); ++i)
    out.push_back(impl_->put_revoke(keys[i], unwritten_of(unwritten_segments, i)));
  return out;
}
std::vector<Result<ReadGrant>> Master::get_replica_list_batch(std::span<const std::string_view> keys) {
  CRESCENT_LOCKED;
  return each_key<Result<ReadGrant>>(keys, [&](std::string_view k) { return impl_->get_replica_list(k); });
}
std::vector<bool> Master::exists_batch(std::span<const std::string_view> keys) {
  CRESCENT_LOCKED;
  return each_key<bool>(keys, [&](std::string_view k) { return impl_->find_complete(k) != nullptr; });
}
std::vector<Status> Master::remove_batch(std::span<const std::string_view> keys) {
  CRESCENT_LOCKED;
  return each_key<Status>(keys, [&](std::string_view k) { return impl_->remove(k); });
}

void Master::tick() {
  CRESCENT_LOCKED;
  impl_->tick();
}
MasterStats Master::stats() const {
  CRESCENT_LOCKED;
  return impl_->stats();
}
std::vector<SegmentInfo> Master::segments() const {
  CRESCENT_LOCKED;
  return impl_->segment_infos();
}
const MasterOptions& Master::options() const {
  return impl_->options();
}

#undef CRESCENT_LOCKED

}  // namespace crescent::store
