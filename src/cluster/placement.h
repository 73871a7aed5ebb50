// The placement protocol: how a request reaches its instances, written once for the simulator
// (sim/disaggregated.cpp) and the live Conductor (cluster/conductor_core.cpp). Both call place(); only how
// orders reach instances differs (a PlacementDriver): engines called directly on a virtual clock, engines in
// this process on the steady clock, or instance processes over a socket.
#pragma once

#include <cstdint>

#include "common/instance_id.h"
#include "conductor/cluster_state.h"
#include "conductor/conductor.h"
#include "engine/engine_core.h"

namespace crescent::cluster {

/// The prefix the Conductor arranged in `decision`, ready when ClusterState::on_request_placed predicted
/// (`timeline`): what the chosen prefill instance's engine is told (EngineCore::submit_prompt).
engine::EngineCore::ArrangedPrefix arranged_prefix(const conductor::Decision& decision,
                                                   const conductor::PrefillTimeline& timeline);

/// Whoever runs the instances, as place() drives them. Called from inside place(): queue or call an engine,
/// never call place() again.
class PlacementDriver {
 public:
  virtual ~PlacementDriver() = default;
  /// Step 1: every decode instance's current load reaches `state` (ClusterState::on_decode_report). A driver
  /// whose instances report on their own (the multi-process cluster) has nothing to do.
  virtual void report_decode_loads(conductor::ClusterState& state, double now_s) = 0;
  /// Step 3: request `id` was accepted as `decision` and recorded in the Conductor's state; its orders
  /// follow (the owner records it here, before an engine in this process can report on it).
  virtual void on_placed(const conductor::Decision& decision, uint64_t id, double now_s) {
    (void)decision;
    (void)id;
    (void)now_s;
  }
  /// Step 4: decode instance `d` reserves HBM for request `id` (its prompt + max output); its KV comes
  /// later. Only for a request that decodes (max_output_tokens > 1).
  virtual void expect(InstanceId d, uint64_t id, const conductor::RequestInfo& request, double now_s) = 0;
  /// Step 5: prefill instance `p` queues `id`'s prompt (FIFO), reusing `prefix`; its KV goes to decode
  /// instance `d` when it decodes.
  virtual void submit_prefill(InstanceId p, uint64_t id, const conductor::RequestInfo& request,
                              const engine::EngineCore::ArrangedPrefix& prefix, InstanceId d,
                              double now_s) = 0;
};

/// Places request `id` at `now_s` (seconds, the caller's clock), in the protocol's order:
///   1. decode reports: driver.report_decode_loads (the Conductor judges decode load as it is now);
///   2. schedule: conductor.schedule over `state` (Algorithm 1, decode choice, admission); a refusal returns
///      here, and nothing was recorded or ordered;
///   3. placed: state.on_request_placed (the prefill queue's predicted timeline; the prompt's blocks indexed
///      on the chosen prefill instance, so the next request finds them), then driver.on_placed;
///   4. expect: the decode instance reserves room (a request of one output token never decodes);
///   5. submit: the prefill instance queues the prompt with the arranged prefix (arranged_prefix).
/// Returns the Conductor's decision.
conductor::Decision place(conductor::Conductor& conductor, conductor::ClusterState& state,
                          const conductor::RequestInfo& request, uint64_t id, double now_s,
                          PlacementDriver& driver);

}  // namespace crescent::cluster
