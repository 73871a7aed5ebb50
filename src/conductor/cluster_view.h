// What the Conductor may know about the cluster when it places a request. ClusterState (cluster_state.h)
// implements it from events, for the simulator and the live Conductor alike; tests may hand-set a fake.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "common/instance_id.h"
#include "kv/block_index.h"
#include "kv/block_key.h"
#include "kv/decode_load.h"

namespace crescent::conductor {

/// Which prefill instances' busy_until or up flag changed lately (ClusterView::prefill_changes), so a
/// consumer that keeps copies of them (the Conductor's busy order, busy_order.h) re-reads those alone instead
/// of comparing the whole pool. Change number c (from 0, since the log began) was to instance
/// recent[c % recent.size()]; the last min(count, recent.size()) changes are there.
struct PrefillChanges {
  uint64_t source = 0;  // tells logs apart: unique to one log over the process's life; 0: no log is kept
  uint64_t count = 0;   // changes logged so far
  std::span<const InstanceId> recent;  // ring of the last changed ids; valid while the log lives
};

/// The log behind PrefillChanges: a ring of the last kRecent changed instance ids. A view calls note(i)
/// after every write to instance i's busy_until or up flag (and for an instance added to the pool). A copy
/// is a new log (another source), so a consumer never mistakes one view's changes for another's; a moved-from
/// log keeps its source and count. The only source of sources: a view must not make its own up.
class PrefillChangeLog {
 public:
  static constexpr size_t kRecent = 64;

  PrefillChangeLog() : source_(next_source()) {}
  PrefillChangeLog(const PrefillChangeLog&) : PrefillChangeLog() {}
  PrefillChangeLog(PrefillChangeLog&&) noexcept : PrefillChangeLog() {}
  /// Assigned, a log starts over as a new one.
  PrefillChangeLog& operator=(const PrefillChangeLog&) {
    source_ = next_source();
    count_ = 0;
    return *this;
  }
  PrefillChangeLog& operator=(PrefillChangeLog&& other) noexcept {
    return *this = static_cast<const PrefillChangeLog&>(other);
  }
  ~PrefillChangeLog() = default;

  /// Logs a change to instance `i`.
  void note(InstanceId i) { recent_[count_++ % kRecent] = i; }
  /// What prefill_changes() returns.
  PrefillChanges changes() const { return {source_, count_, recent_}; }

 private:
  static uint64_t next_source();

  uint64_t source_;
  uint64_t count_ = 0;
  std::array<InstanceId, kRecent> recent_{};
};

/// The decode pool as the decode choice reads it (Conductor::choose_decode, Algorithm 1 line 17): per decode
/// instance, the requests and context tokens a request joining it would share its steps with (running,
/// waiting and incoming: DecodeLoad's three groups), and its room (kv_capacity_tokens - reserved_kv_tokens;
/// minus infinity when it is down, so that no request fits). Arrays of doubles, so the choice's loop over
/// hundreds of instances reads 24 bytes an instance instead of a DecodeLoad's 80 and scores two at a time.
/// Token and request counts below 2^53 are exact as doubles.
class DecodeChoiceLoads {
 public:
  /// Sets instance `d`'s entries from its load and up flag, growing the arrays to hold it.
  void set(InstanceId d, const kv::DecodeLoad& load, bool up) {
    if (d >= room_tokens_.size()) {
      batch_requests_.resize(d + 1, 0);
      context_tokens_.resize(d + 1, 0);
      room_tokens_.resize(d + 1, -std::numeric_limits<double>::infinity());
    }
    batch_requests_[d] =
        static_cast<double>(load.running.requests + load.waiting.requests + load.incoming.requests);
    context_tokens_[d] = static_cast<double>(load.running.context_tokens + load.waiting.context_tokens +
                                             load.incoming.context_tokens);
    room_tokens_[d] = up ? static_cast<double>(load.kv_capacity_tokens - load.reserved_kv_tokens())
                         : -std::numeric_limits<double>::infinity();
  }
  /// Sets every instance's entries: `loads` and `up` (empty: all up) as ClusterView returns them.
  void set_all(std::span<const kv::DecodeLoad> loads, std::span<const uint8_t> up) {
    for (InstanceId d = 0; d < loads.size(); ++d) set(d, loads[d], up.empty() || up[d] != 0);
  }

  /// Per instance: requests running, waiting and incoming.
  std::span<const double> batch_requests() const { return batch_requests_; }
  /// Per instance: their context tokens (DecodeGroup::context_tokens, summed).
  std::span<const double> context_tokens() const { return context_tokens_; }
  /// Per instance: HBM KV tokens not yet reserved; minus infinity when the instance is down.
  std::span<const double> room_tokens() const { return room_tokens_; }

 private:
  std::vector<double> batch_requests_, context_tokens_, room_tokens_;
};

/// Read-only view of the prefill and decode pools.
class ClusterView {
 public:
  virtual ~ClusterView() = default;

  /// Number of prefill instances (>= 1); instance ids are 0..count-1.
  virtual uint32_t prefill_instance_count() const = 0;
  /// Number of decode instances (>= 1): decode_loads().size().
  uint32_t decode_instance_count() const { return static_cast<uint32_t>(decode_loads().size()); }

  /// Per prefill instance: the time (seconds, the Conductor's clock) when it will have finished every request
  /// already assigned to it, from the predicted prefill times of its queue. A value <= now means idle.
  /// Size = prefill_instance_count().
  virtual std::span<const double> prefill_busy_until_s() const = 0;

  /// Current load of each decode instance (its id is its index): a span, so a loop over hundreds of decode
  /// instances reads them in place.
  virtual std::span<const kv::DecodeLoad> decode_loads() const = 0;
  /// decode_loads()[d]. REQUIRES: d < decode_instance_count().
  const kv::DecodeLoad& decode_load(InstanceId d) const { return decode_loads()[d]; }

  /// Which prefill instance caches which block (DRAM prefix caches).
  virtual const kv::BlockIndex& block_index() const = 0;

  /// When prefill instance `holder` will have computed all of `keys` (seconds, the Conductor's clock); a
  /// value <= now means ready. Blocks enter the index when their request is placed, before its prefill has
  /// run, so a remote fetch may have to wait for them. The answer is exact when it is <= `stop_above_s`;
  /// otherwise it is some time > `stop_above_s` (a view may stop at the first key it finds ready later: a
  /// caller looking for the holder ready soonest passes the best time so far). REQUIRES: `holder` holds
  /// every key.
  virtual double prefix_ready_s(InstanceId holder, std::span<const BlockKey> keys,
                                double stop_above_s) const = 0;
  /// The exact time (no stop).
  double prefix_ready_s(InstanceId holder, std::span<const BlockKey> keys) const {
    return prefix_ready_s(holder, keys, std::numeric_limits<double>::infinity());
  }

  /// Per prefill instance (decode instance), 1 when it is up and 0 when it is down: the Conductor places
  /// nothing on an instance that is down. Empty: every instance is up (a simulated cluster's always are; a
  /// live one's go down when they stop reporting). A span, not a call per instance, so the Conductor's loop
  /// over a thousand instances reads it as it reads prefill_busy_until_s().
  virtual std::span<const uint8_t> prefill_up_flags() const { return {}; }
  virtual std::span<const uint8_t> decode_up_flags() const { return {}; }

  /// decode_loads() and decode_up_flags() as the decode choice reads them, kept by a view that sets an
  /// instance's entries whenever its load or up flag changes: at every decision they must equal what
  /// DecodeChoiceLoads::set_all(decode_loads(), decode_up_flags()) makes, at least decode_instance_count()
  /// entries. The default (null): the Conductor derives them on each decision.
  virtual const DecodeChoiceLoads* decode_choice_loads() const { return nullptr; }

  /// Which prefill instances' busy_until or up flag changed lately. A view that returns a source other than
  /// 0 returns its PrefillChangeLog's changes() and must log every such change there (note). The default
  /// keeps no log: the Conductor then compares every instance with its copy on each decision.
  virtual PrefillChanges prefill_changes() const { return {}; }

  /// Whether prefill instance `i` (decode instance `d`) is up.
  bool prefill_up(InstanceId i) const {
    const auto up = prefill_up_flags();
    return up.empty() || up[i] != 0;
  }
  bool decode_up(InstanceId d) const {
    const auto up = decode_up_flags();
    return up.empty() || up[d] != 0;
  }
};

}  // namespace crescent::conductor
