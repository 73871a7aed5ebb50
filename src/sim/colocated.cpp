// The paper's vLLM baselines (§5.1, vLLM v0.5.1): N nodes behind a load balancer, each one engine that both
// prefills and decodes. Nodes interact only through the balancer, so between arrivals each advances on its
// own; at an arrival every node is brought to the arrival time, then the request goes to the node with the
// fewest outstanding requests.
#include "sim/colocated.h"

#include <fmt/format.h>

#include <algorithm>
#include <deque>
#include <functional>
#include <limits>
#include <optional>
#include <queue>
#include <utility>
#include <vector>

#include "conductor/placement_history.h"
#include "kv/block_cache.h"
#include "perf/cost_model.h"
#include "sim/step_log.h"

namespace crescent::sim {
namespace {

// How often (in arrivals) SimOptions::progress is called, as in simulator.cpp.
constexpr uint32_t kProgressEveryRequests = 256;
constexpr double kInf = std::numeric_limits<double>::infinity();
constexpr uint32_t kNoRequest = std::numeric_limits<uint32_t>::max();

// Per-request state while it is in flight.
struct RequestState {
  int64_t prefill_tokens = 0;       // prompt tokens to compute (>= 1: the last is always recomputed)
  int64_t reused_tokens = 0;        // prompt tokens before them whose KV is reused (prefix cache)
  int64_t prefill_done_tokens = 0;  // of prefill_tokens, computed so far
  int64_t decode_steps = 0;         // output tokens after the first (which the prefill produces)
  int64_t join_step = 0;            // its first decode step
  bool finished = false;
  std::vector<BlockKey> pinned;  // blocks pinned in its node's prefix cache while it runs
};

// The run's inputs and outputs, shared by all nodes.
struct Run {
  const perf::CostModel& cost;
  std::span<const trace::Request> trace;
  std::vector<RequestOutcome>& outcomes;
  std::vector<RequestState>& states;
  SimCounters& counters;
};

// What kind of engine every node runs.
struct EngineMode {
  int64_t kv_capacity_tokens = 0;  // HBM for KV: CostModel::decode_kv_capacity_tokens
  bool prefix_cache = false;       // automatic prefix caching in HBM
  int64_t chunk_tokens = 0;        // chunked prefill's prompt tokens per iteration; 0: whole prompts
  int64_t block_size_tokens = 512;
};

// One colocated node: a vLLM-style engine loop running iterations back to back while it has work. At each
// iteration start it plans the iteration:
//  - whole prompts (chunk_tokens == 0; vLLM's default scheduler, prefill first): if the FIFO head fits in
//    HBM, the iteration prefills it whole and the running batch gets no token (the TBT fluctuation of
//    §5.2.2); otherwise it decodes one token for every running request.
//  - chunked prefill: it decodes one token for every running request AND computes what is left of the
//    chunk_tokens budget (decodes take one token each, as in vLLM) of one prompt (the one being prefilled, or
//    the FIFO head if it fits). One prompt per iteration: a chunk that ends a prompt leaves the rest of the
//    budget unused.
// A request's first token comes at the end of the iteration computing its last prompt token; it decodes
// from the next iteration on. Nothing per iteration is proportional to the batch: the running batch is a few
// totals, a min-heap says who leaves after which decode step, and a StepLog gives a leaving request's TBT.
// As in simulator.cpp, iteration ends at or before a time are processed before arrivals at that time, so an
// arrival exactly at an iteration's end misses the iteration that starts then.
class Node {
 public:
  Node(const EngineMode& mode, Run run) : mode_(mode), run_(run) {
    if (mode.prefix_cache)
      cache_.emplace(std::max<int64_t>(1, mode.kv_capacity_tokens / mode.block_size_tokens));
  }

  // Requests routed here and not finished: waiting, being prefilled or decoding.
  int64_t outstanding() const { return outstanding_; }

  // Queues `req` (FIFO) at `now_s`; an idle node starts an iteration at once. REQUIRES: advanced to now_s.
  void enqueue(uint32_t req, double now_s) {
    waiting_.push_back(req);
    ++outstanding_;
    if (!busy_) start_iteration(now_s);
  }

  // Runs every iteration that ends at or before `t_s`.
  void advance_until(double t_s) {
    while (busy_ && iteration_.end_s <= t_s) {
      end_iteration();
      start_iteration(iteration_.end_s);
    }
  }

 private:
  // What the current iteration does.
  struct Iteration {
    double end_s = 0;
    bool decode = false;         // one token for every running request
    int64_t prefill_tokens = 0;  // of prefilling_'s prompt
  };

  RequestOutcome& outcome(uint32_t req) { return run_.outcomes[req]; }
  RequestState& state(uint32_t req) { return run_.states[req]; }

  void start_iteration(double start_s) {
    if (prefilling_ == kNoRequest && !waiting_.empty() && admit(waiting_.front())) {
      prefilling_ = waiting_.front();
      waiting_.pop_front();
      RequestOutcome& o = outcome(prefilling_);
      o.queue_wait_s = start_s - o.arrival_s;  // its prefill starts now; ttft adds its iterations
    }
    const bool chunked = mode_.chunk_tokens > 0;
    int64_t prefix_tokens = 0;
    iteration_.prefill_tokens = 0;
    if (prefilling_ != kNoRequest) {
      const RequestState& s = state(prefilling_);
      const int64_t left = s.prefill_tokens - s.prefill_done_tokens;
      // vLLM's chunked prefill spends its token budget (max_num_batched_tokens) on decodes first, one token
      // each; the prompt gets what is left.
      iteration_.prefill_tokens =
          chunked ? std::min(left, std::max<int64_t>(0, mode_.chunk_tokens - running_requests_)) : left;
      prefix_tokens = s.reused_tokens + s.prefill_done_tokens;
    }
    iteration_.decode = running_requests_ > 0 && (chunked || iteration_.prefill_tokens == 0);
    busy_ = iteration_.decode || iteration_.prefill_tokens > 0;
    if (!busy_) return;
    const int64_t batch = iteration_.decode ? running_requests_ : 0;
    const int64_t context = iteration_.decode ? running_context_tokens_ : 0;
    iteration_.end_s =
        start_s + run_.cost.iteration_time_s(batch, context, iteration_.prefill_tokens, prefix_tokens);
  }

  void end_iteration() {
    ++run_.counters.events;
    const double now_s = iteration_.end_s;
    if (iteration_.decode) {
      ++run_.counters.decode_steps;
      const int64_t step = log_.next_step();
      log_.append(now_s);
      running_context_tokens_ += running_requests_;
      while (!leaving_.empty() && leaving_.top().first == step) {
        const uint32_t req = leaving_.top().second;
        leaving_.pop();
        leave(req, step, now_s);
      }
      while (!decoding_.empty() && state(decoding_.front()).finished) decoding_.pop_front();
      log_.trim_before(decoding_.empty() ? log_.next_step() : state(decoding_.front()).join_step);
    }
    if (iteration_.prefill_tokens > 0) {
      RequestState& s = state(prefilling_);
      s.prefill_done_tokens += iteration_.prefill_tokens;
      if (s.prefill_done_tokens == s.prefill_tokens) {
        const uint32_t req = prefilling_;
        prefilling_ = kNoRequest;
        first_token(req, now_s);
      }
    }
  }

  // Reserves HBM for `req` and starts its prefill if it fits; false (nothing changed) if not.
  // HBM accounting: capacity = reserved KV of admitted requests, prompt + max output each (no preemption, as
  // the disaggregated DecodeInstance) + with a prefix cache, cached blocks no admitted request uses
  // (unpinned). Those are evictable, so a request fits when reserved + its need <= capacity; once it is
  // admitted, unpinned blocks are evicted LRU first until reserved + unpinned * block <= capacity. A cached
  // block two admitted requests share is counted in both reservations (conservative: vLLM shares it).
  bool admit(uint32_t req) {
    RequestOutcome& o = outcome(req);
    RequestState& s = state(req);
    const int64_t need = o.input_tokens + o.output_tokens;
    if (reserved_kv_tokens_ + need > mode_.kv_capacity_tokens) return false;
    reserved_kv_tokens_ += need;
    int64_t hit_tokens = 0;
    if (cache_) {
      const int64_t block = mode_.block_size_tokens;
      const std::span<const BlockKey> keys = run_.trace[req].block_keys;
      hit_tokens = std::min(cache_->prefix_match_blocks(keys) * block, o.input_tokens);
      touch_events_.clear();
      cache_->touch(keys, /*pin=*/true, &touch_events_);
      s.pinned = touch_events_.pinned;
      const int64_t unpinned_blocks = cache_->size_blocks() - cache_->pinned_blocks();
      const int64_t over_tokens = reserved_kv_tokens_ + unpinned_blocks * block - mode_.kv_capacity_tokens;
      if (over_tokens > 0) cache_->evict_unpinned((over_tokens + block - 1) / block);
    }
    // The last prompt token is always recomputed: its logits give the first output token (as the Conductor).
    s.prefill_tokens = std::max<int64_t>(1, o.input_tokens - hit_tokens);
    s.reused_tokens = std::max<int64_t>(0, o.input_tokens - s.prefill_tokens);
    o.prefix_hit_tokens = hit_tokens;
    o.prefill_compute_s = run_.cost.prefill_time_s(s.prefill_tokens, s.reused_tokens);
    return true;
  }

  // The prefill of `req` ended at `now_s` with its first token; it joins the batch at the next iteration.
  void first_token(uint32_t req, double now_s) {
    RequestOutcome& o = outcome(req);
    RequestState& s = state(req);
    o.ttft_s = now_s - o.arrival_s;
    if (s.decode_steps == 0) {
      finish(req, now_s);
      return;
    }
    running_requests_ += 1;
    running_context_tokens_ += o.input_tokens;
    s.join_step = log_.next_step();
    leaving_.emplace(s.join_step + s.decode_steps - 1, req);
    decoding_.push_back(req);
  }

  // `req` produced its last token in decode step `step`, ending at `now_s`.
  void leave(uint32_t req, int64_t step, double now_s) {
    RequestOutcome& o = outcome(req);
    const RequestState& s = state(req);
    running_requests_ -= 1;
    running_context_tokens_ -= o.input_tokens + s.decode_steps;
    const StepLog::Gaps gaps = log_.gaps(o.arrival_s + o.ttft_s, s.join_step, step);
    o.tbt_s = gaps.tbt_s;
    o.max_token_gap_s = gaps.max_gap_s;
    finish(req, now_s);
  }

  void finish(uint32_t req, double now_s) {
    RequestOutcome& o = outcome(req);
    RequestState& s = state(req);
    o.finish_s = now_s;
    reserved_kv_tokens_ -= o.input_tokens + o.output_tokens;
    if (cache_) cache_->unpin(s.pinned);
    std::vector<BlockKey>().swap(s.pinned);
    s.finished = true;
    --outstanding_;
  }

  EngineMode mode_;
  Run run_;
  std::optional<kv::BlockCache> cache_;  // with EngineMode::prefix_cache
  int64_t outstanding_ = 0;
  int64_t reserved_kv_tokens_ = 0;  // prompt + max output of every admitted, unfinished request
  int64_t running_requests_ = 0;    // the decoding batch
  int64_t running_context_tokens_ = 0;
  std::deque<uint32_t> waiting_;      // FIFO, not yet admitted
  uint32_t prefilling_ = kNoRequest;  // admitted, prompt not done
  std::deque<uint32_t> decoding_;     // in join order, to find the oldest request still decoding
  bool busy_ = false;
  Iteration iteration_;
  StepLog log_;
  // (last decode step, request): who leaves after which step.
  std::priority_queue<std::pair<int64_t, uint32_t>, std::vector<std::pair<int64_t, uint32_t>>, std::greater<>>
      leaving_;
  kv::TouchEvents touch_events_;  // scratch for admit
};

}  // namespace

Result<SimResult> simulate_colocated(const ClusterConfig& config, std::span<const trace::Request> trace,
                                     const SimOptions& options) {
  if (options.system == System::kDisaggregated) {
    return Status::invalid_argument("simulate_colocated runs the colocated systems only");
  }
  if (options.system == System::kColocatedChunkedPrefill && options.chunked_prefill_tokens < 1) {
    return Status::invalid_argument(
        fmt::format("chunked prefill tokens must be >= 1, got {}", options.chunked_prefill_tokens));
  }
  const perf::CostModel cost(config.model, config.hardware);
  const EngineMode mode{
      .kv_capacity_tokens = cost.decode_kv_capacity_tokens(config.decode_hbm_reserved_share),
      .prefix_cache = options.system == System::kColocatedPrefixCache,
      .chunk_tokens = options.system == System::kColocatedChunkedPrefill ? options.chunked_prefill_tokens : 0,
      .block_size_tokens = options.block_size_tokens,
  };
  SimResult result;
  result.requests.resize(trace.size());
  std::vector<RequestState> states(trace.size());
  const Run run{cost, trace, result.requests, states, result.counters};
  std::vector<Node> nodes;
  const uint32_t node_count = config.prefill_instances + config.decode_instances;
  nodes.reserve(node_count);
  for (uint32_t i = 0; i < node_count; ++i) nodes.emplace_back(mode, run);
  conductor::PlacementHistory history;
  std::vector<InstanceId> tied;

  for (uint32_t req = 0; req < trace.size(); ++req) {
    const trace::Request& r = trace[req];
    const double now_s = arrival_time_s(trace, req, options.time_scale);
    for (Node& node : nodes) node.advance_until(now_s);
    RequestOutcome& o = result.requests[req];
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
      int64_t fewest = nodes[0].outstanding();
      for (const Node& node : nodes) fewest = std::min(fewest, node.outstanding());
      tied.clear();
      for (uint32_t i = 0; i < node_count; ++i) {
        if (nodes[i].outstanding() == fewest) tied.push_back(i);
      }
      const uint32_t best = history.pick(tied);
      history.record(best, now_s);
      ++result.counters.decisions;
      o.prefill_instance = o.decode_instance = best;
      states[req].decode_steps = std::max<int64_t>(0, r.output_tokens - 1);
      nodes[best].enqueue(req, now_s);
    }
    if (options.progress && (req + 1) % kProgressEveryRequests == 0) {
      options.progress({req + 1, static_cast<int64_t>(trace.size()), now_s});
    }
  }
  for (Node& node : nodes) node.advance_until(kInf);
  for (const RequestOutcome& o : result.requests) result.makespan_s = std::max(result.makespan_s, o.finish_s);
  return result;
}

}  // namespace crescent::sim
