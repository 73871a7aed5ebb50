#include "cluster/placement.h"

namespace crescent::cluster {

engine::EngineCore::ArrangedPrefix arranged_prefix(const conductor::Decision& decision,
                                                   const conductor::PrefillTimeline& timeline) {
  return {.reused_tokens = decision.prefix_tokens(),
          .fetched_tokens = decision.fetched_prefix_tokens,
          .ready_s = timeline.prefix_ready_s};
}

conductor::Decision place(conductor::Conductor& conductor, conductor::ClusterState& state,
                          const conductor::RequestInfo& request, uint64_t id, double now_s,
                          PlacementDriver& driver) {
  driver.report_decode_loads(state, now_s);
  const conductor::Decision decision = conductor.schedule(state, request, now_s);
  if (decision.rejected != conductor::RejectReason::kNone) return decision;
  const conductor::PrefillTimeline timeline = state.on_request_placed(request, decision, now_s);
  driver.on_placed(decision, id, now_s);
  if (request.max_output_tokens > 1) driver.expect(decision.decode_instance, id, request, now_s);
  // The prefix the Conductor found, fetched from another instance when it chose to: copying it is how a hot
  // prefix gains replicas.
  driver.submit_prefill(decision.prefill_instance, id, request, arranged_prefix(decision, timeline),
                        decision.decode_instance, now_s);
  return decision;
}

}  // namespace crescent::cluster
