// What the Conductor may know about the cluster when it places a request. ClusterState (cluster_state.h)
// implements it from events, for the simulator and the live Conductor alike; tests may hand-set a fake.
#pragma once

#include <cstdint>
#include <span>

#include "common/block_key.h"
#include "kv/block_index.h"

namespace crescent::conductor {

/// Requests in one state on a decode instance, and what they hold.
struct DecodeGroup {
  int64_t requests = 0;
  int64_t context_tokens =
      0;                  // KV tokens they hold (or will hold on joining): prompt + tokens generated so far
  int64_t kv_tokens = 0;  // HBM KV tokens reserved for them: prompt + max output each (no preemption)
};

/// Load of one decode instance as the Conductor sees it.
struct DecodeLoad {
  DecodeGroup running;             // in the continuous batch
  DecodeGroup waiting;             // KV arrived, waiting for HBM room to join the batch
  DecodeGroup incoming;            // assigned by the Conductor, still in prefill or KV transfer
  int64_t kv_capacity_tokens = 0;  // HBM KV tokens the instance can hold
};

/// Read-only view of the prefill and decode pools.
class ClusterView {
 public:
  virtual ~ClusterView() = default;

  /// Number of prefill instances (>= 1); instance ids are 0..count-1.
  virtual uint32_t prefill_instance_count() const = 0;
  /// Number of decode instances (>= 1).
  virtual uint32_t decode_instance_count() const = 0;

  /// Per prefill instance: the time (seconds, the Conductor's clock) when it will have finished every request
  /// already assigned to it, from the predicted prefill times of its queue. A value <= now means idle.
  /// Size = prefill_instance_count().
  virtual std::span<const double> prefill_busy_until_s() const = 0;

  /// Current load of decode instance `d`. REQUIRES: d < decode_instance_count().
  virtual DecodeLoad decode_load(InstanceId d) const = 0;

  /// Which prefill instance caches which block (DRAM prefix caches).
  virtual const kv::BlockIndex& block_index() const = 0;

  /// When prefill instance `holder` will have computed all of `keys` (seconds, the Conductor's clock); a
  /// value
  /// <= now means ready. Blocks enter the index when their request is placed, before its prefill has run, so
  /// a remote fetch may have to wait for them. REQUIRES: `holder` holds every key.
  virtual double prefix_ready_s(InstanceId holder, std::span<const BlockKey> keys) const = 0;

  /// Whether prefill instance `i` (decode instance `d`) is up: the Conductor places nothing on an instance
  /// that is down. A simulated cluster's instances are always up; a live one's go down when they stop
  /// reporting.
  virtual bool prefill_up(InstanceId i) const {
    (void)i;
    return true;
  }
  virtual bool decode_up(InstanceId d) const {
    (void)d;
    return true;
  }
};

}  // namespace crescent::conductor
