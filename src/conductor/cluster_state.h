// The Conductor's picture of the cluster (paper §4): which prefill instance caches which block and from when
// it is readable, each prefill instance's predicted queue, each decode instance's load. The one ClusterView
// of both the simulator (sim/simulator.cpp) and the live Conductor, changed only through the named events
// below, so both learn about the cluster by the same rules.
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <unordered_map>
#include <vector>

#include "common/instance_id.h"
#include "conductor/cluster_view.h"
#include "conductor/conductor.h"
#include "kv/block_index.h"
#include "kv/block_key.h"
#include "kv/block_map.h"

namespace crescent::conductor {

/// When a placed request's prefill is predicted to run (seconds, the Conductor's clock).
struct PrefillTimeline {
  double prefix_ready_s =
      0;               // when the source of a fetched prefix will have computed it (0: nothing fetched)
  double start_s = 0;  // it reaches the head of the queue and its remote prefix is computed
  double compute_start_s = 0;  // start_s + Decision::transfer_s: prefix fetched and loaded into HBM
  double done_s = 0;           // compute_start_s + Decision::prefill_s: first token, KV complete
};

/// ClusterView kept current from events. Not thread-safe (the live Conductor serialises events and
/// decisions on one thread, as the simulator does).
class ClusterState final : public ClusterView {
 public:
  /// A cluster of `prefill_instances` and `decode_instances` (each >= 1) whose prompts are cut into blocks
  /// of `block_size_tokens` (>= 1). Decode loads start empty with `decode_kv_capacity_tokens` of HBM each.
  ClusterState(uint32_t prefill_instances, uint32_t decode_instances, int64_t block_size_tokens,
               int64_t decode_kv_capacity_tokens);

  // ClusterView
  uint32_t prefill_instance_count() const override { return static_cast<uint32_t>(busy_until_s_.size()); }
  std::span<const double> prefill_busy_until_s() const override { return busy_until_s_; }
  std::span<const kv::DecodeLoad> decode_loads() const override { return decode_; }
  const kv::BlockIndex& block_index() const override { return index_; }
  /// Walks `keys` last to first (a prompt's later blocks were mostly computed later, so a holder ready after
  /// `stop_above_s` is found out in a key or two) and stops at the first key ready after `stop_above_s`.
  double prefix_ready_s(InstanceId holder, std::span<const BlockKey> keys,
                        double stop_above_s) const override;
  using ClusterView::prefix_ready_s;
  PrefillChanges prefill_changes() const override { return prefill_changes_.changes(); }
  const DecodeChoiceLoads* decode_choice_loads() const override { return &decode_choice_; }

  /// Event "request placed": the Conductor accepted `decision` for `request` at `now_s`. Its prefill joins
  /// the chosen instance's FIFO queue as predicted (Algorithm 1): it starts once the instance is free and,
  /// for a fetched prefix, once the source has computed those blocks; then it loads the prefix
  /// (decision.transfer_s) and computes (decision.prefill_s). A request that will decode (max_output_tokens
  /// > 1) counts as incoming on its decode instance until that instance's next report. The prompt's blocks
  /// are indexed on the prefill instance at once, readable from the predicted end of its prefill (blocks it
  /// already holds keep their time). Returns the predicted timeline. REQUIRES: decision.rejected == kNone,
  /// instances in range.
  PrefillTimeline on_request_placed(const RequestInfo& request, const Decision& decision, double now_s);

  /// Event "KV stored/removed" (vLLM's BlockStored / BlockRemoved, or a simulated cache's TouchEvents):
  /// prefill instance `instance` now caches `stored` and no longer caches `removed`. Stored blocks are
  /// readable by others from `ready_s` on (their prefill's predicted end, or now for computed blocks), or
  /// from the later time a placement predicted for them.
  void on_kv_event(InstanceId instance, std::span<const BlockKey> stored, std::span<const BlockKey> removed,
                   double ready_s);
  /// Event "request dropped": a request placed on prefill instance `instance` with `block_keys` was cancelled
  /// or failed at `now_s` before its prefill ended, with `remaining_prefill_s` of its predicted prefill
  /// (prefix load + compute) not yet run: the whole prediction if it was still queued, what is left of it
  /// if it was computing. The instance's queue is predicted to end that much sooner (never before now).
  /// Blocks only its placement put in the index (no KV event has said the instance stores them, and no other
  /// placement there uses them) leave the index: they will never be computed there.
  void on_request_dropped(InstanceId instance, std::span<const BlockKey> block_keys,
                          double remaining_prefill_s, double now_s) {
    set_busy_until(instance, std::max(now_s, busy_until_s_[instance] - std::max(0.0, remaining_prefill_s)));
    release_placement(instance, block_keys);
  }
  /// Event "all blocks cleared" (vLLM's AllBlocksCleared, or an instance that restarted or left).
  void on_kv_cleared(InstanceId instance);

  /// Event "prefill done": a request's prefill on `instance` ended at `now_s`. A prefill that ran later than
  /// predicted pushes the instance's queue estimate out to now; the blocks it stored are readable by others
  /// from now, even when their placement predicted later. Its placement's prediction has run its
  /// course: of its `block_keys`, those the instance did not store (no KV event said so: a cache smaller than
  /// the prompt keeps its head) leave the index unless another placement there will compute them, as for a
  /// dropped request.
  void on_prefill_done(InstanceId instance, std::span<const BlockKey> block_keys, double now_s);
  /// on_prefill_done's first half, for a Conductor whose KV events may come after the prefill is seen to end
  /// (a live engine's events travel on another socket than its answer, docs/router.md): the queue estimate
  /// and the ready times of stored blocks, but the placement still stands in the index until
  /// on_placement_settled.
  void on_prefill_computed(InstanceId instance, std::span<const BlockKey> block_keys, double now_s);
  /// on_prefill_done's second half: the placement of `block_keys` on `instance` no longer stands. Of its
  /// blocks, those no KV event said the instance stores leave the index unless another placement there will
  /// compute them.
  void on_placement_settled(InstanceId instance, std::span<const BlockKey> block_keys) {
    release_placement(instance, block_keys);
  }

  /// Event "prefill idle": prefill instance `instance` has nothing queued or running at `now_s` (a live
  /// Conductor knows when every request it placed there is done): its queue's predicted end is now at the
  /// latest.
  void on_prefill_idle(InstanceId instance, double now_s) {
    set_busy_until(instance, std::min(busy_until_s_[instance], now_s));
  }

  /// Event "decode report": decode instance `d` reports its load (running, waiting and incoming requests,
  /// HBM capacity). Replaces what placements added since its last report.
  void on_decode_report(InstanceId d, const kv::DecodeLoad& load) {
    decode_[d] = load;
    decode_changed(d);
  }

  /// Event "instance down" (it stopped reporting, or restarted): nothing is placed there any more. A prefill
  /// instance's cached blocks and queue are forgotten; a decode instance's load is zeroed.
  void on_prefill_down(InstanceId instance, double now_s);
  void on_decode_down(InstanceId d);
  /// Event "instance joined" (an engine registered while the router serves, docs/router.md): a new prefill
  /// instance, numbered after the last, with no blocks and an empty queue. It is down until on_prefill_up.
  InstanceId add_prefill_instance();
  /// A new decode instance with `kv_capacity_tokens` of HBM and no load, numbered after the last; down until
  /// on_decode_up.
  InstanceId add_decode_instance(int64_t kv_capacity_tokens);

  /// Makes room in the index for prefill instance `instance` to cache `blocks` blocks (its cache's size,
  /// when known), allocated and written now, so placements there neither grow a table nor fault a page in
  /// until it holds that many (kv::BlockMap::reserve). The room an instance has is its largest call's: asking
  /// again for as much or less adds nothing. Decisions are unchanged. For long-lived Conductors (a router);
  /// the simulator does not call it.
  void reserve_prefix_cache_blocks(InstanceId instance, int64_t blocks);

  /// Event "instance up" (joined or rejoined): placements may go there again.
  void on_prefill_up(InstanceId instance) {
    prefill_up_[instance] = true;
    prefill_changes_.note(instance);
  }
  void on_decode_up(InstanceId d) {
    decode_up_[d] = true;
    decode_changed(d);
  }
  std::span<const uint8_t> prefill_up_flags() const override { return prefill_up_; }
  std::span<const uint8_t> decode_up_flags() const override { return decode_up_; }

 private:
  // A placement on `instance` of `block_keys` no longer stands: blocks only placements put in the index, and
  // no other placement there will compute, leave it.
  void release_placement(InstanceId instance, std::span<const BlockKey> block_keys);
  // After every write to decode_[d] or decode_up_[d]: decode_choice_ follows.
  void decode_changed(InstanceId d) { decode_choice_.set(d, decode_[d], decode_up_[d] != 0); }
  // Every write to a busy_until goes through here, so prefill_changes() logs it.
  void set_busy_until(InstanceId instance, double busy_until_s) {
    busy_until_s_[instance] = busy_until_s;
    prefill_changes_.note(instance);
  }

  const int64_t block_size_tokens_;
  std::vector<double> busy_until_s_;  // per prefill instance: predicted end of its queue
  std::vector<kv::DecodeLoad> decode_;
  std::vector<uint8_t> prefill_up_, decode_up_;  // 1: up
  DecodeChoiceLoads decode_choice_;              // decode_ and decode_up_, as the decode choice reads them
  PrefillChangeLog prefill_changes_;             // writes to busy_until_s_ and prefill_up_
  kv::BlockIndex index_;  // holds `key` on `instance` exactly when ready_s_[instance] has `key`
  std::vector<int64_t> reserved_blocks_;  // per prefill instance: reserve_prefix_cache_blocks' largest
  int64_t index_reserved_blocks_ = 0;     // their sum: the index's reserved size
  // A block indexed on a prefill instance: when it is (or will be) computed there, and whether only
  // placements put it there so far (they are counted, so a dropped request removes only blocks nobody else
  // will compute).
  struct CachedBlock {
    double ready_s = 0;
    uint32_t placements = 0;  // placed requests that will compute it, until a KV event says it is stored
    bool stored = false;      // a KV event (or a simulated cache) said the instance stores it
  };
  // A stored block's prefill ended at `now_s`: it is readable from then, if its placement predicted later.
  static void computed(CachedBlock& block, double now_s) { block.ready_s = std::min(block.ready_s, now_s); }
  // One placement of block `key` (not stored) on `instance` no longer stands: when no other placement there
  // will compute it, it leaves the index and `block` is gone.
  void release(InstanceId instance, BlockKey key, CachedBlock& block) {
    if (block.placements == 0 || --block.placements > 0) return;
    index_.remove(key, instance);
    ready_s_[instance].erase(key);
  }
  // Per prefill instance: its indexed blocks. Blocks are indexed when their request is placed, so a remote
  // fetch must wait until the holder has actually produced them.
  std::vector<kv::BlockMap<CachedBlock>> ready_s_;
};

}  // namespace crescent::conductor
