// The paper's vLLM baselines (§5.1, vLLM v0.5.1): N nodes behind a load balancer, each one engine that both
// prefills and decodes. Nodes interact only through the balancer, so between arrivals each advances on its
// own; at an arrival every node is brought to the arrival time, then the request goes to the node with the
// fewest outstanding requests. Each node is an engine::EngineCore (whole or chunked prefill, optional
// prefix cache in HBM) on the virtual clock, with the mock executor's iteration times.
#include "sim/colocated.h"

#include <fmt/format.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <optional>
#include <vector>

#include "conductor/placement_history.h"
#include "engine/engine_core.h"
#include "perf/cost_model.h"

namespace crescent::sim {
namespace {

constexpr double kNever = std::numeric_limits<double>::infinity();

// Writes what the nodes' engines report into the requests' outcomes.
class OutcomeRecorder final : public engine::EngineListener {
 public:
  OutcomeRecorder(const perf::CostModel& cost, std::vector<cluster::RequestOutcome>& outcomes)
      : cost_(cost), outcomes_(outcomes) {}

  void on_prefill_start(engine::RequestId id, double now_s, const engine::PrefillStart& start) override {
    cluster::RequestOutcome& o = outcomes_[id];
    o.queue_wait_s = now_s - o.arrival_s;  // its prefill starts now; ttft adds its iterations
    o.prefix_hit_tokens = start.hit_tokens;
    o.prefill_compute_s = cost_.prefill_time_s(start.prefill_tokens, start.reused_tokens);
  }
  void on_first_token(engine::RequestId id, double now_s) override {
    outcomes_[id].ttft_s = now_s - outcomes_[id].arrival_s;
  }
  void on_finished(engine::RequestId id, double now_s,
                   const std::optional<engine::StepLog::Gaps>& gaps) override {
    cluster::RequestOutcome& o = outcomes_[id];
    o.finish_s = now_s;
    if (gaps) {
      o.tbt_s = gaps->tbt_s;
      o.max_token_gap_s = gaps->max_gap_s;
    }
  }

 private:
  const perf::CostModel& cost_;
  std::vector<cluster::RequestOutcome>& outcomes_;
};

}  // namespace

Result<cluster::RunResult> simulate_colocated(const cluster::ClusterConfig& config,
                                              std::span<const trace::Request> trace,
                                              const SimOptions& options) {
  if (options.system == System::kDisaggregated) {
    return Status::invalid_argument("simulate_colocated runs the colocated systems only");
  }
  if (options.system == System::kColocatedChunkedPrefill && options.chunked_prefill_tokens < 1) {
    return Status::invalid_argument(
        fmt::format("chunked prefill tokens must be >= 1, got {}", options.chunked_prefill_tokens));
  }
  const perf::CostModel cost = cluster::cost_model(config);
  const engine::EngineOptions mode{
      .kv_capacity_tokens = cluster::decode_kv_capacity_tokens(config),
      .chunk_tokens = options.system == System::kColocatedChunkedPrefill ? options.chunked_prefill_tokens : 0,
      .prefix_cache = options.system == System::kColocatedPrefixCache,
      .block_size_tokens = options.block_size_tokens,
  };
  cluster::RunResult result;
  result.requests.resize(trace.size());
  engine::MockExecutor executor(cost);
  OutcomeRecorder recorder(cost, result.requests);
  std::vector<std::unique_ptr<engine::EngineCore>> nodes;
  const uint32_t node_count = config.prefill_instances + config.decode_instances;
  for (uint32_t i = 0; i < node_count; ++i) {
    nodes.push_back(std::make_unique<engine::EngineCore>(mode, executor, recorder));
  }
  conductor::PlacementHistory history;
  std::vector<InstanceId> tied;

  for (uint32_t req = 0; req < trace.size(); ++req) {
    const trace::Request& r = trace[req];
    const double now_s = trace::arrival_time_s(trace, req, options.time_scale);
    for (auto& node : nodes) node->advance_until(now_s);
    cluster::RequestOutcome& o = result.requests[req];
    o.arrival_s = now_s;
    o.trace_line = r.line;
    o.input_tokens = r.input_tokens;
    o.output_tokens = r.output_tokens;
    ++result.counters.events;
    // Like the Conductor: a request whose KV could never fit a node's HBM is refused.
    if (r.input_tokens > mode.kv_capacity_tokens ||
        r.output_tokens > mode.kv_capacity_tokens - r.input_tokens) {
      o.rejected = conductor::RejectReason::kContextLength;
      o.finish_s = now_s;
    } else {
      // The load balancer: fewest outstanding requests; ties to the node with the fewest requests placed
      // recently, then round robin (as the Conductor breaks its ties).
      int64_t fewest = nodes[0]->outstanding();
      for (const auto& node : nodes) fewest = std::min(fewest, node->outstanding());
      tied.clear();
      for (uint32_t i = 0; i < node_count; ++i) {
        if (nodes[i]->outstanding() == fewest) tied.push_back(i);
      }
      const uint32_t best = history.pick(tied);
      history.record(best, now_s);
      ++result.counters.decisions;
      o.prefill_instance = o.decode_instance = best;
      nodes[best]->submit_prompt(req, r.input_tokens, r.output_tokens, r.block_keys, now_s);
    }
    if (options.progress && (req + 1) % kProgressEveryRequests == 0) {
      options.progress({req + 1, static_cast<int64_t>(trace.size()), now_s});
    }
  }
  for (auto& node : nodes) {
    node->advance_until(kNever);
    result.counters.events += node->iterations();
    result.counters.decode_steps += node->decode_steps();
  }
  for (const cluster::RequestOutcome& o : result.requests)
    result.makespan_s = std::max(result.makespan_s, o.finish_s);
  return result;
}

}  // namespace crescent::sim
