// What the Conductor may know about the cluster when it places a request. ClusterState (cluster_state.h)
// implements it from events, for the simulator and the live Conductor alike; tests may hand-set a fake.
#pragma once

#include <cstdint>
#include <span>

#include "common/instance_id.h"
#include "kv/block_index.h"
#include "kv/block_key.h"
#include "kv/decode_load.h"

namespace crescent::conductor {

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
  /// value
  /// <= now means ready. Blocks enter the index when their request is placed, before its prefill has run, so
  /// a remote fetch may have to wait for them. REQUIRES: `holder` holds every key.
  virtual double prefix_ready_s(InstanceId holder, std::span<const BlockKey> keys) const = 0;

  /// Per prefill instance (decode instance), 1 when it is up and 0 when it is down: the Conductor places
  /// nothing on an instance that is down. Empty: every instance is up (a simulated cluster's always are; a
  /// live one's go down when they stop reporting). A span, not a call per instance, so the Conductor's loop
  /// over a thousand instances reads it as it reads prefill_busy_until_s().
  virtual std::span<const uint8_t> prefill_up_flags() const { return {}; }
  virtual std::span<const uint8_t> decode_up_flags() const { return {}; }

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
